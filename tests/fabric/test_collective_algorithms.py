"""Protocols (LL / LL128 / Simple), full-mesh direct and one-shot, rail rings, NVLS, NVLSTree, the library policy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from gigacluster.cli.estimate_collective import algo_help
from gigacluster.fabric.algorithms import ALGORITHMS, walecki_paths
from gigacluster.fabric.collectives import plan_collective
from gigacluster.fabric.estimate import estimate_collective
from gigacluster.fabric.protocols import get_protocol, protocols
from gigacluster.fabric.topology import TopologyConfig, build_topology
from gigacluster.model import SpecError


def test_protocols_from_the_catalog() -> None:
    """LL carries half payload, LL128 15/16, Simple all; LL has the cheapest step (NCCL tuning model)."""
    assert get_protocol("ll").wire_efficiency == 0.5
    assert get_protocol("ll128").wire_efficiency == pytest.approx(120 / 128)
    assert get_protocol("simple").wire_efficiency == 1.0
    assert list(protocols()) == ["ll", "ll128", "simple"]
    with pytest.raises(SpecError) as exc:
        get_protocol("ll64")
    assert exc.value.field == "protocol"


def test_protocol_follows_message_size() -> None:
    """8 x H100 ring: LL for bytes, LL128 for mid sizes, Simple for GiBs; wire bytes = payload / efficiency."""
    names = [estimate_collective("all_reduce", b, "h100-sxm", 8, algo="ring").algorithm
             for b in (1024, 16 * 2**20, 2**30)]
    assert names == ["ring/ll", "ring/ll128", "ring"]
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=8))
    plan = plan_collective("all_reduce", np.arange(8), 1024, topo, algo="ring")
    assert plan.phases[0].proto == "ll"
    assert plan.phases[0].bytes_per_hop == pytest.approx(2 * 7 / 8 * 1024 / 0.5)


def test_mi300x_drives_all_seven_links() -> None:
    """8 x MI300X, 1 GiB all-reduce: RCCL's rings over every link (and the direct two-shot, when forced)
    reach 7 links x 48 GB/s (AMD: 48 of 64 usable), where a single ring reaches one link's 48 GB/s."""
    best = estimate_collective("all_reduce", 2**30, "mi300x", 8)
    direct = estimate_collective("all_reduce", 2**30, "mi300x", 8, algo="direct")
    ring = estimate_collective("all_reduce", 2**30, "mi300x", 8, algo="ring")
    assert best.algorithm == "mesh_rings"
    assert best.busbw_GBps == pytest.approx(7 * 64 * 0.75, rel=0.02)
    assert direct.busbw_GBps == pytest.approx(7 * 64 * 0.75, rel=0.02)
    assert ring.busbw_GBps == pytest.approx(64 * 0.75, rel=0.02)
    for op in ("reduce_scatter", "all_gather"):
        est = estimate_collective(op, 2**30, "mi300x", 8)
        assert est.algorithm == "mesh_rings" and est.busbw_GBps == pytest.approx(336, rel=0.02)


def test_mesh_rings_pay_ring_steps_where_two_shot_pays_two() -> None:
    """8 MiB on 8 x MI300X: the default (RCCL's rings, 14 steps) is slower than the opt-in direct two-shot (2)."""
    best = estimate_collective("all_reduce", 8 * 2**20, "mi300x", 8)
    direct = estimate_collective("all_reduce", 8 * 2**20, "mi300x", 8, algo="direct")
    assert best.algorithm == "mesh_rings"
    assert best.time_s - direct.time_s == pytest.approx(12 * 3.4e-6, rel=0.05)


def test_direct_reductions_only_up_to_rccl_mscclpp_threshold() -> None:
    """RCCL's MSCCL++ path (direct) serves all-reduce up to 1 MiB by default; one byte more runs its rings."""
    assert estimate_collective("all_reduce", 2**20, "mi300x", 8).algorithm.startswith("direct")
    assert estimate_collective("all_reduce", 2**20 + 1, "mi300x", 8).algorithm.startswith("mesh_rings")


