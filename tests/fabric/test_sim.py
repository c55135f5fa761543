"""FlowSim: contention between jobs, faults mid-collective, traffic classes, clock rules, stats."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.fabric import UnknownFlowGroupError
from gigacluster.fabric.collectives import collective_constants
from gigacluster.fabric.comm_model import FabricCommModel
from gigacluster.fabric.routing import route
from gigacluster.fabric.sim import ClassPolicy, FlowSim
from gigacluster.fabric.topology import Topology
from gigacluster.hw.catalog import get_chip
from gigacluster.model import SpecError
from gigacluster.model.comm import GroupLayout

S = float(2**30)
NIC_BPS = 400e9 / 8 * 0.92  # 400G NIC goodput (catalog nic_efficiency)


def _alternate(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.column_stack([a, b]).ravel()


def _rail_chips(nodes: range, local: int) -> np.ndarray:
    return np.array([d * 8 + local for d in nodes])


def _ring_times(topo: Topology, jobs: list[np.ndarray]) -> list[float]:
    sim = FlowSim(topo)
    hs = [sim.start_collective("all_reduce", r, S, start_s=0.0, algo="ring") for r in jobs]
    sim.run_until_idle()
    assert all(h.state == "done" for h in hs)
    return [h.end_s for h in hs]


def test_two_jobs_on_one_oversubscribed_spine_each_get_half(oversub_spray: Topology) -> None:
    """Two rings whose every hop crosses leaf0/leaf8 uplinks (3:1) each run at half the solo rate, as max-min says."""
    k = 48  # ranks per side; k hops share each leaf's 32 x 400G uplinks
    job_a = _alternate(_rail_chips(range(0, k), 0), _rail_chips(range(96, 96 + k), 0))
    job_b = _alternate(_rail_chips(range(k, 2 * k), 0), _rail_chips(range(96 + k, 96 + 2 * k), 0))
    (alone,) = _ring_times(oversub_spray, [job_a])
    both = _ring_times(oversub_spray, [job_a, job_b])
    n = 2 * k
    uplink_Bps = 32 * NIC_BPS
    bw_alone = 2 * (n - 1) / n * S / (uplink_Bps / k)
    latency = alone - bw_alone
    launch_s, step_s = collective_constants()  # 1 GiB runs the Simple protocol
    assert 0 < latency < launch_s + 2 * (n - 1) * max(10e-6, step_s)  # a step: NICs and three switch hops
    for t in both:  # max-min: each job gets uplink/(2k) per hop
        assert t == pytest.approx(latency + 2 * bw_alone, rel=1e-6)


def test_jobs_on_disjoint_links_do_not_slow_each_other(oversub_spray: Topology) -> None:
    """A ring on rail 1 (other leaves) runs at its solo speed next to the rail-0 ring."""
    k = 48
    job_a = _alternate(_rail_chips(range(0, k), 0), _rail_chips(range(96, 96 + k), 0))
    job_c = _alternate(_rail_chips(range(0, k), 1), _rail_chips(range(96, 96 + k), 1))
    (alone_a,) = _ring_times(oversub_spray, [job_a])
    (alone_c,) = _ring_times(oversub_spray, [job_c])
    both = _ring_times(oversub_spray, [job_a, job_c])
    assert both == [pytest.approx(alone_a, rel=1e-12), pytest.approx(alone_c, rel=1e-12)]


def test_link_failure_mid_collective_reroutes_and_completes(two_groups: Topology) -> None:
    """Killing the spine link a cross-group ring uses, half way through, reroutes it; it still completes."""
    ranks = np.array([0, 64 * 8, 8, 65 * 8])  # rail 0 of nodes 0, 64, 1, 65: leaves 0 and 8
    sim = FlowSim(two_groups)
    h = sim.start_collective("all_reduce", ranks, S, start_s=0.0, algo="ring")
    end0 = h.predicted_end_s
    sim.advance(end0 / 2)
    used = np.flatnonzero(sim.link_stats().rate_Bps > 0)
    spine_links = [lk for lk in used if two_groups.link_tier[lk] == 2]
    assert spine_links
    ev = sim.fail_link(int(spine_links[0]))
    assert [e.kind for e in ev] == ["link_down", "rerouted"]
    assert ev[1].group_id == h.id
    assert sim.link_stats().rate_Bps[spine_links[0]] == 0.0
    done = sim.run_until_idle()
    assert h.state == "done" and [e.kind for e in done] == ["completed"]
    assert h.end_s >= end0 * (1 - 1e-9)


def test_no_path_left_fails_the_collective_with_a_clear_error(two_groups: Topology) -> None:
    """With chip 512's NIC uplink down mid-collective, the group fails naming the chips without a path."""
    ranks = np.array([0, 512])
    sim = FlowSim(two_groups)
    h = sim.start_collective("all_reduce", ranks, S, start_s=0.0, algo="ring")
    sim.advance(h.predicted_end_s / 3)
    ev = sim.fail_link(int(two_groups.nic_up[512]))
    assert [e.kind for e in ev] == ["link_down", "failed"]
    assert h.state == "failed" and "no live path from chip 512" in h.error
    assert ev[1].group_id == h.id
    assert sim.next_event_s() is None
    # a new transfer from the cut-off chip fails at once
    t = sim.start_transfer(512, 0, 1e6, start_s=sim.now_s)
    assert t.state == "failed" and "512" in t.error


