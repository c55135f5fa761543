"""The dispatcher: one pass = a snapshot of the cluster, a decision, and carrying it out.

Like Kueue, which snapshots its cache before nominating workloads, each pass first copies what the
decision reads (free devices from the broker less quarantined ones, placed gangs with their expected
ends, queued jobs, quotas, weights, usage) into a :class:`Snapshot`; the pure policy
(:func:`scheduler.policy.decide`) then runs over it in a worker thread while RPCs are served, and the
result is applied on the event loop: evictions requested, reservations and reasons updated, gangs
allocated through the broker (all chips or none) and handed to the supervisor.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import sys
import time

import grpc
import numpy as np
import structlog

from gigacluster.broker.v1 import broker_pb2
from gigacluster.errors import Unavailable
from gigacluster.runtime import convert
from gigacluster.runtime.clock import EventClock, VirtualClock
from gigacluster.runtime.clock import busy as clock_busy
from gigacluster.runtime.config import SchedulerConfig
from gigacluster.scheduler import checkpoint
from gigacluster.scheduler.book import JobBook
from gigacluster.scheduler.cluster import ClusterView
from gigacluster.scheduler.core import JobRecord, State
from gigacluster.scheduler.messages import RUN_STATES
from gigacluster.scheduler.passes import next_event_pass
from gigacluster.scheduler.placement import Layout, PlacementPolicy, placement_stats
from gigacluster.scheduler.policy import Decision, Pending, QueueSpec, Running, decide
from gigacluster.scheduler.runner import _ranges
from gigacluster.scheduler.supervise import JobSupervisor

log = structlog.get_logger()


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What one decision reads, copied at the start of the pass: the decision never sees a later change."""

    now: float
    layouts: dict[str, Layout]
    free: dict[str, np.ndarray]
    running: list[Running]
    pending: list[Pending]
    queues: dict[tuple[str, str], QueueSpec]
    weights: dict[str, float]
    usage: dict[str, float]


