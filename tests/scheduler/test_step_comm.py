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


def test_a_step_whose_calls_go_out_late_moves_them_all_by_the_lag() -> None:
    """A scheduler short of CPU (wall clock) reaches a step's calls after their times: past the fabric's backdating
    (``LATE_CALLS_WALL_S`` under its default 0.25 s) every call moves by the same lag; below it, and on the event
    clock (never behind), none moves."""
    assert step_comm.LATE_CALLS_WALL_S < 0.25  # FabricConfig.backdate_s's default: the fabric places these exactly
    assert step_comm.late_shift_s(100.0, 100.1, lag_wall_s=0.1) == 0.0
    assert step_comm.late_shift_s(100.0, 108.9, lag_wall_s=8.9) == pytest.approx(8.9)
    assert step_comm.late_shift_s(100.0, 189.0, lag_wall_s=8.9) == pytest.approx(89.0)  # at speed-up 10
    assert step_comm.late_shift_s(100.0, 100.0, lag_wall_s=0.0) == 0.0


def test_late_calls_started_at_once_meet_each_other_and_moved_together_do_not() -> None:
    """Why the calls move together (docs/performance.md, "The three presets"): a pipeline send due mid-step and the
    gradient reduce-scatter due at its end share the first rank's NIC. Started at their own times, or both moved by
    the same lag, each takes its time alone; started at once (what a fabric that cannot backdate does with calls
    that arrive late) the send shares the NIC and takes longer. Measured on the 102,400-chip Llama 3 405B job of
    2gw-b200 on the wall clock: 1.47 ms against 0.74 ms a send."""
    import numpy as np

    from gigacluster.fabric.sim import FlowSim
    from gigacluster.fabric.topology import TopologyConfig, build_topology

    topo = build_topology(TopologyConfig(chip="b200", count=64, system="hgx", routing="spray", tiers=2))
    send_b, rs_b = 64e6, 1e9
    rail0 = np.arange(0, 64, 8)  # one rank per node, on rail 0: chip 0's NIC carries both

    def run(t_send: float, t_rs: float) -> tuple[float, float]:
        sim = FlowSim(topo)
        pp = sim.start_collective("send_recv", np.array([0, 8]), send_b, start_s=t_send)
        rs = sim.start_collective("reduce_scatter", rail0, rs_b, start_s=t_rs, algo="ring")
        sim.run_until_idle()
        return pp.end_s - t_send, rs.end_s - t_rs

    alone = run(2.0, 4.0)
    late = 8.9
    assert run(2.0 + late, 4.0 + late) == pytest.approx(alone, rel=1e-9)
    collapsed = run(6.7, 6.7)
    assert collapsed[0] > 1.5 * alone[0]
