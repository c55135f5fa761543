"""Routing: scale-up paths, ECMP by flow hash, spraying, fault-aware choices."""

from __future__ import annotations

import numpy as np

from gigacluster.fabric.routing import flow_hash, route
from gigacluster.fabric.topology import Topology, TopologyConfig, build_topology


def test_intra_node_goes_through_nvswitch(hgx16: Topology) -> None:
    """Chip 0 -> chip 3 uses chip0-sw0 and sw0-chip3 only."""
    r = route(hgx16, np.array([0]), np.array([3]), np.array([0]))
    assert [hgx16.link_name(lk) for lk in r.e_link] == ["chip0-sw0", "sw0-chip3"]


def test_rail_matched_inter_node_stays_on_one_leaf(hgx16: Topology) -> None:
    """Chip 2 of node 0 -> chip 2 of node 1 shares leaf 2: two NIC hops, no spine."""
    r = route(hgx16, np.array([2]), np.array([10]), np.array([0]))
    assert sorted(hgx16.link_name(lk) for lk in r.e_link) == ["chip2-leaf2", "leaf2-chip10"]
    # cross-rail goes leaf -> spine -> leaf
    r = route(hgx16, np.array([2]), np.array([11]), np.array([0]))
    assert len(r.e_link) == 4


def test_ecmp_is_deterministic_and_spreads_over_spines(two_groups: Topology) -> None:
    """The same (src, dst, label) always hashes to the same spine; 4,000 labels use every spine evenly."""
    src, dst = np.zeros(4000, dtype=np.int64), np.full(4000, 64 * 8, dtype=np.int64)
    labels = np.arange(4000)
    r1 = route(two_groups, src, dst, labels)
    r2 = route(two_groups, src, dst, labels)
    np.testing.assert_array_equal(r1.e_link, r2.e_link)
    up = set(two_groups.up2[0].tolist())
    used = np.array([lk for lk in r1.e_link if lk in up])
    counts = np.unique(used, return_counts=True)[1]
    assert counts.size == two_groups.t2_per_pod
    assert counts.min() > 0.7 * 4000 / counts.size
    assert flow_hash(np.array([1]), np.array([2]), np.array([3]))[0] == flow_hash(
        np.array([1]), np.array([2]), np.array([3]))[0]


def test_dead_spine_link_is_never_chosen(two_groups: Topology) -> None:
    """With leaf0's uplink to spine 0 down, no flow from leaf 0 picks spine 0."""
    alive = np.ones(two_groups.n_links, dtype=bool)
    alive[two_groups.up2[0, 0]] = False
    r = route(two_groups, np.zeros(500, dtype=np.int64), np.full(500, 512), np.arange(500), alive=alive)
    assert r.ok.all()
    assert two_groups.up2[0, 0] not in set(r.e_link.tolist())


def test_no_path_when_nic_is_down(two_groups: Topology) -> None:
    """A chip whose NIC uplink is down cannot reach another node: ok is False and it has no entries."""
    alive = np.ones(two_groups.n_links, dtype=bool)
    alive[two_groups.nic_up[0]] = False
    r = route(two_groups, np.array([0, 1]), np.array([512, 513]), np.array([0, 0]), alive=alive)
    assert r.ok.tolist() == [False, True]
    assert 0 not in r.e_flow.tolist()


def test_spray_spreads_each_flow_evenly(two_groups: Topology) -> None:
    """Spraying puts 1/A of the flow on each of the A leaf uplinks."""
    r = route(two_groups, np.array([0]), np.array([512]), np.array([0]), mode="spray")
    a = two_groups.t2_per_pod
    up = np.isin(r.e_link, two_groups.up2[0])
    assert up.sum() == a
    np.testing.assert_allclose(r.e_coef[up], 1.0 / a)


def test_torus_path_is_shortest_with_wraparound() -> None:
    """On the 4x4 trn2 torus, chip 0 -> chip 15 (x=3, y=3) is 2 hops using the wrap links."""
    topo = build_topology(TopologyConfig(chip="trainium2", count=16))
    r = route(topo, np.array([0, 0]), np.array([15, 10]), np.array([0, 0]))
    hops = np.bincount(r.e_flow, minlength=2)
    assert hops.tolist() == [2, 4]


def test_mesh_falls_back_to_two_hops_then_nics() -> None:
    """MI300X: with the direct link down, 0 -> 1 goes through a peer; with all links of chip 0 down, via NICs."""
    topo = build_topology(TopologyConfig(chip="mi300x", count=8))
    alive = np.ones(topo.n_links, dtype=bool)
    alive[topo.mesh_link[0, 1]] = False
    r = route(topo, np.array([0]), np.array([1]), np.array([0]), alive=alive)
    assert r.ok.all() and r.e_link.size == 2
    alive[topo.mesh_link[0][topo.mesh_link[0] >= 0]] = False
    r = route(topo, np.array([0]), np.array([1]), np.array([0]), alive=alive)
    assert r.ok.all() and int(topo.nic_up[0]) in r.e_link.tolist()
