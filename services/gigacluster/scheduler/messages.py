"""The scheduler's wire messages: a Job, a Queue, a trace and a tenant's usage from the domain records,
and a Queue message checked into a :class:`QueueSpec`. The one place the scheduler builds its protos."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from gigacluster.common.v1 import common_pb2
from gigacluster.errors import InvalidArgument
from gigacluster.hw.catalog import chip_names
from gigacluster.scheduler.core import JobRecord, State
from gigacluster.scheduler.policy import QueueSpec
from gigacluster.scheduler.spec import show, spec_to_proto
from gigacluster.scheduler.v1 import scheduler_pb2

QUEUE_NAME_RE = re.compile(r"^tenants/([a-z0-9][a-z0-9-]{0,39})/queues/([a-z0-9][a-z0-9-]{0,62})$")
COHORT_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
RUN_STATES = (State.PLACING, State.RUNNING, State.CHECKPOINTING)


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
        bubble_s=job.bubble_s_sum / n, mean_step_time_s=job.run_s / ran if (ran := job.step + job.lost_steps) else 0.0,
        preemptions=job.preemptions, lost_steps=job.lost_steps, lost_s=job.lost_s,
        checkpoint_pause_s=job.checkpoint_pause_s, restart_s=job.restart_s, borrowing=job.borrowing,
        placement_domains=job.placement_domains if running else 0,
        placement_leaf_groups=job.placement_leaf_groups if running else 0,
        dp_spine_crossings=job.dp_spine_crossings if running else 0,
        estimated_end_s=(now_s + job.eta_s) if running else 0.0,
        reserved_start_s=job.reserved_start_s if job.state == State.QUEUED else 0.0, failures=job.failures,
        performance_alert=job.performance_alert if running else "", slowdown=job.slowdown if running else 0.0,
    )


class JobMessages:
    """Job messages with each job's spec converted once (a spec never changes after submission)."""

    def __init__(self) -> None:
        self._spec_msgs: dict[str, scheduler_pb2.TrainingSpec] = {}

    def job(self, job: JobRecord, now_s: float) -> scheduler_pb2.Job:
        spec = self._spec_msgs.get(job.job_id)
        if spec is None:
            spec = self._spec_msgs[job.job_id] = spec_to_proto(job.spec_dict)
        return job_msg(job, spec, now_s)


def queue_msg(q: QueueSpec, jobs: Iterable[JobRecord]) -> scheduler_pb2.Queue:
    used: dict[str, int] = {}
    borrowed: dict[str, int] = {}
    for j in jobs:
        if j.tenant == q.tenant and j.queue == q.queue and j.state in RUN_STATES and j.instance:
            used[j.spec.chip] = used.get(j.spec.chip, 0) + j.spec.count
            if j.borrowing:
                borrowed[j.spec.chip] = borrowed.get(j.spec.chip, 0) + j.spec.count
    return scheduler_pb2.Queue(name=f"{q.tenant}/queues/{q.queue}", cohort=q.cohort, quota=dict(q.quota),
                               used=used, borrowed=borrowed)


def queue_spec(q: scheduler_pb2.Queue) -> QueueSpec:
    """A Queue message checked (name, cohort, quota per known chip) into the dispatcher's QueueSpec."""
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
    return QueueSpec(f"tenants/{m.group(1)}", m.group(2), q.cohort,
                     tuple(sorted((c, int(n)) for c, n in q.quota.items())))


def trace_msg(job: JobRecord, steps: Iterable[tuple[int, Any]]) -> scheduler_pb2.GetJobTraceResponse:
    spec, plan = job.spec, job.plan
    out = [scheduler_pb2.StepTrace(
        step=n, start_s=r.start_s, step_time_s=r.breakdown.step_time_s, compute_s=r.breakdown.compute_s,
        exposed_comm_s=r.breakdown.exposed_comm_s, bubble_s=r.breakdown.bubble_s, comm_s=dict(r.comm_s))
        for n, r in steps]
    return scheduler_pb2.GetJobTraceResponse(
        name=job.name, tp=spec.tp, pp=spec.pp, dp=spec.dp, cp=spec.cp, microbatches=plan.microbatches,
        virtual_stages=plan.virtual_stages, steps=out)


def usage_msg(tenant: str, jobs: Iterable[JobRecord], weight: float) -> scheduler_pb2.GetTenantUsageResponse:
    """A tenant's usage, running jobs and share of all chip-hours."""
    every = list(jobs)
    mine = [j for j in every if j.tenant == tenant]
    total_h = sum(j.chip_hours for j in every)
    run = [j for j in mine if j.state in RUN_STATES and j.instance]
    usage = common_pb2.Usage(energy_it_j=sum(j.energy_it_j for j in mine),
                             energy_facility_j=sum(j.energy_facility_j for j in mine),
                             chip_hours=sum(j.chip_hours for j in mine), cost_usd=sum(j.cost_usd for j in mine))
    return scheduler_pb2.GetTenantUsageResponse(
        tenant=tenant, usage=usage, jobs=len(mine), running_jobs=len(run),
        running_chips=sum(j.spec.count for j in run), weight=weight,
        chip_hours_share=usage.chip_hours / total_h if total_h else 0.0)
