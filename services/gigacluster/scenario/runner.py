"""Drive a running stack through a scenario, through the services' public gRPC APIs only.

Order: check everything (the file against the stack's inventory and clock, every job as a SubmitJobRequest)
before anything is created; then create the tenants (admin key), and run three kinds of task against the
stack's virtual clock: job submissions and faults at their times, a sampler (jobs' step times, fabric link
stats) and the inference fleet (a :mod:`gigacluster.loadtest` run). At ``duration_s`` every job still
running is cancelled (usage stops), faults are cleared, and the Job messages and tenant usage are read
for :func:`gigacluster.scenario.report.build`.

Against a stack on the event clock (``Target.clock_coordinator``, as ``up --clock event`` writes it) the
runner takes part in the clock (``runtime/participant.py``, with the admin key): its submissions, faults,
samples and the fleet's arrivals are wake-ups the coordinator knows, so the day runs as fast as the mesh
can serve it and every action lands at its exact virtual time. The fleet is thinned as the file's
``speedup`` would thin it on the wall clock (the same workload in both modes).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import secrets
from collections.abc import Callable
from typing import Any

import grpc

from gigacluster.broker.v1 import broker_pb2
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.client import Client, Endpoints, submit_request
from gigacluster.common.v1 import common_pb2
from gigacluster.errors import FailedPrecondition, InvalidArgument
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.loadtest import report as lt_report
from gigacluster.loadtest import runner as lt_runner
from gigacluster.loadtest.drivers import Timebase
from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.clock import EventClock
from gigacluster.runtime.clock import busy as clock_busy
from gigacluster.runtime.participant import participate
from gigacluster.scenario import contention, fleet, report
from gigacluster.scenario.spec import CHIP_FAULTS, LINK_FAULTS, Fault, Job, Scenario
from gigacluster.scheduler.v1 import scheduler_pb2

SPEEDUP_TOLERANCE = 0.2  # the stack's clock may differ this much from the file's speedup before we refuse
CLOCK_PROBE_S = 1.0  # wall seconds between the two clock reads that measure the stack's speed-up
CLOCK_PROBES = 3  # tries when round trips are too slow for a clean measurement
RPC_TIMEOUT_S = 30.0
SETTLE_TIMEOUT_S = 120.0  # wall seconds a cancelled job may take to account its last steps (final_job)
SETTLE_POLL_S = 0.05
# A fault at site scale moves a lot: a core switch down on the 2 GW preset cuts every steady-state window
# that crosses it and starts the rest of each step as real flows (27-53 s of the fabric's time measured).
FAULT_RPC_TIMEOUT_S = 600.0
FAULT_POLL_S = 10.0  # virtual seconds between looks for a fault's job to be placed
UNKNOWN_OUTCOME = {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}
TERMINAL = {scheduler_pb2.Job.STATE_SUCCEEDED, scheduler_pb2.Job.STATE_FAILED, scheduler_pb2.Job.STATE_CANCELLED}
JOB_FIELDS = ("name", "step", "steps_total", "goodput", "started_s", "finished_s", "lost_s", "restart_s",
              "checkpoint_pause_s", "failures", "restarts", "preemptions", "mfu", "compute_s", "exposed_comm_s",
              "bubble_s", "last_step_time_s", "instance",
              "mean_step_time_s")


@dataclasses.dataclass
class Target:
    """The stack: endpoints, TLS settings as the client found them, and the admin key."""

    endpoints: Endpoints
    admin_key: str
    tls: Any = None
    clock_coordinator: str = ""  # HOST:PORT of an event-clock stack's coordinator: the runner joins its clock


def job_dict(job: scheduler_pb2.Job) -> dict[str, Any]:
    """The Job message fields the report reads, as plain values."""
    d: dict[str, Any] = {f: getattr(job, f) for f in JOB_FIELDS}
    d["state"] = scheduler_pb2.Job.State.Name(job.state).removeprefix("STATE_")
    d["usage"] = {f: getattr(job.usage, f) for f in ("energy_it_j", "energy_facility_j", "chip_hours", "cost_usd")}
    return d


class _Run:
    """One run's state: clients, the clock mapping, and what was observed."""

    def __init__(self, sc: Scenario, target: Target, say: Callable[[str], None],
                 clock: EventClock | None = None) -> None:
        self.sc, self.target, self.say, self.clock = sc, target, say, clock
        self.admin = Client(target.endpoints, target.admin_key, tls=target.tls)
        self.tenants: dict[str, tuple[str, Client]] = {}  # scenario name -> (tenant id, client)
        self.submitted: dict[str, str] = {}  # job key -> scheduler job name
        self.errors: dict[str, str] = {}
        self.steps: dict[str, dict[int, float]] = {}  # job name -> step -> step time
        self.link_samples: list[dict[str, Any]] = []
        self.link_totals: dict[str, dict[str, Any]] = {}  # "start", "end": the fabric's cumulative tier totals
        self.faults: list[dict[str, Any]] = []
        self.active: list[tuple[Fault, list[common_pb2.DeviceRange], str]] = []
        self.speedup = 1.0  # virtual s per wall s of the stack; 1 on the event clock (the fleet runs in virtual s)
        self.fleet_speedup = 1.0  # the speed-up the fleet is thinned for: the stack's, or the file's on the event clock
        self.v0 = 0.0  # the stack's virtual time at the scenario's 0
        self.w0 = 0.0  # the loop's wall time at the scenario's 0 (the clock's virtual time on the event clock)
        self.wall0 = 0.0
        self.shards: list[tuple[int, int, str]] = []
        self.chip_channels: dict[str, grpc.aio.Channel] = {}
        self.inference: dict[str, Any] = {}

    # -- clock --------------------------------------------------------------------------------------
    async def stack_now(self) -> float:
        return float((await self.link_stats()).now_s)

    async def link_stats(self) -> fabric_pb2.GetLinkStatsResponse:
        return await self.admin.fabric.GetLinkStats(fabric_pb2.GetLinkStatsRequest(), metadata=self.admin.md,
                                                    timeout=RPC_TIMEOUT_S)

    async def read_totals(self, when: str) -> float:
        """Note the fabric's cumulative per-tier utilisation totals as of now under ``when`` ("start", "end"), for
        the report's time-average utilisation (the difference over the interval); returns the stack's now."""
        ls = await self.link_stats()
        self.link_totals[when] = {"t_s": float(ls.stats_time_s), "tiers": {
            t.tier: {"links": int(t.links), "busy_link_s": t.busy_link_s, "bytes_carried": t.bytes_carried}
            for t in ls.tiers}}
        return float(ls.now_s)

    async def _clock_read(self) -> tuple[float, float, float]:
        """(wall midpoint, stack virtual now, round trip) of one clock read."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        v = await self.stack_now()
        t1 = loop.time()
        return (t0 + t1) / 2, v, t1 - t0

    async def measure_clock(self) -> None:
        """The stack's virtual seconds per wall second, from two reads of its clock (fabric GetLinkStats.now_s)
        ``CLOCK_PROBE_S`` apart, timed at their midpoints; retried when slow round trips (a loaded machine) would
        blur it by more than 5%. On the event clock there is no rate to measure: the mesh runs as fast as it can."""
        if self.clock is not None:
            self.speedup, self.fleet_speedup = 1.0, self.sc.speedup or 1.0
            return
        for _ in range(CLOCK_PROBES):
            w_a, v_a, rtt_a = await self._clock_read()
            await asyncio.sleep(CLOCK_PROBE_S)
            w_b, v_b, rtt_b = await self._clock_read()
            self.speedup = (v_b - v_a) / (w_b - w_a)
            if (rtt_a + rtt_b) / 2 <= 0.05 * (w_b - w_a):
                break
        want = self.sc.speedup
        if want and abs(self.speedup / want - 1) > SPEEDUP_TOLERANCE:
            raise FailedPrecondition(
                f"the stack runs at about {self.speedup:.3g} virtual s per wall s but the scenario expects {want:g}: "
                f"start it with `gigacluster up --speedup {want:g}`, or pass --speedup {self.speedup:.3g}")
        self.fleet_speedup = self.speedup

    def wall_at(self, virtual_s: float) -> float:
        return self.w0 + virtual_s / self.speedup

    def order(self, kind: str, index: int = 0) -> int:
        """Where an action stands among the runner's actions due at one virtual instant: the samples first (they
        see the instant as the actions before it left it), then fault clears, fault injections and submissions,
        each kind in file order, and the run's end last."""
        nf, nj = len(self.sc.faults), len(self.sc.jobs)
        base = {"sample": 0, "clear": 1, "fault": 1 + nf, "submit": 1 + 2 * nf, "end": 1 + 2 * nf + nj}[kind]
        return base + index

    async def sleep_until(self, virtual_s: float, order: int = 0) -> None:
        """Until ``virtual_s`` of the scenario. On the event clock an action of ``order`` k waits k least steps of
        virtual time more, so actions due at one instant run one after another, each once the mesh has settled
        what the one before set off (a slow chip cleared as a switch comes back: the steps the switch's repair
        restarts meet the chip as it is after its clear, every run), not in whatever order their calls happen to
        reach the services. The steps are ~1e-11 s at a virtual day: below every figure the report gives."""
        if self.clock is not None:
            t = self.v0 + virtual_s
            for _ in range(order):
                t = math.nextafter(t, math.inf)
            await self.clock.sleep_until(t)
            return
        delay = self.wall_at(virtual_s) - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)

    def now_v(self) -> float:
        if self.clock is not None:
            return self.clock.now() - self.v0
        return (asyncio.get_running_loop().time() - self.w0) * self.speedup

    async def start(self) -> None:
        """Fix the scenario's 0: now, on the stack's clock and the loop's."""
        loop = asyncio.get_running_loop()
        self.wall0 = loop.time()
        if self.clock is not None:
            self.v0 = self.w0 = self.clock.now()
        else:
            self.w0, self.v0 = self.wall0, await self.stack_now()
        await self.read_totals("start")

    # -- checks before anything is created -----------------------------------------------------------
    async def check_stack(self) -> None:
        """The file against the running stack: chip type and size (jobs larger than the stack are refused)."""
        inv = await self.admin.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=self.admin.md,
                                                   timeout=RPC_TIMEOUT_S)
        self.shards = [(s.devices.start, s.devices.end, s.endpoint) for s in inv.shards]
        chips = sum(e - s for s, e, _ in self.shards)
        types = {s.chip_type for s in inv.shards}
        if self.sc.site.chip not in types:
            raise FailedPrecondition(f"the stack runs {', '.join(sorted(types))[:80]}, the scenario expects "
                                     f"{self.sc.site.chip} (site.chip)")
        for j in self.sc.jobs:
            if j.chips > chips:
                raise InvalidArgument(f"jobs.{j.key}.chips", f"{j.chips:,} chips, but the running stack has {chips:,}")
            submit_request(j.spec, **j.fields)
        if chips < self.sc.site.chips:
            self.say(f"note: the stack has {chips:,} chips, the file's site {self.sc.site.chips:,}")


