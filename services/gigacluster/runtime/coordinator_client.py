"""A service process's side of the event clock: reports to the coordinator, takes the time from it.

One bidirectional ``ClockService.Sync`` stream per process. The process reports (idle or not, its
earliest wake-up, its open mesh calls, its activity counter) whenever its state has settled after
a change, and at once when the coordinator asks (a probe round); the coordinator sends the time,
which wakes the process's sleepers. "Settled" means the activity counter stayed put while the
event loop ran every ready callback several times: asyncio runs one callback at a time, so a
handler doing CPU work keeps this task from running at all, and one that awaits a mesh call or
the clock has been counted. Work the clock cannot see (a thread) must hold it (``clock.busy()``).

If the coordinator goes away the process reconnects with backoff and re-registers with its own
time, so a restarted coordinator starts from the latest time any process knew.
"""

from __future__ import annotations

import asyncio
import os
import uuid

import grpc
import structlog

from gigacluster.clock.v1 import clock_pb2, clock_pb2_grpc
from gigacluster.errors import Unavailable
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.clock import EventClock

log = structlog.get_logger()

SETTLE_YIELDS = 8  # loop passes with no activity before a process calls itself settled
# Wall seconds a process stays at rest before it reports dormant: a process that serves calls every few
# milliseconds (a job's chips and fabric stepping one step at a time) would pay a wake round trip per call;
# one with nothing to do (a shard no job runs on) goes dormant after this and stays so. Speed only: the
# rule is safe at any value.
DORMANT_AFTER_S = 0.5
RECONNECT_MAX_S = 1.0


