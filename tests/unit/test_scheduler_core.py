"""Scheduler pure logic: the job state machine, submission checks, rank layout, spec round trip."""

from __future__ import annotations

from typing import Any

import pytest

from gigacluster.errors import FailedPrecondition, InvalidArgument
from gigacluster.model import DoesNotFitError
from gigacluster.model.training import TrainSpec
from gigacluster.scheduler.core import LEGAL, JobRecord, State, rank_groups, validate_submission
from gigacluster.scheduler.runner import _ranges, arithmetic_runs
from gigacluster.scheduler.spec import proto_to_spec, spec_to_proto, split_job_file

SPEC: dict[str, Any] = {
    "model": {"preset": "llama3-8b", "seq_len": 2048}, "batch": {"global_batch": 64},
    "parallelism": {"tp": 8, "microbatch_size": 2, "recompute": "selective"},
    "hardware": {"chip": "h100-sxm", "count": 32}, "precision": "bf16", "steps": 10,
}


def job(**kw: Any) -> JobRecord:
    spec, plan, steps = validate_submission(SPEC, priority=0, checkpoint_interval_steps=0, max_restarts=0,
                                            cluster_chips={"h100-sxm": 64})
    return JobRecord(job_id="j-1", tenant="tenants/a", display_name="x", queue="q", priority=0, spec_dict=SPEC,
                     spec=spec, plan=plan, steps_total=steps, checkpoint_interval_steps=0, max_restarts=0,
                     created_s=0.0, **kw)


def test_only_legal_transitions_are_allowed() -> None:
    """QUEUED -> PLACING -> RUNNING -> SUCCEEDED works; SUCCEEDED -> RUNNING is FAILED_PRECONDITION."""
    j = job()
    for s in (State.PLACING, State.RUNNING, State.CHECKPOINTING, State.RUNNING, State.SUCCEEDED):
        j.transition(s)
    with pytest.raises(FailedPrecondition, match="SUCCEEDED; it cannot become RUNNING"):
        j.transition(State.RUNNING)
    assert all(not LEGAL[t] for t in (State.SUCCEEDED, State.FAILED, State.CANCELLED))


def test_submission_checks_name_the_field() -> None:
    """Missing chip, steps and priority bounds are INVALID_ARGUMENT naming the field; too many chips and
    an oversized model are FAILED_PRECONDITION with the numbers."""
    cases: list[tuple[dict[str, Any], dict[str, Any], type[Exception], str]] = [
        ({**SPEC, "hardware": {"count": 8}}, {}, InvalidArgument, "spec.hardware.chip"),
        ({k: v for k, v in SPEC.items() if k != "steps"}, {}, InvalidArgument, "spec.steps"),
        (SPEC, {"priority": 5000}, InvalidArgument, "priority"),
        ({**SPEC, "parallelism": {"tp": 3}}, {}, InvalidArgument, "spec."),
        ({**SPEC, "hardware": {"chip": "h100-sxm", "count": 128}, "batch": {"global_batch": 128}}, {},
         FailedPrecondition, "needs 128 h100-sxm chips but the cluster has 64"),
        ({**SPEC, "model": {"preset": "llama3-405b"}, "hardware": {"chip": "h100-sxm", "count": 8},
          "batch": {"global_batch": 8}}, {}, DoesNotFitError, "GiB"),
    ]
    for spec, kw, exc, needle in cases:
        args = {"priority": 0, "checkpoint_interval_steps": 0, "max_restarts": 0, **kw}
        with pytest.raises(exc, match=needle):
            validate_submission(spec, cluster_chips={"h100-sxm": 64}, **args)


def test_rank_groups_follow_megatron_order() -> None:
    """TP groups are consecutive ranks; DP groups stride by TP; PP pairs stride a whole stage."""
    spec = TrainSpec.from_dict({**SPEC, "parallelism": {"tp": 8, "pp": 2, "microbatch_size": 1},
                                "hardware": {"chip": "h100-sxm", "count": 64}})
    assert rank_groups(spec, "tp")[:2] == (8, 1) and rank_groups(spec, "tp")[3][:3] == [0, 8, 16]
    size, stride, copies, offsets = rank_groups(spec, "dp_grad")
    assert (size, stride, copies) == (4, 8, 16) and offsets[:9] == [0, 1, 2, 3, 4, 5, 6, 7, 32]
    assert rank_groups(spec, "pp")[:2] == (2, 32)


def test_offsets_compress_into_arithmetic_runs_and_ids_into_ranges() -> None:
    """Offsets become (first, count, stride) runs; device ids become [start, end) ranges in order."""
    assert arithmetic_runs([0, 1, 2, 3, 32, 33, 34, 35]) == [(0, 4, 1), (32, 4, 1)]
    assert arithmetic_runs([0, 8, 16, 24]) == [(0, 4, 8)]
    assert arithmetic_runs([5]) == [(5, 1, 1)]
    import numpy as np

    assert _ranges(np.array([8, 9, 10, 20, 21])) == [(8, 11), (20, 22)]
    assert _ranges(np.array([16, 8, 24]), keep_order=True) == [(16, 17), (8, 9), (24, 25)]


def test_job_file_round_trips_through_the_proto() -> None:
    """split_job_file separates job fields; spec -> TrainingSpec proto -> spec preserves every field set."""
    spec, jobf = split_job_file({**SPEC, "name": "n", "priority": 3, "max_restarts": 2})
    assert jobf == {"name": "n", "priority": 3, "max_restarts": 2} and "name" not in spec
    back = proto_to_spec(spec_to_proto(spec))
    assert TrainSpec.from_dict(back) == TrainSpec.from_dict(spec)