def test_nvswitch_link_down_falls_back_to_the_nic(hgx16: Topology) -> None:
    """With chip0-sw0 down, a 1 GiB transfer chip 0 -> chip 1 runs over the 400G NICs instead of NVLink."""
    sim = FlowSim(hgx16)
    sim.fail_link(hgx16.link_id_by_name("chip0-sw0"))
    h = sim.start_transfer(0, 1, S, start_s=0.0)
    sim.run_until_idle()
    assert h.end_s == pytest.approx(S / NIC_BPS, rel=1e-3)


def test_switch_down_reroutes_around_a_spine(two_groups: Topology) -> None:
    """Taking a whole spine down moves its flows to the other spines; the transfer completes."""
    sim = FlowSim(two_groups)
    h = sim.start_transfer(0, 512, S, start_s=0.0)
    lk = [int(x) for x in np.flatnonzero(sim.link_stats().rate_Bps > 0) if two_groups.link_tier[x] == 2]
    spine = int(two_groups.link_dst[lk[0]])
    ev = sim.fail_switch(spine)
    assert ev[0].kind == "switch_down" and ev[1].kind == "rerouted"
    sim.run_until_idle()
    assert h.state == "done"
    assert sim.link_stats().tiers[2].links_down == 2 * 16  # up and down links of that spine to 16 leaves


def test_degraded_link_slows_a_transfer_by_its_factor(hgx16: Topology) -> None:
    """A NIC link at 25% capacity stretches a NIC-bound transfer 4x."""
    sim = FlowSim(hgx16)
    sim.degrade_link(int(hgx16.nic_up[0]), 0.25)
    h = sim.start_transfer(0, 8, S, start_s=0.0)
    sim.run_until_idle()
    assert h.end_s == pytest.approx(S / (0.25 * NIC_BPS), rel=1e-3)
    with pytest.raises(SpecError) as exc:
        sim.degrade_link(0, 1.5)
    assert exc.value.field == "capacity_factor"


def test_strict_priority_serves_inference_first(hgx16: Topology) -> None:
    """Inference at priority 1 takes the whole NIC; training waits, then finishes at 2B/c."""
    sim = FlowSim(hgx16, classes={"training": ClassPolicy(0, 1.0), "inference": ClassPolicy(1, 1.0)})
    tr = sim.start_transfer(0, 8, S, start_s=0.0, traffic_class="training")
    inf = sim.start_transfer(0, 8, S, start_s=0.0, traffic_class="inference")
    sim.run_until_idle()
    assert inf.end_s == pytest.approx(S / NIC_BPS, rel=1e-3)
    assert tr.end_s == pytest.approx(2 * S / NIC_BPS, rel=1e-3)


