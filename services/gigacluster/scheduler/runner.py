"""Runs one placed job step by step through the chip and fabric services.

Each step: one ``ExecuteWork`` per chip shard for all the job's devices (a group of identical
ranks), one ``StartCollective`` per run of identical parallel groups for every collective demand,
then the step time from the model's own ``compose_step``. All calls carry ``not_before_s`` = the
step's virtual start, so gRPC latency does not enter the timing; the runner then sleeps in
virtual time until the step ends, which paces a live run at the clock's speed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import numpy as np

from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.errors import FailedPrecondition, Unavailable
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.hw.catalog import Chip, facility
from gigacluster.model.cost import job_cost
from gigacluster.model.power import host_overhead_w, link_energy_j
from gigacluster.model.training import StepBreakdown, compose_step, link_bytes
from gigacluster.runtime import convert
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.channels import ChannelPool
from gigacluster.runtime.clock import VirtualClock
from gigacluster.runtime.errors import error_info
from gigacluster.scheduler import step_comm
from gigacluster.scheduler.core import JobRecord, rank_groups
from gigacluster.wire import chip as chip_wire
from gigacluster.wire import fabric as fabric_wire

OPS = fabric_wire.OP_ENUMS


class StepFailed(Exception):
    """A chip or link fault failed the running step; ``cause`` says which.

    ``devices`` are the device ids known to have failed (from the chip service's ErrorInfo or the
    failure model); ``effect`` is ``device``, ``host``, ``network`` or ``software``
    (:mod:`scheduler.failures`); ``modelled`` is True for the scheduler's own failure model.
    """

    def __init__(self, cause: str, devices: Sequence[int] = (), effect: str = "device",
                 modelled: bool = False) -> None:
        super().__init__(cause)
        self.cause = cause
        self.devices = list(devices)
        self.effect = effect
        self.modelled = modelled


class CapabilityRejected(Exception):
    """The chip or fabric service refused the job's capability (expired, or a broker restart)."""


@dataclasses.dataclass(frozen=True)
class StepResult:
    start_s: float
    breakdown: StepBreakdown
    above_idle_j: float
    comm_s: dict[str, float]
    # (start, end) of each collective call in ``JobRunner.collective_calls`` order, and the chips' compute
    # time: what a steady-state window (scheduler/window.py) repeats.
    calls: Sequence[tuple[float, float]] = ()
    chip_s: float = 0.0

    @property
    def end_s(self) -> float:
        return self.start_s + self.breakdown.step_time_s


def arithmetic_runs(offsets: Sequence[int]) -> list[tuple[int, int, int]]:
    """Split sorted offsets into (first, count, stride) runs of equal spacing."""
    runs: list[tuple[int, int, int]] = []
    i = 0
    while i < len(offsets):
        if i + 1 == len(offsets):
            runs.append((offsets[i], 1, 1))
            break
        stride = offsets[i + 1] - offsets[i]
        j = i + 1
        while j + 1 < len(offsets) and offsets[j + 1] - offsets[j] == stride:
            j += 1
        runs.append((offsets[i], j - i + 1, stride))
        i = j + 1
    return runs


def device_runs(devices: np.ndarray, run: tuple[int, int, int], stride: int,
                size: int) -> list[tuple[np.ndarray, int, int]]:
    """A run of rank groups (first offset, count, offset stride) as (device ids of its first group, count,
    stride in device ids) pieces whose groups are translates of each other in device-id space, as the
    fabric expands ``groups`` x ``group_stride``. A gang with a hole (chips excluded after a fault) is not
    evenly spaced, so one run of offsets may become several pieces."""
    first, count, gstride = run
    ids = devices[first + gstride * np.arange(count)[:, None] + stride * np.arange(size)[None, :]]
    if count == 1:
        return [(ids[0], 1, 1)]
    step = ids[1:] - ids[:-1]
    even = (step == step[:, :1]).all(axis=1) & (step[:, 0] > 0)
    out: list[tuple[np.ndarray, int, int]] = []
    i = 0
    while i < count:
        j = i
        while j < count - 1 and even[j] and step[j, 0] == step[i, 0]:
            j += 1
        out.append((ids[i], j - i + 1, int(step[i, 0]) if j > i else 1))
        i = j + 1
    return out