class ClockAgent:
    """Keeps one process's :class:`EventClock` in step with the coordinator at ``endpoint``."""

    def __init__(self, clock: EventClock, endpoint: str, service: str, *, connect_timeout_s: float,
                 service_key: str = "", dormancy: bool = False) -> None:
        self.clock = clock
        # May this process report itself dormant (clock/core.py)? Only where every call it handles or makes
        # passes the clock interceptors, which wake it first (not a process that serves HTTP or a client
        # participant driven by its own code).
        self.dormancy = dormancy
        self._wake_seq = 0
        self._waking: asyncio.Future[None] | None = None
        self._rest_since: float | None = None  # loop time since which the process has been at rest
        self._rest_activity = -1  # its activity counter then (any activity since starts the rest again)
        self._rest_timer: asyncio.TimerHandle | None = None
        self.metadata = call_metadata(api_key=service_key)
        self.endpoint = endpoint
        self.process = f"{service}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.connect_timeout_s = connect_timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._dirty = asyncio.Event()
        self._probe = 0
        self._sent: tuple[object, ...] | None = None
        self.synced = asyncio.Event()  # set once the coordinator has told this process the time
        clock.on_change = self._dirty.set
        if dormancy:
            clock.on_awaken = self._awaken

    async def connect(self) -> None:
        """Reach the coordinator, or fail naming the setting (a service in event mode cannot run without it)."""
        self._channel = open_channel(self.endpoint, metered=False)
        try:
            await asyncio.wait_for(self._channel.channel_ready(), self.connect_timeout_s)
        except TimeoutError:
            await self._channel.close()
            raise Unavailable(f"clock_coordinator {self.endpoint[:80]} is not reachable after "
                              f"{self.connect_timeout_s:g} s: start it (gigacluster serve clock) or fix "
                              "--clock-coordinator / GIGACLUSTER_CLOCK_COORDINATOR") from None

    async def _awaken(self) -> None:
        """A call reached (or leaves) this dormant process: report awake, wait for the coordinator to take it in."""
        if self._waking is None:
            self._wake_seq += 1
            self._waking = asyncio.get_running_loop().create_future()
            self._dirty.set()
        await asyncio.shield(self._waking)

    def _woken(self) -> None:
        """The coordinator took the wake in (or the session is gone, and with it the dormancy it knew of)."""
        self.clock.dormant = False
        if self._waking is not None:
            if not self._waking.done():
                self._waking.set_result(None)
            self._waking = None
            self.clock.bump()  # the woken calls run within the next settle, before any report

    async def close(self) -> None:
        if self._rest_timer is not None:
            self._rest_timer.cancel()
            self._rest_timer = None
        self._woken()
        self.clock.on_change = None
        self.clock.on_awaken = None
        if self._channel is not None:
            await self._channel.close()

    async def run(self) -> None:
        """Sync with the coordinator for ever, reconnecting after a loss."""
        delay = 0.05
        while True:
            try:
                await self._session()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # the service is stopping
                log.warning("clock coordinator stream cancelled; reconnecting", retry_in_s=delay)
            except grpc.aio.AioRpcError as err:
                log.warning("clock coordinator lost; reconnecting", code=err.code().name, retry_in_s=delay)
            except Exception as exc:  # noqa: BLE001 - a write to a stream that just died; never stop syncing
                log.warning("clock coordinator lost; reconnecting", error=repr(exc)[:120], retry_in_s=delay)
            else:
                delay = 0.05  # the coordinator ended the stream cleanly: a fresh start
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONNECT_MAX_S)

    async def _session(self) -> None:
        assert self._channel is not None, "connect() first"
        call = clock_pb2_grpc.ClockServiceStub(self._channel).Sync(metadata=self.metadata)
        self._sent = None
        self._woken()  # a new session: the coordinator knows nothing of this process yet
        first = self._report(0)
        self.clock.dormant = first.dormant
        await call.write(first)
        reader = asyncio.ensure_future(self._read(call))
        try:
            while not reader.done():
                waiter = asyncio.ensure_future(self._dirty.wait())
                await asyncio.wait({waiter, reader}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                if reader.done():
                    break
                # A probe answered with nothing new since the last (settled) report needs no settling: calls
                # and wake-ups since would have moved the activity counter.
                if not (self._probe and self._sent is not None and self.clock.activity == self._sent[4]):
                    await self._settle()
                self._dirty.clear()
                rnd, self._probe = self._probe, 0
                rep = self._report(rnd)
                key = (rep.idle, rep.next_wake_s if rep.HasField("next_wake_s") else None, rep.calls_out,
                       rep.calls_in, rep.activity, rep.stream_messages_sent, rep.stream_messages_received,
                       rep.dormant, rep.wake)
                if rnd == 0 and key == self._sent:
                    continue  # nothing new to say
                self._sent = key
                if rep.dormant:  # from now on (before the write yields) a call waits to wake this process
                    self.clock.dormant = True
                await call.write(rep)
            reader.result()  # raises the stream's error, if any
        finally:
            reader.cancel()
            call.cancel()
            self._woken()

    async def _read(self, call: grpc.aio.StreamStreamCall) -> None:
        async for msg in call:
            due = self.clock.next_wake_s()
            self.clock.advance(msg.now_s, horizon_s=msg.horizon_s if msg.HasField("horizon_s") else None)
            self.synced.set()
            if msg.woken and msg.woken == self._wake_seq:
                self._woken()
            elif msg.probe_round or (due is not None and msg.now_s >= due):
                # Probed, or told the time of its own wake-up: the coordinator counts this process in its
                # rounds until its next report, so its calls need not wake it (a dormant report sets it again).
                self.clock.dormant = False
            if msg.probe_round:
                self._probe = max(self._probe, msg.probe_round)
            self._dirty.set()

    async def _settle(self) -> None:
        while True:
            before = self.clock.activity
            for _ in range(SETTLE_YIELDS):
                await asyncio.sleep(0)
            if self.clock.activity == before:
                return

    def _rested(self) -> bool:
        """Whether the process has been at rest, with no activity at all, for DORMANT_AFTER_S wall seconds; if
        not yet, a report is due when it will have been (a timer sets the dirty flag)."""
        loop = asyncio.get_running_loop()
        if self._rest_since is None or self.clock.activity != self._rest_activity:
            self._rest_since, self._rest_activity = loop.time(), self.clock.activity
        left = self._rest_since + DORMANT_AFTER_S - loop.time()
        if left <= 0:
            return True
        if self._rest_timer is None:
            self._rest_timer = loop.call_later(left, self._rest_due)
        return False

    def _rest_due(self) -> None:
        self._rest_timer = None
        self._dirty.set()

    def _report(self, rnd: int) -> clock_pb2.SyncRequest:
        c = self.clock
        nxt = c.next_wake_s()
        # A pending wake goes with every report until it is acknowledged (each report with it is).
        wake = self._wake_seq if self._waking is not None else 0
        dormant = self.dormancy and self._waking is None and c.at_rest and self._rested()
        return clock_pb2.SyncRequest(process=self.process, round=rnd, idle=c.holds == 0, next_wake_s=nxt,
                                     dormant=dormant, wake=wake,
                                     calls_out=max(c.calls_out, 0), calls_in=max(c.calls_in, 0),
                                     activity=c.activity, now_s=c.now(), stream_messages_sent=max(c.msgs_sent, 0),
                                     stream_messages_received=max(c.msgs_received, 0))


__all__ = ["ClockAgent"]
