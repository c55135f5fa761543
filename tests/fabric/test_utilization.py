"""Per-tier utilisation totals without gRPC: the time integral of bytes over capacity, flows and windows alike."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gigacluster.fabric.service.book import FlowBook
from gigacluster.fabric.service.driver import SimDriver
from gigacluster.fabric.service.windows import PatternCollective, Window
from gigacluster.fabric.sim import N_TIERS, FlowSim
from gigacluster.fabric.topology import TIER_NAMES, Topology, TopologyConfig, build_topology
from gigacluster.model.cadence import Cadence
from gigacluster.runtime.clock import EventClock

NIC = TIER_NAMES.index("nic")
RANKS = np.array([0, 9, 18, 27])  # one chip per node, each on another rail: the ring crosses the spines
BYTES = 2e9
OFFSET = 0.1


@pytest.fixture(scope="module")
def topo64() -> Topology:
    """Eight HGX H100 nodes on a two-tier fat-tree."""
    return build_topology(TopologyConfig(chip="h100-sxm", count=64))


def _per_tier(topo: Topology, bytes_: np.ndarray) -> np.ndarray:
    """Per tier, the sum over links of bytes / capacity: the reference, from every link's carried bytes."""
    return np.bincount(topo.link_tier, weights=bytes_ / topo.link_capacity_Bps, minlength=N_TIERS)


def test_a_lone_transfer_integrates_to_its_rate_times_its_time_on_each_of_its_links(hgx16: Topology) -> None:
    """Chip 0 to chip 8 (two NIC links, alone at their full capacity): midway the NIC tier holds exactly 2 x t
    link-seconds and 2 x rate x t bytes; at the end 2 x bytes / capacity; idle time after adds nothing."""
    sim = FlowSim(hgx16)
    cap = float(hgx16.link_capacity_Bps[hgx16.link_tier == NIC].max())
    h = sim.start_transfer(0, 8, 1e9, start_s=0.0)
    sim.advance(0.004)
    busy, byt = sim.tier_totals()
    assert busy[NIC] == pytest.approx(2 * 0.004, rel=1e-12) and byt[NIC] == pytest.approx(2 * cap * 0.004, rel=1e-12)
    assert busy.sum() == busy[NIC]
    sim.run_until_idle()
    assert float(h.end_s) >= 1e9 / cap  # the drain, then the path's latency
    sim.advance(5.0)
    busy, byt = sim.tier_totals()
    assert busy[NIC] == pytest.approx(2 * 1e9 / cap, rel=1e-12) and byt[NIC] == pytest.approx(2e9, rel=1e-12)


def test_flows_whose_rates_change_integrate_to_every_links_bytes_over_its_capacity(topo64: Topology) -> None:
    """Transfers and a ring that share links and end at different times (rates change at every end): each tier's
    total equals the sum over its links of bytes carried / capacity, at an instant mid-run and at the end."""
    sim = FlowSim(topo64)
    sim.start_collective("all_reduce", RANKS, BYTES, start_s=0.0)
    sim.start_transfer(0, 9, 3e9, start_s=0.01)
    sim.start_transfer(18, 1, 1e9, start_s=0.02)
    for t in (0.03, 10.0):
        sim.advance(t)
        busy, byt = sim.tier_totals()
        carried = sim.link_stats().bytes_carried
        np.testing.assert_allclose(busy, _per_tier(topo64, carried), rtol=1e-9)
        np.testing.assert_allclose(byt, np.bincount(topo64.link_tier, weights=carried, minlength=N_TIERS),
                                   rtol=1e-9)
    assert sim.next_event_s() is None and busy[NIC] > 0 and busy[TIER_NAMES.index("leaf-spine")] > 0


def test_a_degraded_link_counts_its_bytes_against_its_capacity_in_the_topology(hgx16: Topology) -> None:
    """A NIC link at half capacity carries the transfer at half rate: its link-seconds are bytes over the full
    (topology) capacity, so the tier's figure says how much of the built network the traffic used."""
    sim = FlowSim(hgx16)
    up = int(hgx16.nic_up[0])
    sim.degrade_link(up, 0.5)
    sim.start_transfer(0, 8, 1e9, start_s=0.0)
    sim.run_until_idle()
    busy, _ = sim.tier_totals()
    cap = float(hgx16.link_capacity_Bps[up])
    assert busy[NIC] == pytest.approx(2 * 1e9 / cap, rel=1e-12)


def test_a_tracking_simulator_keeps_each_tiers_highest_link_utilisation(hgx16: Topology) -> None:
    """A lone transfer fills its NIC links (peak 1 on the NIC tier, 0 elsewhere); clearing the traffic resets it."""
    sim = FlowSim(hgx16, track_links=True)
    sim.start_transfer(0, 8, 1e9, start_s=0.0)
    sim.run_until_idle()
    peak = sim.tier_peak()
    assert peak[NIC] == pytest.approx(1.0) and peak.sum() == pytest.approx(1.0)
    sim.clear_traffic()
    assert not sim.tier_peak().any() and not sim.tier_totals()[0].any()


def _driver(topo: Topology) -> SimDriver:
    sim = FlowSim(topo)
    return SimDriver(sim, topo, FlowBook(sim), EventClock(), lag_s=0.0, publish=lambda *_: None)


def _pattern(expected_s: float = 0.0) -> list[PatternCollective]:
    return [PatternCollective("all_reduce", RANKS, 0, 1, BYTES, None, "training", "job", OFFSET, expected_s)]