async def _estimates(jobs: tuple[Job, ...]) -> dict[str, tuple[float, float]]:
    """Idle-cluster step time and MFU of each distinct spec (``estimate train``), off the event loop."""
    def work() -> dict[str, tuple[float, float]]:
        out: dict[str, tuple[float, float]] = {}
        for j in jobs:
            k = repr(j.spec)
            if k not in out:
                est = estimate_train(TrainSpec.from_dict(j.spec))
                out[k] = (est.step_time_s, est.mfu)
        return out
    with clock_busy():  # a participant working in a thread looks idle to the event clock: hold its time meanwhile
        return await asyncio.to_thread(work)


async def create_tenants(run: _Run) -> None:
    """Each scenario tenant as ``<name>-<tag>`` with its weight (a fresh tag per run: keys are shown once)."""
    tag = secrets.token_hex(2)
    for t in run.sc.tenants:
        tid = f"{t.name}-{tag}"
        resp = await run.admin.broker.CreateTenant(broker_pb2.CreateTenantRequest(tenant_id=tid, weight=t.weight),
                                                   metadata=run.admin.md, timeout=RPC_TIMEOUT_S)
        run.tenants[t.name] = (tid, Client(run.target.endpoints, str(resp.api_key), tls=run.target.tls))
    run.say(f"tenants: {', '.join(tid for tid, _ in run.tenants.values())}")


