"""One replica of a deployment: a :class:`ReplicaEngine` in virtual time whose every batch iteration runs
on its chips through the chip service, with the capability :class:`Lease` it runs under.

The replica times each iteration where it forms the batch and emits its tokens then; the chips
book the iterations after the fact, batched, through :class:`.reporting.WorkReporter` (their
measured speed scales the next iterations), so no chip round trip sits on the token path.

Replicas heal themselves. Each broker instance's capability lives in a :class:`Lease` that is
refreshed in the background once two thirds of its lifetime have passed (and at once when a chip
refuses it, after which the call is retried on the new token). When a replica's chips stop
answering (a chip-shard restart), its in-flight requests end with a retryable UNAVAILABLE, the
replica starts afresh (a restarted chip holds no KV cache) and probes the shard's health with
backoff; it serves again as soon as the shard answers. Meanwhile the deployment reports DEGRADED.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.errors import DomainError
from gigacluster.inference.engine import ReplicaConfig, ReplicaEngine, Request, TokenEvent
from gigacluster.inference.policies import ReplicaView
from gigacluster.inference.request import Iteration
from gigacluster.router.pacing import TokenBox
from gigacluster.router.reporting import TOKEN_REFUSED, WorkReporter  # noqa: F401  (TOKEN_REFUSED: re-exported)
from gigacluster.runtime import convert
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.clock import VirtualClock

if TYPE_CHECKING:
    from gigacluster.router.moe_traffic import A2aTraffic

log = structlog.get_logger()


SLOW_EWMA = 0.2  # weight of the newest KV transfer in the transport's slowdown average
SLOW_WINDOW = 64  # batch iterations a replica's slowdown is measured over
SLOW_THRESHOLD = 0.05  # flag a deployment more than 5% slower than its model


REFRESH_FRACTION = 2 / 3  # refresh a capability once this share of its lifetime has passed
REFRESH_MARGIN_MAX_S = 120.0  # ... and never later than this before it expires
HEAL_FIRST_PROBE_S = 0.05  # first wait before probing a failed replica's chips (doubles up to the config cap)


class ReplicaFailed(Exception):
    """The replica's chips (or the fabric under a KV transfer) failed under a request."""


RefreshFn = Callable[[str], Awaitable[tuple[str, float]]]


@dataclasses.dataclass(frozen=True)
class Binding:
    """Where a replica runs: its broker instance, devices, shard endpoint and capability lease."""

    instance: str
    devices: list[tuple[int, int]]
    endpoint: str
    lease: Lease
    shards: tuple[tuple[str, list[tuple[int, int]]], ...] = ()  # (endpoint, ranges) per shard; () = all on endpoint


# Allocates a new instance for a replica whose instance the broker no longer knows.
ReacquireFn = Callable[["Replica"], Awaitable[Binding]]


class Lease:
    """The capability token of one broker instance, kept fresh.

    Calling the lease gives the current token. :meth:`run` refreshes it in the background once
    :data:`REFRESH_FRACTION` of its lifetime has passed, so an idle deployment never holds an
    expired token; :meth:`refresh` fetches a new one now (one broker call however many wait).
    """

    def __init__(self, instance: str, token: str, expires_s: float, refresh: RefreshFn) -> None:
        self.instance = instance
        self.token = token
        self.expires_s = expires_s
        self._lifetime_s = max(expires_s - time.time(), 1e-3)
        self._refresh = refresh
        self._inflight: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        self.refreshes = 0
        # The broker no longer knows the instance (released behind our back, or a broker that lost it).
        self.lost = False
        self.on_lost: list[Callable[[], None]] = []

    def __call__(self) -> str:
        return self.token

    def due_in_s(self) -> float:
        """Wall seconds until the token should be refreshed (0 when it is due or expired)."""
        margin = min(self._lifetime_s * (1 - REFRESH_FRACTION), REFRESH_MARGIN_MAX_S)
        return max(0.0, self.expires_s - margin - time.time())

    async def refresh(self) -> None:
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.ensure_future(self._fetch())
        await asyncio.shield(self._inflight)

    async def _fetch(self) -> None:
        try:
            token, expires_s = await self._refresh(self.instance)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.NOT_FOUND and not self.lost:
                self.lost = True
                log.warning("instance lost", instance=self.instance, error=(err.details() or "")[:200])
                for cb in self.on_lost:
                    cb()
            raise
        self._lifetime_s = max(expires_s - time.time(), 1e-3)
        self.token, self.expires_s = token, expires_s
        self.refreshes += 1

    async def run(self, backoff_max_s: float = 5.0) -> None:
        """Refresh before every expiry, forever; a failed refresh is retried with backoff."""
        delay = 0.1
        while True:
            await asyncio.sleep(self.due_in_s())
            try:
                await self.refresh()
                delay = 0.1
            except grpc.aio.AioRpcError as err:
                if self.lost:
                    return  # nothing left to refresh: the replicas re-acquire an instance
                log.warning("capability refresh failed; retrying", instance=self.instance, code=err.code().name,
                            retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, backoff_max_s)

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.ensure_future(self.run())

    async def close(self) -> None:
        for t in (self.task, self._inflight):
            if t is not None and not t.done():
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                    await t