class JobRunner:
    """The mesh side of one running job: devices, endpoints and the capability to use them."""

    def __init__(self, job: JobRecord, *, devices: np.ndarray, shards: list[tuple[str, int, int]],
                 fabric: str, capability: Callable[[], str], clock: VirtualClock) -> None:
        self.job = job
        self.devices = devices  # global ids in rank order
        self.clock = clock
        self.capability = capability
        self.channels = ChannelPool()
        self.fabric_ep = fabric
        # (endpoint, device ranges on that shard) for the job's devices
        self.shard_ranges: list[tuple[str, list[tuple[int, int]]]] = []
        for ep, start, end in shards:
            sel = devices[(devices >= start) & (devices < end)]
            if sel.size:
                self.shard_ranges.append((ep, _ranges(np.sort(sel))))
        # inline collectives (many per step): several calls spread over the window (scheduler/step_comm.py)
        self.collective_calls, self.call_samples = step_comm.expand(job.plan, self._collective_calls(), _copy_req)
        # HBM per chip of the plan's most loaded pipeline stage (weights, grads, optimizer state,
        # activations): the chips show it in use while the job holds them.
        self.memory_per_chip_bytes = int(job.plan.memory.total_bytes)

    def channel(self, ep: str) -> grpc.aio.Channel:
        return self.channels.get(ep)

    async def close(self) -> None:
        await self.channels.close()

    def _collective_calls(self) -> list[tuple[str, fabric_pb2.StartCollectiveRequest]]:
        spec = self.job.spec
        calls = []
        for d in self.job.plan.collectives:
            size, stride, _copies, offsets = rank_groups(spec, d.name)
            for run in arithmetic_runs(offsets):
                for ranks, count, group_stride in device_runs(self.devices, run, stride, size):
                    calls.append((d.name, fabric_pb2.StartCollectiveRequest(
                        op=OPS[d.op], ranks=convert.range_msgs(_ranges(ranks, keep_order=True)), bytes=d.bytes_,
                        traffic_class=fabric_pb2.TRAFFIC_CLASS_TRAINING, groups=count, group_stride=group_stride,
                        tag=self.job.name, repeats=step_comm.repeats(d),
                    )))
        return calls

    def _md(self) -> tuple[tuple[str, str], ...]:
        return call_metadata(capability=self.capability())

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying the job's capability."""
        return self._md()

    def work_items(self) -> list[chip_pb2.WorkItem]:
        """One step's work items for every chip of the job."""
        return chip_wire.work_msgs(self.job.plan.compute)

    async def flow_ends(self, names: list[str]) -> list[float]:
        """Actual end times of flow groups, watching those still running (StepFailed if one failed)."""
        try:
            return await self._wait_flows(names, []) if names else []
        except grpc.aio.AioRpcError as err:
            raise step_error(err) from err

    async def run_step(self, start_s: float) -> StepResult:
        """Run one step starting at virtual ``start_s``; returns when it has ended in virtual time."""
        job = self.job
        items = self.work_items()
        md = self._md()
        try:
            chip_res = await gather_or_cancel([
                chip_pb2_grpc.ChipServiceStub(self.channel(ep)).ExecuteWork(
                    chip_pb2.ExecuteWorkRequest(devices=convert.range_msgs(rs), items=items, not_before_s=start_s,
                                                tag=job.name, memory_in_use_bytes=self.memory_per_chip_bytes),
                    metadata=md, timeout=30)
                for ep, rs in self.shard_ranges])
            compute_s = max(r.end_s for r in chip_res) - start_s
            fabric = fabric_pb2_grpc.FabricServiceStub(self.channel(self.fabric_ep))
            fab_calls = []
            base_s = start_s + step_comm.late_shift_s(start_s, self.clock.now(), self.clock.lag_wall_s(start_s))
            for (name, req), k in zip(self.collective_calls, self.call_samples, strict=True):
                req.not_before_s = base_s + step_comm.offset_s(job.plan, name, k, compute_s)
                fab_calls.append(fabric.StartCollective(req, metadata=md, timeout=30))
            fab_res = await gather_or_cancel(fab_calls)
        except grpc.aio.AioRpcError as err:
            raise step_error(err) from err
        above = float(sum(r.energy_j for r in chip_res))
        # Collectives: wait for the actual ends (other traffic may slow them after the prediction).
        names = [n for n, _ in self.collective_calls]
        preds = [r.predicted_end_s for r in fab_res]
        first_bd = self._compose(compute_s, names, fab_res, [r.predicted_end_s for r in fab_res], start_s)
        await self.clock.sleep_until(start_s + first_bd.step_time_s)
        finals: list[float] = []
        if fab_res:
            try:
                finals = await self._wait_flows([r.name for r in fab_res], preds)
            except grpc.aio.AioRpcError as err:
                raise step_error(err) from err
        step_comm.log_samples(job.name, start_s, names, self.call_samples, [r.start_s for r in fab_res], finals)
        bd = self._compose(compute_s, names, fab_res, finals, start_s)
        await self.clock.sleep_until(start_s + bd.step_time_s)
        comm = step_comm.demand_s(job.plan, step_comm.per_call_s(names, self.call_samples,
                                                                  [r.start_s for r in fab_res], finals))
        calls = tuple((r.start_s, end) for r, end in zip(fab_res, finals, strict=True)) if fab_res else ()
        return StepResult(start_s, bd, above, comm, calls, compute_s)

    def _compose(self, compute_s: float, names: list[str], fab_res: Sequence[fabric_pb2.StartCollectiveResponse],
                 ends: list[float], start_s: float) -> StepBreakdown:
        per = step_comm.per_call_s(names, self.call_samples, [r.start_s for r in fab_res], ends)
        return compose_step(self.job.plan, compute_s, step_comm.demand_s(self.job.plan, per))

    async def _wait_flows(self, names: list[str], preds: list[float]) -> list[float]:
        """Actual end times of flow groups (watching those still running)."""
        fabric = fabric_pb2_grpc.FabricServiceStub(self.channel(self.fabric_ep))
        md = self._md()
        ends: dict[str, float] = {}
        got = await asyncio.gather(*(fabric.GetFlow(fabric_pb2.GetFlowRequest(name=n), metadata=md, timeout=30)
                                     for n in names))
        for n, r in zip(names, got, strict=True):
            if r.flow.state == fabric_pb2.Flow.STATE_DONE:
                ends[n] = r.flow.end_s
            elif r.flow.state == fabric_pb2.Flow.STATE_FAILED:
                raise StepFailed(f"collective {n} failed: {r.flow.error}", effect="network")
        pending = [n for n in names if n not in ends]
        if pending:
            async for upd in fabric.WatchFlows(fabric_pb2.WatchFlowsRequest(names=pending), metadata=md, timeout=3600):
                f = upd.flow
                if f.state == fabric_pb2.Flow.STATE_DONE:
                    ends[f.name] = f.end_s
                elif f.state == fabric_pb2.Flow.STATE_FAILED:
                    raise StepFailed(f"collective {f.name} failed: {f.error}", effect="network")
                if all(n in ends for n in names):
                    break
        return [ends[n] for n in names]