async def submit_at(run: _Run, job: Job) -> None:
    """Submit ``job`` as its tenant at its virtual time; a refusal is recorded, not raised."""
    await run.sleep_until(job.at_s, run.order("submit", run.sc.jobs.index(job)))
    client = run.tenants[job.tenant][1]
    try:
        j = await client.submit_job(job.spec, **job.fields)
    except grpc.aio.AioRpcError as exc:
        run.errors[job.key] = f"{exc.code().name}: {(exc.details() or '')[:160]}"
        run.say(f"t={run.now_v():.0f}s {job.key} refused: {run.errors[job.key]}")
        return
    run.submitted[job.key] = j.name
    run.say(f"t={run.now_v():.0f}s submitted {job.key} ({job.chips:,} chips) as {j.name}")


def nth_device(ranges: Any, index: int) -> int:
    """The ``index``-th device id of an instance's ranges (without expanding a 100k-device instance)."""
    for rg in ranges:
        if index < rg.end - rg.start:
            return int(rg.start + index)
        index -= rg.end - rg.start
    raise FailedPrecondition(f"the instance has fewer devices than device_index {index}")


async def _fault_devices(run: _Run, fault: Fault, deadline_v: float) -> list[int]:
    """The device ids a chip fault hits: its ``device``, or its job's ``device_index``-th device once placed."""
    if fault.device >= 0:
        return [fault.device]
    tenant = fault.job.partition("/")[0]
    client = run.tenants[tenant][1]
    while run.now_v() < deadline_v:
        name = run.submitted.get(fault.job)
        if name:
            j = await client.get_job(name)
            if j.instance and j.state == scheduler_pb2.Job.STATE_RUNNING:
                inst = await run.admin.broker.GetInstance(broker_pb2.GetInstanceRequest(name=j.instance),
                                                          metadata=run.admin.md, timeout=RPC_TIMEOUT_S)
                return [nth_device(inst.instance.devices, fault.device_index)]
        await run.sleep_until(run.now_v() + FAULT_POLL_S)
    raise FailedPrecondition(f"{fault.job} was not running by the end of the scenario")


