"""The scheduler service: its parts composed, and its thin gRPC servicer.

The parts (no gRPC server code in any of them):

- :mod:`scheduler.book`: job records, state transitions, persistence, watchers, idempotency, ids;
- :mod:`scheduler.cluster`: the cluster as the broker, chip shards and fabric report it;
- :mod:`scheduler.dispatch`: each pass snapshots the cluster, decides (:mod:`scheduler.policy`) in a
  worker thread and applies the decision: gangs allocated as exactly the devices the configured
  placement policy chose (all chips or none), evictions checkpoint and requeue, waiting jobs say why;
- :mod:`scheduler.supervise`: each placed job's step loop (:mod:`scheduler.runner` for a step),
  checkpoints, failures and restarts (:mod:`scheduler.checkpoint`; failures come from the mesh, :mod:`faults`);
- :mod:`scheduler.messages`: every message the servicer answers with.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import structlog

from gigacluster.errors import InvalidArgument, PermissionDenied
from gigacluster.runtime import convert
from gigacluster.runtime.auth import Principal
from gigacluster.runtime.clock import busy as clock_busy
from gigacluster.runtime.config import SchedulerConfig
from gigacluster.runtime.errors import grpc_errors
from gigacluster.runtime.metrics import FunctionCollector, counter, gauge
from gigacluster.runtime.server import Service
from gigacluster.scheduler import messages
from gigacluster.scheduler.book import JobBook
from gigacluster.scheduler.cluster import ClusterView
from gigacluster.scheduler.core import JobRecord, State, cached_estimate, validate_submission
from gigacluster.scheduler.diagnose import CAUSES, Expected
from gigacluster.scheduler.dispatch import Dispatcher
from gigacluster.scheduler.placement import get_policy
from gigacluster.scheduler.policy import QueueSpec
from gigacluster.scheduler.spec import SpecBounds, check_bounds, proto_to_spec, show
from gigacluster.scheduler.store import JobStore
from gigacluster.scheduler.supervise import JobSupervisor, PeerLost
from gigacluster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

__all__ = ["PeerLost", "SchedulerService", "SchedulerServicer"]

log = structlog.get_logger()


class SchedulerService(Service[SchedulerConfig]):
    """Composes the book, the cluster view, the supervisor and the dispatcher; answers what the servicer asks."""

    name = "scheduler"

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.registry.register(FunctionCollector(self.metrics))
        self.auth = self.broker_auth()
        self.bounds = SpecBounds(max_chips=config.max_job_chips, max_global_batch=config.max_global_batch,
                                 max_steps=config.max_job_steps)
        path = pathlib.Path(config.state_dir) / "scheduler.db" if config.state_dir else None
        self.book = JobBook(JobStore(path), self.clock, self.telemetry, config.max_queued_per_tenant)
        self.cluster = ClusterView(config, self.auth, self.book)
        policy = get_policy(config.placement)
        # The config load checked the name; a model installed as an entry point is built the same way.
        self.supervisor = JobSupervisor(config, self.clock, self.telemetry, self.book, self.cluster)
        self.dispatcher = Dispatcher(config, self.clock, self.book, self.cluster, self.supervisor, policy)

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(SchedulerServicer(self), server)
        return [scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name]

    async def start(self) -> None:
        await super().start()
        self.cluster.orphans += self.book.recover()
        self.spawn(self.dispatcher.loop(), "dispatch")
        self.every(self.config.telemetry_interval_s, self._publish_stats, "stats")

    async def stop(self) -> None:
        self.supervisor.cancel_all()
        await super().stop()
        await self.auth.close()
        self.book.store.close()

    async def _publish_stats(self) -> None:
        # From the kept counts and the placed gangs: a stats tick never walks every job.
        jobs = self.book.jobs
        counts = {st.name: n for st, n in self.book.state_counts.items() if n}
        self.telemetry.publish("stats", {"t_s": self.clock.now(), "jobs": counts,
                                         "running_chips": sum(jobs[j].spec.count for j in self.supervisor.gangs
                                                              if jobs[j].state == State.RUNNING),
                                         "quarantined_chips": len(self.cluster.bad)})

    def metrics(self) -> list[Any]:
        """Jobs by state, per running job its step time, model step time and slowdown, and loss events."""
        jobs = gauge("gigacluster_jobs", "Jobs by state.", ["state"])
        counts: dict[str, int] = {s.name.lower(): self.book.state_counts.get(s, 0) for s in State}
        for st_name, c in counts.items():
            jobs.add_metric([st_name], float(c))
        step = gauge("gigacluster_job_step_time_seconds", "Last step time of a running job.", ["job", "tenant"])
        model = gauge("gigacluster_job_predicted_step_time_seconds", "Model step time of a running job.",
                      ["job", "tenant"])
        slow = gauge("gigacluster_job_slowdown", "Step time over the model's, minus 1 (0 when on model).",
                     ["job", "tenant"])
        for j in (self.book.jobs[i] for i in self.supervisor.gangs):
            if j.state == State.RUNNING:
                step.add_metric([j.name, j.tenant], j.last_step_time_s)
                model.add_metric([j.name, j.tenant], j.predicted_step_time_s)
                slow.add_metric([j.name, j.tenant], j.slowdown)
        loss = counter("gigacluster_performance_loss_events_total", "Performance-loss diagnoses by cause.", ["cause"])
        for cause in CAUSES:
            loss.add_metric([cause], float(self.supervisor.loss_events.get(cause, 0)))
        return [jobs, step, model, slow, loss]

    # -- what the servicer asks -------------------------------------------------------------------
    async def submit(self, p: Principal, request: scheduler_pb2.SubmitJobRequest) -> JobRecord:
        """A tenant's submission: bounds, admission and the model's checks, then a queued job
        (the earlier job when ``request_id`` repeats)."""
        if p.kind != "tenant":
            raise PermissionDenied("jobs belong to tenants: submit with a tenant's API key", reason="TENANT_ONLY")
        if not request.HasField("spec"):
            raise InvalidArgument("spec", "required: the training spec (model, batch, parallelism, hardware, steps)")
        prior = self.book.prior(p.tenant, request.request_id)
        if prior is not None:
            return prior
        check_bounds(request, self.bounds)  # every sizing field, before any model work
        self.book.admit(p.tenant)
        spec_dict = proto_to_spec(request.spec)
        chips = await self.cluster.cluster_chips()

        def model() -> tuple[Any, Any, int, Any]:
            spec, plan, steps = validate_submission(
                spec_dict, priority=request.priority, checkpoint_interval_steps=int(request.checkpoint_interval_steps),
                max_restarts=int(request.max_restarts), cluster_chips=chips)
            return spec, plan, steps, cached_estimate(spec)

        # The model's work (parse, plan, estimate: ~30 ms for a new spec, cached for a repeated one)
        # runs off the event loop, so other tenants' calls are not queued behind it.
        with clock_busy():  # the event clock holds time while the thread works
            spec, plan, steps, est = await asyncio.to_thread(model)
        job_id = self.book.new_id()
        job = JobRecord(
            job_id=job_id, tenant=p.tenant, display_name=request.display_name or job_id,
            queue=request.queue or "default", priority=int(request.priority), spec_dict=spec_dict, spec=spec,
            plan=plan, steps_total=steps, checkpoint_interval_steps=int(request.checkpoint_interval_steps),
            max_restarts=int(request.max_restarts), created_s=self.clock.now(),
            predicted_step_time_s=est.step_time_s, reason="queued",
        )
        log.info("job submitted", job=job.name, tenant=p.tenant, chips=spec.count, steps=steps)
        self.book.add(job, Expected(est.step_time_s, est.breakdown.compute_s, dict(est.comm_s)), request.request_id)
        return job

    def list_jobs(self, p: Principal, tenant: str, state: int) -> list[JobRecord]:
        """The jobs ``p`` may see, of ``tenant`` (all it may see when empty) in ``state`` (any when 0), newest first."""
        if tenant and not p.privileged and tenant != p.tenant:
            raise PermissionDenied("only the admin lists another tenant's jobs", reason="OTHER_TENANT")
        if state and state not in scheduler_pb2.Job.State.values():
            raise InvalidArgument("state", f"unknown state {state}")
        who = tenant or (None if p.privileged else p.tenant)
        jobs = [j for j in self.book.jobs.values()
                if (who is None or j.tenant == who) and (not state or int(j.state) == state)]
        jobs.sort(key=lambda j: -self.book.seq[j.job_id])
        return jobs

    async def cancel(self, p: Principal, name: str) -> JobRecord:
        job = self.book.visible(p, name)
        self.book.set_state(job, State.CANCELLED, f"cancelled by {p.tenant or p.kind}")
        if job.job_id not in self.supervisor.tasks:  # a running job's supervisor releases its gang
            await self.cluster.release(job)
        return job

    def update_queue(self, p: Principal, q: scheduler_pb2.Queue) -> QueueSpec:
        if not p.privileged:
            raise PermissionDenied("only the admin sets queue quotas", reason="ADMIN_ONLY")
        spec = messages.queue_spec(q)
        self.book.put_queue(spec)
        log.info("queue updated", queue=q.name, cohort=q.cohort, quota=dict(q.quota))
        return spec

    def visible_queues(self, p: Principal) -> list[QueueSpec]:
        return sorted((q for q in self.book.queues.values() if p.privileged or q.tenant == p.tenant),
                      key=lambda q: (q.tenant, q.queue))

    def queue_msg(self, q: QueueSpec) -> scheduler_pb2.Queue:
        return messages.queue_msg(q, self.book.jobs.values())

    async def tenant_usage(self, p: Principal, tenant: str) -> scheduler_pb2.GetTenantUsageResponse:
        tenant = tenant or p.tenant
        if not tenant:
            raise InvalidArgument("tenant", "required for the admin: 'tenants/<id>'")
        if not tenant.startswith("tenants/") or len(tenant) <= 8:
            raise InvalidArgument("tenant", f"must look like 'tenants/<id>', got {show(tenant)}")
        if not p.privileged and tenant != p.tenant:
            raise PermissionDenied("only the admin reads another tenant's usage", reason="OTHER_TENANT")
        return messages.usage_msg(tenant, self.book.jobs.values(), await self.cluster.weight(tenant))


@grpc_errors(scheduler_pb2_grpc.SchedulerServiceServicer)
class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    """Authenticate, call the service, answer with :mod:`scheduler.messages`."""

    def __init__(self, svc: SchedulerService) -> None:
        self.svc = svc
        self.book = svc.book
        self.msgs = messages.JobMessages()

    def _msg(self, job: JobRecord) -> scheduler_pb2.Job:
        return self.msgs.job(job, self.svc.clock.now())

    async def SubmitJob(self, request: scheduler_pb2.SubmitJobRequest,
                        context: grpc.aio.ServicerContext) -> scheduler_pb2.SubmitJobResponse:
        p = await self.svc.auth.principal(context)
        return scheduler_pb2.SubmitJobResponse(job=self._msg(await self.svc.submit(p, request)))

    async def GetJob(self, request: scheduler_pb2.GetJobRequest,
                     context: grpc.aio.ServicerContext) -> scheduler_pb2.GetJobResponse:
        p = await self.svc.auth.principal(context)
        return scheduler_pb2.GetJobResponse(job=self._msg(self.book.visible(p, request.name)))

    async def ListJobs(self, request: scheduler_pb2.ListJobsRequest,
                       context: grpc.aio.ServicerContext) -> scheduler_pb2.ListJobsResponse:
        p = await self.svc.auth.principal(context)
        jobs = self.svc.list_jobs(p, request.tenant, int(request.state))
        items, token = convert.page(jobs, request.page_size, request.page_token)
        return scheduler_pb2.ListJobsResponse(jobs=[self._msg(j) for j in items], next_page_token=token)

    async def CancelJob(self, request: scheduler_pb2.CancelJobRequest,
                        context: grpc.aio.ServicerContext) -> scheduler_pb2.CancelJobResponse:
        p = await self.svc.auth.principal(context)
        return scheduler_pb2.CancelJobResponse(job=self._msg(await self.svc.cancel(p, request.name)))

    async def WatchJob(self, request: scheduler_pb2.WatchJobRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[scheduler_pb2.WatchJobResponse]:
        p = await self.svc.auth.principal(context)
        job = self.book.visible(p, request.name)
        q = self.book.watch(job)
        try:
            yield scheduler_pb2.WatchJobResponse(job=self._msg(job), kind="state", message=job.reason)
            while not job.terminal or not q.empty():  # a window's steps are queued as copies: send them all
                kind, message, snap = await q.get()
                yield scheduler_pb2.WatchJobResponse(job=self._msg(snap or job), kind=kind, message=message)
        finally:
            self.book.unwatch(job, q)

    async def UpdateQueue(self, request: scheduler_pb2.UpdateQueueRequest,
                          context: grpc.aio.ServicerContext) -> scheduler_pb2.UpdateQueueResponse:
        p = await self.svc.auth.principal(context)
        return scheduler_pb2.UpdateQueueResponse(queue=self.svc.queue_msg(self.svc.update_queue(p, request.queue)))

    async def ListQueues(self, request: scheduler_pb2.ListQueuesRequest,
                         context: grpc.aio.ServicerContext) -> scheduler_pb2.ListQueuesResponse:
        p = await self.svc.auth.principal(context)
        items, token = convert.page(self.svc.visible_queues(p), request.page_size, request.page_token)
        return scheduler_pb2.ListQueuesResponse(queues=[self.svc.queue_msg(q) for q in items], next_page_token=token)

    async def GetJobTrace(self, request: scheduler_pb2.GetJobTraceRequest,
                          context: grpc.aio.ServicerContext) -> scheduler_pb2.GetJobTraceResponse:
        p = await self.svc.auth.principal(context)
        job = self.book.visible(p, request.name)
        return messages.trace_msg(job, self.book.trace(job))

    async def GetTenantUsage(self, request: scheduler_pb2.GetTenantUsageRequest,
                             context: grpc.aio.ServicerContext) -> scheduler_pb2.GetTenantUsageResponse:
        p = await self.svc.auth.principal(context)
        return await self.svc.tenant_usage(p, request.tenant)
