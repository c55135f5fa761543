"""The scheduler's gRPC layer and its dispatcher.

The dispatcher places queued jobs in priority order (FIFO within a priority) as gangs: all of a
job's chips come from one broker ``AllocateInstance`` or none do, and a job that cannot be placed
says why in ``reason``. Each placed job runs in its own task (:mod:`scheduler.runner`).
"""

from __future__ import annotations

import asyncio
import itertools
import pathlib
import time
from typing import Any

import grpc
import numpy as np
import structlog

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.common.v1 import common_pb2
from gigacluster.errors import InvalidArgument, NotFound, PermissionDenied, Unavailable
from gigacluster.hw.catalog import get_system
from gigacluster.runtime import convert
from gigacluster.runtime.auth import BrokerAuth, Principal, call_metadata
from gigacluster.runtime.config import SchedulerConfig
from gigacluster.runtime.errors import grpc_errors
from gigacluster.runtime.server import Service
from gigacluster.scheduler.core import TERMINAL, JobRecord, State, validate_submission
from gigacluster.scheduler.runner import JobRunner, StepFailed, account
from gigacluster.scheduler.spec import proto_to_spec
from gigacluster.scheduler.store import JobStore
from gigacluster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc

log = structlog.get_logger()


class SchedulerService(Service[SchedulerConfig]):
    name = "scheduler"

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.auth = BrokerAuth(config.broker, cluster=config.cluster, service_key=config.service_key)
        self.jobs: dict[str, JobRecord] = {}
        self.seq: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._watchers: dict[str, set[asyncio.Queue[tuple[str, str]]]] = {}
        self._kick = asyncio.Event()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._inventory: broker_pb2.GetInventoryResponse | None = None
        self._idempotency: dict[tuple[str, str], str] = {}
        path = pathlib.Path(config.state_dir) / "scheduler.db" if config.state_dir else None
        self.store = JobStore(path)

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
        """Reload jobs after a restart; running ones resume from their last checkpoint."""
        from gigacluster.model.training import TrainSpec, plan_step

        for seq, d in self.store.load():
            spec = TrainSpec.from_dict(d["spec_dict"])
            job = JobRecord(spec=spec, plan=plan_step(spec), **d)
            self.jobs[job.job_id] = job
            self.seq[job.job_id] = seq
            if job.state not in TERMINAL and job.state not in (State.QUEUED,):
                lost = job.step - job.last_checkpoint_step
                job.step = job.last_checkpoint_step
                job.tokens = job.step * spec.tokens_per_step
                job.state = State.QUEUED
                job.reason = f"scheduler restarted; resuming from checkpoint at step {job.step} ({lost} steps lost)"
                job.instance = ""
                self.store.save(job, seq)
        if self.jobs:
            nums = [int(j.removeprefix("j-")) for j in self.jobs if j.startswith("j-") and j[2:].isdigit()]
            self._ids = itertools.count(max(nums, default=0) + 1)
            log.info("recovered jobs", jobs=len(self.jobs))
        self._kick.set()

    def save(self, job: JobRecord) -> None:
        self.store.save(job, self.seq[job.job_id])

    def notify(self, job: JobRecord, kind: str, message: str = "") -> None:
        for q in self._watchers.get(job.job_id, ()):
            q.put_nowait((kind, message))
        if kind == "state":
            self.save(job)
            self._kick.set()
        tenant = job.tenant.removeprefix("tenants/")
        self.telemetry.publish(f"tenants/{tenant}/jobs/{job.job_id}/{'progress' if kind == 'progress' else 'state'}", {
            "job": job.name, "state": job.state.name, "reason": job.reason, "step": job.step,
            "steps_total": job.steps_total, "tokens": job.tokens, "step_time_s": job.last_step_time_s,
            "predicted_step_time_s": job.predicted_step_time_s, "mfu": job.mfu,
            "energy_it_j": job.energy_it_j, "cost_usd": job.cost_usd, "eta_s": job.eta_s,
            "t_s": self.clock.now(), "message": message,
        })

    def set_state(self, job: JobRecord, to: State, reason: str = "", message: str = "") -> None:
        job.transition(to, reason)
        if to in TERMINAL:
            job.finished_s = self.clock.now()
        log.info("job state", job=job.name, state=to.name, reason=reason)
        self.notify(job, "state", message or reason)

    async def _publish_stats(self) -> None:
        counts: dict[str, int] = {}
        for j in self.jobs.values():
            counts[j.state.name] = counts.get(j.state.name, 0) + 1
        self.telemetry.publish("stats", {"t_s": self.clock.now(), "jobs": counts,
                                         "running_chips": sum(j.spec.count for j in self.jobs.values()
                                                              if j.state == State.RUNNING)})

    # -- broker -----------------------------------------------------------------------------------
    @property
    def broker(self) -> broker_pb2_grpc.BrokerServiceStub:
        return self.auth.stub

    def _smd(self) -> tuple[tuple[str, str], ...]:
        return call_metadata(api_key=self.config.service_key)

    async def inventory(self) -> broker_pb2.GetInventoryResponse:
        if self._inventory is None:
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

    # -- dispatch ---------------------------------------------------------------------------------
    async def _dispatch_loop(self) -> None:
        while True:
            await self._kick.wait()
            self._kick.clear()
            try:
                await self._dispatch()
            except Exception:
                log.exception("dispatch failed")
                await asyncio.sleep(0.5)
                self._kick.set()

    async def _dispatch(self) -> None:
        queued = sorted((j for j in self.jobs.values() if j.state == State.QUEUED),
                        key=lambda j: (-j.priority, self.seq[j.job_id]))
        blocked_by: JobRecord | None = None
        for job in queued:
            if blocked_by is not None:
                reason = f"waiting behind {blocked_by.name} (priority {blocked_by.priority})"
                if job.reason != reason:
                    job.reason = reason
                    self.notify(job, "event", reason)
                continue
            if not await self._place(job):
                blocked_by = job

    async def _place(self, job: JobRecord) -> bool:
        """Try to allocate the job's gang; True if it is now running."""
        spec = job.spec
        self.set_state(job, State.PLACING, "allocating chips through the broker")
        dom = get_system(spec.system).chips
        # Whole scale-up domains (or one domain), so TP groups never straddle two domains.
        topo = (broker_pb2.TOPOLOGY_CONSTRAINT_SAME_DOMAIN if spec.count <= dom or spec.count % dom == 0
                else broker_pb2.TOPOLOGY_CONSTRAINT_NONE)
        try:
            resp = await self.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                chip_type=spec.chip, count=spec.count, topology=topo, purpose=job.name, tenant=job.tenant,
            ), metadata=self._smd(), timeout=30)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                self.set_state(job, State.QUEUED, f"waiting for {spec.count} {spec.chip} chips: {err.details()}")
                return False
            self.set_state(job, State.QUEUED, f"broker refused placement ({err.code().name}): {err.details()}")
            await asyncio.sleep(0.5)
            return False
        inst = resp.instance
        job.instance = inst.name
        devices = np.concatenate([np.arange(r.start, r.end) for r in inst.devices])
        self.set_state(job, State.RUNNING, "", f"placed on {inst.device_count} chips ({inst.name})")
        if not job.started_s:
            job.started_s = self.clock.now()
        self._running[job.job_id] = asyncio.create_task(self._run(job, devices, resp.capability,
                                                                  resp.capability_expires_s))
        return True

    async def _run(self, job: JobRecord, devices: np.ndarray, capability: str, expires_s: float) -> None:
        inv = await self.inventory()
        cap = {"token": capability, "expires": expires_s}
        runner = JobRunner(job, devices=devices,
                           shards=[(s.endpoint, int(s.devices.start), int(s.devices.end)) for s in inv.shards],
                           fabric=inv.fabric_endpoint, capability=lambda: str(cap["token"]), clock=self.clock)
        structlog.contextvars.bind_contextvars(job_id=job.job_id)
        t = max(self.clock.now(), job.started_s)
        try:
            while job.step < job.steps_total and job.state == State.RUNNING:
                if float(cap["expires"]) - time.time() < 60:
                    r = await self.broker.RefreshCapability(
                        broker_pb2.RefreshCapabilityRequest(instance=job.instance), metadata=self._smd(), timeout=10)
                    cap.update(token=r.capability, expires=r.capability_expires_s)
                res = await self._step_with_retry(runner, job, t)
                if job.state != State.RUNNING:
                    break
                account(job, res)
                t = res.end_s
                if job.step % max(self.config.progress_interval_steps, 1) == 0 or job.step == job.steps_total:
                    self.notify(job, "progress")
                if job.checkpoint_interval_steps and job.step % job.checkpoint_interval_steps == 0:
                    job.last_checkpoint_step = job.step
                    self.save(job)
            if job.state == State.RUNNING:
                job.last_checkpoint_step = job.step
                self.set_state(job, State.SUCCEEDED, "", f"finished {job.step} steps")
        except StepFailed as exc:
            lost = job.step - job.last_checkpoint_step
            if job.restarts >= job.max_restarts:
                self.set_state(job, State.FAILED, f"{exc.cause}; max_restarts ({job.max_restarts}) reached")
            else:
                job.restarts += 1
                self.set_state(job, State.RESTARTING, f"{exc.cause}; restarting from step "
                               f"{job.last_checkpoint_step} ({lost} steps lost)")
                job.step = job.last_checkpoint_step
                job.tokens = job.step * job.spec.tokens_per_step
                self.set_state(job, State.QUEUED, "waiting for healthy chips to restart")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("job runner failed", job=job.name)
            if job.state not in TERMINAL:
                self.set_state(job, State.FAILED, f"internal error: {exc}")
        finally:
            await runner.close()
            self._running.pop(job.job_id, None)
            await self._release(job)

    async def _step_with_retry(self, runner: JobRunner, job: JobRecord, t: float) -> Any:
        """Run a step; a service that is briefly unavailable (restarting) delays the step, it does
        not fail the job. Chip and link faults (StepFailed) go to the caller."""
        delay = 0.2
        for attempt in range(8):
            try:
                return await runner.run_step(t)
            except Unavailable as exc:
                log.warning("step delayed: a service is unavailable", job=job.name, error=str(exc), attempt=attempt)
                self.notify(job, "event", f"step {job.step + 1} delayed: {exc}")
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                t = max(t, self.clock.now())
        return await runner.run_step(t)

    async def _release(self, job: JobRecord) -> None:
        if not job.instance:
            return
        try:
            await self.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=job.instance),
                                              metadata=self._smd(), timeout=30)
        except grpc.aio.AioRpcError as err:
            log.warning("release failed", job=job.name, instance=job.instance, error=err.details())
        job.instance = ""
        self.save(job)
        self._kick.set()

    # -- API helpers ------------------------------------------------------------------------------
    def visible(self, p: Principal, name: str) -> JobRecord:
        if not name.startswith("jobs/") or len(name) <= 5:
            raise InvalidArgument("name", f"must look like 'jobs/<id>', got {name!r}")
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


