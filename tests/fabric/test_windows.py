"""The fabric's steady-state windows without gRPC: grant, the exact cut by other traffic, credited link bytes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from gigacluster.fabric.service.book import FlowBook, FlowRecord
from gigacluster.fabric.service.driver import SimDriver
from gigacluster.fabric.service.windows import PatternCollective, Window, cut_plan
from gigacluster.fabric.sim import FlowSim
from gigacluster.fabric.topology import TopologyConfig, build_topology
from gigacluster.model.cadence import Cadence
from gigacluster.runtime.clock import EventClock

RANKS = np.array([0, 9, 18, 27])  # one chip per node, each on another rail: the ring crosses the spines
BYTES = 2e9
OFFSET = 0.1


def _topo() -> Any:
    return build_topology(TopologyConfig(chip="h100-sxm", count=64))


def _pattern(expected_s: float = 0.0) -> list[PatternCollective]:
    return [PatternCollective("all_reduce", RANKS, 0, 1, BYTES, None, "training", "job", OFFSET, expected_s)]


def _driver() -> SimDriver:
    sim = FlowSim(_topo())
    return SimDriver(sim, sim.topo, FlowBook(sim), EventClock(), lag_s=0.0, publish=lambda *_: None)


def _grant(d: SimDriver, steps: int, pause_after: tuple[int, ...] = (),
           pause_s: float = 0.0) -> tuple[Window, float, float]:
    iso = d.windows.isolated(_pattern())
    dur = iso.durations_s[0]
    pattern = _pattern(dur)
    period = OFFSET + dur + 0.05
    assert d.windows.refusal(pattern, iso, period) == ""
    win = d.windows.grant(tenant="tenants/a", instance="i-1", tag="job", pattern=pattern, iso=iso,
                          cadence=Cadence(0.0, period, steps, pause_after, pause_s))
    d.open_window(win)
    return win, dur, period


def _neighbour(sim: FlowSim, t: float) -> Any:
    # another tenant's transfer over the job's own NIC links (the simulator does not care whose chips they are)
    return sim.start_transfer(0, 9, 4e9, start_s=t, tag="neighbour")


def test_a_window_is_refused_when_its_step_differs_or_its_links_carry_traffic() -> None:
    """Refused: a reference duration the pattern alone does not take, or traffic already on its links."""
    d = _driver()
    iso = d.windows.isolated(_pattern())
    assert "not in a steady state" in d.windows.refusal(_pattern(iso.durations_s[0] * 1.1), iso, 10.0)
    assert d.windows.mismatch(_pattern(iso.durations_s[0] * 1.1), iso) == 0  # the caller gets the alone durations
    assert d.windows.mismatch(_pattern(iso.durations_s[0]), iso) is None
    assert "ends after the step" in d.windows.refusal(_pattern(iso.durations_s[0]), iso, OFFSET)
    _neighbour(d.sim, 0.0)
    assert "other traffic" in d.windows.refusal(_pattern(iso.durations_s[0]), iso, 10.0)


def test_traffic_entering_a_windows_links_cuts_it_at_that_time_and_matches_the_per_step_run() -> None:
    """A neighbour transfer starting mid-collective of step 3 cuts the window at its start time; the job's
    step-3 collective (finished as a real flow with the bytes it had left) and the neighbour end within 1%
    of the run where every step's collective went through the simulator, and the links' bytes agree."""
    d = _driver()
    win, dur, period = _grant(d, 10)
    t_n = 3 * period + OFFSET + dur / 2
    h = _neighbour(d.sim, t_n)
    d.add(FlowRecord(d.book.new_name(), "tenants/b", [h.id], h.algorithm, t_n, 4e9, "", "send_recv", 2))
    d.advance(t_n + 10.0)
    assert win.final and win.cut_s == t_n and win.repeat == 3 and "entered its links" in win.cause
    (flow,) = win.step_flows
    assert flow.start_s == pytest.approx(3 * period + OFFSET) and flow.end_s == 0.0
    job_end = d.book.status(d.book.flows[win.flow_names[0]]).end_s
    # the per-step reference: the job's collective of every step in the simulator, the neighbour as above
    ref = FlowSim(_topo())
    hs = [ref.start_collective("all_reduce", RANKS, BYTES, start_s=j * period + OFFSET) for j in range(4)]
    hn = _neighbour(ref, t_n)
    ref.run_until_idle()
    assert hs[3].end_s > hs[3].start_s + dur * 1.05  # the neighbour really slowed the job's step-3 collective
    assert job_end - flow.start_s == pytest.approx(hs[3].end_s - hs[3].start_s, rel=0.01)
    assert float(h.end_s) - t_n == pytest.approx(float(hn.end_s) - t_n, rel=0.01)
    assert d.sim.link_stats().bytes_carried.sum() == pytest.approx(ref.link_stats().bytes_carried.sum(), rel=0.01)


def test_a_window_that_runs_to_its_end_credits_every_steps_bytes_and_frees_its_links() -> None:
    """Ended without a cut: its links carry steps x one step's bytes, and a second window may take them."""
    d = _driver()
    win, _, _ = _grant(d, 5)
    d.clock.advance(win.end_s)
    d.end_window(win)
    one = FlowSim(_topo())
    one.start_collective("all_reduce", RANKS, BYTES, start_s=0.0)
    one.run_until_idle()
    assert win.repeat == 5 and d.sim.reserved is None
    assert d.sim.link_stats().bytes_carried.sum() == pytest.approx(5 * one.link_stats().bytes_carried.sum())
    _grant(d, 2)


