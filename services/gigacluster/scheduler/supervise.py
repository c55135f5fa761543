"""A placed job's life on its gang: the step loop around :class:`scheduler.runner.JobRunner`.

Per step: wait out a peer's outage (never charged as a restart), refresh the capability, account the
step, check it against the model (performance-loss diagnosis), settle asynchronous checkpoints, and
take checkpoints when due (the scheduler draws no failures: they reach a job through the mesh, where the
fault injector ``gigacluster.faults`` breaks chips and links and the step fails). Around the loop:
eviction for preemption (synchronous checkpoint, then requeue), a chip or link fault (quarantine, restart
from the durable checkpoint, charged against ``max_restarts``), a lost peer (requeue, not charged), and
the release of the gang's instance when the runner ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import grpc
import numpy as np
import structlog

from gigacluster.broker.v1 import broker_pb2
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.errors import Unavailable
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.hw.catalog import get_system
from gigacluster.runtime import convert
from gigacluster.runtime.clock import EventClock, VirtualClock
from gigacluster.runtime.config import SchedulerConfig
from gigacluster.runtime.telemetry import Telemetry
from gigacluster.scheduler import checkpoint
from gigacluster.scheduler.book import JobBook
from gigacluster.scheduler.cluster import ClusterView
from gigacluster.scheduler.core import TERMINAL, JobRecord, State
from gigacluster.scheduler.diagnose import THRESHOLD as DRIFT_THRESHOLD
from gigacluster.scheduler.diagnose import Observed, diagnose
from gigacluster.scheduler.runner import CapabilityRejected, JobRunner, StepFailed, StepResult, account
from gigacluster.scheduler.window import (
    NotSteady,
    WindowRun,
    alike,
    alone_reference,
    carried_reference,
    run_window,
    window_plan,
)

log = structlog.get_logger()


class PeerLost(Exception):
    """A peer service stayed unavailable past ``peer_wait_s`` or lost the job's allocation: the job is
    requeued from its checkpoint without using a restart."""


def get_system_chips(job: JobRecord) -> int:
    return get_system(job.spec.system).chips


@dataclasses.dataclass(eq=False)
class JobSupervisor:
    """Runs placed jobs, one task each; ``gangs`` holds each placed job's devices while it runs."""

    config: SchedulerConfig
    clock: VirtualClock
    telemetry: Telemetry
    book: JobBook
    cluster: ClusterView
    gangs: dict[str, np.ndarray] = dataclasses.field(default_factory=dict, init=False)
    tasks: dict[str, asyncio.Task[None]] = dataclasses.field(default_factory=dict, init=False)
    loss_events: dict[str, int] = dataclasses.field(default_factory=dict, init=False)
    # Per job, its last steady step and the names of its collective calls: after a restart the job's first
    # window tries it on the new chips at once (the fabric and the chips grant it only if the step there is
    # the same: durations alone on the new links, compute and energy), instead of two steps through the
    # per-step path first. Not durable: a restarted scheduler simply runs two steps.
    steady: dict[str, tuple[StepResult, tuple[str, ...]]] = dataclasses.field(default_factory=dict, init=False)

    def start(self, job: JobRecord, devices: np.ndarray, capability: str, expires_s: float) -> None:
        """Run a job just placed on ``devices`` (already in ``gangs``) in its own task."""
        self.tasks[job.job_id] = asyncio.create_task(self.run(job, devices, capability, expires_s))

    def cancel_all(self) -> None:
        for t in self.tasks.values():
            t.cancel()

    async def run(self, job: JobRecord, devices: np.ndarray, capability: str, expires_s: float) -> None:
        instance = job.instance  # this runner's gang; the job may be placed again before the runner ends
        inv = await self.cluster.inventory()
        cap = {"token": capability, "expires": expires_s}
        runner = JobRunner(job, devices=devices,
                           shards=[(s.endpoint, int(s.devices.start), int(s.devices.end)) for s in inv.shards],
                           fabric=inv.fabric_endpoint, capability=lambda: str(cap["token"]), clock=self.clock)
        structlog.contextvars.bind_contextvars(job_id=job.job_id)
        ckpt = checkpoint.AsyncCheckpoints(durable_step=job.last_checkpoint_step)
        try:
            await self._steps(job, devices, runner, instance, cap, ckpt)
        except StepFailed as exc:
            await self.on_failure(job, devices, exc, ckpt)
        except PeerLost as exc:
            self.requeue_after_peer_loss(job, exc, ckpt)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("job runner failed", job=job.name)
            if job.state not in TERMINAL:
                self.book.set_state(job, State.FAILED, f"internal error: {exc}")
        finally:
            await runner.close()
            if job.state in TERMINAL:
                self.steady.pop(job.job_id, None)
            if self.tasks.get(job.job_id) is asyncio.current_task():
                self.tasks.pop(job.job_id, None)
            if self.gangs.get(job.job_id) is devices:
                self.gangs.pop(job.job_id, None)
            await self.cluster.release(job, instance)

    async def _steps(self, job: JobRecord, devices: np.ndarray, runner: JobRunner, instance: str,
                     cap: dict[str, Any], ckpt: checkpoint.AsyncCheckpoints) -> None:
        """The step loop: from a restart (if pending) to the last step, an eviction or a state change."""
        book = self.book
        t = max(self.clock.now(), job.started_s)
        pause = checkpoint.pause_s(job.plan)
        write = checkpoint.write_s(job.spec)
        if job.resume_pending:
            cost = checkpoint.restart_s(job.spec)
            book.notify(job, "event", f"restarting: relaunch and read the step-{job.step} checkpoint "
                                      f"({cost:.1f} s)")
            await self.clock.sleep_until(t + cost)
            t += cost
            job.restart_s += cost
            job.resume_pending = False
        recent: list[StepResult] = []  # the last two steps run, the reference of a steady-state window
        carried = self.steady.get(job.job_id)
        ref = carried_reference(runner, *carried) if carried is not None else None
        if ref is not None:
            recent = [ref, ref]
        while job.step < job.steps_total and job.state == State.RUNNING:
            if job.preempt_reason:
                await self.evict(job, t, ckpt, pause, write)
                return
            if float(cap["expires"]) - time.time() < 60:
                await self.refresh(job, instance, cap)
            out = await self.window(job, runner, recent, t, ckpt)
            if out is None:
                res = await self.step_with_retry(runner, job, t, instance, cap)
                if job.state != State.RUNNING:
                    break
                t = await self.after_step(job, devices, res, ckpt, pause, write, runner=runner)
                recent = [*recent[-1:], res]
                continue
            for i, res in enumerate(out.steps):
                t = await self.after_step(job, devices, res, ckpt, pause, write,
                                          last_of_window=i == len(out.steps) - 1)
            if out.failed is not None:
                raise out.failed
            # A window cut before its first step (a fault while its start was still ahead) leaves the mesh's time
            # past the step's start: the next step starts now, never in the past (its calls would start late and
            # no two steps would be alike again).
            t = max(t, self.clock.now())
            recent = out.steps[-2:]  # a step finished after a cut differs from the reference: no window until two agree
        if job.state == State.RUNNING and job.step >= job.steps_total:
            job.last_checkpoint_step = job.step
            book.set_state(job, State.SUCCEEDED, "", f"finished {job.step} steps")

    async def after_step(self, job: JobRecord, devices: np.ndarray, res: StepResult, ckpt: checkpoint.AsyncCheckpoints,
                         pause: float, write: float, *, runner: JobRunner | None = None,
                         last_of_window: bool | None = None) -> float:
        """Account a finished step, check it against the model (per-step path: ``runner`` given), settle
        checkpoint writes, tell watchers and take a checkpoint when due; returns
        the virtual time the next step starts. A window's steps come here one by one when it ends: watchers
        get a copy of the job per step, MQTT and the job book the window's last (or a checkpoint's) step."""
        book = self.book
        account(job, res)
        book.record_step(job, res)
        t = res.end_s
        if runner is not None:
            await self.check_performance(job, res, runner)
        inside = last_of_window is False  # a window's step before its last: the window's last step saves
        if ckpt.settle(t):
            job.last_checkpoint_step = ckpt.durable_step
            if not inside:
                book.save(job)
        durable = last_of_window is None or last_of_window or job.step == job.steps_total
        if job.step % max(self.config.progress_interval_steps, 1) == 0 or job.step == job.steps_total:
            book.notify(job, "progress", publish=durable, snapshot=last_of_window is not None)
        if durable:
            book.save(job)  # a scheduler crash then knows how many steps it really loses
        if ckpt.due(job.step, job.checkpoint_interval_steps, job.steps_total):
            msg = f"checkpoint at step {job.step}: {pause:.2f} s pause, {write:.1f} s asynchronous write"
            if inside:  # the window booked its pause already (window_plan): watchers are told, as for its steps
                book.notify(job, "event", msg, publish=False)
            else:
                book.set_state(job, State.CHECKPOINTING, "", msg)
                await self.clock.sleep_until(t + pause)
            t += pause
            job.checkpoint_pause_s += pause
            ckpt.start(job.step, t, write)
            if job.state == State.CHECKPOINTING:
                book.set_state(job, State.RUNNING)
        return t

    async def window(self, job: JobRecord, runner: JobRunner, recent: list[StepResult], t: float,
                     ckpt: checkpoint.AsyncCheckpoints) -> WindowRun | None:
        """The next steps as one steady-state window (scheduler/window.py) when the last two steps were alike
        (the same compute and call times) and the fabric grants it, with the reference step or, if the fabric
        runs its pattern alone in other durations, with those; None to run the next step through the per-step
        path. The job book saves a window's steps when it ends: a crash mid-window loses only steps never
        accounted."""
        if len(recent) < 2 or not alike(recent[0], recent[1]):
            if len(recent) == 2:
                a, b = recent
                log.debug("no window: the last two steps differ", job=job.name, chip_s=(a.chip_s, b.chip_s),
                          energy_j=(a.above_idle_j, b.above_idle_j), calls=(len(a.calls), len(b.calls)))
            return None
        if not (self.config.wall_clock_windows or isinstance(self.clock, EventClock)):
            return None
        ref = recent[1]
        out: WindowRun | None = None
        wake = self.book.watch(job)
        try:
            for attempt in range(2):
                k, pauses = window_plan(job, ckpt, self.config.max_window_steps, t, ref.breakdown.step_time_s,
                                        checkpoint.pause_s(job.plan), checkpoint.write_s(job.spec))
                if not k:
                    log.debug("no window: fewer than two steps to run", job=job.name, step=job.step,
                              deferred=ckpt.deferred, inflight=ckpt.inflight)
                    return None
                try:
                    out = await run_window(runner, ref, t, k,
                                           lambda: bool(job.preempt_reason) or job.state != State.RUNNING, wake,
                                           pauses, checkpoint.pause_s(job.plan))
                except NotSteady as exc:  # the step as the fabric runs it alone is the steady one: ask with it
                    if attempt:
                        break
                    ref = alone_reference(runner, ref, exc.alone_s)
                    continue
                break
        except (Unavailable, CapabilityRejected) as exc:
            log.warning("window abandoned; the per-step path retries", job=job.name, error=str(exc))
            return None
        finally:
            self.book.unwatch(job, wake)
        if out is None:
            recent.clear()  # not granted now: try again after two more steps
            return None
        log.info("window", job=job.name, steps=len(out.steps), start_s=t, cause=out.cause, cut_s=out.cut_s)
        self.steady[job.job_id] = (ref, tuple(n for n, _ in runner.collective_calls))
        if job.state not in (State.RUNNING, State.CHECKPOINTING):  # cancelled: as in the per-step loop, the
            return dataclasses.replace(out, steps=out.steps[:-1])  # step in progress does not count
        return out

    async def check_performance(self, job: JobRecord, res: Any, runner: JobRunner) -> None:
        """Flag a step slower than the model and name the likely cause: a WatchJob line, an MQTT alert and a
        Prometheus counter. Queries the chips and links only when the step is already slow."""
        exp = self.book.expected(job)
        bd = res.breakdown
        if bd.step_time_s <= exp.step_s * (1 + DRIFT_THRESHOLD):
            if job.performance_alert:
                job.performance_alert, job.slowdown = "", 0.0
                self.book.notify(job, "event", "performance back to the model's prediction")
            return
        if job.performance_alert and job.step % 10:
            return  # already flagged; re-diagnose every 10 steps
        slow, n, degraded = 0, 0, {}
        md = self.cluster.metadata()
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
        self.loss_events[d.cause] = self.loss_events.get(d.cause, 0) + 1
        msg = f"performance loss: step {d.slowdown * 100:+.0f}% vs the model; likely cause {d.cause}: {d.detail}"
        log.warning("performance loss", job=job.name, cause=d.cause, slowdown=d.slowdown)
        self.book.notify(job, "event", msg)
        tenant = job.tenant.removeprefix("tenants/")
        self.telemetry.publish(f"tenants/{tenant}/jobs/{job.job_id}/alerts", {
            "job": job.name, "event": "performance_loss", "cause": d.cause, "detail": d.detail,
            "slowdown": d.slowdown, "step": job.step, "t_s": self.clock.now()})

    async def on_failure(self, job: JobRecord, devices: np.ndarray, exc: StepFailed,
                         ckpt: checkpoint.AsyncCheckpoints | None = None) -> None:
        """A real job fault (chip or link failed a step): the only thing that uses a restart."""
        now = self.clock.now()
        if ckpt is not None:  # a write that ended before the fault is durable; one still in flight is not
            ckpt.settle(now)
            job.last_checkpoint_step = ckpt.durable_step
        bad = list(exc.devices)
        if not exc.modelled and exc.effect == "device":
            bad = sorted(set(bad) | set(await self.cluster.failed_devices(devices)))
        if exc.effect == "host" and bad:
            dom = int(get_system_chips(job))
            bad = sorted({d // dom * dom + k for d in bad for k in range(dom)})
        if exc.effect in ("device", "host"):
            for d in bad:
                self.cluster.bad[int(d)] = (now + self.config.repair_s) if exc.modelled else None
        lost = job.charge_lost_work()
        job.failures += 1
        where = f" (devices {', '.join(map(str, bad[:8]))}{'...' if len(bad) > 8 else ''} excluded)" if bad else ""
        if job.restarts >= job.max_restarts:
            self.book.set_state(job, State.FAILED, f"{exc.cause}; max_restarts ({job.max_restarts}) reached; "
                                f"{lost} steps since the checkpoint at step {job.last_checkpoint_step} lost")
            return
        job.restarts += 1
        self.restart_from_checkpoint(
            job, f"{exc.cause}; restarting from step {job.last_checkpoint_step} ({lost} steps lost){where}",
            "waiting for healthy chips to restart")

    def restart_from_checkpoint(self, job: JobRecord, restarting: str, queued: str) -> None:
        """RESTARTING (saying why), back to the last durable checkpoint, then QUEUED for the next dispatch."""
        self.book.set_state(job, State.RESTARTING, restarting)
        job.rewind()
        job.resume_pending = True
        self.book.set_state(job, State.QUEUED, queued)

    async def evict(self, job: JobRecord, t: float, ckpt: checkpoint.AsyncCheckpoints, pause: float,
                    write: float) -> None:
        """Preemption: checkpoint synchronously (pause + write after any write in flight), then requeue."""
        reason = job.preempt_reason
        self.book.set_state(job, State.CHECKPOINTING, reason, f"{reason}: writing a checkpoint at step {job.step} "
                            f"({pause + write:.1f} s) before releasing the chips")
        end = ckpt.flush_end(t + pause, write)
        await self.clock.sleep_until(end)
        job.checkpoint_pause_s += end - t
        job.last_checkpoint_step = job.step
        job.preemptions += 1
        job.preempt_reason = ""
        job.resume_pending = True
        self.book.set_state(job, State.PREEMPTED, reason)
        self.book.set_state(job, State.QUEUED, f"requeued after preemption ({reason})")

    async def step_with_retry(self, runner: JobRunner, job: JobRecord, t: float, instance: str,
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
                self.book.notify(job, "event", job.reason)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.peer_backoff_max_s)
                t = max(t, self.clock.now())
                continue
            except CapabilityRejected as exc:
                if refreshed:
                    raise PeerLost(f"the mesh no longer accepts this job's allocation ({exc})") from exc
                log.warning("capability rejected; refreshing it", job=job.name, error=str(exc))
                await self.refresh(job, instance, cap)
                refreshed = True
                continue
            if attempt:
                waited = time.monotonic() - started
                job.reason = ""
                log.info("services back; job continues", job=job.name, waited_s=round(waited, 1))
                self.book.notify(job, "event", f"services back after {waited:.0f} s; step {job.step + 1} ran "
                                               f"(restarts not charged)")
            return res

    async def refresh(self, job: JobRecord, instance: str, cap: dict[str, Any]) -> None:
        """A fresh capability for ``instance``, waiting out a broker outage (PeerLost past ``peer_wait_s``
        or when the broker no longer knows the instance)."""
        started = time.monotonic()
        delay = 0.2
        while True:
            try:
                r = await self.cluster.broker.RefreshCapability(
                    broker_pb2.RefreshCapabilityRequest(instance=instance), metadata=self.cluster.metadata(),
                    timeout=10)
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
                self.book.notify(job, "event", job.reason)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.peer_backoff_max_s)

    def requeue_after_peer_loss(self, job: JobRecord, exc: PeerLost, ckpt: checkpoint.AsyncCheckpoints) -> None:
        """Requeue from the last durable checkpoint after a peer outage or a lost allocation; the chips
        are re-acquired by the next dispatch. Not a job fault: ``restarts`` and ``failures`` stay."""
        ckpt.settle(self.clock.now())
        job.last_checkpoint_step = ckpt.durable_step
        lost = job.charge_lost_work()
        if job.state not in (State.RUNNING, State.CHECKPOINTING):
            return
        self.restart_from_checkpoint(
            job, f"{exc}; resuming from the checkpoint at step {job.last_checkpoint_step} "
            f"({lost} steps lost; restarts not charged)",
            "re-acquiring chips after a peer outage (restarts not charged)")
