"""The mesh's one virtual clock, in one of two modes (``--clock``).

``wall`` (the default): virtual time is ``(wall_time - epoch) * speedup`` seconds. Every process
of a cluster gets the same ``epoch`` (``gigacluster up`` passes its own start time) and
``speedup``, so their clocks agree without messages: 1x is real time, 100x-1000x compresses
what-if runs. Wall time is ``time.time()`` so processes on different hosts agree as far as NTP does.

``event``: :class:`EventClock`, virtual time that jumps to the next pending wake-up whenever the
whole mesh is idle, held by a coordinator (``gigacluster.clock``; docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import heapq
import hmac
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator


@dataclasses.dataclass(frozen=True)
class VirtualClock:
    epoch_unix_s: float
    speedup: float = 1.0

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise ValueError(f"speedup must be > 0, got {self.speedup}")

    @classmethod
    def starting_now(cls, speedup: float = 1.0) -> VirtualClock:
        return cls(time.time(), speedup)

    def now(self) -> float:
        """Virtual seconds since the epoch."""
        return (time.time() - self.epoch_unix_s) * self.speedup

    def wall_s(self, virtual_s: float) -> float:
        """Wall seconds that ``virtual_s`` virtual seconds take."""
        return virtual_s / self.speedup

    async def sleep_until(self, t_s: float, *, ahead: bool = False) -> None:
        """Wait until virtual time ``t_s`` (returns at once if it has passed). ``ahead``: the event clock may
        end the wait before ``t_s`` once its horizon passes it (:meth:`EventClock.sleep_until`); here no effect."""
        delay = (t_s - self.now()) / self.speedup
        if delay > 0:
            await asyncio.sleep(delay)

    async def sleep(self, virtual_s: float) -> None:
        if virtual_s > 0:
            await asyncio.sleep(virtual_s / self.speedup)

    def lag_wall_s(self, t_s: float) -> float:
        """Wall seconds this process runs behind virtual time ``t_s`` (0 if ``t_s`` is still ahead)."""
        return max(0.0, self.now() - t_s) / self.speedup

    async def wait_past(self, t_s: float, poll_wall_s: float) -> None:
        """Wait for another process to act on virtual time ``t_s`` (a peer's simulator settling an event due
        then): here a poll interval of wall time, in which the clock moves on by itself."""
        await asyncio.sleep(poll_wall_s)

    def horizon_s(self) -> float:
        """Up to when work of this process's own may run ahead of the clock without waiting for it: on the
        wall clock never (-inf)."""
        return -math.inf


CLOCK_MODES = ("wall", "event")


class EventClock(VirtualClock):
    """Virtual time that jumps from event to event, told by the mesh's clock coordinator.

    A drop-in for :class:`VirtualClock` (``now``, ``sleep_until``, ``sleep``, ``wall_s``): services
    use it unchanged. ``now`` is the last time this process was told (by the coordinator, or on a
    call from a process that was told later); it never goes backwards. ``sleep_until`` parks the
    task until the coordinator moves time to ``t_s``, which it does once the whole mesh is idle
    and nothing is in flight (``gigacluster.clock.core``). This object only keeps the process's
    side of that: its sleepers, its open mesh calls (counted by the interceptors of
    ``runtime/clock_wire.py``) and an activity counter; ``runtime/coordinator_client.py`` reports
    them. No gRPC here.
    """

    def __init__(self, now_s: float = 0.0, *, sign_key: str = "", wire_keys: Iterable[str] = ()) -> None:
        super().__init__(0.0, 1.0)
        self._now = now_s
        # A time on a call counts only with its proof (:func:`vt_mac`) under one of ``wire_keys`` (the mesh's
        # service and admin keys), so a caller without them can neither move nor hold the mesh's time;
        # this process signs the times it sends with ``sign_key``. No key at all (a bare test server):
        # times are taken unsigned.
        self.sign_key = sign_key
        self.wire_keys = tuple(k for k in wire_keys if k)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._ahead: list[tuple[float, int, asyncio.Future[None]]] = []  # sleepers the horizon may release
        self._watchers: list[asyncio.Future[None]] = []  # tasks waiting for time to move at all (no wake-up)
        self._seq = 0
        self.calls_out = 0
        self.calls_in = 0
        self.msgs_sent = 0  # messages of open mesh server streams, as their server
        self.msgs_received = 0  # ... and as their client
        self.activity = 0
        self.holds = 0
        self.left = False  # a client participant left the clock: its later calls come from outside the mesh
        self.on_change: Callable[[], None] | None = None  # the coordinator client's wake-up
        # Dormancy (clock/core.py): True while the coordinator may be leaving this process out of its rounds
        # (its last report said dormant); a call then waits for ``on_awaken`` (the coordinator's acknowledgement)
        # before it is handled or sent. ``external``: calls from outside the mesh being served now.
        self.dormant = False
        self.on_awaken: Callable[[], Awaitable[None]] | None = None
        self.external = 0
        self._horizon = -math.inf  # the coordinator's lookahead for this process (SyncResponse.horizon_s)

    def now(self) -> float:
        return self._now

    def wall_s(self, virtual_s: float) -> float:
        """No wall time brings virtual time nearer: a future instant is infinitely far in wall time (a
        poller waits its longest tick, since only the coordinator moves time), a past one is due now."""
        return math.copysign(math.inf, virtual_s) if virtual_s else 0.0

    async def awaken(self) -> None:
        """Before this process handles or sends a call: if it told the coordinator it is dormant, wake through
        the coordinator first (its report taken in and acknowledged), so it is in the rounds again."""
        if self.dormant and self.on_awaken is not None:
            await self.on_awaken()

    @property
    def at_rest(self) -> bool:
        """Idle with no call, stream message or outside call open: what a dormant report requires."""
        return (self.holds == 0 and self.calls_in <= 0 and self.calls_out <= 0 and self.msgs_sent <= 0
                and self.msgs_received <= 0 and self.external <= 0)

    def bump(self) -> None:
        """Something happened that the coordinator must hear about before it moves time."""
        self.activity += 1
        if self.on_change is not None:
            self.on_change()

    async def sleep_until(self, t_s: float, *, ahead: bool = False) -> None:
        """Wait until virtual time ``t_s`` (returns at once if it has passed).

        ``ahead``: also end the wait as soon as this process's horizon passes ``t_s``, though time has not
        reached it. Nothing from another process can reach this one before its horizon, so a task whose own
        next event is ``t_s`` may go on from there at once, its times its own (a replica forming its next batch
        at its iteration's end). The coordinator moved time for another wake-up of this process and told a
        later horizon: without this, every such sleeper of one process would cost the mesh an advance."""
        if t_s <= self._now or (ahead and t_s < self.horizon_s()):
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._seq += 1
        heapq.heappush(self._ahead if ahead else self._sleepers, (t_s, self._seq, fut))
        self.bump()
        try:
            await fut
        finally:
            if not fut.done():
                fut.cancel()  # a cancelled sleeper: dropped from the heap by next_wake_s
                self.bump()

    async def sleep(self, virtual_s: float) -> None:
        if virtual_s > 0:
            await self.sleep_until(self._now + virtual_s)

    def lag_wall_s(self, t_s: float) -> float:
        """Never behind: virtual time moves only once every process is done with what was due before it."""
        return 0.0

    async def wait_past(self, t_s: float, poll_wall_s: float) -> None:
        """Wait for virtual time to pass ``t_s`` by the least step: the coordinator moves it there once the
        whole mesh (the peer that has yet to act on ``t_s`` included) is idle, so no wall time is spent
        polling and time never runs past the peer's pending event."""
        await self.sleep_until(math.nextafter(max(t_s, self._now), math.inf))

    async def moved_past(self, t_s: float) -> None:
        """Return once this process's time is past ``t_s``, whenever something else moves it: unlike a sleep this
        is no wake-up of the coordinator's, so it never moves time itself."""
        while self._now <= t_s:
            f = asyncio.get_running_loop().create_future()
            self._watchers = [w for w in self._watchers if not w.done()]  # (a cancelled wait leaves its future)
            self._watchers.append(f)
            await f

    def next_wake_s(self) -> float | None:
        """The earliest time a task of this process waits for (None: none waits)."""
        wakes = []
        for heap in (self._sleepers, self._ahead):
            while heap and heap[0][2].done():
                heapq.heappop(heap)
            if heap:
                wakes.append(heap[0][0])
        return min(wakes) if wakes else None

    def horizon_s(self) -> float:
        """The earliest wake-up of every other process when time last moved (the coordinator's
        ``horizon_s``): nothing from outside this process can reach it before then, so a task whose own
        next event ends before it may run on without a round of the coordinator per event. ``now`` when
        not told (a message that moved time without one, or before the first)."""
        return max(self._horizon, self._now)

    def advance(self, t_s: float, horizon_s: float | None = None) -> None:
        """Move this process's time to ``t_s`` (never back) and wake every task due by then; ``horizon_s``: the
        coordinator's lookahead at that instant (kept until time moves again)."""
        if horizon_s is not None and t_s >= self._now:
            self._horizon = horizon_s
        elif t_s > self._now:
            self._horizon = -math.inf
        if t_s > self._now:
            for f in self._watchers:
                if not f.done():
                    f.set_result(None)
            self._watchers = []
        self._now = max(self._now, t_s)
        woke = _wake(self._sleepers, lambda t: t <= self._now)
        horizon = self.horizon_s()
        woke |= _wake(self._ahead, lambda t: t <= self._now or t < horizon)
        if woke:
            self.bump()

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Hold virtual time while work the coordinator cannot see runs (a thread, a subprocess)."""
        self.holds += 1
        self.bump()
        try:
            yield
        finally:
            self.holds -= 1
            self.bump()

    def call_started(self, inbound: bool) -> None:
        if inbound:
            self.calls_in += 1
        else:
            self.calls_out += 1
        self.bump()

    def call_ended(self, inbound: bool) -> None:
        if inbound:
            self.calls_in -= 1
        else:
            self.calls_out -= 1
        self.bump()

    def stream_messages(self, n: int, *, sent: bool) -> None:
        """``n`` more (or, when a stream ends, fewer) messages of open mesh streams sent or received."""
        if sent:
            self.msgs_sent += n
        else:
            self.msgs_received += n
        self.bump()


def _wake(heap: list[tuple[float, int, asyncio.Future[None]]], due: Callable[[float], bool]) -> bool:
    """Release the sleepers of ``heap`` (earliest first) while ``due``; returns whether any was waiting."""
    woke = False
    while heap and due(heap[0][0]):
        _, _, fut = heapq.heappop(heap)
        if not fut.done():
            fut.set_result(None)
            woke = True
    return woke


_ACTIVE: EventClock | None = None

#: The header (gRPC metadata key, HTTP header) in which a participant of the event clock sends its time.
VT_KEY = "x-gigacluster-vt"
#: Over HTTP, where any client may send headers, the time counts only with this proof (:func:`vt_mac`).
VT_MAC_KEY = "x-gigacluster-vt-mac"


def vt_mac(key: str, vt: str) -> str:
    """A participant's proof that it may stamp the time ``vt`` on a call: HMAC-SHA256 of the header's value
    under the service key (a service) or the admin key (a client participant; runtime/participant.py)."""
    return hmac.new(key.encode(), vt.encode(), hashlib.sha256).hexdigest()


def parse_vt(value: str | None) -> float | None:
    """A time sent in :data:`VT_KEY`, or None for an absent, malformed or non-finite one (a time at
    infinity would end the mesh's time)."""
    if value is None:
        return None
    try:
        t = float(value)
    except (TypeError, ValueError):
        return None
    return t if math.isfinite(t) else None


def proven_vt(clock: EventClock, vt_header: str | None, mac_header: str | None) -> float | None:
    """The time a gRPC call carries, if its proof holds under the clock's wire keys (or the clock has none)."""
    if clock.wire_keys and not _proven(vt_header, mac_header, clock.wire_keys):
        return None
    return parse_vt(vt_header)


def _proven(vt_header: str | None, mac_header: str | None, keys: Iterable[str]) -> bool:
    return bool(vt_header and mac_header) and any(
        k and hmac.compare_digest(vt_mac(k, vt_header or ""), mac_header or "") for k in keys)


@contextlib.contextmanager
def serving(vt_header: str | None, mac_header: str | None = None, keys: Iterable[str] = ()) -> Iterator[None]:
    """Serve one call that came over a transport the gRPC interceptors do not see (the router's HTTP API):
    a call stamped with a participant's time (``runtime/participant.py``) and its proof under one of ``keys``
    counts open here while it runs, as the participant counts it open until its answer is in; any other call
    is activity (a client without the key can neither move nor hold the mesh's time). No-op in wall mode."""
    clock = _ACTIVE
    vt = parse_vt(vt_header) if _proven(vt_header, mac_header, keys) else None
    if clock is None:
        yield
        return
    if vt is None:
        clock.bump()
        yield
        return
    clock.advance(vt)
    clock.call_started(inbound=True)
    try:
        yield
    finally:
        clock.call_ended(inbound=True)


def install(clock: EventClock | None) -> None:
    """Make ``clock`` the process's event clock: its channels and servers count mesh calls for it."""
    global _ACTIVE
    _ACTIVE = clock


def active() -> EventClock | None:
    """The process's event clock, or None in wall-clock mode (the default)."""
    return _ACTIVE


@contextlib.contextmanager
def busy() -> Iterator[None]:
    """Hold the mesh's virtual time while this process works where the event clock cannot see it
    (``asyncio.to_thread``, an executor). A no-op in wall-clock mode."""
    clock = _ACTIVE
    if clock is None:
        yield
        return
    with clock.busy():
        yield
