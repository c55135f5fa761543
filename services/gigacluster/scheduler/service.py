"""The scheduler's gRPC layer and its dispatcher.

Each dispatch pass reads the free devices from the broker (the source of truth, shared with the
router's inference replicas), asks the pure policy (:mod:`scheduler.policy`) what to do, and
carries it out: gangs placed by the configured placement policy are allocated as exactly those
devices in one broker ``AllocateInstance`` (all chips or none), gangs chosen for eviction
checkpoint and requeue, and every waiting job says why in ``reason``. Each placed job runs in its
own task (:mod:`scheduler.runner` for a step), which also models checkpoints, failures and
restarts (:mod:`scheduler.checkpoint`, :mod:`scheduler.failures`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import json
import pathlib
import re
import sys
import time
from collections import deque
from typing import Any

import grpc
import numpy as np
import structlog

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.common.v1 import common_pb2
from gigacluster.errors import InvalidArgument, NotFound, PermissionDenied, ResourceExhausted, Unavailable
from gigacluster.fabric.topology import TopologyConfig, build_topology
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.hw.catalog import chip_names
from gigacluster.runtime import convert
from gigacluster.runtime.auth import BrokerAuth, Principal, call_metadata, rate_limiter
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.config import SchedulerConfig
from gigacluster.runtime.errors import grpc_errors
from gigacluster.runtime.metrics import FunctionCollector, counter, gauge
from gigacluster.runtime.server import Service
from gigacluster.scheduler import checkpoint
from gigacluster.scheduler.core import (
    TERMINAL,
    JobRecord,
    State,
    cached_estimate,
    cached_plan,
    parse_spec,
    validate_submission,
)
from gigacluster.scheduler.diagnose import CAUSES, Expected, Observed, diagnose
from gigacluster.scheduler.diagnose import THRESHOLD as DRIFT_THRESHOLD
from gigacluster.scheduler.failures import FAILURE_MODELS
from gigacluster.scheduler.placement import Layout, get_policy, placement_stats
from gigacluster.scheduler.policy import Pending, QueueSpec, Running, decide
from gigacluster.scheduler.runner import CapabilityRejected, JobRunner, StepFailed, _ranges, account
from gigacluster.scheduler.spec import SpecBounds, check_bounds, proto_to_spec, show
from gigacluster.scheduler.store import JobStore
from gigacluster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gigacluster.security.ratelimit import TenantRateLimiter

log = structlog.get_logger()
TRACE_STEPS = 2000  # steps kept per job for GetJobTrace (bounded memory)


QUEUE_NAME_RE = re.compile(r"^tenants/([a-z0-9][a-z0-9-]{0,39})/queues/([a-z0-9][a-z0-9-]{0,62})$")
COHORT_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
RUN_STATES = (State.PLACING, State.RUNNING, State.CHECKPOINTING)


class PeerLost(Exception):
    """A peer service stayed unavailable past ``peer_wait_s`` or lost the job's allocation: the job is
    requeued from its checkpoint without using a restart."""


class SchedulerService(Service[SchedulerConfig]):
    name = "scheduler"

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self._expected: dict[str, Expected] = {}
        self._traces: dict[str, deque[Any]] = {}
        self._loss_events: dict[str, int] = {}
        self.registry.register(FunctionCollector(self.metrics))
        self.auth = BrokerAuth(config.broker, cluster=config.cluster, service_key=config.service_key,
                               limiter=rate_limiter(config.rate_ops_per_s, config.rate_ops_burst))
        self.jobs: dict[str, JobRecord] = {}
        self.seq: dict[str, int] = {}
        # Queued jobs (insertion order) with their dispatcher view, and counts per tenant: a dispatch
        # pass and the admission check never scan every job the scheduler has ever seen.
        self._queued: dict[str, Pending] = {}
        self._queued_per_tenant: dict[str, int] = {}
        self._usage_s: dict[str, float] = {}  # chip-seconds run per tenant (fair share), kept as steps end
        self._reserved: set[str] = set()  # jobs holding a backfill reservation after the last pass
        self._state_counts: collections.Counter[State] = collections.Counter()  # kept by index()
        self.bounds = SpecBounds(max_chips=config.max_job_chips, max_global_batch=config.max_global_batch,
                                 max_steps=config.max_job_steps)
        self._ids = itertools.count(1)
        self._watchers: dict[str, set[asyncio.Queue[tuple[str, str]]]] = {}
        self._kick = asyncio.Event()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._devices: dict[str, np.ndarray] = {}
        self._inventory: broker_pb2.GetInventoryResponse | None = None
        self._layouts: dict[str, Layout] | None = None
        self._idempotency: dict[tuple[str, str], str] = {}
        self._orphans: list[str] = []  # instances held by jobs when the scheduler died: released on start
        self.queues: dict[tuple[str, str], QueueSpec] = {}
        self._weights: dict[str, tuple[float, float]] = {}  # tenant -> (weight, fetched at wall time)
        # quarantined devices: id -> virtual time it is back (None: until the chip service says healthy)
        self.bad: dict[int, float | None] = {}
        self._health_checked = 0.0
        self.policy = get_policy(config.placement)
        # The config load checked the name; a model installed as an entry point is built the same way.
        self.failure_model = FAILURE_MODELS.lookup(config.failure_model)(config.failure_rate_scale)
        self.rng = np.random.default_rng(config.failure_seed)
        path = pathlib.Path(config.state_dir) / "scheduler.db" if config.state_dir else None
        self.store = JobStore(path)

    def rpc_limiter(self) -> TenantRateLimiter | None:
        return self.auth.limiter

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(SchedulerServicer(self), server)
        return [scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name]

    async def start(self) -> None:
        await super().start()
        self._recover()
        self.spawn(self._dispatch_loop(), "dispatch")
        self.every(self.config.telemetry_interval_s, self._publish_stats, "stats")

    async def stop(self) -> None:
        for t in self._running.values():
            t.cancel()
        await super().stop()
        await self.auth.close()
        self.store.close()

    # -- state ------------------------------------------------------------------------------------
    def _recover(self) -> None:
        """Reload jobs and queues after a restart; running ones resume from their last checkpoint."""

        for q in json.loads(self.store.get_meta("queues") or "[]"):
            qspec = QueueSpec(q["tenant"], q["queue"], q.get("cohort", ""),
                              tuple((c, int(n)) for c, n in q.get("quota", {}).items()))
            self.queues[(qspec.tenant, qspec.queue)] = qspec
        for seq, d in self.store.load():
            spec = parse_spec(json.dumps(d["spec_dict"], sort_keys=True))  # cached: jobs share specs
            known = {f for f in JobRecord.__dataclass_fields__}
            job = JobRecord(spec=spec, plan=cached_plan(spec), **{k: v for k, v in d.items() if k in known})
            self.jobs[job.job_id] = job
            self.seq[job.job_id] = seq
            job.preempt_reason = ""
            if job.state not in TERMINAL and job.state != State.QUEUED:
                lost = job.step - job.last_checkpoint_step
                job.lost_steps += lost
                job.lost_s += lost * job.mean_step_s()
                job.step = job.last_checkpoint_step
                job.tokens = job.step * spec.tokens_per_step
                job.state = State.QUEUED
                job.resume_pending = job.step > 0 or job.resume_pending
                job.reason = f"scheduler restarted; resuming from checkpoint at step {job.step} ({lost} steps lost)"
                if job.instance:
                    self._orphans.append(job.instance)
                job.instance = ""
                self.store.save(job, seq)
            self.index(job, None)
            self._usage_s[job.tenant] = self._usage_s.get(job.tenant, 0.0) + job.chip_hours * 3600.0
        if self.jobs:
            nums = [int(j.removeprefix("j-")) for j in self.jobs if j.startswith("j-") and j[2:].isdigit()]
            self._ids = itertools.count(max(nums, default=0) + 1)
            log.info("recovered jobs", jobs=len(self.jobs), queues=len(self.queues))
        self._kick.set()

    def save(self, job: JobRecord) -> None:
        self.store.save(job, self.seq[job.job_id])

    def save_queues(self) -> None:
        self.store.set_meta("queues", json.dumps([
            {"tenant": q.tenant, "queue": q.queue, "cohort": q.cohort, "quota": dict(q.quota)}
            for q in self.queues.values()]))

    def notify(self, job: JobRecord, kind: str, message: str = "") -> None:
        for q in self._watchers.get(job.job_id, ()):
            if not q.full():  # a watcher that stopped reading loses updates, never the scheduler
                q.put_nowait((kind, message))
        if kind == "state":
            self.save(job)
        tenant = job.tenant.removeprefix("tenants/")
        now = self.clock.now()
        self.telemetry.publish(f"tenants/{tenant}/jobs/{job.job_id}/{'progress' if kind == 'progress' else 'state'}", {
            "job": job.name, "state": job.state.name, "reason": job.reason, "step": job.step,
            "steps_total": job.steps_total, "tokens": job.tokens, "step_time_s": job.last_step_time_s,
            "predicted_step_time_s": job.predicted_step_time_s, "mfu": job.mfu,
            "energy_it_j": job.energy_it_j, "cost_usd": job.cost_usd, "eta_s": job.eta_s,
            "goodput": job.goodput_at(now), "restarts": job.restarts, "preemptions": job.preemptions,
            "lost_steps": job.lost_steps, "t_s": now, "message": message,
        })

    def set_state(self, job: JobRecord, to: State, reason: str = "", message: str = "") -> None:
        before = job.state
        job.transition(to, reason)
        if to in TERMINAL:
            job.finished_s = self.clock.now()
        self.index(job, before)
        log.info("job state", job=job.name, state=to.name, reason=reason)
        self.notify(job, "state", message or reason)
        # Only what changes the dispatcher's inputs asks for a pass: a job entering or leaving the
        # queue, or ending (its chips come back through _release, which kicks as well). A running
        # job's checkpoints do not.
        if to == State.QUEUED or before == State.QUEUED or to in TERMINAL:
            self._kick.set()

    def index(self, job: JobRecord, before: State | None) -> None:
        """Keep the queued-job index in step with ``job.state`` (``before``: its previous state, None if new)."""
        if before is not None:
            self._state_counts[before] -= 1
        self._state_counts[job.state] += 1
        was, now_q = before == State.QUEUED, job.state == State.QUEUED
        if was == now_q:
            return
        n = self._queued_per_tenant.get(job.tenant, 0) + (1 if now_q else -1)
        self._queued_per_tenant[job.tenant] = n
        if now_q:
            self._queued[job.job_id] = self._pending(job)
        else:
            self._queued.pop(job.job_id, None)

    def _pending(self, job: JobRecord) -> Pending:
        """The dispatcher's view of a queued job (fixed while it stays queued: its step does not move)."""
        left = max(job.steps_total - job.step, 0) * job.mean_step_s()
        duration = left + (checkpoint.restart_s(job.spec) if job.resume_pending else 0.0)
        return Pending(job.job_id, job.tenant, job.queue, job.priority, self.seq[job.job_id], job.spec.chip,
                       job.spec.count, job.spec.tp, duration)

    def admit(self, tenant: str) -> None:
        """Refuse a submission past the tenant's bound on queued jobs (RESOURCE_EXHAUSTED)."""
        n = self._queued_per_tenant.get(tenant, 0)
        if n >= self.config.max_queued_per_tenant:
            raise ResourceExhausted(f"{tenant} has {n} queued jobs, the most allowed (max_queued_per_tenant); "
                                    f"wait for some to start or cancel some", retry_after_s=5.0,
                                    reason="TOO_MANY_QUEUED_JOBS", limit=self.config.max_queued_per_tenant)

    async def _publish_stats(self) -> None:
        # From the kept counts and the placed gangs: a stats tick never walks every job.
        counts = {st.name: n for st, n in self._state_counts.items() if n}
        self.telemetry.publish("stats", {"t_s": self.clock.now(), "jobs": counts,
                                         "running_chips": sum(self.jobs[j].spec.count for j in self._devices
                                                              if self.jobs[j].state == State.RUNNING),
                                         "quarantined_chips": len(self.bad)})

    # -- broker -----------------------------------------------------------------------------------
    @property
    def broker(self) -> broker_pb2_grpc.BrokerServiceStub:
        return self.auth.stub

    def _smd(self) -> tuple[tuple[str, str], ...]:
        return call_metadata(api_key=self.config.service_key)

    async def inventory(self, fresh: bool = False) -> broker_pb2.GetInventoryResponse:
        if self._inventory is None or fresh:
            try:
                self._inventory = await self.broker.GetInventory(broker_pb2.GetInventoryRequest(),
                                                                 metadata=self._smd(), timeout=10)
            except grpc.aio.AioRpcError as err:
                raise Unavailable(f"isolation broker unavailable ({err.code().name}); retry") from err
        return self._inventory

    async def cluster_chips(self) -> dict[str, int]:
        inv = await self.inventory()
        out: dict[str, int] = {}
        for s in inv.shards:
            out[s.chip_type] = out.get(s.chip_type, 0) + int(s.devices.end - s.devices.start)
        return out

    async def layouts(self) -> dict[str, Layout]:
        """Per chip type, where its devices sit: domains and the fabric's leaf groups."""
        if self._layouts is not None:
            return self._layouts
        inv = await self.inventory()
        spans: dict[str, list[tuple[int, int, int]]] = {}
        for s in inv.shards:
            spans.setdefault(s.chip_type, []).append((int(s.devices.start), int(s.devices.end),
                                                      int(s.chips_per_domain) or 1))
        topo_resp = None
        try:
            async with open_channel(inv.fabric_endpoint) as ch:
                topo_resp = await fabric_pb2_grpc.FabricServiceStub(ch).GetTopology(
                    fabric_pb2.GetTopologyRequest(), metadata=self._smd(), timeout=10)
        except grpc.aio.AioRpcError as err:
            log.warning("fabric topology unavailable; placing by scale-up domains only", error=err.details())
        out: dict[str, Layout] = {}
        for chip, ss in spans.items():
            start, end, dom = min(s[0] for s in ss), max(s[1] for s in ss), ss[0][2]
            n = end - start
            lay = Layout.uniform(n, dom, 1, offset=start)
            if topo_resp is not None and topo_resp.chip_type == chip and int(topo_resp.chips) == n:
                tiers = topo_resp.switch_tiers or (3 if any(tr.tier == "spine-core" for tr in topo_resp.tiers) else 2)
                topo = build_topology(TopologyConfig(
                    chip=chip, count=n, system=topo_resp.system or None, tiers=tiers,
                    oversubscription=topo_resp.oversubscription or 1.0, switch=topo_resp.switch or "tomahawk5",
                    nic=topo_resp.nic or None, routing=topo_resp.routing or "ecmp"))
                lay = Layout.from_topology(topo, offset=start)
            out[chip] = lay
        self._layouts = out
        return out

    async def weight(self, tenant: str) -> float:
        w = self._weights.get(tenant)
        if w is None or time.monotonic() - w[1] > 30:
            try:
                r = await self.broker.GetTenant(broker_pb2.GetTenantRequest(name=tenant), metadata=self._smd(),
                                                timeout=10)
                self._weights[tenant] = w = (float(r.tenant.weight) or 1.0, time.monotonic())
            except grpc.aio.AioRpcError:
                return w[0] if w is not None else 1.0
        return w[0]

    # -- dispatch ---------------------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        """A pass when something changed (a kick), else every ``dispatch_interval_s`` (quarantine ends,
        reservations age). Passes never overlap; kicks during a pass coalesce into the next one."""
        # The pass runs in a worker thread; hand the GIL back to the event loop every millisecond
        # (CPython's default is 5 ms) so RPCs answered during a pass wait at most about that long.
        sys.setswitchinterval(0.001)
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kick.wait(), timeout=self.config.dispatch_interval_s)
            # A burst of submissions is one pass, not one each: let the burst land first.
            await asyncio.sleep(self.config.dispatch_debounce_s)
            self._kick.clear()
            started = time.monotonic()
            try:
                await self._dispatch()
            except Unavailable as exc:  # the broker is restarting: wait, do not spam tracebacks
                log.warning("dispatch pass waits for a peer", error=str(exc)[:200])
                await asyncio.sleep(1.0)
                self._kick.set()
            except Exception:
                log.exception("dispatch failed")
                await asyncio.sleep(0.5)
                self._kick.set()
            # Passes take at most about a third of the scheduler's time (and of the GIL its RPCs
            # need), however fast changes arrive.
            await asyncio.sleep(2 * (time.monotonic() - started))

    def _estimated_end(self, job: JobRecord, now: float) -> float:
        left = max(job.steps_total - job.step, 0) * job.mean_step_s()
        return now + left + (checkpoint.restart_s(job.spec) if job.resume_pending else 0.0)

    async def _dispatch(self) -> None:
        while self._orphans:
            inst = self._orphans[0]
            try:
                await self.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=inst), metadata=self._smd(),
                                                  timeout=30)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise Unavailable(f"cannot release {inst} of the previous run yet: {err.details()}") from err
            self._orphans.pop(0)
            log.info("released an instance held before the restart", instance=inst)
        if not self._queued:
            return
        now = self.clock.now()
        await self._check_health(now)
        inv = await self.inventory(fresh=True)
        layouts = await self.layouts()
        free = {c: np.zeros(lay.n_devices, dtype=bool) for c, lay in layouts.items()}
        for r in inv.free:
            for c, lay in layouts.items():
                a, b = max(int(r.start), lay.offset), min(int(r.end), lay.offset + lay.n_devices)
                if a < b:
                    free[c][a - lay.offset:b - lay.offset] = True
        for dev, until in list(self.bad.items()):
            if until is not None and until <= now:
                del self.bad[dev]
                continue
            for c, lay in layouts.items():
                if lay.offset <= dev < lay.offset + lay.n_devices:
                    free[c][dev - lay.offset] = False
        running = []
        for job_id, devs in self._devices.items():  # placed gangs only, not every job ever seen
            j = self.jobs[job_id]
            if j.state in RUN_STATES:
                draining = bool(j.preempt_reason)
                end = (now + checkpoint.write_s(j.spec) if draining else self._estimated_end(j, now))
                running.append(Running(j.job_id, j.tenant, j.queue, j.priority, j.spec.chip, devs, end,
                                       j.started_s, j.borrowing, draining, checkpoint.write_s(j.spec)))
        pending = list(self._queued.values())
        usage = dict(self._usage_s)  # chip-seconds run; decide adds what running gangs have committed, once
        tenants = {t for t, n in self._queued_per_tenant.items() if n} | {r.tenant for r in running}
        weights = {t: await self.weight(t) for t in tenants}
        jobs = self.jobs

        def work() -> tuple[Any, list[tuple[str, str]]]:
            dd = decide(now, pending, running, layouts=layouts, free=free, policy=self.policy,
                        queues=dict(self.queues), weights=weights, usage=usage, preemption=self.config.preemption,
                        backfill=self.config.backfill)
            # Which reasons changed (read-only here; applied on the loop): usually a handful of 10,000.
            return dd, [(jid, why) for jid, why in dd.reasons.items() if jobs[jid].reason != why]

        # The pass is pure array work over a snapshot: run it off the event loop so RPCs are served
        # while thousands of queued jobs are weighed.
        d, changed = await asyncio.to_thread(work)
        for victim, reason in d.preempt:
            vj = self.jobs[victim]
            if not vj.preempt_reason:
                vj.preempt_reason = reason
                self.notify(vj, "event", f"eviction requested: {reason}")
        for job_id in self._reserved - d.reserved.keys():
            self.jobs[job_id].reserved_start_s = 0.0
        for job_id, start in d.reserved.items():
            self.jobs[job_id].reserved_start_s = start
        self._reserved = set(d.reserved)
        for job_id, why in changed:
            job = self.jobs[job_id]
            if job.state != State.QUEUED:
                continue  # changed while the pass ran
            if job.reason != why:
                job.reason = why
                self.notify(job, "event", why)
        for job_id, devs, borrowing in d.place:
            job = self.jobs[job_id]
            if job.state != State.QUEUED:
                continue
            await self._place(job, devs, borrowing, layouts[job.spec.chip])

    async def _check_health(self, now: float) -> None:
        """Give quarantined devices of real faults back once their chip shard reports them healthy."""
        real = sorted(d for d, u in self.bad.items() if u is None)
        if not real or time.monotonic() - self._health_checked < 1.0:
            return
        self._health_checked = time.monotonic()
        inv = await self.inventory()
        for s in inv.shards:
            mine = [d for d in real if s.devices.start <= d < s.devices.end]
            if not mine:
                continue
            try:
                async with open_channel(s.endpoint) as ch:
                    r = await chip_pb2_grpc.ChipServiceStub(ch).ListDevices(chip_pb2.ListDevicesRequest(
                        devices=convert.range_msgs(_ranges(np.array(mine))), page_size=len(mine)),
                        metadata=self._smd(), timeout=10)
            except grpc.aio.AioRpcError as err:
                log.warning("device health check failed", shard=s.endpoint, error=err.details())
                continue
            for dev in r.devices:
                if dev.state != chip_pb2.Device.STATE_FAILED:
                    self.bad.pop(int(dev.id), None)

    async def _failed_devices(self, devices: np.ndarray) -> list[int]:
        """Which of a gang's devices the chip service reports failed now."""
        inv = await self.inventory()
        out: list[int] = []
        for s in inv.shards:
            mine = devices[(devices >= s.devices.start) & (devices < s.devices.end)]
            if not mine.size:
                continue
            try:
                async with open_channel(s.endpoint) as ch:
                    r = await chip_pb2_grpc.ChipServiceStub(ch).ListDevices(chip_pb2.ListDevicesRequest(
                        devices=convert.range_msgs(_ranges(mine)), page_size=int(mine.size)),
                        metadata=self._smd(), timeout=10)
            except grpc.aio.AioRpcError:
                continue
            out += [int(d.id) for d in r.devices if d.state == chip_pb2.Device.STATE_FAILED]
        return out

    async def _place(self, job: JobRecord, devices: np.ndarray, borrowing: bool, layout: Layout) -> bool:
        """Allocate exactly ``devices`` for the job's gang; True if it is now running."""
        spec = job.spec
        self.set_state(job, State.PLACING, f"allocating {spec.count} {spec.chip} chips through the broker")
        try:
            resp = await self.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                chip_type=spec.chip, count=spec.count, topology=broker_pb2.TOPOLOGY_CONSTRAINT_NONE,
                purpose=job.name, tenant=job.tenant, devices=convert.range_msgs(_ranges(devices)),
            ), metadata=self._smd(), timeout=30)
        except grpc.aio.AioRpcError as err:
            self.set_state(job, State.QUEUED, f"broker refused placement ({err.code().name}): {err.details()}")
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
        self._devices[job.job_id] = devices
        self.set_state(job, State.RUNNING, "", f"placed on {inst.device_count} chips ({inst.name}): "
                       f"{st.domains} domains, {st.leaf_groups} leaf groups, {st.dp_spine_crossings} DP spine "
                       f"crossings{' (borrowed quota)' if borrowing else ''}")
        if not job.started_s:
            job.started_s = self.clock.now()
        self._running[job.job_id] = asyncio.create_task(self._run(job, devices, resp.capability,
                                                                  resp.capability_expires_s))
        return True

    async def _run(self, job: JobRecord, devices: np.ndarray, capability: str, expires_s: float) -> None:
        instance = job.instance  # this runner's gang; the job may be placed again before the runner ends
        inv = await self.inventory()
        cap = {"token": capability, "expires": expires_s}
        runner = JobRunner(job, devices=devices,
                           shards=[(s.endpoint, int(s.devices.start), int(s.devices.end)) for s in inv.shards],
                           fabric=inv.fabric_endpoint, capability=lambda: str(cap["token"]), clock=self.clock)
        structlog.contextvars.bind_contextvars(job_id=job.job_id)
        t = max(self.clock.now(), job.started_s)
        pause = checkpoint.pause_s(job.plan)
        write = checkpoint.write_s(job.spec)
        ckpt = checkpoint.AsyncCheckpoints(durable_step=job.last_checkpoint_step)
        try:
            if job.resume_pending:
                cost = checkpoint.restart_s(job.spec)
                self.notify(job, "event", f"restarting: relaunch and read the step-{job.step} checkpoint "
                                          f"({cost:.1f} s)")
                await self.clock.sleep_until(t + cost)
                t += cost
                job.restart_s += cost
                job.resume_pending = False
            while job.step < job.steps_total and job.state == State.RUNNING:
                if job.preempt_reason:
                    await self._evict(job, t, ckpt, pause, write)
                    return
                if float(cap["expires"]) - time.time() < 60:  # type: ignore[arg-type]
                    await self._refresh(job, instance, cap)
                res = await self._step_with_retry(runner, job, t, instance, cap)
                if job.state != State.RUNNING:
                    break
                account(job, res)
                step_chip_s = job.spec.count * res.breakdown.step_time_s
                self._usage_s[job.tenant] = self._usage_s.get(job.tenant, 0.0) + step_chip_s
                self._traces.setdefault(job.job_id, deque(maxlen=TRACE_STEPS)).append((job.step, res))
                t = res.end_s
                await self._check_performance(job, res, runner)
                if ckpt.settle(t):
                    job.last_checkpoint_step = ckpt.durable_step
                    self.save(job)
                self._maybe_fail(job, devices, res.breakdown.step_time_s)
                if job.step % max(self.config.progress_interval_steps, 1) == 0 or job.step == job.steps_total:
                    self.notify(job, "progress")
                    self.save(job)  # a scheduler crash then knows how many steps it really loses
                if ckpt.due(job.step, job.checkpoint_interval_steps, job.steps_total):
                    self.set_state(job, State.CHECKPOINTING, "", f"checkpoint at step {job.step}: "
                                   f"{pause:.2f} s pause, {write:.1f} s asynchronous write")
                    await self.clock.sleep_until(t + pause)
                    t += pause
                    job.checkpoint_pause_s += pause
                    ckpt.start(job.step, t, write)
                    if job.state == State.CHECKPOINTING:
                        self.set_state(job, State.RUNNING)
            if job.state == State.RUNNING and job.step >= job.steps_total:
                job.last_checkpoint_step = job.step
                self.set_state(job, State.SUCCEEDED, "", f"finished {job.step} steps")
        except StepFailed as exc:
            await self._on_failure(job, devices, exc, ckpt)
        except PeerLost as exc:
            self._requeue_after_peer_loss(job, exc, ckpt)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("job runner failed", job=job.name)
            if job.state not in TERMINAL:
                self.set_state(job, State.FAILED, f"internal error: {exc}")
        finally:
            await runner.close()
            if self._running.get(job.job_id) is asyncio.current_task():
                self._running.pop(job.job_id, None)
            if self._devices.get(job.job_id) is devices:
                self._devices.pop(job.job_id, None)
            await self._release(job, instance)

    def expected(self, job: JobRecord) -> Expected:
        """The model's step for this job on an idle cluster (cached)."""
        exp = self._expected.get(job.job_id)
        if exp is None:
            est = cached_estimate(job.spec)
            exp = self._expected[job.job_id] = Expected(est.step_time_s, est.breakdown.compute_s, dict(est.comm_s))
        return exp

    async def _check_performance(self, job: JobRecord, res: Any, runner: JobRunner) -> None:
        """Flag a step slower than the model and name the likely cause: a WatchJob line, an MQTT alert and a
        Prometheus counter. Queries the chips and links only when the step is already slow."""
        exp = self.expected(job)
        bd = res.breakdown
        if bd.step_time_s <= exp.step_s * (1 + DRIFT_THRESHOLD):
            if job.performance_alert:
                job.performance_alert, job.slowdown = "", 0.0
                self.notify(job, "event", "performance back to the model's prediction")
            return
        if job.performance_alert and job.step % 10:
            return  # already flagged; re-diagnose every 10 steps
        slow, n, degraded = 0, 0, {}
        md = self._smd()
        try:
            for ep, rs in runner.shard_ranges:
                st = await chip_pb2_grpc.ChipServiceStub(runner.channel(ep)).GetStats(
                    chip_pb2.GetStatsRequest(devices=convert.range_msgs(rs)), metadata=md, timeout=10)
                slow += int(st.throttled) + int(st.failed)
                n += int(st.devices)
            ls = await fabric_pb2_grpc.FabricServiceStub(runner.channel(runner.fabric_ep)).GetLinkStats(
                fabric_pb2.GetLinkStatsRequest(), metadata=md, timeout=10)
            degraded = {t.tier: int(t.links_down + t.links_degraded) for t in ls.tiers}
        except grpc.aio.AioRpcError as err:
            log.warning("performance diagnosis incomplete", job=job.name, error=err.details())
        d = diagnose(exp, Observed(bd.step_time_s, bd.compute_s, res.comm_s, n, slow, 0.0, degraded))
        if d is None:
            return
        job.performance_alert, job.slowdown = f"{d.cause}: {d.detail}", d.slowdown
        self._loss_events[d.cause] = self._loss_events.get(d.cause, 0) + 1
        msg = f"performance loss: step {d.slowdown * 100:+.0f}% vs the model; likely cause {d.cause}: {d.detail}"
        log.warning("performance loss", job=job.name, cause=d.cause, slowdown=d.slowdown)
        self.notify(job, "event", msg)
        tenant = job.tenant.removeprefix("tenants/")
        self.telemetry.publish(f"tenants/{tenant}/jobs/{job.job_id}/alerts", {
            "job": job.name, "event": "performance_loss", "cause": d.cause, "detail": d.detail,
            "slowdown": d.slowdown, "step": job.step, "t_s": self.clock.now()})

    def metrics(self) -> list[Any]:
        """Jobs by state, per running job its step time, model step time and slowdown, and loss events."""
        jobs = gauge("gigacluster_jobs", "Jobs by state.", ["state"])
        counts: dict[str, int] = {s.name.lower(): self._state_counts.get(s, 0) for s in State}
        for st_name, c in counts.items():
            jobs.add_metric([st_name], float(c))
        step = gauge("gigacluster_job_step_time_seconds", "Last step time of a running job.", ["job", "tenant"])
        model = gauge("gigacluster_job_predicted_step_time_seconds", "Model step time of a running job.",
                      ["job", "tenant"])
        slow = gauge("gigacluster_job_slowdown", "Step time over the model's, minus 1 (0 when on model).",
                     ["job", "tenant"])
        for j in (self.jobs[i] for i in self._devices):
            if j.state == State.RUNNING:
                step.add_metric([j.name, j.tenant], j.last_step_time_s)
                model.add_metric([j.name, j.tenant], j.predicted_step_time_s)
                slow.add_metric([j.name, j.tenant], j.slowdown)
        loss = counter("gigacluster_performance_loss_events_total", "Performance-loss diagnoses by cause.", ["cause"])
        for cause in CAUSES:
            loss.add_metric([cause], float(self._loss_events.get(cause, 0)))
        return [jobs, step, model, slow, loss]

    def _maybe_fail(self, job: JobRecord, devices: np.ndarray, step_s: float) -> None:
        """The failure model: interrupt this step with the probability of its chip-seconds."""
        fm = self.failure_model
        if fm is None or self.rng.random() >= fm.p_interrupt(job.spec.count, step_s):
            return
        cause, effect = fm.draw_cause(self.rng)
        dev = int(devices[int(self.rng.integers(devices.size))])
        raise StepFailed(f"{cause} on device {dev} (failure model)", [dev], effect, modelled=True)

    async def _on_failure(self, job: JobRecord, devices: np.ndarray, exc: StepFailed,
                          ckpt: checkpoint.AsyncCheckpoints | None = None) -> None:
        """A real job fault (chip or link failed a step): the only thing that uses a restart."""
        now = self.clock.now()
        if ckpt is not None:  # a write that ended before the fault is durable; one still in flight is not
            ckpt.settle(now)
            job.last_checkpoint_step = ckpt.durable_step
        bad = list(exc.devices)
        if not exc.modelled and exc.effect == "device":
            bad = sorted(set(bad) | set(await self._failed_devices(devices)))
        if exc.effect == "host" and bad:
            dom = int(get_system_chips(job))
            bad = sorted({d // dom * dom + k for d in bad for k in range(dom)})
        if exc.effect in ("device", "host"):
            for d in bad:
                self.bad[int(d)] = (now + self.config.repair_s) if exc.modelled else None
        lost = job.step - job.last_checkpoint_step
        job.failures += 1
        job.lost_steps += lost
        job.lost_s += lost * job.mean_step_s()
        where = f" (devices {', '.join(map(str, bad[:8]))}{'...' if len(bad) > 8 else ''} excluded)" if bad else ""
        if job.restarts >= job.max_restarts:
            self.set_state(job, State.FAILED, f"{exc.cause}; max_restarts ({job.max_restarts}) reached; "
                           f"{lost} steps since the checkpoint at step {job.last_checkpoint_step} lost")
            return
        job.restarts += 1
        self.set_state(job, State.RESTARTING, f"{exc.cause}; restarting from step "
                       f"{job.last_checkpoint_step} ({lost} steps lost){where}")
        job.step = job.last_checkpoint_step
        job.tokens = job.step * job.spec.tokens_per_step
        job.resume_pending = True
        self.set_state(job, State.QUEUED, "waiting for healthy chips to restart")

    async def _evict(self, job: JobRecord, t: float, ckpt: checkpoint.AsyncCheckpoints, pause: float,
                     write: float) -> None:
        """Preemption: checkpoint synchronously (pause + write after any write in flight), then requeue."""
        reason = job.preempt_reason
        self.set_state(job, State.CHECKPOINTING, reason, f"{reason}: writing a checkpoint at step {job.step} "
                       f"({pause + write:.1f} s) before releasing the chips")
        end = ckpt.flush_end(t + pause, write)
        await self.clock.sleep_until(end)
        job.checkpoint_pause_s += end - t
        job.last_checkpoint_step = job.step
        job.preemptions += 1
        job.preempt_reason = ""
        job.resume_pending = True
        self.set_state(job, State.PREEMPTED, reason)
        self.set_state(job, State.QUEUED, f"requeued after preemption ({reason})")

    async def _step_with_retry(self, runner: JobRunner, job: JobRecord, t: float, instance: str,
                               cap: dict[str, Any]) -> Any:
        """Run a step. A peer service that is unavailable (restarting, or down for minutes) delays the
        step: wait with bounded backoff, visibly in the job's ``reason``, for up to ``peer_wait_s``, then
        raise PeerLost (requeue from the checkpoint). A capability the mesh no longer accepts (a broker
        restart) is refreshed once, then PeerLost. Neither uses a restart: only chip and link faults
        (StepFailed, raised to the caller) do."""
        started = time.monotonic()
        delay = 0.2
        attempt = 0
        refreshed = False
        while True:
            try:
                res = await runner.run_step(t)
            except Unavailable as exc:
                waited = time.monotonic() - started
                if waited >= self.config.peer_wait_s:
                    raise PeerLost(f"a service stayed unavailable for {waited:.0f} s ({exc})") from exc
                attempt += 1
                job.reason = (f"step {job.step + 1} waiting for an unavailable service (attempt {attempt}, "
                              f"{waited:.0f} s so far; restarts not charged): {exc}")
                log.warning("step delayed: a service is unavailable", job=job.name, error=str(exc),
                            attempt=attempt, waited_s=round(waited, 1), retry_in_s=delay)
                self.notify(job, "event", job.reason)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.peer_backoff_max_s)
                t = max(t, self.clock.now())
                continue
            except CapabilityRejected as exc:
                if refreshed:
                    raise PeerLost(f"the mesh no longer accepts this job's allocation ({exc})") from exc
                log.warning("capability rejected; refreshing it", job=job.name, error=str(exc))
                await self._refresh(job, instance, cap)
                refreshed = True
                continue
            if attempt:
                waited = time.monotonic() - started
                job.reason = ""
                log.info("services back; job continues", job=job.name, waited_s=round(waited, 1))
                self.notify(job, "event", f"services back after {waited:.0f} s; step {job.step + 1} ran "
                                          f"(restarts not charged)")
            return res

    async def _refresh(self, job: JobRecord, instance: str, cap: dict[str, Any]) -> None:
        """A fresh capability for ``instance``, waiting out a broker outage (PeerLost past ``peer_wait_s``
        or when the broker no longer knows the instance)."""
        started = time.monotonic()
        delay = 0.2
        while True:
            try:
                r = await self.broker.RefreshCapability(broker_pb2.RefreshCapabilityRequest(instance=instance),
                                                        metadata=self._smd(), timeout=10)
                cap.update(token=r.capability, expires=r.capability_expires_s)
                return
            except grpc.aio.AioRpcError as err:
                waited = time.monotonic() - started
                if err.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    raise PeerLost(f"the broker no longer holds {instance} ({err.code().name})") from err
                if waited >= self.config.peer_wait_s:
                    raise PeerLost(f"the broker stayed unavailable for {waited:.0f} s") from err
                job.reason = (f"waiting for the isolation broker to refresh the capability ({waited:.0f} s so far; "
                              f"restarts not charged)")
                log.warning("capability refresh delayed: broker unavailable", job=job.name, waited_s=round(waited, 1))
                self.notify(job, "event", job.reason)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.peer_backoff_max_s)

    def _requeue_after_peer_loss(self, job: JobRecord, exc: PeerLost, ckpt: checkpoint.AsyncCheckpoints) -> None:
        """Requeue from the last durable checkpoint after a peer outage or a lost allocation; the chips
        are re-acquired by the next dispatch. Not a job fault: ``restarts`` and ``failures`` stay."""
        ckpt.settle(self.clock.now())
        job.last_checkpoint_step = ckpt.durable_step
        lost = job.step - job.last_checkpoint_step
        job.lost_steps += lost
        job.lost_s += lost * job.mean_step_s()
        if job.state not in (State.RUNNING, State.CHECKPOINTING):
            return
        self.set_state(job, State.RESTARTING, f"{exc}; resuming from the checkpoint at step "
                       f"{job.last_checkpoint_step} ({lost} steps lost; restarts not charged)")
        job.step = job.last_checkpoint_step
        job.tokens = job.step * job.spec.tokens_per_step
        job.resume_pending = True
        self.set_state(job, State.QUEUED, "re-acquiring chips after a peer outage (restarts not charged)")

    async def _release(self, job: JobRecord, instance: str | None = None) -> None:
        """Release ``instance`` (default: the job's current one). A runner that ends after its job was
        already placed again must release only its own instance, never the new one."""
        name = job.instance if instance is None else instance
        if not name:
            return
        try:
            await self.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=name),
                                              metadata=self._smd(), timeout=30)
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.NOT_FOUND:
                log.warning("release failed; retried by the dispatcher", job=job.name, instance=name,
                            error=err.details())
                self._orphans.append(name)  # released once the broker is back, never leaked
        if job.instance == name:
            job.instance = ""
            job.borrowing = False
            self.save(job)
        self._kick.set()

    # -- API helpers ------------------------------------------------------------------------------
    def visible(self, p: Principal, name: str) -> JobRecord:
        if not name.startswith("jobs/") or not 5 < len(name) <= 64:  # ids are short: j-<n>
            raise InvalidArgument("name", f"must look like 'jobs/<id>', got {show(name)}")
        job = self.jobs.get(name.removeprefix("jobs/"))
        if job is None or (not p.privileged and job.tenant != p.tenant):
            raise NotFound(name)
        return job

    def watch(self, job: JobRecord) -> asyncio.Queue[tuple[str, str]]:
        q: asyncio.Queue[tuple[str, str]] = asyncio.Queue(maxsize=10_000)
        self._watchers.setdefault(job.job_id, set()).add(q)
        return q

    def unwatch(self, job: JobRecord, q: asyncio.Queue[tuple[str, str]]) -> None:
        self._watchers.get(job.job_id, set()).discard(q)

    def queue_msg(self, q: QueueSpec) -> scheduler_pb2.Queue:
        used: dict[str, int] = {}
        borrowed: dict[str, int] = {}
        for j in self.jobs.values():
            if j.tenant == q.tenant and j.queue == q.queue and j.state in RUN_STATES and j.instance:
                used[j.spec.chip] = used.get(j.spec.chip, 0) + j.spec.count
                if j.borrowing:
                    borrowed[j.spec.chip] = borrowed.get(j.spec.chip, 0) + j.spec.count
        return scheduler_pb2.Queue(name=f"{q.tenant}/queues/{q.queue}", cohort=q.cohort, quota=dict(q.quota),
                                   used=used, borrowed=borrowed)