def step_energy_it_j(job: JobRecord, res: StepResult, chip: Chip | None = None) -> float:
    """IT energy of one step for the whole job: the same terms as ``estimate_train``.

    Chips at idle power for the step plus what the chip service booked above idle, the host
    share per chip, and link energy for the bytes the step's collectives move.
    """
    chip = job.spec.chip_spec() if chip is None else chip
    step = res.breakdown.step_time_s
    up, out = link_bytes(job.plan)
    n = job.spec.count
    return n * (chip.idle_w + host_overhead_w()) * step + res.above_idle_j + n * link_energy_j(up, out)


def account(job: JobRecord, res: StepResult) -> None:
    """Fold one finished step into the job's progress, energy and cost (a window's steps come here one by one
    when it ends, thousands at once: the chip is looked up once a step)."""
    bd = res.breakdown
    spec = job.spec
    chip = spec.chip_spec()
    job.step += 1
    job.tokens += spec.tokens_per_step
    job.last_step_time_s = bd.step_time_s
    job.run_s += bd.step_time_s
    job.compute_s_sum += bd.compute_s
    job.exposed_comm_s_sum += bd.exposed_comm_s
    job.bubble_s_sum += bd.bubble_s
    peak = chip.peak_flops(spec.precision)
    job.mfu = job.plan.model_flops_per_step / spec.count / bd.step_time_s / peak
    e = step_energy_it_j(job, res, chip)
    job.energy_it_j += e
    job.energy_facility_j += e * spec.pue
    job.chip_hours += spec.count * bd.step_time_s / 3600.0
    cost = job_cost(chip, spec.count, job.run_s, job.energy_facility_j,
                    energy_price_usd_per_kwh=spec.energy_price_usd_per_kwh
                    if spec.energy_price_usd_per_kwh is not None else facility().energy_price_usd_per_kwh)
    job.cost_usd = cost.total_usd


