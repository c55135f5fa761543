"""When a step's collectives start and what each demand costs: samples spread over the window."""

from __future__ import annotations

import pytest

from gigacluster.model.step import StepPlan
from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train
from gigacluster.scheduler import step_comm


def _plan() -> StepPlan:
    """Llama 3 70B on 1,024 Trainium3, TP 8 and PP 4."""
    spec = {"model": {"preset": "llama3-70b"}, "batch": {"global_batch_tokens": 8192 * 2 * 32 * 4},
            "parallelism": {"tp": 8, "pp": 4, "microbatch_size": 1, "recompute": "selective"},
            "hardware": {"chip": "trainium3", "count": 1024}, "precision": "bf16", "steps": 1}
    return estimate_train(TrainSpec.from_dict(spec)).plan


def test_inline_collectives_that_run_many_times_get_several_samples() -> None:
    """TP and PP (many calls per step): INLINE_SAMPLES calls each; the DP windows (one call per step): one."""
    plan = _plan()
    n = {d.name: step_comm.samples(d) for d in plan.collectives}
    k = step_comm.INLINE_SAMPLES
    assert n == {"tp": k, "pp": k, "dp_grad": 1, "dp_param": 1}
    calls, index = step_comm.expand(plan, [(d.name, [d.name]) for d in plan.collectives], list)
    assert [c[0] for c in calls].count("pp") == step_comm.INLINE_SAMPLES
    assert index[[c[0] for c in calls].index("pp"):][:step_comm.INLINE_SAMPLES] == list(range(step_comm.INLINE_SAMPLES))
    pp = [req for name, req in calls if name == "pp"]
    assert all(r == ["pp"] for r in pp) and len({id(r) for r in pp}) == len(pp)  # copies, not one shared request


def test_samples_sit_evenly_over_the_pipelined_window_with_the_middle_among_them() -> None:
    """Sample k of n starts at (k + 1/2)/n of the window; an odd count keeps the old mid-window sample."""
    plan = _plan()
    pipe = 10.0 * plan.pipelined_fraction
    k = step_comm.INLINE_SAMPLES
    got = [step_comm.offset_s(plan, "pp", i, 10.0) for i in range(k)]
    assert got == pytest.approx([pipe * (i + 0.5) / k for i in range(k)])
    assert k % 2 == 1 and got[k // 2] == pytest.approx(0.5 * pipe)
    assert step_comm.offset_s(plan, "tp", k // 2, 10.0) == pytest.approx(0.5 * pipe)
    assert step_comm.offset_s(plan, "dp_param", 0, 10.0) == 0.0


def test_a_burst_on_one_sample_counts_for_its_share_of_the_window_only() -> None:
    """Per sample the longest of its calls (runs of groups), then the mean over samples: a 10x sample among
    five 1 ms ones gives 2.8 ms per call, not the 10 ms a lone mid-step sample would have given."""
    names = ["pp"] * 6 + ["tp"]
    index = [0, 1, 2, 2, 3, 4, 0]
    starts = [0.0, 1.0, 2.0, 2.0, 3.0, 4.0, 0.0]
    ends = [0.001, 1.001, 2.010, 2.002, 3.001, 4.001, 0.5]
    per = step_comm.per_call_s(names, index, starts, ends)
    assert per["pp"] == pytest.approx((0.001 * 4 + 0.010) / 5)
    assert per["tp"] == pytest.approx(0.5)
    plan = _plan()
    counts = {d.name: d.count for d in plan.collectives}
    got = step_comm.demand_s(plan, per)
    assert got["pp"] == pytest.approx(per["pp"] * counts["pp"]) and got["dp_grad"] == 0.0


def test_each_timed_call_stands_for_its_share_of_the_steps_calls_in_the_fabrics_statistics() -> None:
    """``repeats`` (StartCollectiveRequest.repeats): the timed calls of an inline demand together stand for its
    count per step (TP: thousands of all-gathers a step), a DP window's one call for itself."""
    plan = _plan()
    for d in plan.collectives:
        r = step_comm.repeats(d)
        assert r * step_comm.samples(d) == d.count if d.count % step_comm.samples(d) == 0 else r >= 1
    by = {d.name: d for d in plan.collectives}
    assert step_comm.repeats(by["tp"]) == by["tp"].count > 100 and step_comm.repeats(by["dp_grad"]) == 1
