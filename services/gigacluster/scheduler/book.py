"""The job book: every job record, its state transitions and who is told about them.

One place owns a job's durable life: records and their submission order (``seq``), the queued-job
index the dispatcher reads, counts per state, idempotency keys, job ids (never repeated across
restarts), persistence through :mod:`scheduler.store`, watchers and telemetry on every change, and
the per-job history the runner adds to (chip-seconds per tenant, step traces, the model's expected
step). No gRPC: the servicer and the dispatcher call these methods.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import itertools
import json
from collections import deque
from collections.abc import Iterable
from typing import Any

import structlog

from gigacluster.errors import InvalidArgument, NotFound, ResourceExhausted
from gigacluster.runtime.auth import Principal
from gigacluster.runtime.clock import VirtualClock
from gigacluster.runtime.telemetry import Telemetry
from gigacluster.scheduler import checkpoint
from gigacluster.scheduler.core import TERMINAL, JobRecord, State, cached_estimate, cached_plan, parse_spec
from gigacluster.scheduler.diagnose import Expected
from gigacluster.scheduler.policy import Pending, QueueSpec
from gigacluster.scheduler.spec import show
from gigacluster.scheduler.store import JobStore

log = structlog.get_logger()
TRACE_STEPS = 2000  # steps kept per job for GetJobTrace (bounded memory)


class JobBook:
    """Job records, their states and their history; ``kick`` is set when the dispatcher's inputs change."""

    def __init__(self, store: JobStore, clock: VirtualClock, telemetry: Telemetry, max_queued_per_tenant: int) -> None:
        self.store = store
        self.clock = clock
        self.telemetry = telemetry
        self.max_queued_per_tenant = max_queued_per_tenant
        self.jobs: dict[str, JobRecord] = {}
        self.seq: dict[str, int] = {}
        self.queues: dict[tuple[str, str], QueueSpec] = {}
        # Queued jobs (insertion order) with their dispatcher view, and counts per tenant: a dispatch
        # pass and the admission check never scan every job the scheduler has ever seen.
        self.queued: dict[str, Pending] = {}
        self.queued_per_tenant: dict[str, int] = {}
        self.state_counts: collections.Counter[State] = collections.Counter()  # kept by index()
        self.usage_s: dict[str, float] = {}  # chip-seconds run per tenant (fair share), kept as steps end
        self.kick = asyncio.Event()
        self._expected: dict[str, Expected] = {}
        self._traces: dict[str, deque[Any]] = {}
        self._ids = itertools.count(1)
        self._watchers: dict[str, set[asyncio.Queue[tuple[str, str, JobRecord | None]]]] = {}
        self._idempotency: dict[tuple[str, str], str] = {}

    # -- durable state ----------------------------------------------------------------------------
    def recover(self) -> list[str]:
        """Reload jobs and queues after a restart; running ones resume from their last checkpoint.
        Returns the instances those jobs held (to release: the scheduler that held them died)."""
        orphans: list[str] = []
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
                lost = job.charge_lost_work()
                job.rewind()
                job.state = State.QUEUED
                job.resume_pending = job.step > 0 or job.resume_pending
                job.reason = f"scheduler restarted; resuming from checkpoint at step {job.step} ({lost} steps lost)"
                if job.instance:
                    orphans.append(job.instance)
                job.instance = ""
                self.store.save(job, seq)
            self.index(job, None)
            self.usage_s[job.tenant] = self.usage_s.get(job.tenant, 0.0) + job.chip_hours * 3600.0
        if self.jobs:
            nums = [int(j.removeprefix("j-")) for j in self.jobs if j.startswith("j-") and j[2:].isdigit()]
            self._ids = itertools.count(max(nums, default=0) + 1)
            log.info("recovered jobs", jobs=len(self.jobs), queues=len(self.queues))
        self.kick.set()
        return orphans

    def save(self, job: JobRecord) -> None:
        self.store.save(job, self.seq[job.job_id])

    def save_queues(self) -> None:
        self.store.set_meta("queues", json.dumps([
            {"tenant": q.tenant, "queue": q.queue, "cohort": q.cohort, "quota": dict(q.quota)}
            for q in self.queues.values()]))

    def put_queue(self, spec: QueueSpec) -> None:
        """Create or replace a queue's quota (durable), and ask for a pass."""
        self.queues[(spec.tenant, spec.queue)] = spec
        self.save_queues()
        self.kick.set()

    # -- submission -------------------------------------------------------------------------------
    def prior(self, tenant: str, request_id: str) -> JobRecord | None:
        """The job an earlier submission with this idempotency key created, if any."""
        if not request_id:
            return None
        job_id = self._idempotency.get((tenant, request_id))
        return None if job_id is None else self.jobs[job_id]

    def new_id(self) -> str:
        return f"j-{next(self._ids)}"

    def add(self, job: JobRecord, expected: Expected, request_id: str = "") -> None:
        """Record a newly submitted job (durable, indexed, watchers told) and ask for a pass."""
        self.jobs[job.job_id] = job
        # The same estimate serves performance-loss detection (no second estimate per job).
        self._expected[job.job_id] = expected
        self.seq[job.job_id] = int(job.job_id[2:])
        if request_id:
            self._idempotency[(job.tenant, request_id)] = job.job_id
        self.save(job)
        self.index(job, None)
        self.notify(job, "state", "submitted")
        self.kick.set()

    def admit(self, tenant: str) -> None:
        """Refuse a submission past the tenant's bound on queued jobs (RESOURCE_EXHAUSTED)."""
        n = self.queued_per_tenant.get(tenant, 0)
        if n >= self.max_queued_per_tenant:
            raise ResourceExhausted(f"{tenant} has {n} queued jobs, the most allowed (max_queued_per_tenant); "
                                    f"wait for some to start or cancel some", retry_after_s=5.0,
                                    reason="TOO_MANY_QUEUED_JOBS", limit=self.max_queued_per_tenant)

    # -- transitions ------------------------------------------------------------------------------
    def notify(self, job: JobRecord, kind: str, message: str = "", *, publish: bool = True,
               snapshot: bool = False) -> None:
        """Tell watchers (with a copy of the job as it is now when ``snapshot``: a window's steps are told
        one after the other at once) and, when ``publish``, MQTT; a state change is saved."""
        watchers = self._watchers.get(job.job_id, ())
        snap = copy.copy(job) if snapshot and watchers else None
        for q in watchers:
            if not q.full():  # a watcher that stopped reading loses updates, never the scheduler
                q.put_nowait((kind, message, snap))
        if kind == "state":
            self.save(job)
        if not publish:
            return
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
        # queue, or ending (its chips come back through a release, which kicks as well). A running
        # job's checkpoints do not.
        if to == State.QUEUED or before == State.QUEUED or to in TERMINAL:
            self.kick.set()

    def index(self, job: JobRecord, before: State | None) -> None:
        """Keep the queued-job index in step with ``job.state`` (``before``: its previous state, None if new)."""
        if before is not None:
            self.state_counts[before] -= 1
        self.state_counts[job.state] += 1
        was, now_q = before == State.QUEUED, job.state == State.QUEUED
        if was == now_q:
            return
        n = self.queued_per_tenant.get(job.tenant, 0) + (1 if now_q else -1)
        self.queued_per_tenant[job.tenant] = n
        if now_q:
            self.queued[job.job_id] = self._pending(job)
        else:
            self.queued.pop(job.job_id, None)

    def _pending(self, job: JobRecord) -> Pending:
        """The dispatcher's view of a queued job (fixed while it stays queued: its step does not move)."""
        left = max(job.steps_total - job.step, 0) * job.mean_step_s()
        duration = left + (checkpoint.restart_s(job.spec) if job.resume_pending else 0.0)
        return Pending(job.job_id, job.tenant, job.queue, job.priority, self.seq[job.job_id], job.spec.chip,
                       job.spec.count, job.spec.tp, duration)

    # -- reading ----------------------------------------------------------------------------------
    def visible(self, p: Principal, name: str) -> JobRecord:
        if not name.startswith("jobs/") or not 5 < len(name) <= 64:  # ids are short: j-<n>
            raise InvalidArgument("name", f"must look like 'jobs/<id>', got {show(name)}")
        job = self.jobs.get(name.removeprefix("jobs/"))
        if job is None or (not p.privileged and job.tenant != p.tenant):
            raise NotFound(name)
        return job

    def watch(self, job: JobRecord) -> asyncio.Queue[tuple[str, str, JobRecord | None]]:
        q: asyncio.Queue[tuple[str, str, JobRecord | None]] = asyncio.Queue(maxsize=10_000)
        self._watchers.setdefault(job.job_id, set()).add(q)
        return q

    def unwatch(self, job: JobRecord, q: asyncio.Queue[tuple[str, str, JobRecord | None]]) -> None:
        self._watchers.get(job.job_id, set()).discard(q)

    def expected(self, job: JobRecord) -> Expected:
        """The model's step for this job on an idle cluster (cached)."""
        exp = self._expected.get(job.job_id)
        if exp is None:
            est = cached_estimate(job.spec)
            exp = self._expected[job.job_id] = Expected(est.step_time_s, est.breakdown.compute_s, dict(est.comm_s))
        return exp

    # -- history ----------------------------------------------------------------------------------
    def record_step(self, job: JobRecord, res: Any) -> None:
        """A finished step: its chip-seconds count toward the tenant's fair share; its trace is kept."""
        step_chip_s = job.spec.count * res.breakdown.step_time_s
        self.usage_s[job.tenant] = self.usage_s.get(job.tenant, 0.0) + step_chip_s
        self._traces.setdefault(job.job_id, deque(maxlen=TRACE_STEPS)).append((job.step, res))

    def trace(self, job: JobRecord) -> Iterable[tuple[int, Any]]:
        """The job's last ``TRACE_STEPS`` steps as (step, result)."""
        return self._traces.get(job.job_id, ())