async def gather_or_cancel(calls: list[Any]) -> list[Any]:
    """Results of RPC calls in order; on the first failure the others are cancelled, so a retry of the step
    never piles on calls of this attempt still running (the fabric drops a cancelled call's planning)."""
    try:
        return list(await asyncio.gather(*calls))
    except BaseException:
        for c in calls:
            c.cancel()
        raise


def _copy_req(req: fabric_pb2.StartCollectiveRequest) -> fabric_pb2.StartCollectiveRequest:
    out = fabric_pb2.StartCollectiveRequest()
    out.CopyFrom(req)
    return out


def _ranges(ids: np.ndarray, *, keep_order: bool = False) -> list[tuple[int, int]]:
    """Compress ids into [start, end) runs (in the given order when ``keep_order``)."""
    ids = np.asarray(ids, dtype=np.int64)
    if ids.size == 0:
        return []
    if not keep_order:
        ids = np.sort(ids)
    breaks = np.flatnonzero(np.diff(ids) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [ids.size]))
    return [(int(ids[a]), int(ids[b - 1]) + 1) for a, b in zip(starts, ends, strict=True)]


def step_error(err: grpc.aio.AioRpcError) -> Exception:
    """A failed mesh call as what the scheduler does about it: StepFailed (a job fault, uses a restart),
    Unavailable (wait and retry), CapabilityRejected (refresh) or FailedPrecondition."""
    if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
        info = error_info(err)
        dev = info.metadata.get("device") if info is not None else None
        devices = [int(dev)] if dev is not None and dev.lstrip("-").isdigit() else []
        return StepFailed((err.details() or "device failed")[:160], devices, "device" if devices else "network")
    # CANCELLED here is the server's doing (a service shutting down ends its calls; our own
    # cancellation raises asyncio.CancelledError instead): wait for it like any outage.
    if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return Unavailable(f"service unavailable during a step: {(err.details() or '')[:120]}")
    if err.code() == grpc.StatusCode.NOT_FOUND:
        # a flow group the fabric no longer knows: it restarted mid-step; the step runs again
        return Unavailable(f"a service lost the step's state (restarted?): {(err.details() or '')[:120]}")
    if err.code() in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return CapabilityRejected(f"{err.code().name}: {(err.details() or '')[:120]}")
    return FailedPrecondition(f"step rejected by the mesh: {err.code().name}: {(err.details() or '')[:120]}")


_step_error = step_error  # the name tests and older callers use