def test_cut_plan_counts_ended_steps_and_splits_the_step_in_progress() -> None:
    """Steps that ended by the cut count; of the next, an ended collective keeps its end, a later one starts at
    its own time with all its bytes, one in flight continues from the cut with the share of bytes it had left."""
    d = _driver()
    win, dur, period = _grant(d, 10)
    assert cut_plan(win, 2 * period + OFFSET / 2)[1][0].bytes_ == BYTES
    k, (f,) = cut_plan(win, 2 * period + OFFSET + dur / 4)
    assert k == 2 and f.at_s == pytest.approx(2 * period + OFFSET + dur / 4) and f.bytes_ == pytest.approx(0.75 * BYTES)
    k, (f,) = cut_plan(win, 2 * period + OFFSET + dur + 0.01)
    assert k == 2 and f.end_s == pytest.approx(2 * period + OFFSET + dur)
    assert cut_plan(win, 100 * period) == (10, [])


def test_a_window_with_checkpoint_pauses_starts_each_step_after_them_and_a_cut_in_a_pause_is_exact() -> None:
    """Pauses of 0.3 s after steps 1 and 4: step 5 starts 0.6 s late and the window ends so; traffic entering
    during the second pause counts 5 steps and starts step 5's collective at its own (paused) time."""
    d = _driver()
    win, dur, period = _grant(d, 8, (1, 4), 0.3)
    assert win.end_s == pytest.approx(8 * period + 0.6)
    k, (f,) = cut_plan(win, 5 * period + 0.3 + 0.1)  # inside the pause after step 4
    assert k == 5 and f.at_s == pytest.approx(5 * period + 0.6 + OFFSET) and f.bytes_ == BYTES
    k, (f,) = cut_plan(win, 2 * period + 0.3 + OFFSET + dur / 2)  # step 2, after the first pause
    assert k == 2 and f.bytes_ == pytest.approx(BYTES / 2)
    d.clock.advance(win.end_s)
    d.end_window(win)
    assert win.repeat == 8