def test_weights_share_a_link_in_proportion(hgx16: Topology) -> None:
    """Default weights (inference 4, training 1): inference finishes at B/(0.8c), training at 2B/c."""
    sim = FlowSim(hgx16)
    tr = sim.start_transfer(0, 8, S, start_s=0.0, traffic_class="training")
    inf = sim.start_transfer(0, 8, S, start_s=0.0, traffic_class="inference")
    sim.run_until_idle()
    assert inf.end_s == pytest.approx(S / (0.8 * NIC_BPS), rel=1e-3)
    assert tr.end_s == pytest.approx(2 * S / NIC_BPS, rel=1e-3)
    with pytest.raises(SpecError) as exc:
        sim.start_transfer(0, 8, S, start_s=0.0, traffic_class="bulk")
    assert exc.value.field == "traffic_class"


def test_clock_rules_and_predictions(hgx16: Topology) -> None:
    """A start in the past starts now; a second flow on the link pushes the first one's prediction out."""
    sim = FlowSim(hgx16)
    assert sim.advance(1.0) == [] and sim.now_s == 1.0
    a = sim.start_transfer(0, 8, S, start_s=0.0)
    assert a.start_s == 1.0
    p1 = a.predicted_end_s
    assert p1 == pytest.approx(1.0 + S / NIC_BPS, rel=1e-3)
    b = sim.start_transfer(0, 8, S, start_s=1.0)
    assert a.predicted_end_s == pytest.approx(1.0 + 2 * S / NIC_BPS, rel=1e-3)
    later = sim.start_transfer(1, 9, S, start_s=5.0)
    assert later.state == "pending" and later.predicted_end_s == pytest.approx(5.0 + S / NIC_BPS, rel=1e-3)
    ev = sim.advance(100.0)
    assert [e.group_id for e in ev] == [a.id, b.id, later.id] or [e.group_id for e in ev] == [b.id, a.id, later.id]
    assert [e.time_s for e in ev] == sorted(e.time_s for e in ev)
    with pytest.raises(SpecError):
        sim.advance(50.0)
    with pytest.raises(UnknownFlowGroupError):
        sim.predicted_end_s("f-999")


def test_link_stats_per_tier_and_bytes_carried(hgx16: Topology) -> None:
    """A NIC-bound transfer shows full utilisation on its two NIC links and carries its bytes."""
    sim = FlowSim(hgx16)
    h = sim.start_transfer(0, 8, S, start_s=0.0)
    st = sim.link_stats()
    up = int(hgx16.nic_up[0])
    assert st.utilization[up] == pytest.approx(1.0)
    nic = next(t for t in st.tiers if t.tier == "nic")
    assert nic.max_utilization == pytest.approx(1.0) and nic.links == 32
    sim.advance(h.predicted_end_s + 1e-3)
    assert sim.link_stats().bytes_carried[up] == pytest.approx(S, rel=1e-6)


def test_1024_rank_collective_is_one_lockstep_flow_and_ecmp_collides() -> None:
    """A 1,024-rank ring completes in one event; spraying reaches the NIC bound, ECMP hash collisions do not."""
    from gigacluster.fabric.topology import TopologyConfig, build_topology

    times = {}
    for routing in ("spray", "ecmp"):
        topo = build_topology(TopologyConfig(chip="h100-sxm", count=1024, routing=routing))
        sim = FlowSim(topo)
        h = sim.start_collective("all_reduce", np.arange(1024), S, start_s=0.0, algo="ring")
        ev = sim.run_until_idle()
        assert h.state == "done" and len(ev) == 1
        times[routing] = h.end_s
    # bound by the NIC hops (2(n-1)/n S at 46 GB/s) plus 2(n-1) steps of the slowest hop's latency
    launch_s, step_s = collective_constants()
    hop_s = float(route(topo, np.array([7]), np.array([8]), np.array([0])).latency_s[0])
    alpha_s = launch_s + 2 * 1023 * max(hop_s, step_s)
    assert alpha_s > 0.005  # the latency term of a 1,024-rank ring is no longer small
    assert times["spray"] == pytest.approx(alpha_s + 2 * 1023 / 1024 * S / NIC_BPS, rel=1e-6)
    # chip order crosses rails at each node boundary (leaf 7 -> leaf 0): 64 hops hashed onto 8 spine links
    assert times["ecmp"] > 1.1 * times["spray"]