def _chip_stub(run: _Run, device: int) -> chip_pb2_grpc.ChipServiceStub:
    """The chip service of the shard holding ``device`` (from the broker's inventory)."""
    ep = next(ep for s, e, ep in run.shards if s <= device < e)
    if ep not in run.chip_channels:
        run.chip_channels[ep] = open_channel(ep, run.target.tls)
    return chip_pb2_grpc.ChipServiceStub(run.chip_channels[ep])


async def _inject(run: _Run, fault: Fault, row: dict[str, Any]) -> tuple[list[common_pb2.DeviceRange], str]:
    md = run.admin.md
    if fault.is_chip:
        devs = await _fault_devices(run, fault, run.sc.duration_s)
        ranges = [common_pb2.DeviceRange(start=d, end=d + 1) for d in devs]
        kind = getattr(chip_pb2, f"FAULT_KIND_{CHIP_FAULTS[fault.kind]}")
        r = await _chip_stub(run, devs[0]).InjectFault(
            chip_pb2.InjectFaultRequest(devices=ranges, kind=kind, clock_factor=fault.clock_factor),
            metadata=md, timeout=FAULT_RPC_TIMEOUT_S)
        row.update(target=f"{fault.job or 'device'} device {devs[0]}", affected=int(r.affected))
        return ranges, ""
    kind_l = getattr(fabric_pb2.InjectLinkFaultRequest, f"KIND_{LINK_FAULTS[fault.kind]}")
    lr = await run.admin.fabric.InjectLinkFault(
        fabric_pb2.InjectLinkFaultRequest(target=fault.target, kind=kind_l, capacity_factor=fault.capacity_factor),
        metadata=md, timeout=FAULT_RPC_TIMEOUT_S)
    row.update(affected=int(lr.links_affected), flows_rerouted=int(lr.flows_rerouted),
               flows_failed=int(lr.flows_failed))
    return [], fault.target


async def clear(run: _Run, fault: Fault, ranges: list[common_pb2.DeviceRange], target: str) -> None:
    md = run.admin.md
    if ranges:
        await _chip_stub(run, ranges[0].start).ClearFault(chip_pb2.ClearFaultRequest(devices=ranges), metadata=md,
                                                          timeout=FAULT_RPC_TIMEOUT_S)
    elif target:
        await run.admin.fabric.ClearLinkFault(fabric_pb2.ClearLinkFaultRequest(target=target), metadata=md,
                                              timeout=FAULT_RPC_TIMEOUT_S)