def _window(d: SimDriver, steps: int) -> tuple[Window, float]:
    iso = d.windows.isolated(_pattern())
    pattern = _pattern(iso.durations_s[0])
    period = OFFSET + iso.durations_s[0] + 0.05
    win = d.windows.grant(tenant="tenants/a", instance="i-1", tag="job", pattern=pattern, iso=iso,
                          cadence=Cadence(0.0, period, steps))
    d.open_window(win)
    return win, period


def _one_step(topo: Topology) -> np.ndarray:
    """Per tier, the link-seconds of one step's collective run through the simulator as flows."""
    one = FlowSim(topo)
    one.start_collective("all_reduce", RANKS, BYTES, start_s=0.0)
    one.run_until_idle()
    return _per_tier(topo, one.link_stats().bytes_carried)


def test_an_open_window_counts_its_completed_steps_and_credits_all_k_by_its_end(topo64: Topology) -> None:
    """A window of 7 steps: read mid-step 4 (in the collective), the tiers hold exactly 3 steps' link-seconds and
    the window's step peak; after its end, 7 x one step's (the step run as flows), and no window peak."""
    d = _driver(topo64)
    step = _one_step(topo64)
    win, period = _window(d, 7)
    d.clock.advance(3 * period + OFFSET + win.iso.durations_s[0] / 2)
    tiers, _, t = d.tier_stats()
    assert t == pytest.approx(d.clock.now())
    got = {ts.tier: ts for ts in tiers}
    for i, name in enumerate(TIER_NAMES):
        if name in got:
            assert got[name].busy_link_s == pytest.approx(3 * step[i], rel=1e-9, abs=1e-15)
    assert got["nic"].busy_link_s > 0 and got["nic"].mean_utilization == 0.0  # no live flow: the window's bytes
    assert got["nic"].windows_max_utilization == pytest.approx(1.0)  # its ring fills its NIC links alone
    d.clock.advance(win.end_s)
    d.end_window(win)
    tiers, _, _ = d.tier_stats()
    got = {ts.tier: ts for ts in tiers}
    assert win.repeat == 7 and got["nic"].windows_max_utilization == 0.0
    for i, name in enumerate(TIER_NAMES):
        if name in got:
            assert got[name].busy_link_s == pytest.approx(7 * step[i], rel=1e-9, abs=1e-15)


def test_a_cut_window_credits_its_whole_steps_and_the_share_of_the_step_in_progress(topo64: Topology) -> None:
    """Cut midway through step 3's collective: its ended steps and the half of the collective sent are credited at
    once, the other half runs as a flow, and once it drains the totals are 4 steps' (nothing lost or doubled)."""
    d = _driver(topo64)
    step = _one_step(topo64)
    win, period = _window(d, 10)
    t_cut = 3 * period + OFFSET + win.iso.durations_s[0] / 2
    d.clock.advance(t_cut)
    d.advance(t_cut)
    d.cut_window(win, t_cut, "test")
    busy, _ = d.sim.tier_totals()
    np.testing.assert_allclose(busy, 3.5 * step, rtol=1e-6, atol=1e-15)
    d.advance(t_cut + 10.0)
    busy, _ = d.sim.tier_totals()
    np.testing.assert_allclose(busy, 4 * step, rtol=1e-6, atol=1e-15)


def test_a_collective_standing_for_repeats_calls_counts_them_all_in_the_statistics_not_in_its_timing(
        topo64: Topology) -> None:
    """A TP-like all-gather inside one node (scale-up links) and a ring across nodes, each started as standing for
    5 calls (``repeats``): they end exactly when a single call does, and every tier's link-seconds and bytes,
    and every link's carried bytes, are 5 x the single call's."""
    def run(repeats: int) -> tuple[list[float], np.ndarray, np.ndarray, np.ndarray]:
        sim = FlowSim(topo64)
        hs = [sim.start_collective("all_gather", np.arange(8), 1e8, start_s=0.0, repeats=repeats),
              sim.start_collective("all_reduce", RANKS, BYTES, start_s=0.0, repeats=repeats)]
        sim.run_until_idle()
        busy, byt = sim.tier_totals()
        return [float(h.end_s) for h in hs], busy, byt, sim.link_stats().bytes_carried

    ends1, busy1, byt1, links1 = run(1)
    ends5, busy5, byt5, links5 = run(5)
    assert ends5 == ends1
    assert busy1[TIER_NAMES.index("scaleup")] > 0 and busy1[NIC] > 0
    np.testing.assert_allclose(busy5, 5 * busy1, rtol=1e-12)
    np.testing.assert_allclose(byt5, 5 * byt1, rtol=1e-12)
    np.testing.assert_allclose(links5, 5 * links1, rtol=1e-12)
    np.testing.assert_allclose(_per_tier(topo64, links5), busy5, rtol=1e-9)  # the per-link view agrees


def test_a_window_whose_collective_stands_for_repeats_calls_credits_them_all_per_step(topo64: Topology) -> None:
    """The window path: an isolated step of a pattern collective standing for 3 calls moves 3 x the bytes of one,
    on the same links, in the same time."""
    d = _driver(topo64)
    one = d.windows.isolated(_pattern())
    three = d.windows.isolated([dataclasses.replace(c, repeats=3) for c in _pattern()])
    assert three.durations_s == one.durations_s
    np.testing.assert_array_equal(three.links, one.links)
    np.testing.assert_allclose(three.step_bytes, 3 * one.step_bytes, rtol=1e-12)
    np.testing.assert_allclose(three.tier_busy_s, 3 * one.tier_busy_s, rtol=1e-12)
