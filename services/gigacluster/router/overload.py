"""Router-wide admission, checked before any work on a request: open streams and event-loop lag.

Each deployment's replicas bound their own queues (``max_queue``, refused with a model-based
retry-after). This bounds the front end itself: a router process holding ``max_streams`` open
streams, or running more than ``max_loop_lag_s`` behind (its event loop wakes late, or its
replicas emit tokens later than their virtual time: it cannot serve what it holds on time),
refuses a new request at once with RESOURCE_EXHAUSTED and a retry-after, never letting it queue
until the transport gives up on it (gRPC's core cancels calls the application has not picked up:
that was the CANCELLED under overload).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from gigacluster.errors import ResourceExhausted


class Overload:
    """Counts open streams and watches the event loop's lag; :meth:`admit` refuses beyond either bound."""

    def __init__(self, max_streams: int, max_loop_lag_s: float, retry_after_s: float) -> None:
        self.max_streams = max_streams
        self.max_loop_lag_s = max_loop_lag_s
        self.retry_after_s = retry_after_s
        self.open = 0
        self.lag_s = 0.0  # how far behind the router runs: its loop, or its replicas' token emission
        self.refused = 0
        self._emit_lag_s = 0.0  # the latest tick's worst emission lag

    def observe_emit_lag(self, lag_s: float) -> None:
        """A replica emitted an iteration's tokens ``lag_s`` wall seconds after their virtual time."""
        if lag_s > self._emit_lag_s:
            self._emit_lag_s = lag_s

    def admit(self) -> Callable[[], None]:
        """Take a stream slot (its release function, idempotent) or raise ResourceExhausted."""
        if self.open >= self.max_streams:
            self.refused += 1
            raise ResourceExhausted(f"the router holds {self.open} open streams (its max_streams); retry later",
                                    retry_after_s=self.retry_after_s, reason="ROUTER_SATURATED")
        if self.lag_s > self.max_loop_lag_s:
            self.refused += 1
            raise ResourceExhausted(f"the router is {1e3 * self.lag_s:.0f} ms behind (its max_loop_lag_s is "
                                    f"{1e3 * self.max_loop_lag_s:.0f} ms); retry later",
                                    retry_after_s=max(self.retry_after_s, self.lag_s), reason="ROUTER_SATURATED")
        self.open += 1
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                self.open -= 1

        return release

    async def watch(self, interval_s: float = 0.01) -> None:
        """Measure the lag for ever: how late a ``interval_s`` sleep wakes, or the worst emission lag the
        replicas saw since the last sample, whichever is larger."""
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(interval_s)
            self.tick(max(0.0, time.monotonic() - t0 - interval_s))

    def tick(self, loop_lag_s: float) -> None:
        """One sample: the lag is the loop's or the replicas' since the last sample."""
        self.lag_s = max(loop_lag_s, self._emit_lag_s)
        self._emit_lag_s = 0.0