async def fault_at(run: _Run, fault: Fault) -> None:
    """Inject ``fault`` at its time and clear it ``clear_after_s`` later (or at the end of the run)."""
    row: dict[str, Any] = {"at_s": fault.at_s, "kind": fault.kind, "target": fault.target or fault.job,
                           "affected": 0, "error": ""}
    run.faults.append(row)
    index = run.sc.faults.index(fault)
    await run.sleep_until(fault.at_s, run.order("fault", index))
    try:
        ranges, target = await _inject(run, fault, row)
    except (grpc.aio.AioRpcError, FailedPrecondition) as exc:
        row["error"] = (exc.details() or "") if isinstance(exc, grpc.aio.AioRpcError) else exc.message
        if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in UNKNOWN_OUTCOME and not fault.is_chip:
            # The fabric may have applied it after we stopped waiting: clear it at the end all the same.
            row["error"] = f"outcome unknown ({exc.code().name}): {row['error']}"[:200]
            run.active.append((fault, [], fault.target))
        run.say(f"t={run.now_v():.0f}s fault {fault.kind} not injected: {row['error'][:120]}")
        return
    row["injected_s"] = run.now_v()
    run.say(f"t={row['injected_s']:.0f}s injected {fault.kind} on {row['target']}")
    entry = (fault, ranges, target)
    run.active.append(entry)
    if fault.clear_after_s:
        await run.sleep_until(row["injected_s"] + fault.clear_after_s, run.order("clear", index))
        await clear(run, fault, ranges, target)
        run.active.remove(entry)
        row["cleared_s"] = run.now_v()


async def sample(run: _Run) -> None:
    """Every ``sample_s`` virtual seconds: each running job's step time (per step number) and the fabric's
    per-tier link stats."""
    k = 0
    while True:
        await run.sleep_until(k * run.sc.sample_s)
        k += 1
        try:
            ls = await run.link_stats()
            run.link_samples.append({"t_s": run.now_v(), "tiers": [
                {"tier": t.tier, "links": int(t.links), "mean_utilization": t.mean_utilization,
                 "max_utilization": max(t.max_utilization, t.windows_max_utilization),
                 "links_down": int(t.links_down), "links_degraded": int(t.links_degraded)} for t in ls.tiers]})
            for _tid, client in run.tenants.values():
                for j in await client.list_jobs():
                    if j.step and j.last_step_time_s > 0:
                        run.steps.setdefault(j.name, {})[int(j.step)] = float(j.last_step_time_s)
        except grpc.aio.AioRpcError as exc:
            run.say(f"t={run.now_v():.0f}s sample skipped: {exc.code().name}")


async def inference(run: _Run) -> None:
    """Deploy the fleet and replay the trace streams (a loadtest run as the fleet's tenant), from ``start_s``."""
    inf = run.sc.inference
    if inf is None:
        return
    scales, qps = fleet.rate_scales(run.sc, inf, run.fleet_speedup)
    qps = qps / run.fleet_speedup * run.speedup  # per wall s of the stack; per virtual s on the event clock
    run.inference = {"deployment": f"deployments/{inf.deploy['deployment_id']}", "duration_s": inf.duration_s,
                     "wall_qps": qps, "rate_scales": scales, "error": ""}
    lt = fleet.loadtest_scenario(run.sc, inf, scales, run.speedup)
    await run.sleep_until(inf.start_s)
    tid, client = run.tenants[inf.tenant]
    unit = "virtual" if run.clock is not None else "wall"
    run.say(f"t={run.now_v():.0f}s inference: {inf.deploy['deployment_id']} for {tid}, "
            f"{qps:.2f} req/s {unit}")
    tb = Timebase(run.clock, run.target.admin_key) if run.clock is not None else None
    try:
        res = await lt_runner.run(lt, lt_runner.Target(run.target.endpoints, client.api_key), timebase=tb)
    except (grpc.aio.AioRpcError, RuntimeError, InvalidArgument) as exc:
        msg = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        run.inference["error"] = (msg or "")[:200]
        run.say(f"inference failed: {run.inference['error']}")
        return
    run.inference["summary"] = lt_report.summarize(lt, res.results, wall_s=res.wall_s)
    run.inference["requests"] = fleet.request_rows(res, run.w0, run.speedup)