@dataclasses.dataclass(eq=False)
class Stream:
    """Where a request's tokens go, and what the router recorded for it."""

    queue: TokenBox  # its events on their way to the writer (router/pacing.py)
    req: Request
    owner: Replica
    last_token_s: float = float("nan")
    itl: list[float] = dataclasses.field(default_factory=list)
    closed: bool = False
    prefill_replica: int = -1
    kv_transfer_bytes: float = 0.0

    def close(self) -> None:
        """The client went away: drop the request wherever it is."""
        self.closed = True
        self.owner.engine.cancel(self.req.id)
        self.owner.streams.pop(self.req.id, None)


def replica_memory_bytes(engine: ReplicaEngine) -> int:
    """HBM one chip of a replica holds: its weight shard plus its share of the KV blocks in use."""
    cfg = engine.cfg
    return int(cfg.shard.weight_bytes + engine.kv_used_frac * cfg.kv_cache_bytes / cfg.chips)


class Replica:
    def __init__(self, index: int, cfg: ReplicaConfig, *, instance: str, devices: list[tuple[int, int]],
                 endpoint: str, lease: Lease, clock: VirtualClock, heal_backoff_max_s: float = 0.5,
                 report_max_iterations: int = 1024, report_interval_s: float = 0.0,
                 shards: list[tuple[str, list[tuple[int, int]]]] | None = None, run_ahead_max: int = 0) -> None:
        self.index = index
        self.run_ahead_max = run_ahead_max
        self.engine = ReplicaEngine(cfg)
        self.instance = instance
        self.devices = devices
        self.endpoint = endpoint
        self.lease = lease
        self.clock = clock
        self.heal_backoff_max_s = heal_backoff_max_s
        self.heals = 0
        self._probe_s = HEAL_FIRST_PROBE_S
        self.streams: dict[str, Stream] = {}
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.failed = ""
        self.channel = open_channel(endpoint)
        self.stub = chip_pb2_grpc.ChipServiceStub(self.channel)
        # The chips on other shards than ``endpoint``'s (a wide-EP replica spanning shards): endpoint -> ranges.
        self.other_shards: dict[str, list[tuple[int, int]]] = {}
        self._other_channels: dict[str, grpc.aio.Channel] = {}
        self._set_shards(endpoint, devices, shards)
        self.energy_j = 0.0
        self.on_prefilled: Callable[[Replica, TokenEvent, Stream], None] | None = None
        self.on_dropped: Callable[[Replica, Stream], None] | None = None
        self.reacquire: ReacquireFn | None = None
        self.on_lag: Callable[[float], None] = lambda lag_s: None  # how late (wall s) an iteration's tokens went out
        self.reacquires = 0
        self.a2a: A2aTraffic | None = None  # an expert-parallel replica's all-to-all, booked on the fabric
        lease.on_lost.append(self.wake.set)
        # Live and roofline times of the last batch iterations: their ratio is above 1 when the chips run slow.
        self._timing: deque[tuple[float, float]] = deque(maxlen=SLOW_WINDOW)
        self._reported_memory = -1  # bytes per device last sent with SetMemoryInUse
        self._idle_report: asyncio.Future[None] | None = None
        self._view: tuple[Any, ReplicaView] | None = None  # (the stats it was built from, the view)
        self.reporter = WorkReporter(self._report_target, self._on_reported, self.wake.set,
                                     max_batch=report_max_iterations, tag=lambda: self.instance,
                                     interval_s=report_interval_s)

    @property
    def role(self) -> str:
        return self.engine.cfg.role

    @property
    def first_device(self) -> int:
        return self.devices[0][0]

    def hand_over(self, stream: Stream) -> None:
        """Take a request already admitted to this replica's engine (its KV cache has landed)."""
        stream.owner = self
        self.streams[stream.req.id] = stream
        self.wake.set()

    def _set_shards(self, endpoint: str, devices: list[tuple[int, int]],
                    shards: list[tuple[str, list[tuple[int, int]]]] | None) -> None:
        """Where each of the replica's devices lives: ``endpoint``'s own ranges, and the other shards'."""
        by_ep = dict(shards) if shards else {endpoint: devices}
        self.own_ranges = by_ep.pop(endpoint, devices)
        self.other_shards = by_ep

    def _shard_stubs(self) -> list[tuple[Any, list[tuple[int, int]]]]:
        """(stub, device ranges) per shard the replica's chips live on, its first device's shard first."""
        out: list[tuple[Any, list[tuple[int, int]]]] = [(self.stub, self.own_ranges)]
        for ep, ranges in self.other_shards.items():
            if ep not in self._other_channels:
                self._other_channels[ep] = open_channel(ep)
            out.append((chip_pb2_grpc.ChipServiceStub(self._other_channels[ep]), ranges))
        return out

    def _report_target(self) -> tuple[list[tuple[Any, Any]], Lease, int]:
        """What the reporter books the next iterations with: (stub, device ranges) per shard, lease, memory."""
        parts = [(stub, convert.range_msgs(rs)) for stub, rs in self._shard_stubs()]
        return parts, self.lease, replica_memory_bytes(self.engine)

    def _on_reported(self, it: Iteration, resp: Any) -> None:
        """The chips booked an iteration: their energy and their time against the roofline's."""
        self.energy_j += resp.energy_j
        if it.compute_s > 0:
            self._timing.append((resp.end_s - resp.start_s, it.compute_s))

    async def _report_memory(self) -> None:
        """Tell the chips what the idle replica holds (its weights and any KV cache still in use), once
        per change (on every shard it spans); the last report carried the value of the iteration before it."""
        await self.reporter.drain()  # the last report carried the memory of its last iteration
        mem = replica_memory_bytes(self.engine)
        if mem in (self._reported_memory, self.reporter.reported_memory) or self.reporter.busy:
            return  # unchanged, or a report under way carries it
        try:
            md = call_metadata(capability=self.lease())
            for stub, rs in self._shard_stubs():  # one shard, or a few for a replica spanning shards
                await stub.SetMemoryInUse(chip_pb2.SetMemoryInUseRequest(devices=convert.range_msgs(rs),
                                                                         bytes_per_device=mem), metadata=md, timeout=2)
            self._reported_memory = mem
        except grpc.aio.AioRpcError as err:  # telemetry only: the next iteration reports it again
            log.info("memory report failed", replica=self.index, code=err.code().name)

    def _drop_all(self, why: str) -> None:
        """End every request this replica holds with a retryable error and start from an empty engine
        (the chips that held their KV caches are gone)."""
        for s in list(self.streams.values()):
            s.queue.put_nowait(ReplicaFailed(why))
            if self.on_dropped is not None:
                self.on_dropped(self, s)
        self.streams.clear()
        self.engine = ReplicaEngine(self.engine.cfg)
        self._timing.clear()
        self.reporter.reset()

    async def _heal(self) -> None:
        """Probe the shard's health with backoff until it serves again, then reopen the channel.

        The backoff carries over until an iteration succeeds, so chips that answer health but keep
        failing work are retried at ``heal_backoff_max_s``, not in a tight loop.
        """
        while True:
            await asyncio.sleep(self._probe_s)
            self._probe_s = min(self._probe_s * 2, self.heal_backoff_max_s)
            channel = open_channel(self.endpoint)  # a fresh channel: no inherited reconnect backoff
            try:
                r = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if r.status != health_pb2.HealthCheckResponse.SERVING:
                    raise ReplicaFailed("not serving yet")
                if self.lease.due_in_s() == 0:
                    await self.lease.refresh()  # re-acquire a token that lapsed while the chips were away
            except (grpc.aio.AioRpcError, ReplicaFailed):
                await channel.close()
                if self.lease.lost:
                    return  # the instance itself is gone: run() re-acquires one
                continue
            old, self.channel = self.channel, channel
            self.stub = chip_pb2_grpc.ChipServiceStub(channel)
            await old.close()
            return

    async def _rebind(self) -> None:
        """Move to a new instance (devices, shard, lease) after the broker lost ours; retried with backoff."""
        old = self.instance
        self.failed = f"replica {self.index}: its instance {old} is gone; acquiring a new one"
        self._drop_all(f"{self.failed}; the request was dropped: retry it")
        if self.reacquire is None:  # e.g. disaggregated replicas sharing one instance: redeploy
            self.failed = f"replica {self.index}: its instance {old} is gone; delete and redeploy"
            await asyncio.Event().wait()
        assert self.reacquire is not None
        delay = 0.1
        while True:
            try:
                b = await self.reacquire(self)
                break
            except (grpc.aio.AioRpcError, DomainError) as err:
                log.warning("re-acquire failed; retrying", replica=self.index, error=str(err)[:200], retry_in_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        self.instance, self.devices, self.lease = b.instance, b.devices, b.lease
        b.lease.on_lost.append(self.wake.set)
        if b.endpoint != self.endpoint:
            self.endpoint = b.endpoint
            old_ch, self.channel = self.channel, open_channel(b.endpoint)
            self.stub = chip_pb2_grpc.ChipServiceStub(self.channel)
            await old_ch.close()
        self._set_shards(b.endpoint, b.devices, list(b.shards) or None)
        self.reacquires += 1
        self.failed = ""
        log.info("replica re-acquired", replica=self.index, old=old, instance=self.instance)

    async def _failed(self, err: grpc.aio.AioRpcError) -> None:
        """The chips failed a report: drop every request, wait for the shard to serve again."""
        detail = (err.details() or "")[:200]
        self.failed = f"replica {self.index} lost its chips ({err.code().name}: {detail})"
        log.error("replica failed; healing", replica=self.index, code=err.code().name, error=detail)
        self._drop_all(f"{self.failed}; the request was dropped: retry it")
        await self._heal()
        if not self.lease.lost:  # else the top of the loop re-acquires an instance
            self.failed = ""
            self.heals += 1
            log.info("replica healed", replica=self.index, heals=self.heals)

    async def run(self, on_finish: Callable[[TokenEvent, Stream], None]) -> None:
        """Form batches, time them, emit their tokens at their virtual end; the chips hear of them after
        (:class:`.reporting.WorkReporter`), so no round trip sits between two tokens."""
        t_free = self.clock.now()
        chained = 0
        while True:
            if self.lease.lost:  # (a report refused for a lost instance marks the lease it used, this one)
                await self._rebind()
                t_free = self.clock.now()
                continue
            if self.reporter.error is not None:
                await self._failed(self.reporter.error)
                t_free = self.clock.now()
                continue
            # In virtual time the next iteration starts when the last one ended (here or, if they ran
            # slower than we thought, on the chips) or when work arrived, never later because this task
            # woke late.
            start = max(t_free, self.reporter.chip_end_s, min(self.clock.now(), self.engine.ready_since_s()))
            it = self.engine.next_iteration(start)
            if it is None:
                self.wake.clear()
                if self._idle_report is None or self._idle_report.done():  # never waited for: work may come
                    self._idle_report = asyncio.ensure_future(self._report_memory())
                if self.reporter.error is None and not self.lease.lost:
                    await self.wake.wait()
                continue
            self._probe_s = HEAL_FIRST_PROBE_S
            duration = self.reporter.duration_s(it)
            self.reporter.add(it, start)
            end = start + duration + it.comm_s + it.host_s  # host time per iteration, as the offline engine
            if self.a2a is not None:  # the fabric's measured slowdown of the expert all-to-all
                end += self.a2a.book(it, start + duration)
            if self._may_run_ahead(end, chained):
                chained += 1  # nothing can reach this replica before the next iteration forms: no round
            else:
                chained = 0
                await self._sleep_to(end)
                self.on_lag(self.clock.lag_wall_s(end))
            # The iteration's energy as the model gives it at the chips' measured speed, shared by its requests.
            energy = self.engine.iteration_energy_j(it, duration_s=end - start)
            self._emit(self.engine.complete(it, end, energy_j=energy), on_finish)
            t_free = end

    async def _sleep_to(self, end_s: float) -> None:
        """Sleep on the clock to the iteration's end. On the event clock the sleep also ends once the horizon
        passes ``end_s`` (time moved for another wake-up of this process, another replica's, and the horizon
        came with it); the replica then goes on at once if it may run ahead from there, else it sleeps on to
        ``end_s`` itself. So the replicas of one router cost the mesh one advance between two outside events,
        not one each."""
        await self.clock.sleep_until(end_s, ahead=True)
        if self.clock.now() < end_s and not self._may_run_ahead(end_s, 0):
            await self.clock.sleep_until(end_s)

    def _may_run_ahead(self, end_s: float, chained: int) -> bool:
        """Whether the iteration ending at ``end_s`` may complete at once, without waiting for the clock.

        On the event clock the coordinator tells each process its horizon: the earliest wake-up of every
        other process, before which nothing (no request, no cancellation) can reach this one. The next
        iteration forms at ``end_s``; if that is before the horizon, it forms on exactly the queue it would
        have seen had the replica slept, so the replica runs on and its tokens go out stamped with their
        virtual times (``time_s``), ahead of the clock. Not for a replica whose work crosses replicas or
        processes inside an iteration (disaggregated prefill/decode, the fabric's all-to-all), nor when the
        chips run behind the replica's timing; never more than ``run_ahead_max`` iterations in a row (the
        loop is held meanwhile; 0 on the wall clock, whose horizon is -inf anyway)."""
        return (chained < self.run_ahead_max and end_s < self.clock.horizon_s() and self.a2a is None
                and self.engine.cfg.role == "both" and self.on_prefilled is None
                and self.reporter.chip_end_s <= end_s)

    def _emit(self, events: list[TokenEvent], on_finish: Callable[[TokenEvent, Stream], None]) -> None:
        for ev in events:
            st = self.streams.get(ev.request_id)
            if st is None:
                continue
            if ev.finish_reason == "prefilled":
                del self.streams[ev.request_id]
                if self.on_prefilled is not None:
                    self.on_prefilled(self, ev, st)
                continue
            if st.last_token_s == st.last_token_s:  # not NaN
                st.itl.append(ev.time_s - st.last_token_s)
            st.last_token_s = ev.time_s
            st.queue.put_nowait(ev)
            if ev.finished:
                on_finish(ev, st)
                del self.streams[ev.request_id]

    @property
    def slow_ratio(self) -> float:
        """Live over roofline time of the recent iterations, weighted by their length (1.0 = on model)."""
        predicted = sum(p for _, p in self._timing)
        return sum(a for a, _ in self._timing) / predicted if predicted > 0 else 1.0

    def view(self) -> ReplicaView:
        """What routing sees of this replica (rebuilt only when the engine's stats changed)."""
        st = self.engine.routing_stats()
        if self._view is None or self._view[0] is not st:
            self._view = (st, ReplicaView.from_stats(self.index, st, self.engine.cfg.block_size))
        return self._view[1]

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        if self._idle_report is not None:
            self._idle_report.cancel()
        await self.reporter.close()
        if self.a2a is not None:
            await self.a2a.close()
        for s in self.streams.values():
            s.queue.put_nowait(ReplicaFailed("deployment deleted"))
        await self.channel.close()
        for ch in self._other_channels.values():
            await ch.close()