def test_fabric_comm_model_sees_rail_contention() -> None:
    """TP of 8 in one HGX matches the ring estimate; 8 concurrent DP groups (one per rail) take no less than one."""
    m = FabricCommModel(algo="ring")
    chip = get_chip("h100-sxm")
    tp = m.collective_time_s(chip, "hgx", "all_reduce", S, GroupLayout(8, 8, 1))
    assert tp == pytest.approx(2 * 7 / 8 * S / (450e9 * 0.82), rel=0.015)  # + 14 Simple steps of 3.4 us
    one = m.collective_time_s(chip, "hgx", "all_reduce", S, GroupLayout(64, 1, 1))
    eight = m.collective_time_s(chip, "hgx", "all_reduce", S, GroupLayout(64, 1, 8))
    assert eight >= one * (1 - 1e-12)
    assert one == pytest.approx(2 * 63 / 64 * S / NIC_BPS, rel=0.02)
    with pytest.raises(SpecError) as exc:
        m.collective_time_s(chip, "hgx", "all_reduce", S, GroupLayout(64, 2, 8))
    assert exc.value.field == "layout.groups_sharing_domain"


def test_cancel_ends_a_booked_group_and_frees_its_links(hgx16: Topology) -> None:
    """A group booked ahead and then cancelled ends failed at once, and another flow then gets the full NIC."""
    sim = FlowSim(hgx16)
    booked = sim.start_transfer(0, 8, 100 * S, start_s=5.0)
    other = sim.start_transfer(0, 9, S, start_s=5.0)
    ev = sim.cancel(booked.id, "cancelled: instances/i-1 was released")
    assert [e.kind for e in ev] == ["failed"] and booked.state == "failed"
    assert "released" in str(booked.error)
    assert sim.cancel(booked.id, "again") == []  # an ended group stays as it is
    sim.run_until_idle()
    assert other.state == "done"
    assert other.end_s - 5.0 == pytest.approx(S / NIC_BPS, rel=0.02)  # alone on the NIC: no phantom sharer


def _same_stats(a: object, b: object) -> bool:
    fields = ("rate_Bps", "capacity_Bps", "utilization", "active_flows", "bytes_carried", "state")
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for f in fields)


def test_link_stats_are_kept_only_while_nothing_changed(two_groups: Topology) -> None:
    """link_stats() is reused while time, flows, link state and credited bytes stand still, and recomputed
    (equal to a fresh computation) after each of them changes; the cheap readers agree with it."""
    sim = FlowSim(two_groups)
    ring = np.arange(16)
    st0 = sim.link_stats()
    assert sim.link_stats() is st0
    h = sim.start_collective("all_reduce", ring, S, start_s=0.0, algo="ring")
    sim.advance(1e-3)
    st1 = sim.link_stats()
    assert st1 is not st0 and st1.active_flows.sum() > 0
    assert _same_stats(st1, sim._link_stats())
    used = np.flatnonzero(st1.active_flows)
    assert sim.flows_on(used[:1]) and not sim.flows_on(np.flatnonzero(st1.active_flows == 0)[:1])
    assert np.array_equal(sim.bytes_carried(), st1.bytes_carried)
    state, cap = sim.link_state()
    assert np.array_equal(state, st1.state) and np.array_equal(cap, st1.capacity_Bps)
    sim.credit_bytes(used[:1], np.array([5.0]))
    assert sim.link_stats().bytes_carried[used[0]] == st1.bytes_carried[used[0]] + 5.0
    sim.fail_link(int(used[0]))
    st2 = sim.link_stats()
    assert st2.state[used[0]] == 2 and _same_stats(st2, sim._link_stats())
    sim.run_until_idle()
    assert h.state == "done" and sim.link_stats().active_flows.sum() == 0


