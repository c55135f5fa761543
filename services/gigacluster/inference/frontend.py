"""The API server in front of a replica's engine, as the offline simulator prices it.

vLLM's OpenAI-compatible server handled each request's synchronous part (parsing, tokenisation) on
one asyncio event loop (vllm-project/vllm PR 10635: tokenisation "done synchronously ... sequentially,
blocking the asyncio event loop"). So it serves requests one at a time, each taking
``serving.api_prompt_token_s`` per prompt token (tokenising grows with the prompt; vLLM v1's path, with
the tokeniser off the loop since PR 10635, takes ``serving.api_request_s`` per request), and while
requests are queued in front of it the loop runs their handlers before the tasks that forward requests
to the engine: a burst reaches the engine, and its first tokens the clients, only when the loop has
worked through the whole burst (as users report of vLLM's v0 engine: "the model will not run until all
the requests are added", vllm-project/vllm issue 13259). A request that finds the loop idle waits just
its own intake, as before. Each replica has its own server (:class:`ApiServers`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from gigacluster.inference.engine import ReplicaEngine
from gigacluster.inference.policies import ReplicaView


def release_times(arrivals_s: np.ndarray, api_s: float | np.ndarray) -> np.ndarray:
    """When each request (``arrivals_s`` sorted, client send times) reaches the engine: the end of the
    API server's busy period it arrived in, the server taking ``api_s`` for each request (one value, or one per
    request), first come first served. One server of :class:`ApiServers`."""
    out = np.empty_like(arrivals_s, dtype=float)
    cost = np.broadcast_to(np.asarray(api_s, dtype=float), arrivals_s.shape).tolist()
    server = ApiServers(1)
    for j, t in enumerate(arrivals_s.tolist()):
        _, t_rel = server.next_release()
        if t_rel < t:  # the loop went idle: the previous burst is released
            out[server.pop(0)] = t_rel
        server.take(0, j, t, cost[j])
    _, t_rel = server.next_release()
    out[server.pop(0)] = t_rel
    return out


class ApiServers:
    """The API servers of a cluster's replicas, one each (every vLLM instance runs its own event loop): a request is
    routed when it arrives, then its replica's server takes it after those before it and releases each busy
    period's requests together when the period ends, as :func:`release_times` does for one server."""

    def __init__(self, replicas: int) -> None:
        self.end = np.full(replicas, -math.inf)  # the end of each server's current busy period
        self.held: list[list[int]] = [[] for _ in range(replicas)]  # the requests it holds (indices)

    def next_release(self) -> tuple[int, float]:
        """(server, time) of the earliest busy period to end; (-1, inf) when none holds a request."""
        best, t = -1, math.inf
        for k, held in enumerate(self.held):
            if held and self.end[k] < t:
                best, t = k, float(self.end[k])
        return best, t

    def take(self, k: int, j: int, now: float, intake_s: float) -> None:
        """Server ``k`` queues request ``j``, arrived at ``now``, which takes it ``intake_s``. The caller releases a
        busy period that ended before ``now`` first (:meth:`next_release` comes before a later arrival)."""
        if self.held[k] and now > self.end[k]:
            raise AssertionError("a busy period that ended was not released")
        self.end[k] = max(float(self.end[k]), now) + intake_s
        self.held[k].append(j)

    def pop(self, k: int) -> list[int]:
        """The requests of server ``k``'s busy period, now released."""
        out, self.held[k] = self.held[k], []
        return out

    def views(self, engines: Sequence[ReplicaEngine], block_size: int) -> list[ReplicaView]:
        """What the router sees of each replica: its engine's counters plus the requests routed to it that its API
        server still holds (the router knows what it sent)."""
        out = []
        for k, e in enumerate(engines):
            v = ReplicaView.from_stats(k, e.stats(), block_size)
            if self.held[k]:
                n = len(self.held[k])
                v = dataclasses.replace(v, outstanding_requests=v.outstanding_requests + n,
                                        queue_depth=v.queue_depth + n)
            out.append(v)
        return out
