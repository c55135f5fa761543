"""Router-wide admission, checked before any work on a request: open streams and how far behind the router runs.

Each deployment's replicas bound their own queues (``max_queue``, refused with a model-based
retry-after). This bounds the front end itself:

* a router process holding ``max_streams`` open streams, or running more than ``max_loop_lag_s``
  behind (its event loop wakes late, or its replicas emit tokens later than their virtual time: it
  cannot serve what it holds on time), refuses every new request at once with RESOURCE_EXHAUSTED
  and a retry-after. "Behind" is a standing lag, not a burst: the least of the last
  :data:`STANDING_SAMPLES` samples, as CoDel (RFC 8289, section 3.2) acts on the least sojourn over an
  interval rather than on one packet's. One late wake is the whole process paused (descheduled on a
  loaded host, a garbage collection): the calls that arrive during it are no sign of overload, and
  refusing them shed requests at 0.2 a second in a 6-process test stack on 2 busy cores;
* new calls waiting in gRPC's core before the process sees them (measured by
  :class:`gigacluster.runtime.accept_probe.AcceptProbe`, given here as ``accept_lag``) are held near
  ``accept_target_s`` by refusing a fraction of new requests, the fraction set as PIE sets its drop
  probability (RFC 8033: every sample, ``p += alpha (wait - target) + beta (wait - previous wait)``).
  A fraction, not all: each refusal still costs the router the call's acceptance (most of a served
  call's CPU at 1,000 requests/s), so refusing everything while the queue is long starves the calls
  it could serve. Refusing every call behind the bound instead served 204 a second against 750 with no
  bound, at 1,000 offered.

Neither refuses while fewer than :data:`SHORT_QUEUE` calls are waiting behind the delay (the arrival
rate times the delay, by Little's law): PIE drops nothing from a queue of fewer than two packets
(RFC 8033, section 5.1), because a delay that no queue explains is not relieved by refusing. On a
host whose other processes take the router's CPU, its loop and its calls run late at any load; at
0.2 requests a second that refused calls nothing was waiting behind.

Either way no request queues until the transport gives up on it (gRPC's core cancels calls the
application has not picked up: that was the CANCELLED under overload).
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import math
import random
import time
from collections.abc import Callable

from gigacluster.errors import ResourceExhausted

#: Set in a call's context once :meth:`Overload.shed` let it through (by the gRPC server, before the servicer).
SHED_CHECKED: contextvars.ContextVar[bool] = contextvars.ContextVar("shed_checked", default=False)

#: How many consecutive late samples make a standing lag (the router refuses); one on-time sample ends it.
STANDING_SAMPLES = 3

#: Fewer calls than this waiting behind a delay are no queue to shed (RFC 8033, section 5.1: two packets).
SHORT_QUEUE = 2.0

#: The arrival rate is an exponential mean over about this many seconds.
RATE_WINDOW_S = 1.0

#: PIE's gains (RFC 8033, section 4.2: alpha 0.125, beta 1.25, per second of queueing delay), per sample.
PIE_ALPHA, PIE_BETA = 0.125, 1.25


class Overload:
    """Counts open streams and watches how far behind the router runs; :meth:`admit` refuses beyond the bounds."""

    def __init__(self, max_streams: int, max_loop_lag_s: float, retry_after_s: float,
                 accept_lag: Callable[[], float] | None = None, accept_target_s: float = 0.25,
                 seed: int | None = None) -> None:
        self.max_streams = max_streams
        self.max_loop_lag_s = max_loop_lag_s
        self.retry_after_s = retry_after_s
        self.open = 0
        self.lag_s = 0.0  # how far behind the router runs: its loop, or its replicas' token emission (standing)
        self._recent: collections.deque[tuple[float, str]] = collections.deque(maxlen=STANDING_SAMPLES)
        self.cause = "loop"  # which of the two
        self.refused = 0
        self._emit_lag_s = 0.0  # the latest tick's worst emission lag
        self.accept_lag = accept_lag  # how long new calls wait before this process sees them (None: not measured)
        self.accept_target_s = accept_target_s
        self.accept_wait_s = 0.0  # the latest sample of it
        self.refuse_p = 0.0  # the fraction of new requests refused for it
        self._rng = random.Random(seed)
        self.arrival_rate = 0.0  # new calls a second (an exponential mean over RATE_WINDOW_S)
        self._arrivals = 0  # new calls since the last sample
        self._last_tick = time.monotonic()

    def waiting(self, delay_s: float) -> float:
        """How many calls wait behind a delay of ``delay_s`` at the current arrival rate (Little's law)."""
        return self.arrival_rate * delay_s

    def observe_emit_lag(self, lag_s: float) -> None:
        """A replica emitted an iteration's tokens ``lag_s`` wall seconds after their virtual time."""
        if lag_s > self._emit_lag_s:
            self._emit_lag_s = lag_s

    def shed(self) -> ResourceExhausted | None:
        """The refusal for a new request when the router runs behind, else None (counted; no slot is taken).

        The gRPC server asks first, before any other work on the call (runtime/accept_probe.py), and marks the
        call's context so that :meth:`admit` does not ask again."""
        self._arrivals += 1
        if self.lag_s > self.max_loop_lag_s and self.waiting(self.lag_s) >= SHORT_QUEUE:
            self.refused += 1
            what = "its tokens go out that late" if self.cause == "emit" else "its event loop wakes that late"
            return ResourceExhausted(f"the router is {1e3 * self.lag_s:.0f} ms behind: {what} (its max_loop_lag_s "
                                     f"is {1e3 * self.max_loop_lag_s:.0f} ms); retry later",
                                     retry_after_s=max(self.retry_after_s, self.lag_s), reason="ROUTER_SATURATED")
        if self.refuse_p > 0 and self.waiting(self.accept_wait_s) >= SHORT_QUEUE and self._rng.random() < self.refuse_p:
            self.refused += 1
            return ResourceExhausted(f"new calls wait {1e3 * self.accept_wait_s:.0f} ms in the router's gRPC queue "
                                     f"before it sees them (its target is {1e3 * self.accept_target_s:.0f} ms): it "
                                     f"refuses {100 * self.refuse_p:.0f}% of new requests; retry later",
                                     retry_after_s=max(self.retry_after_s, self.accept_wait_s),
                                     reason="ROUTER_SATURATED")
        return None

    def screen(self) -> ResourceExhausted | None:
        """:meth:`shed`, for a server that asks before the call reaches :meth:`admit`: a call let through is
        marked in its context, so that ``admit`` does not ask (and draw) again."""
        exc = self.shed()
        if exc is None:
            SHED_CHECKED.set(True)
        return exc

    def admit(self) -> Callable[[], None]:
        """Take a stream slot (its release function, idempotent) or raise ResourceExhausted."""
        if self.open >= self.max_streams:
            self.refused += 1
            raise ResourceExhausted(f"the router holds {self.open} open streams (its max_streams); retry later",
                                    retry_after_s=self.retry_after_s, reason="ROUTER_SATURATED")
        if not SHED_CHECKED.get() and (exc := self.shed()) is not None:
            raise exc
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

    def tick(self, loop_lag_s: float, now_s: float | None = None) -> None:
        """One sample: how far behind is the loop's or the replicas' lag since the last sample, whichever is larger;
        the router's lag is the least of the last :data:`STANDING_SAMPLES` of them. The new calls' wait moves the
        fraction refused (PIE's update), and the calls since the last sample the arrival rate."""
        now_s = time.monotonic() if now_s is None else now_s
        dt, self._last_tick = now_s - self._last_tick, now_s
        if dt > 0:
            w = -math.expm1(-dt / RATE_WINDOW_S)
            self.arrival_rate += w * (self._arrivals / dt - self.arrival_rate)
            self._arrivals = 0
        self._recent.append(max((loop_lag_s, "loop"), (self._emit_lag_s, "emit")))
        self.lag_s, self.cause = min(self._recent) if len(self._recent) == STANDING_SAMPLES else (0.0, "loop")
        self._emit_lag_s = 0.0
        if self.accept_lag is not None:
            wait = self.accept_lag()
            p = self.refuse_p + PIE_ALPHA * (wait - self.accept_target_s) + PIE_BETA * (wait - self.accept_wait_s)
            self.refuse_p = min(1.0, max(0.0, p))
            self.accept_wait_s = wait