def test_a_link_fault_cuts_a_window_at_once_and_its_step_in_progress_meets_the_fault_as_real_flows() -> None:
    """A link of the pattern taken down mid-collective of step 2: the window ends there with 2 steps, the rest of
    step 2's all-reduce is started as a real flow group before the fault applies, and the fault reroutes it (the
    spines are redundant) instead of the window carrying on as if nothing happened."""
    d = _driver()
    win, dur, period = _grant(d, 10)
    t = 2 * period + OFFSET + dur / 2
    d.clock.advance(t)
    spine = next(int(i) for i in win.iso.links if "spine" in d.topo.link_name(int(i)))
    events, failed = d.inject_fault(("link", spine), "down", 0.0)
    assert win.final and win.repeat == 2 and win.cut_s == pytest.approx(t) and win.cause == "a link fault"
    assert not failed and any(e.kind == "rerouted" for e in events)
    rec = d.book.flows[win.flow_names[0]]
    assert d.book.status(rec).state == "running" and rec.bytes_ == pytest.approx(BYTES / 2, rel=0.05)


def test_a_reused_scratch_simulator_runs_a_pattern_alone_exactly_as_a_new_one() -> None:
    """Alone runs take an idle scratch simulator kept for the same link state (cleared of its traffic) instead of
    allocating one over every link: the step's durations, links and bytes are those of a new simulator, a
    changed link state gets its own, and at most SCRATCH_KEEP idle ones are kept per live simulator."""
    from gigacluster.fabric.service import windows as w

    live = FlowSim(_topo())
    pattern = [*_pattern(), PatternCollective("all_gather", RANKS + 1, 0, 1, BYTES / 2, None, "training", "job",
                                              0.0, 0.0)]
    first = w.isolated_step(w.LinkState.of(live), pattern)
    again = w.isolated_step(w.LinkState.of(live), pattern)  # the scratch of the first, cleared
    new = w._new_scratch(w.LinkState.of(live))  # what every alone run allocated before
    hs = [w._start(new, c, c.offset_s) for c in pattern]
    new.run_until_idle()
    b = new.bytes_carried()
    assert np.array_equal(new.carried()[0], np.flatnonzero(b > 0))
    for iso in (first, again):
        assert iso.durations_s == tuple(max(float(h.end_s) for h in g) - c.offset_s
                                        for c, g in zip(pattern, hs, strict=True))
        assert np.array_equal(iso.links, np.flatnonzero(b > 0)) and np.array_equal(iso.step_bytes, b[iso.links])
    for c, (ids, bb) in zip(pattern, w.collective_bytes(w.LinkState.of(live), pattern), strict=True):
        alone = w._new_scratch(w.LinkState.of(live))  # each collective alone on a new simulator, as before
        w._start(alone, c, 0.0)
        alone.run_until_idle()
        ab = alone.bytes_carried()
        assert np.array_equal(ids, np.flatnonzero(ab > 0)) and np.array_equal(bb, ab[ids])
    live.fail_link(int(first.links[-1]))  # another link state (a spine link): a scratch with it down
    moved = w.isolated_step(w.LinkState.of(live), pattern)
    assert int(first.links[-1]) not in set(moved.links.tolist())
    assert sum(len(v) for v in w._idle[live].values()) <= w.SCRATCH_KEEP


def test_whether_flows_cross_links_is_read_through_the_pools_numbering_as_isin_gives_it() -> None:
    """FlowSim.flows_on (a window's refusal) through the pool's local link numbering: the same answer as testing
    every incidence entry against the links, for links the flows cross, links they never met and, after the
    flows end, none."""
    sim = FlowSim(_topo())
    sim.start_transfer(0, 9, 4e9, start_s=0.0)
    sim.start_collective("all_reduce", RANKS + 2, 1e9, start_s=0.0)
    sim.advance(1e-6)
    crossed = np.unique(sim._pool.e_link)
    spare = np.setdiff1d(np.arange(sim.topo.n_links), crossed)
    for links in (crossed[:1], crossed[-3:], spare[:50], np.concatenate([spare[:5], crossed[5:6]])):
        assert sim.flows_on(links) == bool(np.isin(sim._pool.e_link, links).any())
    assert sim.flows_on(crossed[:1]) and not sim.flows_on(spare[:50])
    sim.run_until_idle()
    assert not sim.flows_on(crossed)
