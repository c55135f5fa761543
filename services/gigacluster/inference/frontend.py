"""The API server in front of a replica's engine, as the offline simulator prices it.

vLLM's OpenAI-compatible server handled each request's synchronous part (parsing, tokenisation) on
one asyncio event loop (vllm-project/vllm PR 10635: tokenisation "done synchronously ... sequentially,
blocking the asyncio event loop"). So it serves requests one at a time, ``serving.api_request_s``
each, and while requests are queued in front of it the loop runs their handlers before the tasks
that forward requests to the engine: a burst reaches the engine, and its first tokens the clients,
only when the loop has worked through the whole burst (as users report of vLLM's v0 engine: "the model
will not run until all the requests are added", vllm-project/vllm issue 13259). A request that finds
the loop idle waits just its own ``api_request_s``, as before.
"""

from __future__ import annotations

import numpy as np


def release_times(arrivals_s: np.ndarray, api_s: float) -> np.ndarray:
    """When each request (``arrivals_s`` sorted, client send times) reaches the engine: the end of the
    API server's busy period it arrived in, the server taking ``api_s`` per request, first come first served."""
    out = np.empty_like(arrivals_s, dtype=float)
    start, busy_end = 0, -np.inf
    for i, t in enumerate(arrivals_s.tolist()):
        if t > busy_end and i > start:  # the loop went idle: the previous burst is released
            out[start:i] = busy_end
            start = i
        busy_end = max(busy_end, t) + api_s
    out[start:] = busy_end
    return out
