"""A job's restart budget is charged only for its own faults: a peer that is unavailable (or loses the
job's allocation) delays the step or requeues the job from its checkpoint, never uses a restart."""

from __future__ import annotations

from typing import Any

import pytest

from gigacluster.errors import Unavailable
from gigacluster.model.training import plan_step
from gigacluster.runtime.config import SchedulerConfig
from gigacluster.scheduler import checkpoint
from gigacluster.scheduler.core import JobRecord, State, parse_spec
from gigacluster.scheduler.runner import CapabilityRejected, StepFailed
from gigacluster.scheduler.service import SchedulerService
from gigacluster.scheduler.supervise import PeerLost
from tests.scheduler.test_spec_strict import SPEC


def service(**cfg: Any) -> SchedulerService:
    return SchedulerService(SchedulerConfig(peer_backoff_max_s=0.01, **cfg))


def running_job(svc: SchedulerService, step: int = 25, durable: int = 20) -> JobRecord:
    import json

    spec = parse_spec(json.dumps(SPEC, sort_keys=True))
    job = JobRecord(job_id="j-1", tenant="tenants/a", display_name="j", queue="default", priority=0, spec_dict=SPEC,
                    spec=spec, plan=plan_step(spec), steps_total=100, checkpoint_interval_steps=10, max_restarts=2,
                    created_s=0.0, state=State.RUNNING, step=step, last_checkpoint_step=durable)
    svc.book.jobs[job.job_id] = job
    svc.book.seq[job.job_id] = 1
    svc.book.index(job, None)
    return job


class FlakyRunner:
    """Raises the given errors in turn, then returns a result."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def run_step(self, t: float) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


async def test_unavailable_peer_delays_the_step_and_says_so() -> None:
    """Five UNAVAILABLE answers (a peer restarting) delay the step; it then runs, restarts untouched,
    and the job's reason said it was waiting while it waited."""
    svc = service()
    job = running_job(svc)
    seen: list[str] = []
    svc.book.notify = lambda j, kind, msg="": seen.append(msg)  # type: ignore[method-assign]
    runner = FlakyRunner(*(Unavailable("fabric restarting") for _ in range(5)))
    assert await svc.supervisor.step_with_retry(runner, job, 0.0, "i-1", {}) == "ok"  # type: ignore[arg-type]
    assert runner.calls == 6 and job.restarts == 0 and job.failures == 0 and job.reason == ""
    assert any("waiting for an unavailable service" in m and "restarts not charged" in m for m in seen)
    assert "services back" in seen[-1]


async def test_a_peer_down_past_the_wait_bound_requeues_without_a_restart() -> None:
    """Past peer_wait_s the step gives up with PeerLost; the job is requeued from its durable checkpoint,
    lost steps counted exactly, restarts and failures unchanged."""
    svc = service(peer_wait_s=0.05)
    job = running_job(svc, step=25, durable=20)

    class Down:
        async def run_step(self, t: float) -> str:
            raise Unavailable("broker down")

    with pytest.raises(PeerLost) as err:
        await svc.supervisor.step_with_retry(Down(), job, 0.0, "i-1", {})  # type: ignore[arg-type]
    svc.supervisor.requeue_after_peer_loss(job, err.value, checkpoint.AsyncCheckpoints(durable_step=20))
    assert job.state == State.QUEUED and job.step == 20 and job.lost_steps == 5
    assert job.restarts == 0 and job.failures == 0 and job.resume_pending
    assert "restarts not charged" in job.reason and "j-1" in svc.book.queued


async def test_a_rejected_capability_is_refreshed_then_the_step_runs() -> None:
    """A capability the mesh no longer accepts is refreshed once and the step retried."""
    svc = service()
    job = running_job(svc)
    refreshed: list[str] = []

    async def refresh(j: JobRecord, instance: str, cap: dict[str, Any]) -> None:
        refreshed.append(instance)

    svc.supervisor.refresh = refresh  # type: ignore[method-assign]
    runner = FlakyRunner(CapabilityRejected("UNAUTHENTICATED: bad token"))
    assert await svc.supervisor.step_with_retry(runner, job, 0.0, "i-7", {}) == "ok"  # type: ignore[arg-type]
    assert refreshed == ["i-7"] and job.restarts == 0
    twice = FlakyRunner(CapabilityRejected("x"), CapabilityRejected("x"))
    with pytest.raises(PeerLost):
        await svc.supervisor.step_with_retry(twice, job, 0.0, "i-7", {})  # type: ignore[arg-type]


async def test_only_a_job_fault_uses_a_restart() -> None:
    """A chip fault (StepFailed) is the job's own failure: one restart used, lost steps counted."""
    svc = service()
    job = running_job(svc, step=25, durable=20)
    svc.book.notify = lambda j, kind, msg="": None  # type: ignore[method-assign]
    import numpy as np

    await svc.supervisor.on_failure(job, np.arange(8), StepFailed("chip failed", [3], modelled=True),
                                    checkpoint.AsyncCheckpoints(durable_step=20))
    assert job.restarts == 1 and job.failures == 1 and job.lost_steps == 5 and job.state == State.QUEUED


@pytest.mark.parametrize(("code", "kind"), [
    ("UNAVAILABLE", Unavailable), ("DEADLINE_EXCEEDED", Unavailable), ("CANCELLED", Unavailable),
    ("NOT_FOUND", Unavailable), ("UNAUTHENTICATED", CapabilityRejected), ("PERMISSION_DENIED", CapabilityRejected),
    ("FAILED_PRECONDITION", StepFailed),
])
def test_mesh_errors_map_to_wait_refresh_or_fault(code: str, kind: type) -> None:
    """A peer shutting down (CANCELLED), restarting (UNAVAILABLE) or forgetting a flow (NOT_FOUND) is
    waited for; a refused capability is refreshed; only FAILED_PRECONDITION (a device fault) is a job fault."""
    import grpc

    from gigacluster.scheduler.runner import _step_error

    err = grpc.aio.AioRpcError(getattr(grpc.StatusCode, code), grpc.aio.Metadata(), grpc.aio.Metadata(), "x" * 500)
    out = _step_error(err)
    assert isinstance(out, kind)
    assert len(str(out)) < 200