def job_msg(job: JobRecord, spec_msg: Any) -> scheduler_pb2.Job:
    n = max(job.step, 1)
    return scheduler_pb2.Job(
        name=job.name, tenant=job.tenant, display_name=job.display_name, queue=job.queue, priority=job.priority,
        spec=spec_msg, state=int(job.state), reason=job.reason, steps_total=job.steps_total, step=job.step,
        tokens=job.tokens, last_step_time_s=job.last_step_time_s, predicted_step_time_s=job.predicted_step_time_s,
        mfu=job.mfu, usage=common_pb2.Usage(energy_it_j=job.energy_it_j, energy_facility_j=job.energy_facility_j,
                                           chip_hours=job.chip_hours, cost_usd=job.cost_usd),
        eta_s=job.eta_s, created_s=job.created_s, started_s=job.started_s, finished_s=job.finished_s,
        instance=job.instance, restarts=job.restarts, max_restarts=job.max_restarts,
        checkpoint_interval_steps=job.checkpoint_interval_steps, last_checkpoint_step=job.last_checkpoint_step,
        goodput=job.goodput, compute_s=job.compute_s_sum / n, exposed_comm_s=job.exposed_comm_s_sum / n,
        bubble_s=job.bubble_s_sum / n,
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
        return job_msg(job, spec)

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
        if len(request.display_name) > 200:
            raise InvalidArgument("display_name", "at most 200 characters")
        spec_dict = proto_to_spec(request.spec)
        spec, plan, steps = validate_submission(
            spec_dict, priority=request.priority, checkpoint_interval_steps=int(request.checkpoint_interval_steps),
            max_restarts=int(request.max_restarts), cluster_chips=await self.svc.cluster_chips())
        from gigacluster.model.training import estimate_train

        est = estimate_train(spec)
        job_id = f"j-{next(self.svc._ids)}"
        job = JobRecord(
            job_id=job_id, tenant=p.tenant, display_name=request.display_name or job_id,
            queue=request.queue or "default", priority=int(request.priority), spec_dict=spec_dict, spec=spec,
            plan=plan, steps_total=steps, checkpoint_interval_steps=int(request.checkpoint_interval_steps),
            max_restarts=int(request.max_restarts), created_s=self.svc.clock.now(),
            predicted_step_time_s=est.step_time_s, reason="queued",
        )
        self.svc.jobs[job_id] = job
        self.svc.seq[job_id] = int(job_id[2:])
        if request.request_id:
            self.svc._idempotency[(p.tenant, request.request_id)] = job_id
        self.svc.save(job)
        log.info("job submitted", job=job.name, tenant=p.tenant, chips=spec.count, steps=steps)
        self.svc.notify(job, "state", "submitted")
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