async def job_trace(run: _Run, key: str, name: str) -> list[dict[str, Any]]:
    """A job's recent steps (scheduler GetJobTrace) on the run's virtual clock; [] if the trace is unavailable."""
    client = run.tenants[key.partition("/")[0]][1]
    try:
        tr = await client.scheduler.GetJobTrace(scheduler_pb2.GetJobTraceRequest(name=name), metadata=client.md,
                                                timeout=RPC_TIMEOUT_S)
    except grpc.aio.AioRpcError:
        return []
    return [{"step": int(s.step), "start_s": s.start_s - run.v0, "step_time_s": s.step_time_s,
             "exposed_comm_s": s.exposed_comm_s, "comm_s": dict(s.comm_s)} for s in tr.steps]


async def finish(run: _Run) -> dict[str, dict[str, Any]]:
    """At the end: note each job's state, cancel those still going (their usage stops), clear faults still on,
    wait for every job's record to be final; returns the final Job dicts (with their traces) by job key."""
    states: dict[str, str] = {}
    for key, name in run.submitted.items():
        client = run.tenants[key.partition("/")[0]][1]
        j = await client.get_job(name)
        states[key] = scheduler_pb2.Job.State.Name(j.state).removeprefix("STATE_")
        if j.state not in TERMINAL:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await client.cancel_job(name)
    for fault, ranges, target in list(run.active):
        with contextlib.suppress(grpc.aio.AioRpcError):
            await clear(run, fault, ranges, target)
    run.active.clear()
    jobs = {key: await final_job(run, key, name) for key, name in run.submitted.items()}
    out = {}
    for key, name in run.submitted.items():
        d = job_dict(jobs[key])
        d["state_at_end"] = states[key]
        d["trace"] = await job_trace(run, key, name)
        out[key] = d
    return out


async def final_job(run: _Run, key: str, name: str) -> scheduler_pb2.Job:
    """The job's record once it is final: ended and holding no instance. A job cancelled while it runs is
    CANCELLED at once, but the step in progress completes and a steady-state window's steps are accounted
    after that (scheduler/window.py), and only then does the scheduler release its devices. Waits in wall time
    (on the event clock the mesh's time runs on meanwhile), at most ``SETTLE_TIMEOUT_S``."""
    client = run.tenants[key.partition("/")[0]][1]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_TIMEOUT_S
    while True:
        j = await client.get_job(name)
        if (j.state in TERMINAL and not j.instance) or loop.time() > deadline:
            return j
        await asyncio.sleep(SETTLE_POLL_S)


async def abort(run: _Run) -> None:
    """Best effort after an interrupted run: cancel the jobs it submitted and clear the faults it left on."""
    for key, name in run.submitted.items():
        with contextlib.suppress(grpc.aio.AioRpcError):
            await run.tenants[key.partition("/")[0]][1].cancel_job(name)
    for fault, ranges, target in list(run.active):
        with contextlib.suppress(grpc.aio.AioRpcError):
            await clear(run, fault, ranges, target)


async def tenant_usage(run: _Run) -> list[dict[str, Any]]:
    """Each tenant's GetTenantUsage (as the tenant), with its id and weight."""
    rows = []
    for t in run.sc.tenants:
        tid, client = run.tenants[t.name]
        u = await client.scheduler.GetTenantUsage(scheduler_pb2.GetTenantUsageRequest(), metadata=client.md,
                                                  timeout=RPC_TIMEOUT_S)
        rows.append({"name": t.name, "id": tid, "weight": t.weight, "chip_hours_share": u.chip_hours_share,
                     "usage": {f: getattr(u.usage, f) for f in ("energy_it_j", "energy_facility_j", "chip_hours",
                                                                "cost_usd")}})
    return rows


