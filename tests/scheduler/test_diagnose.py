"""Performance-loss diagnosis names the cause the evidence points to."""

from __future__ import annotations

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