def get_system_chips(job: JobRecord) -> int:
    from gigacluster.hw.catalog import get_system

    return get_system(job.spec.system).chips


def job_msg(job: JobRecord, spec_msg: Any, now_s: float = 0.0) -> scheduler_pb2.Job:
    n = max(job.step, 1)
    running = job.state in RUN_STATES and bool(job.instance)
    return scheduler_pb2.Job(
        name=job.name, tenant=job.tenant, display_name=job.display_name, queue=job.queue, priority=job.priority,
        spec=spec_msg, state=int(job.state), reason=job.reason, steps_total=job.steps_total, step=job.step,  # type: ignore[arg-type]  # protobuf enums are int NewTypes
        tokens=job.tokens, last_step_time_s=job.last_step_time_s, predicted_step_time_s=job.predicted_step_time_s,
        mfu=job.mfu, usage=common_pb2.Usage(energy_it_j=job.energy_it_j, energy_facility_j=job.energy_facility_j,
                                           chip_hours=job.chip_hours, cost_usd=job.cost_usd),
        eta_s=job.eta_s, created_s=job.created_s, started_s=job.started_s, finished_s=job.finished_s,
        instance=job.instance, restarts=job.restarts, max_restarts=job.max_restarts,
        checkpoint_interval_steps=job.checkpoint_interval_steps, last_checkpoint_step=job.last_checkpoint_step,
        goodput=job.goodput_at(now_s), compute_s=job.compute_s_sum / n, exposed_comm_s=job.exposed_comm_s_sum / n,
        bubble_s=job.bubble_s_sum / n, preemptions=job.preemptions, lost_steps=job.lost_steps, lost_s=job.lost_s,
        checkpoint_pause_s=job.checkpoint_pause_s, restart_s=job.restart_s, borrowing=job.borrowing,
        placement_domains=job.placement_domains if running else 0,
        placement_leaf_groups=job.placement_leaf_groups if running else 0,
        dp_spine_crossings=job.dp_spine_crossings if running else 0,
        estimated_end_s=(now_s + job.eta_s) if running else 0.0,
        reserved_start_s=job.reserved_start_s if job.state == State.QUEUED else 0.0, failures=job.failures,
    )