@dataclasses.dataclass(eq=False)
class Dispatcher:
    """Runs passes when something changed (``book.kick``) or every ``dispatch_interval_s``."""

    config: SchedulerConfig
    clock: VirtualClock
    book: JobBook
    cluster: ClusterView
    supervisor: JobSupervisor
    policy: PlacementPolicy
    # jobs holding a backfill reservation after the last pass
    _reserved: set[str] = dataclasses.field(default_factory=set, init=False)

    async def loop(self) -> None:
        """A pass when something changed (a kick), else every ``dispatch_interval_s`` (quarantine ends,
        reservations age). Passes never overlap; kicks during a pass coalesce into the next one."""
        # The pass runs in a worker thread; hand the GIL back to the event loop every millisecond
        # (CPython's default is 5 ms) so RPCs answered during a pass wait at most about that long.
        sys.setswitchinterval(0.001)
        kick = self.book.kick
        event = isinstance(self.clock, EventClock)
        while True:
            if event:
                await self._next_event_pass(kick)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(kick.wait(), timeout=self.config.dispatch_interval_s)
                # A burst of submissions is one pass, not one each: let the burst land first.
                await asyncio.sleep(self.config.dispatch_debounce_s)
            kick.clear()
            started = time.monotonic()
            try:
                await self.dispatch()
            except Unavailable as exc:  # the broker is restarting: wait, do not spam tracebacks
                log.warning("dispatch pass waits for a peer", error=str(exc)[:200])
                await asyncio.sleep(1.0)
                kick.set()
            except Exception:
                log.exception("dispatch failed")
                await asyncio.sleep(0.5)
                kick.set()
            if not event:
                # Passes take at most about a third of the scheduler's time (and of the GIL its RPCs
                # need), however fast changes arrive.
                await asyncio.sleep(2 * (time.monotonic() - started))

    async def _next_event_pass(self, kick: asyncio.Event) -> None:
        """Event clock: wait for a kick, or (while jobs are queued) ``event_dispatch_interval_s`` of virtual
        time, as a wake-up the coordinator knows; when nothing else in the mesh is pending, for a quarantine's
        end or ``dispatch_interval_s`` wall seconds instead (scheduler/passes.py: the poll would be the mesh's
        only event and time would race from poll to poll). A kick dispatches at once, at the virtual time of
        the change: a wall-time debounce or pause would let the mesh run past the pending pass (the process
        looks idle while it sleeps on the wall clock), and would hold an idle mesh for nothing."""
        if kick.is_set():
            return
        clock = self.clock
        assert isinstance(clock, EventClock)
        own = clock.next_wake_s()  # this process's other sleepers (a running job's runner)
        nxt = next_event_pass(now_s=clock.now(), queued=bool(self.book.queued),
                              interval_s=self.config.event_dispatch_interval_s,
                              others_wake_s=min(clock.horizon_s(), math.inf if own is None else own),
                              quarantine_ends_s=self.cluster.bad.values(),
                              wall_interval_s=self.config.dispatch_interval_s)
        waits: list[asyncio.Future[object]] = [asyncio.ensure_future(kick.wait())]
        if nxt.at_s is not None:
            waits.append(asyncio.ensure_future(clock.sleep_until(nxt.at_s)))
        if nxt.wall_s is not None:
            waits.append(asyncio.ensure_future(asyncio.sleep(nxt.wall_s)))
            # Time moving means something else became pending after all (a job this process placed, work
            # from outside): poll in virtual time again from the next pass.
            waits.append(asyncio.ensure_future(clock.moved_past(clock.now())))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def dispatch(self) -> None:
        """One pass: release what a previous run held, snapshot, decide off the loop, apply."""
        await self.cluster.release_orphans()
        if not self.book.queued:
            return
        snap = await self.snapshot()
        jobs = self.book.jobs

        def work() -> tuple[Decision, list[tuple[str, str]]]:
            dd = decide(snap.now, snap.pending, snap.running, layouts=snap.layouts, free=snap.free,
                        policy=self.policy, queues=snap.queues, weights=snap.weights, usage=snap.usage,
                        preemption=self.config.preemption, backfill=self.config.backfill)
            # Which reasons changed (read-only here; applied on the loop): usually a handful of 10,000.
            return dd, [(jid, why) for jid, why in dd.reasons.items() if jobs[jid].reason != why]

        # The pass is pure array work over a snapshot: run it off the event loop so RPCs are served
        # while thousands of queued jobs are weighed.
        with clock_busy():  # the event clock holds time while the thread works
            d, changed = await asyncio.to_thread(work)
        await self.apply(d, changed, snap.layouts)

    def _estimated_end(self, job: JobRecord, now: float) -> float:
        left = max(job.steps_total - job.step, 0) * job.mean_step_s()
        return now + left + (checkpoint.restart_s(job.spec) if job.resume_pending else 0.0)

    async def snapshot(self) -> Snapshot:
        """Copy the decision's inputs: free devices, placed gangs, queued jobs, quotas, weights, usage."""
        now = self.clock.now()
        await self.cluster.check_health()
        inv = await self.cluster.inventory(fresh=True)
        layouts = await self.cluster.layouts()
        free = self.cluster.free_devices(inv, layouts, now)
        running = []
        for job_id, devs in self.supervisor.gangs.items():  # placed gangs only, not every job ever seen
            j = self.book.jobs[job_id]
            if j.state in RUN_STATES:
                draining = bool(j.preempt_reason)
                end = (now + checkpoint.write_s(j.spec) if draining else self._estimated_end(j, now))
                running.append(Running(j.job_id, j.tenant, j.queue, j.priority, j.spec.chip, devs, end,
                                       j.started_s, j.borrowing, draining, checkpoint.write_s(j.spec)))
        pending = list(self.book.queued.values())
        usage = dict(self.book.usage_s)  # chip-seconds run; decide adds what running gangs have committed, once
        tenants = {t for t, n in self.book.queued_per_tenant.items() if n} | {r.tenant for r in running}
        weights = {t: await self.cluster.weight(t) for t in tenants}
        return Snapshot(now, layouts, free, running, pending, dict(self.book.queues), weights, usage)

    async def apply(self, d: Decision, changed: list[tuple[str, str]], layouts: dict[str, Layout]) -> None:
        """Carry out a decision on the live jobs (some may have changed while it was taken)."""
        jobs = self.book.jobs
        for victim, reason in d.preempt:
            vj = jobs[victim]
            if not vj.preempt_reason:
                vj.preempt_reason = reason
                self.book.notify(vj, "event", f"eviction requested: {reason}")
        for job_id in self._reserved - d.reserved.keys():
            jobs[job_id].reserved_start_s = 0.0
        for job_id, start in d.reserved.items():
            jobs[job_id].reserved_start_s = start
        self._reserved = set(d.reserved)
        for job_id, why in changed:
            job = jobs[job_id]
            if job.state != State.QUEUED:
                continue  # changed while the pass ran
            if job.reason != why:
                job.reason = why
                self.book.notify(job, "event", why)
        for job_id, devs, borrowing in d.place:
            job = jobs[job_id]
            if job.state != State.QUEUED:
                continue
            await self.place(job, devs, borrowing, layouts[job.spec.chip])

    async def place(self, job: JobRecord, devices: np.ndarray, borrowing: bool, layout: Layout) -> bool:
        """Allocate exactly ``devices`` for the job's gang; True if it is now running."""
        spec = job.spec
        self.book.set_state(job, State.PLACING, f"allocating {spec.count} {spec.chip} chips through the broker")
        try:
            resp = await self.cluster.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                chip_type=spec.chip, count=spec.count, topology=broker_pb2.TOPOLOGY_CONSTRAINT_NONE,
                purpose=job.name, tenant=job.tenant, devices=convert.range_msgs(_ranges(devices)),
            ), metadata=self.cluster.metadata(), timeout=30)
        except grpc.aio.AioRpcError as err:
            self.book.set_state(job, State.QUEUED, f"broker refused placement ({err.code().name}): {err.details()}")
            if err.code() not in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.FAILED_PRECONDITION):
                await asyncio.sleep(0.5)
            return False
        inst = resp.instance
        job.instance = inst.name
        job.borrowing = borrowing
        job.reserved_start_s = 0.0
        st = placement_stats(layout, devices, tp=spec.tp, cp=spec.cp, dp=spec.dp, pp=spec.pp)
        job.placement_domains, job.placement_leaf_groups = st.domains, st.leaf_groups
        job.dp_spine_crossings = st.dp_spine_crossings
        self.supervisor.gangs[job.job_id] = devices
        self.book.set_state(job, State.RUNNING, "", f"placed on {inst.device_count} chips ({inst.name}): "
                            f"{st.domains} domains, {st.leaf_groups} leaf groups, {st.dp_spine_crossings} DP spine "
                            f"crossings{' (borrowed quota)' if borrowing else ''}")
        if not job.started_s:
            # 0 means "never started" (JobRecord): a job placed at virtual time 0 (an event-clock mesh starts
            # there) records 1 ns, or a restart would move its start and goodput would read 0.
            job.started_s = max(self.clock.now(), 1e-9)
        self.supervisor.start(job, devices, resp.capability, resp.capability_expires_s)
        return True