def test_no_ll128_on_gfx942() -> None:
    """RCCL runs LL128 only from gfx950: MI300X never plans it, H100 does for mid-size messages."""
    assert "ll128" not in estimate_collective("all_reduce", 16 * 2**20, "mi300x", 8, algo="ring").algorithm
    assert estimate_collective("all_reduce", 16 * 2**20, "h100-sxm", 8, algo="ring").algorithm == "ring/ll128"


def test_one_shot_wins_only_small_messages_on_a_mesh() -> None:
    """One-shot (whole buffer to every peer, one step) is chosen for bytes, not for MiBs; never on a switch."""
    assert estimate_collective("all_reduce", 64, "mi300x", 8).algorithm == "one_shot/ll"
    assert estimate_collective("all_reduce", 64 * 2**20, "mi300x", 8).algorithm.startswith("mesh_rings")
    with pytest.raises(SpecError) as exc:
        estimate_collective("all_reduce", 64, "h100-sxm", 8, algo="one_shot")
    assert exc.value.field == "algo" and "ring" in str(exc.value)
    with pytest.raises(SpecError):
        estimate_collective("all_reduce", 2**20, "h100-sxm", 8, algo="direct")


def test_rail_rings_use_every_nic_of_a_node() -> None:
    """2 x 8 H100: one ring per rail with PXN; every inter-node hop stays on its rail; busbw near 8 NICs'
    goodput (46 GB/s each) where one node-major ring gets one NIC's."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=16))
    plan = plan_collective("all_reduce", np.arange(16), 2**30, topo, algo="rail_rings")
    ph = plan.phases[0]
    cross = topo.chip_domain[ph.src] != topo.chip_domain[ph.dst]
    assert (topo.chip_local[ph.src[cross]] == topo.chip_local[ph.dst[cross]]).all()
    assert ph.n_flows == 8
    rings = estimate_collective("all_reduce", 2**30, "h100-sxm", 16, algo="rail_rings")  # NCCL_ALGO=Ring
    one = estimate_collective("all_reduce", 2**30, "h100-sxm", 16, algo="ring")
    assert rings.busbw_GBps > 6 * one.busbw_GBps
    assert 330 < rings.busbw_GBps < 8 * 46


def test_rail_rings_span_racks_holding_different_numbers_of_the_ranks() -> None:
    """A group that fills one GB200 NVL72 rack and 8 GPUs of a second (a job of 80 GPUs, or 512 on 7 racks and a
    bit) ran a single ring, which crossed each rack boundary on one NIC: the reduce-scatter went at one NIC's
    speed. Rail rings now take it: as many rings as the fuller rack holds ranks, each entering a rack at its own
    local rank (modulo the rack's count), every rank visited once per ring; the thinner rack's 8 NICs carry all
    72 rings and pace the collective, so it runs at least 6x the single ring and no faster than two full racks."""
    topo = build_topology(TopologyConfig(chip="gb200", count=144, system="gb200-nvl72"))
    ranks = np.concatenate([np.arange(72), np.arange(72, 80)])
    plan = plan_collective("reduce_scatter", ranks, 2**31, topo, algo="rail_rings")
    ph = plan.phases[0]
    assert ph.n_flows == 72
    for c in range(72):  # each ring visits every rank once (a hand-over aside) and leaves each rack once
        mine = ph.flow_of == c
        assert set(ph.src[mine].tolist()) == set(ranks.tolist())
        assert (topo.chip_domain[ph.src[mine]] != topo.chip_domain[ph.dst[mine]]).sum() == 2
    assert (ph.src != ph.dst).all()
    uneven = estimate_collective("reduce_scatter", 2**31, "gb200", 80, system="gb200-nvl72")
    one = estimate_collective("reduce_scatter", 2**31, "gb200", 80, system="gb200-nvl72",
                              algo="ring")
    even = estimate_collective("reduce_scatter", 2**31, "gb200", 144, system="gb200-nvl72")
    assert uneven.algorithm.startswith("rail_rings")
    assert uneven.time_s * 6 < one.time_s
    assert uneven.time_s > even.time_s
    with pytest.raises(SpecError):  # equal racks keep the grid; full-mesh domains keep their own paths
        plan_collective("reduce_scatter", np.concatenate([np.arange(8), np.arange(8, 10)]), 2**20,
                        build_topology(TopologyConfig(chip="mi300x", count=16)), algo="rail_rings")


def test_walecki_paths_split_the_complete_graph() -> None:
    """The m/2 zigzag paths of an even m are Hamiltonian and share no link; together they are the whole mesh."""
    for m in (2, 4, 6, 8):
        paths = walecki_paths(m)
        assert all(sorted(p) == list(range(m)) for p in paths)
        edges = [frozenset(e) for p in paths for e in itertools.pairwise(p)]
        assert len(edges) == len(set(edges)) == m * (m - 1) // 2
    with pytest.raises(ValueError):
        walecki_paths(7)


@pytest.mark.parametrize("nodes", [2, 3])
def test_mesh_rail_rings_use_every_xgmi_link_and_nic_once(nodes: int) -> None:
    """g x 8 MI300X: the 8 rail rings use each directed xGMI link of a node once and each node's 8 NICs once
    each way, so busbw is the NICs' (8 x 46 GB/s), not one link's 48 GB/s (rccl-tests: 356 on 2 x 8)."""
    n = 8 * nodes
    topo = build_topology(TopologyConfig(chip="mi300x", count=n))
    ph = plan_collective("all_reduce", np.arange(n), 2**30, topo, algo="rail_rings").phases[0]
    inside = topo.chip_domain[ph.src] == topo.chip_domain[ph.dst]
    pairs = list(zip(ph.src[inside].tolist(), ph.dst[inside].tolist(), strict=True))
    assert len(pairs) == len(set(pairs)) == nodes * 8 * 7
    out = np.bincount(ph.src[~inside], minlength=n)
    into = np.bincount(ph.dst[~inside], minlength=n)
    assert (out == 1).all() and (into == 1).all()
    assert ph.n_flows == 8
    est = estimate_collective("all_reduce", 8 * 2**30, "mi300x", n)
    assert est.algorithm == "rail_rings" and 340 < est.busbw_GBps <= 8 * 46


def test_nvls_only_where_the_switch_reduces() -> None:
    """NVLS runs inside one NVSwitch-3 domain (H100 yes, A100 no, not across nodes) at (1 + 1/n) S per link."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=16))
    nvls = ALGORITHMS["nvls"]
    assert nvls.supports("all_reduce", np.arange(8), topo)
    assert not nvls.supports("all_reduce", np.arange(16), topo)
    assert not nvls.supports("all_gather", np.arange(8), topo)
    a100 = build_topology(TopologyConfig(chip="a100-80gb", count=8))
    assert not nvls.supports("all_reduce", np.arange(8), a100)
    est = estimate_collective("all_reduce", 2**32, "h100-sxm", 8)
    assert est.algorithm == "nvls"
    assert est.algbw_GBps == pytest.approx(450 * 0.82 * 0.84 * 8 / 9, rel=0.01)


def test_nvls_tree_only_across_nvls_domains() -> None:
    """NVLSTree runs all-reduce on >= 2 NVLS domains holding equal shares (NCCL: not on one node), not on A100."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=32))
    tree = ALGORITHMS["nvls_tree"]
    assert tree.supports("all_reduce", np.arange(16), topo) and tree.supports("all_reduce", np.arange(32), topo)
    assert not tree.supports("all_reduce", np.arange(8), topo)
    assert not tree.supports("all_reduce", np.arange(12), topo)
    assert not tree.supports("all_gather", np.arange(16), topo)
    a100 = build_topology(TopologyConfig(chip="a100-80gb", count=16))
    assert not tree.supports("all_reduce", np.arange(16), a100)


def test_nvls_needs_three_local_ranks_as_nccl_sets_it_up() -> None:
    """NCCL leaves NVLS off for a communicator with <= 2 GPUs on a node (src/transport/nvls.cc, ncclNvlsInit,
    catalog efficiency.comm.nvls.min_local_ranks): no nvls on 2 GPUs, no nvls_tree on 2 ranks per node."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=32))
    two_per_node = np.array([0, 1, 8, 9, 16, 17, 24, 25])
    three_per_node = np.array([0, 1, 2, 8, 9, 10])
    assert not ALGORITHMS["nvls"].supports("all_reduce", np.arange(2), topo)
    assert ALGORITHMS["nvls"].supports("all_reduce", np.arange(3), topo)
    assert not ALGORITHMS["nvls_tree"].supports("all_reduce", two_per_node, topo)
    assert ALGORITHMS["nvls_tree"].supports("all_reduce", three_per_node, topo)


def test_nvls_tree_moves_one_shard_each_way_per_nic_on_two_nodes() -> None:
    """2 x 8 B200: every NIC carries S/8 each way (a ring carries 2(n-1)/n x S/8), so busbw reaches 1.875x the NICs'
    46 GB/s; the NVLS pairs stay inside their node and load each GPU link (1 + 1/8) S / NVLS efficiency."""
    from gigacluster.model.nvls import nvls_efficiency

    topo = build_topology(TopologyConfig(chip="b200", count=16))
    (ph,) = plan_collective("all_reduce", np.arange(16), 2**30, topo, algo="nvls_tree").phases
    assert ph.weight is not None
    cross = topo.chip_domain[ph.src] != topo.chip_domain[ph.dst]
    assert (topo.chip_local[ph.src[cross]] == topo.chip_local[ph.dst[cross]]).all()
    out = np.bincount(ph.src[cross], weights=ph.weight[cross], minlength=16) * ph.bytes_per_hop
    assert out == pytest.approx(np.full(16, 2**30 / 8))  # B200's NICs are below NCCL's 96 GB/s channel ceiling
    inside = np.bincount(ph.src[~cross], weights=ph.weight[~cross], minlength=16) * ph.bytes_per_hop
    assert inside == pytest.approx(np.full(16, (1 + 1 / 8) * 2**30 / nvls_efficiency("b200")))
    est = estimate_collective("all_reduce", 8 * 2**30, "b200", 16)
    assert est.algorithm == "nvls_tree" and est.busbw_GBps == pytest.approx(8 * 46 * 15 / 8, rel=0.01)


def test_nvls_tree_is_held_by_nccls_channel_ceiling_on_hopper() -> None:
    """2 x 8 H100: NCCL's per-channel NVLSTree ceiling (perChMaxNVLSTreeBws, 57.7 GB/s busbw on two nodes) is
    below the NIC's rate, so busbw is 8 heads x 57.7; on four nodes (45.5 per head) the rail rings win, as NVIDIA/
    nccl issue 1221 saw NVLS help on 2 nodes of 8x H100 but not on more."""
    est = estimate_collective("all_reduce", 8 * 2**30, "h100-sxm", 16)
    assert est.algorithm == "nvls_tree" and est.busbw_GBps == pytest.approx(8 * 57.7, rel=0.01)
    assert estimate_collective("all_reduce", 8 * 2**30, "h100-sxm", 32).algorithm == "rail_rings"


def test_nvls_tree_weights_survive_a_reroute() -> None:
    """A spine link failing mid-NVLSTree (nodes 0 and 64 of 1,024 H100 sit in two leaf groups) moves its sub-flows
    with their byte shares: the collective completes when planned and every link ends idle."""
    from gigacluster.fabric.sim import FlowSim

    topo = build_topology(TopologyConfig(chip="h100-sxm", count=1024))
    ranks = np.concatenate([np.arange(8), 64 * 8 + np.arange(8)])
    sim = FlowSim(topo)
    h = sim.start_collective("all_reduce", ranks, 2**30, start_s=0.0, algo="nvls_tree")
    end0 = h.predicted_end_s
    sim.advance(end0 / 2)
    before = sim.link_stats().rate_Bps.copy()
    spine = [lk for lk in np.flatnonzero(before > 0) if topo.link_tier[lk] == 2]
    assert spine
    ev = sim.fail_link(int(spine[0]))
    assert [e.kind for e in ev] == ["link_down", "rerouted"]
    sim.run_until_idle()
    # the spine has room for the moved sub-flows: with their shares kept, the end does not move (booking the
    # moved tree edges at the shard's full bytes instead made it 17% later)
    assert h.state == "done" and h.end_s == pytest.approx(end0, rel=1e-9)
    assert not sim.link_stats().rate_Bps.any()


def test_fastest_policy_keeps_the_algorithms_libraries_lack() -> None:
    """The default 'library' policy never picks halving-doubling; the 'fastest' policy may."""
    topo = build_topology(TopologyConfig(chip="a100-80gb", count=16, nics_per_node=4))
    lib = plan_collective("all_reduce", np.arange(16), 2**30, topo)
    fast = plan_collective("all_reduce", np.arange(16), 2**30, topo, policy="fastest")
    assert lib.algorithm == "rail_rings"
    assert fast.algorithm == "halving_doubling"


def test_algo_help_lists_what_each_algorithm_runs() -> None:
    """--algo help names double_binary_tree and says direct/one_shot all-reduce need a full mesh."""
    text = algo_help()
    assert "double_binary_tree" in text and "nvls: all_reduce" in text and "rail_rings" in text
    assert "full-mesh" in text


@pytest.mark.parametrize(("bytes_", "chip", "count"), [(32, "a100-40gb", 2), (32768, "mi300x", 8),
                                                        (8 * 2**20, "mi300x", 8), (2**30, "h100-sxm", 8),
                                                        (2**20 + 1, "mi300x", 8), (8 * 2**30, "h100-sxm", 16),
                                                        (8 * 2**30, "b200", 16)])
def test_analytical_estimate_matches_the_flow_simulation(bytes_: int, chip: str, count: int) -> None:
    """collective_estimate_s (linear cost per algorithm and protocol, cached) gives what FlowSim gives for one
    collective on an idle domain, including the policy's size switch (direct up to 1 MiB on a mesh)."""
    from gigacluster.fabric.estimate import collective_estimate_s

    sim = estimate_collective("all_reduce", bytes_, chip, count).time_s
    assert collective_estimate_s("all_reduce", bytes_, chip, count) == pytest.approx(sim, rel=1e-9)
    assert collective_estimate_s("all_reduce", 0, chip, count) == 0.0


def test_torus_hamiltonian_pair_uses_every_link_once() -> None:
    """The two Hamiltonian cycles of the 4x4 torus visit every chip and together use each of its 32 links once
    (the Neuron docs' "2 non-overlapping Hamiltonian cycles on 2D Torus")."""
    from gigacluster.fabric.algorithms import torus_hamiltonian_pair

    pair = torus_hamiltonian_pair(4, 4)
    assert pair is not None
    edges = []
    for cycle in pair:
        assert sorted(cycle) == list(range(16))
        for a, b in zip(cycle, cycle[1:] + cycle[:1], strict=True):
            (ax, ay), (bx, by) = (a % 4, a // 4), (b % 4, b // 4)
            assert (ax == bx and (ay - by) % 4 in (1, 3)) or (ay == by and (ax - bx) % 4 in (1, 3))
            edges.append(frozenset((a, b)))
    assert len(set(edges)) == len(edges) == 32


def test_torus_rings_drive_all_four_links_of_a_trn1_chip() -> None:
    """16 Trainium (trn1), 1 GiB all-reduce: the library runs four rings over the torus's disjoint links, four
    times one ring's busbw (48 GiB/s links at 0.82); a ring alone uses one link of each chip."""
    link = 192 * 2**30 / 4 / 1e9 * 0.82
    best = estimate_collective("all_reduce", 2**30, "trainium1", 16, system="trn1")
    ring = estimate_collective("all_reduce", 2**30, "trainium1", 16, system="trn1", algo="ring")
    assert best.algorithm == "torus_rings"
    assert best.busbw_GBps == pytest.approx(4 * link, rel=0.02)
    assert ring.busbw_GBps == pytest.approx(link, rel=0.02)
    topo = build_topology(TopologyConfig(chip="trainium1", count=16, system="trn1"))
    phase = plan_collective("all_gather", np.arange(16), 2**26, topo).phases[0]
    assert phase.flow_of is not None and int(phase.flow_of.max()) + 1 == 4
    hops = {(int(s), int(d)) for s, d in zip(phase.src, phase.dst, strict=True)}
    assert len(hops) == 64  # every directed link of the torus once


def test_torus_rings_only_on_one_whole_torus() -> None:
    """torus_rings needs exactly the chips of one torus: not 8 of them, not two tori, not a switched domain."""
    algo = ALGORITHMS["torus_rings"]
    trn = build_topology(TopologyConfig(chip="trainium2", count=32))
    assert algo.supports("all_reduce", np.arange(16), trn)
    assert algo.supports("all_reduce", np.arange(16, 32)[::-1], trn)
    assert not algo.supports("all_reduce", np.arange(8), trn)
    assert not algo.supports("all_reduce", np.arange(32), trn)
    assert not algo.supports("all_to_all", np.arange(16), trn)
    us = build_topology(TopologyConfig(chip="trainium2", count=64, system="trn2-ultraserver"))
    assert algo.supports("reduce_scatter", np.arange(16, 32), us)
    assert not algo.supports("reduce_scatter", np.arange(8, 24), us)  # spans two instances
    hgx = build_topology(TopologyConfig(chip="h100-sxm", count=8))
    assert not algo.supports("all_reduce", np.arange(8), hgx)
    with pytest.raises(SpecError):
        plan_collective("all_reduce", np.arange(8), 1024, trn, algo="torus_rings")


def test_neuron_step_costs_its_published_per_hop_latency() -> None:
    """A Neuron ring step costs at least the docs' per-hop latency (catalog trn1 step_latency_s, 1-2 us): a
    64-byte all-gather on 16 Trainium pays 15 steps of 1.5 us, not LL's 0.6 us; the NVLink systems keep
    NCCL's own step (no system figure)."""
    from gigacluster.fabric.collectives import system_step_s
    from gigacluster.fabric.protocols import get_protocol

    trn = build_topology(TopologyConfig(chip="trainium1", count=16, system="trn1"))
    assert system_step_s(trn) == pytest.approx(1.5e-6)
    assert system_step_s(build_topology(TopologyConfig(chip="h100-sxm", count=8))) == 0.0
    est = estimate_collective("all_gather", 64, "trainium1", 16, system="trn1")
    assert est.algorithm == "torus_rings/ll"
    assert est.time_s == pytest.approx(get_protocol("ll").base_s + 15 * 1.5e-6, rel=0.01)


def test_torus_rings_laid_over_many_tori_at_once() -> None:
    """Four TP groups, one per trn1 torus, started as one request (ranks + 16 k): every copy runs the four
    torus rings on its own instance's links, so the four finish together in one group's time."""
    from gigacluster.fabric.sim import FlowSim

    topo = build_topology(TopologyConfig(chip="trainium1", count=64, system="trn1"))
    one = estimate_collective("all_gather", 2**26, "trainium1", 16, system="trn1")
    sim = FlowSim(topo)
    handles = sim.start_collectives("all_gather", np.arange(16), 16, 4, float(2**26), start_s=0.0)
    sim.run_until_idle()
    assert {h.algorithm for h in handles} == {"torus_rings"}
    assert max(h.end_s for h in handles) == pytest.approx(one.time_s, rel=1e-6)
