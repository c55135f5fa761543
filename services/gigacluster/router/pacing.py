"""How a request's tokens reach its writer: a :class:`TokenBox` per stream, paced by a router-wide :class:`Pacer`.

Every stream message costs the router (and its client) a write through the transport: about
30 us of a core each side for gRPC, whatever it carries. A :class:`TokenBox` takes the place of the
stream's ``asyncio.Queue``: a replica appends its events (no future, no task, no wake-up per
token) and the writer takes everything pending as one message when it wakes. It wakes

* at once for the first message (TTFT is never held), for the last token and for an error;
* otherwise no sooner than ``hold`` wall seconds after the stream's last message, where ``hold``
  is the :class:`Pacer`'s: the router's open streams divided by its message budget
  (``stream_messages_per_s``; at most ``stream_max_hold_s``), or ``coalesce_hold_s`` once the
  stream runs more than ``coalesce_lag_s`` behind its virtual time, whichever is longer.

So a router serving few streams sends every token as its own message (exact inter-token times);
one serving many sends each stream fewer, fuller messages, spending a bounded number of writes a
second instead of falling behind. The tokens keep their virtual times (a chunk says when its last
was produced and how many it holds); time to first token and end-to-end latency are never
delayed. On the event clock pacing is off (its tokens are stamped, not timed on the wire): a stream's
first message holds the tokens of its first virtual time only (the first token, as every client reads
TTFT), and each later one everything pending, each token with its own virtual time
(``GenerateResponse.token_times_s``). A replica running ahead of the clock produces many iterations'
tokens at once, and one message each cost the router and its client a write and a read per token.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from gigacluster.runtime.clock import VirtualClock


@dataclasses.dataclass(frozen=True)
class Pacer:
    """The router-wide rule: how long after its last message a stream's next one may wait for more tokens."""

    clock: VirtualClock
    open_streams: Callable[[], int]
    messages_per_s: float = 0.0  # the router's budget of stream messages a second (0: none)
    max_hold_s: float = 0.05  # ... never holding a message longer than this after the last
    lag_s: float = 0.005  # a stream this far behind its virtual time ...
    behind_hold_s: float = 0.0  # ... holds each message at least this long (0: never)
    # What the stream's events are: the last (or an error), and their virtual time. By default a replica's
    # TokenEvents and exceptions; a front end's are the core's LinkEvents.
    final: Callable[[Any], bool] = lambda ev: isinstance(ev, Exception) or ev.finished
    time_of: Callable[[Any], float] = lambda ev: float(ev.time_s)
    # The event clock: the first message carries the tokens of its first virtual time only (its time is the
    # first token's, TTFT); later messages carry every pending token with its own time (a replica running
    # ahead of the clock queues many iterations' tokens at once).
    stamped: bool = False

    def hold_s(self, pending: Sequence[Any]) -> float:
        """Wall seconds the next message of a stream with ``pending`` events may wait after its last one
        (0 when one of them is the last token or an error)."""
        if not pending or any(self.final(ev) for ev in pending):
            return 0.0
        hold = min(self.max_hold_s, self.open_streams() / self.messages_per_s) if self.messages_per_s > 0 else 0.0
        if self.behind_hold_s > hold and self.clock.lag_wall_s(self.time_of(pending[0])) > self.lag_s:
            hold = self.behind_hold_s
        return hold


class TokenBox:
    """A request's events on their way to its writer (in place of an ``asyncio.Queue``): replicas (or a front
    end's link reader) :meth:`put_nowait`, the writer awaits :meth:`take` for everything pending, paced by
    ``pacer``."""

    __slots__ = ("_last_s", "_timer", "_waiter", "items", "pacer", "sent")

    def __init__(self, pacer: Pacer | None = None) -> None:
        self.items: list[Any] = []
        self.pacer = pacer
        self.sent = 0  # messages taken so far
        self._last_s = 0.0  # loop time of the last take
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def put_nowait(self, ev: Any) -> None:
        self.items.append(ev)
        w = self._waiter
        # A hold already timed stays as it is unless this event ends the stream (the common case: one check).
        if w is not None and not w.done() and (self._timer is None or self.pacer is None or self.pacer.final(ev)):
            self._arm(w)

    def empty(self) -> bool:
        return not self.items

    def get_nowait(self) -> Any:
        """The oldest pending event (as ``asyncio.Queue``'s, for code moving a stream elsewhere)."""
        if not self.items:
            raise asyncio.QueueEmpty
        return self.items.pop(0)

    def delay_s(self, now_s: float) -> float:
        """How long from ``now_s`` (loop time) the writer should still wait before taking what is pending."""
        if not self.items:
            return float("inf")
        if not self.sent or self.pacer is None:
            return 0.0
        hold = self.pacer.hold_s(self.items)
        return self._last_s + hold - now_s if hold > 0 else 0.0

    def _arm(self, w: asyncio.Future[None]) -> None:
        """Wake the waiting writer now, or once the pending events' hold is over (one timer at a time)."""
        loop = w.get_loop()
        d = self.delay_s(loop.time())
        if d <= 0:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            w.set_result(None)
        elif self._timer is None:
            self._timer = loop.call_later(d, self._due, w)

    def _due(self, w: asyncio.Future[None]) -> None:
        self._timer = None
        if not w.done():
            self._arm(w)  # pending events may have changed the hold meanwhile

    async def take(self) -> list[Any]:
        """Everything pending, once the first message, the last token, an error or the pacer's hold is due."""
        loop = asyncio.get_running_loop()
        if self.delay_s(loop.time()) > 0:
            w = self._waiter = loop.create_future()
            try:
                if self.items:
                    self._arm(w)
                await w
            finally:
                self._waiter = None
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
        items, self.items = self.items, []
        if (self.pacer is not None and self.pacer.stamped and not self.sent and len(items) > 1
                and not isinstance(items[0], Exception)):
            t0, n = self.pacer.time_of(items[0]), 1
            while n < len(items) and not isinstance(items[n], Exception) and self.pacer.time_of(items[n]) == t0:
                n += 1
            items, self.items = items[:n], items[n:]
        self.sent += 1
        self._last_s = loop.time()
        return items