async def _drive(run: _Run, est: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Create the tenants, run every task until ``duration_s``, then collect what the report needs."""
    await create_tenants(run)
    loop = asyncio.get_running_loop()
    await run.start()
    timed = [asyncio.create_task(submit_at(run, j)) for j in run.sc.jobs]
    timed += [asyncio.create_task(fault_at(run, f)) for f in run.sc.faults]
    sampler = asyncio.create_task(sample(run))
    fleet_task = asyncio.create_task(inference(run))
    try:
        await run.sleep_until(run.sc.duration_s, run.order("end"))
        for task in timed:
            task.cancel()
        await asyncio.gather(*timed, return_exceptions=True)
        end_v = await run.read_totals("end")  # the run's end: the final records' wait below is not part of it
        wall_s = loop.time() - run.wall0
        final = await finish(run)
        sampler.cancel()
        await asyncio.gather(sampler, return_exceptions=True)
        await fleet_task
        tenants = await tenant_usage(run)
    except BaseException:
        # Interrupted (Ctrl-C, a failed call): leave the stack as found -- no job of ours running, no fault on.
        for task in (*timed, sampler, fleet_task):
            task.cancel()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(abort(run), timeout=RPC_TIMEOUT_S)
        raise
    jobs = []
    for j in run.sc.jobs:
        name = run.submitted.get(j.key, "")
        step_s, mfu = est[repr(j.spec)]
        jobs.append({"key": j.key, "tenant": j.tenant, "name": j.name, "chips": j.chips, "at_s": j.at_s,
                     "job": final.get(j.key, {}),
                     "error": run.errors.get(j.key, "" if name else "not submitted before the end"),
                     "state_at_end": final.get(j.key, {}).get("state_at_end", ""),
                     "step_samples": list(run.steps.get(name, {}).values()),
                     "trace": final.get(j.key, {}).pop("trace", []),
                     "estimate_step_s": step_s, "estimate_mfu": mfu})
    return {"scenario": run.sc.name, "site": dataclasses.asdict(run.sc.site), "speedup_expected": run.sc.speedup,
            "speedup_stack": run.speedup, "clock": "event" if run.clock is not None else "wall",
            "wall_s": wall_s, "virtual_s": end_v - run.v0, "end_s": end_v,
            "jobs": jobs, "tenants": tenants, "link_samples": run.link_samples, "link_totals": run.link_totals,
            "inference": run.inference,
            "faults": run.faults}


async def run(sc: Scenario, target: Target, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run ``sc`` against the stack and return its report (:func:`gigacluster.scenario.report.build`); on an
    event-clock stack as a participant of its clock (channels opened inside, so every call counts)."""
    if not target.clock_coordinator:
        return await _run(sc, target, progress, None)
    async with participate(target.clock_coordinator, "scenario", key=target.admin_key) as clock:
        return await _run(sc, target, progress, clock)


async def _run(sc: Scenario, target: Target, progress: Callable[[str], None] | None,
               clock: EventClock | None) -> dict[str, Any]:
    r = _Run(sc, target, progress or (lambda _m: None), clock)
    try:
        await r.check_stack()
        await r.measure_clock()
        if sc.inference is not None:
            # a bad trace path or window is refused before anything is created
            fleet.rate_scales(sc, sc.inference, r.fleet_speedup)
        est = await _estimates(sc.jobs)
        r.say(f"{sc.name}: {len(sc.jobs)} jobs, {len(sc.faults)} faults, {sc.duration_s:g} virtual s "
              + ("on the event clock" if clock is not None
                 else f"at {r.speedup:.3g}x = {sc.duration_s / r.speedup:.0f} wall s"))
        obs = await _drive(r, est)
    finally:
        for _tid, client in r.tenants.values():
            await client.close()
        for ch in r.chip_channels.values():
            await ch.close()
        await r.admin.close()
    return report.build(obs)


def end_to_end_check(rep: dict[str, Any]) -> list[str]:
    """Consistency of a report: every job accounted for, tenant chip-hours summing to the jobs', tier
    utilisations in [0, 1], the contention section's phases covering the fleet's requests; returns what is
    wrong (empty when all holds)."""
    bad = []
    t = rep["totals"]
    if not math.isclose(t["chip_hours"], t["chip_hours_of_jobs"], rel_tol=1e-3, abs_tol=1e-6):
        bad.append(f"tenant chip-hours {t['chip_hours']:.4f} != jobs' {t['chip_hours_of_jobs']:.4f}")
    bad += [f"tier {r['tier']} utilisation {r['mean_utilization']}" for r in rep["tiers"]
            if not 0 <= r["mean_utilization"] <= 1 or not 0 <= r["peak_utilization"] <= 1]
    bad += [f"job {j['key']} neither submitted nor refused" for j in rep["jobs"] if not (j["job"] or j["error"])]
    bad += contention.check(rep.get("contention") or {}, sum(s["offered"] for s in rep["inference"]["streams"]))
    return bad