def _tiers_by_hand(sim: FlowSim) -> list[tuple[object, ...]]:
    st = sim.link_stats()
    out = []
    for t in range(int(sim.topo.link_tier.max()) + 1):
        m = sim.topo.link_tier == t
        if m.any():
            out.append((int(m.sum()), float(st.capacity_Bps[m].sum()), float(st.rate_Bps[m].sum()),
                        float(st.utilization[m].mean()), float(st.utilization[m].max()),
                        int((st.state[m] == 2).sum()), int((st.state[m] == 1).sum())))
    return out


def test_tier_stats_equal_the_per_link_arrays_through_traffic_and_faults(two_groups: Topology) -> None:
    """tier_stats() (busy links only, link state once per network version) gives each tier's count, capacity,
    carried rate, mean and max utilisation and links down/degraded exactly as the per-link arrays do, idle, under
    traffic, after a link fails and one degrades, and after the traffic ends."""
    sim = FlowSim(two_groups)

    def check() -> None:
        tiers, active = sim.tier_stats()
        got = [(t.links, t.capacity_Bps, t.used_Bps, t.mean_utilization, t.max_utilization, t.links_down,
                t.links_degraded) for t in tiers]
        want = _tiers_by_hand(sim)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g[0] == w[0] and g[5:] == w[5:]
            assert g[1:5] == pytest.approx(w[1:5], rel=1e-12, abs=1e-12)
        assert active == sim.link_stats().active_flows_total
        assert [t.tier for t in tiers] == [t.tier for t in sim.link_stats().tiers]

    check()
    h = sim.start_collective("all_reduce", np.arange(16), S, start_s=0.0, algo="ring")
    sim.start_transfer(0, 9, S, start_s=0.0)
    sim.advance(1e-3)
    check()
    assert max(t.max_utilization for t in sim.tier_stats()[0]) > 0.5
    used = np.flatnonzero(sim.link_stats().active_flows)
    sim.fail_link(int(used[-1]))
    sim.degrade_link(int(used[0]), 0.5)
    check()
    assert sum(t.links_down for t in sim.tier_stats()[0]) == 1
    assert sum(t.links_degraded for t in sim.tier_stats()[0]) == 1
    sim.run_until_idle()
    check()
    assert h.state in ("done", "failed") and sim.tier_stats()[1] == 0


def test_ecmp_paths_come_from_the_flows_not_from_the_order_their_calls_arrived(two_groups: Topology) -> None:
    """Two jobs' rings over the spine started at one instant, in either order, end at the same times (ECMP labels
    are the job's, ``phase_labels``); a job's next step takes the paths of its first, as a NIC's queue pairs keep
    their UDP source port for the communicator's life."""
    # every hop of both rings crosses the spine, through the same two rail-0 leaves: ECMP collisions set the times
    a = _alternate(_rail_chips(range(0, 32), 0), _rail_chips(range(64, 96), 0))
    b = _alternate(_rail_chips(range(32, 64), 0), _rail_chips(range(96, 128), 0))

    def ends(order: tuple[str, ...]) -> dict[str, float]:
        sim = FlowSim(two_groups)
        hs = {tag: sim.start_collective("all_reduce", {"a": a, "b": b}[tag], S, start_s=0.0, algo="ring", tag=tag)
              for tag in order}
        sim.run_until_idle()
        return {tag: h.end_s for tag, h in hs.items()}

    first, second = ends(("a", "b")), ends(("b", "a"))
    assert first == second  # exactly: the same paths, so the same max-min solution
    # (with labels handed out in start order the two orders gave 0.0752 s and 0.0695 s for both rings)
    sim = FlowSim(two_groups)
    h1 = sim.start_collective("all_reduce", a, S, start_s=0.0, algo="ring", tag="a")
    sim.run_until_idle()
    h2 = sim.start_collective("all_reduce", a, S, start_s=h1.end_s, algo="ring", tag="a")
    sim.run_until_idle()
    assert h2.end_s - h2.start_s == pytest.approx(h1.end_s - h1.start_s, rel=1e-12)
    other = FlowSim(two_groups).start_collective("all_reduce", a, S, start_s=0.0, algo="ring", tag="another job")
    assert other.predicted_end_s > 0  # another tag hashes elsewhere (its time may differ: ECMP is a lottery)
