"""Performance-loss diagnosis names the cause the evidence points to."""

from __future__ import annotations

import pytest

from gigacluster.scheduler.diagnose import Expected, Observed, diagnose

EXP = Expected(step_s=1.0, compute_s=0.6, comm_s={"tp": 0.2, "dp_grad": 0.3})


def obs(**kw: object) -> Observed:
    base: dict[str, object] = {"step_s": 1.0, "compute_s": 0.6, "comm_s": {"tp": 0.2, "dp_grad": 0.3}, "devices": 32,
                               "slow_devices": 0, "min_clock": 1.0, "degraded_links": {}}
    base.update(kw)
    return Observed(**base)  # type: ignore[arg-type]


def test_within_threshold_is_no_loss() -> None:
    """A step 4% over the model is within the live mesh's agreement: no diagnosis."""
    assert diagnose(EXP, obs(step_s=1.04)) is None


def test_slow_compute_on_throttled_chips_blames_the_chips() -> None:
    """Longer compute with chips below nominal clock: throttled or faulty chip, with the counts."""
    d = diagnose(EXP, obs(step_s=1.3, compute_s=0.9, slow_devices=4, min_clock=0.5))
    assert d is not None and d.cause == "throttled_or_faulty_chip" and "4 of 32" in d.detail
    assert abs(d.slowdown - 0.3) < 1e-9


def test_slow_collectives_with_a_degraded_link_blame_the_link_else_contention() -> None:
    """Longer DP collectives with a degraded leaf-spine link: degraded link; without one: fabric contention."""
    d = diagnose(EXP, obs(step_s=1.4, comm_s={"tp": 0.2, "dp_grad": 0.7}, degraded_links={"leaf-spine": 1}))
    assert d is not None and d.cause == "degraded_link" and "leaf-spine" in d.detail
    d2 = diagnose(EXP, obs(step_s=1.4, comm_s={"tp": 0.2, "dp_grad": 0.7}))
    assert d2 is not None and d2.cause == "fabric_contention" and "dp_grad" in d2.detail


def test_slow_compute_on_healthy_chips_is_chip_contention() -> None:
    """Longer compute with every chip at nominal clock: other work on the chips."""
    d = diagnose(EXP, obs(step_s=1.2, compute_s=0.8))
    assert d is not None and d.cause == "chip_contention"


def test_the_job_message_carries_the_diagnosis_while_the_job_runs() -> None:
    """GetJob shows a running job's slowdown and its likely cause (they were computed but never sent, so
    clients always read 0), and neither once the job has ended."""
    import json

    from gigacluster.model.training import plan_step
    from gigacluster.scheduler.core import JobRecord, State, parse_spec
    from gigacluster.scheduler.messages import job_msg
    from tests.scheduler.test_spec_strict import SPEC

    spec = parse_spec(json.dumps(SPEC, sort_keys=True))
    job = JobRecord(job_id="j-1", tenant="tenants/a", display_name="j", queue="default", priority=0, spec_dict=SPEC,
                    spec=spec, plan=plan_step(spec), steps_total=100, checkpoint_interval_steps=10, max_restarts=2,
                    created_s=0.0, state=State.RUNNING, instance="instances/i-1",
                    performance_alert="fabric_contention: dp_grad 0.7 s vs 0.3 s", slowdown=0.4)
    msg = job_msg(job, None)
    assert msg.slowdown == 0.4 and msg.performance_alert.startswith("fabric_contention")
    job.state = State.SUCCEEDED
    assert job_msg(job, None).slowdown == 0.0 and job_msg(job, None).performance_alert == ""


def test_the_job_message_carries_the_exact_mean_step_over_every_step_run() -> None:
    """``Job.mean_step_time_s`` is run time over every step run, the steps lost to a failure and redone
    included (3 steps of 1 s, 2 lost, then 2 of 4 s: 11 s over 5 steps); 0 before any step. The scenario report
    takes it over its samples of ``last_step_time_s``, which caught whichever steps a sample instant saw."""
    import json

    from gigacluster.model.training import plan_step
    from gigacluster.scenario.report import mean_step_s
    from gigacluster.scheduler.core import JobRecord, State, parse_spec
    from gigacluster.scheduler.messages import job_msg
    from tests.scheduler.test_spec_strict import SPEC

    spec = parse_spec(json.dumps(SPEC, sort_keys=True))
    job = JobRecord(job_id="j-1", tenant="tenants/a", display_name="j", queue="default", priority=0, spec_dict=SPEC,
                    spec=spec, plan=plan_step(spec), steps_total=100, checkpoint_interval_steps=10, max_restarts=2,
                    created_s=0.0, state=State.RUNNING, instance="instances/i-1")
    assert job_msg(job, None).mean_step_time_s == 0.0
    job.step, job.run_s, job.last_checkpoint_step = 3, 3.0, 1
    job.charge_lost_work()
    job.rewind()
    job.step, job.run_s = job.step + 2, job.run_s + 8.0
    msg = job_msg(job, None)
    assert (msg.step, msg.lost_steps, msg.mean_step_time_s) == (3, 2, pytest.approx(11.0 / 5))
    assert mean_step_s([9.0, 9.0], {"mean_step_time_s": msg.mean_step_time_s}) == pytest.approx(2.2)
    assert mean_step_s([1.0, 3.0], {"mean_step_time_s": 0.0}) == pytest.approx(2.0)  # an older scheduler