@grpc_errors(scheduler_pb2_grpc.SchedulerServiceServicer)
class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, svc: SchedulerService) -> None:
        self.svc = svc
        self._spec_msgs: dict[str, Any] = {}

    def _msg(self, job: JobRecord) -> scheduler_pb2.Job:
        from gigacluster.scheduler.spec import spec_to_proto

        spec = self._spec_msgs.get(job.job_id)
        if spec is None:
            spec = self._spec_msgs[job.job_id] = spec_to_proto(job.spec_dict)
        return job_msg(job, spec, self.svc.clock.now())

    async def SubmitJob(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self.svc.auth.principal(context)
        if p.kind != "tenant":
            raise PermissionDenied("jobs belong to tenants: submit with a tenant's API key", reason="TENANT_ONLY")
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "required: the training spec (model, batch, parallelism, hardware, steps)")
        if request.request_id:
            prior = self.svc._idempotency.get((p.tenant, request.request_id))
            if prior is not None:
                return scheduler_pb2.SubmitJobResponse(job=self._msg(self.svc.jobs[prior]))
        check_bounds(request, self.svc.bounds)  # every sizing field, before any model work
        self.svc.admit(p.tenant)
        spec_dict = proto_to_spec(request.spec)
        chips = await self.svc.cluster_chips()

        def model() -> tuple[Any, Any, int, Any]:
            spec, plan, steps = validate_submission(
                spec_dict, priority=request.priority, checkpoint_interval_steps=int(request.checkpoint_interval_steps),
                max_restarts=int(request.max_restarts), cluster_chips=chips)
            return spec, plan, steps, cached_estimate(spec)

        # The model's work (parse, plan, estimate: ~30 ms for a new spec, cached for a repeated one)
        # runs off the event loop, so other tenants' calls are not queued behind it.
        spec, plan, steps, est = await asyncio.to_thread(model)
        job_id = f"j-{next(self.svc._ids)}"
        job = JobRecord(
            job_id=job_id, tenant=p.tenant, display_name=request.display_name or job_id,
            queue=request.queue or "default", priority=int(request.priority), spec_dict=spec_dict, spec=spec,
            plan=plan, steps_total=steps, checkpoint_interval_steps=int(request.checkpoint_interval_steps),
            max_restarts=int(request.max_restarts), created_s=self.svc.clock.now(),
            predicted_step_time_s=est.step_time_s, reason="queued",
        )
        self.svc.jobs[job_id] = job
        # The same estimate serves performance-loss detection (no second estimate per job).
        self.svc._expected[job_id] = Expected(est.step_time_s, est.breakdown.compute_s, dict(est.comm_s))
        self.svc.seq[job_id] = int(job_id[2:])
        if request.request_id:
            self.svc._idempotency[(p.tenant, request.request_id)] = job_id
        self.svc.save(job)
        self.svc.index(job, None)
        log.info("job submitted", job=job.name, tenant=p.tenant, chips=spec.count, steps=steps)
        self.svc.notify(job, "state", "submitted")
        self.svc._kick.set()
        return scheduler_pb2.SubmitJobResponse(job=self._msg(job))

    async def GetJob(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self.svc.auth.principal(context)
        return scheduler_pb2.GetJobResponse(job=self._msg(self.svc.visible(p, request.name)))

    async def ListJobs(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self.svc.auth.principal(context)
        if request.tenant and not p.privileged and request.tenant != p.tenant:
            raise PermissionDenied("only the admin lists another tenant's jobs", reason="OTHER_TENANT")
        if request.state and request.state not in scheduler_pb2.Job.State.values():
            raise InvalidArgument("state", f"unknown state {request.state}")
        tenant = request.tenant or (None if p.privileged else p.tenant)
        jobs = [j for j in self.svc.jobs.values()
                if (tenant is None or j.tenant == tenant) and (not request.state or int(j.state) == request.state)]
        jobs.sort(key=lambda j: -self.svc.seq[j.job_id])
        items, token = convert.page(jobs, request.page_size, request.page_token)
        return scheduler_pb2.ListJobsResponse(jobs=[self._msg(j) for j in items],  # type: ignore[arg-type]
                                              next_page_token=token)

    async def CancelJob(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self.svc.auth.principal(context)
        job = self.svc.visible(p, request.name)
        self.svc.set_state(job, State.CANCELLED, f"cancelled by {p.tenant or p.kind}")
        task = self.svc._running.get(job.job_id)
        if task is None:
            await self.svc._release(job)
        return scheduler_pb2.CancelJobResponse(job=self._msg(job))

    async def WatchJob(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self.svc.auth.principal(context)
        job = self.svc.visible(p, request.name)
        q = self.svc.watch(job)
        try:
            yield scheduler_pb2.WatchJobResponse(job=self._msg(job), kind="state", message=job.reason)
            while not job.terminal:
                kind, message = await q.get()
                yield scheduler_pb2.WatchJobResponse(job=self._msg(job), kind=kind, message=message)
        finally:
            self.svc.unwatch(job, q)

    async def UpdateQueue(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self.svc.auth.principal(context)
        if not p.privileged:
            raise PermissionDenied("only the admin sets queue quotas", reason="ADMIN_ONLY")
        q = request.queue
        m = QUEUE_NAME_RE.match(q.name)
        if m is None:
            raise InvalidArgument("queue.name", f"must look like 'tenants/<tenant>/queues/<queue>', got {show(q.name)}")
        if q.cohort and not COHORT_RE.match(q.cohort):
            raise InvalidArgument("queue.cohort", f"lowercase letters, digits and '-', got {show(q.cohort)}")
        known = chip_names()
        for chip, n in q.quota.items():
            if chip not in known:
                raise InvalidArgument("queue.quota", f"unknown chip {show(chip)}; allowed: {', '.join(known)}")
            if n > 100_000_000:
                raise InvalidArgument("queue.quota", f"{chip}: at most 100000000 chips, got {n}")
        spec = QueueSpec(f"tenants/{m.group(1)}", m.group(2), q.cohort,
                         tuple(sorted((c, int(n)) for c, n in q.quota.items())))
        self.svc.queues[(spec.tenant, spec.queue)] = spec
        self.svc.save_queues()
        self.svc._kick.set()
        log.info("queue updated", queue=q.name, cohort=q.cohort, quota=dict(q.quota))
        return scheduler_pb2.UpdateQueueResponse(queue=self.svc.queue_msg(spec))

    async def ListQueues(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self.svc.auth.principal(context)
        qs = sorted((q for q in self.svc.queues.values() if p.privileged or q.tenant == p.tenant),
                    key=lambda q: (q.tenant, q.queue))
        items, token = convert.page(qs, request.page_size, request.page_token)
        return scheduler_pb2.ListQueuesResponse(queues=[self.svc.queue_msg(q) for q in items],  # type: ignore[arg-type]
                                                next_page_token=token)

    async def GetJobTrace(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self.svc.auth.principal(context)
        job = self.svc.visible(p, request.name)
        spec, plan = job.spec, job.plan
        steps = [scheduler_pb2.StepTrace(
            step=n, start_s=r.start_s, step_time_s=r.breakdown.step_time_s, compute_s=r.breakdown.compute_s,
            exposed_comm_s=r.breakdown.exposed_comm_s, bubble_s=r.breakdown.bubble_s, comm_s=dict(r.comm_s))
            for n, r in self.svc._traces.get(job.job_id, ())]
        return scheduler_pb2.GetJobTraceResponse(
            name=job.name, tp=spec.tp, pp=spec.pp, dp=spec.dp, cp=spec.cp, microbatches=plan.microbatches,
            virtual_stages=plan.virtual_stages, steps=steps)

    async def GetTenantUsage(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        p = await self.svc.auth.principal(context)
        tenant = request.tenant or p.tenant
        if not tenant:
            raise InvalidArgument("tenant", "required for the admin: 'tenants/<id>'")
        if not tenant.startswith("tenants/") or len(tenant) <= 8:
            raise InvalidArgument("tenant", f"must look like 'tenants/<id>', got {show(tenant)}")
        if not p.privileged and tenant != p.tenant:
            raise PermissionDenied("only the admin reads another tenant's usage", reason="OTHER_TENANT")
        mine = [j for j in self.svc.jobs.values() if j.tenant == tenant]
        total_h = sum(j.chip_hours for j in self.svc.jobs.values())
        run = [j for j in mine if j.state in RUN_STATES and j.instance]
        usage = common_pb2.Usage(energy_it_j=sum(j.energy_it_j for j in mine),
                                 energy_facility_j=sum(j.energy_facility_j for j in mine),
                                 chip_hours=sum(j.chip_hours for j in mine), cost_usd=sum(j.cost_usd for j in mine))
        return scheduler_pb2.GetTenantUsageResponse(
            tenant=tenant, usage=usage, jobs=len(mine), running_jobs=len(run),
            running_chips=sum(j.spec.count for j in run), weight=await self.svc.weight(tenant),
            chip_hours_share=usage.chip_hours / total_h if total_h else 0.0)
