"""Topology construction: scale-up domains, fat-tree sizing, names, validation, scale."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.fabric.topology import TIER_NAMES, Topology, TopologyConfig, build_topology
from gigacluster.model import SpecError


def _tier(topo: Topology, name: str) -> np.ndarray:
    return topo.link_tier == TIER_NAMES.index(name)


def test_hgx_nvswitch_links_carry_per_direction_goodput(hgx16: Topology) -> None:
    """Each H100 has one up and one down NVSwitch link at 450 GB/s x 0.82 (NVLink4 900 GB/s bidir, datasheet)."""
    su = _tier(hgx16, "scaleup")
    assert su.sum() == 2 * 16
    np.testing.assert_allclose(hgx16.link_capacity_Bps[su], 450e9 * 0.82)
    np.testing.assert_allclose(hgx16.link_line_rate_Bps[su], 450e9)
    nic = _tier(hgx16, "nic")
    assert nic.sum() == 2 * 16
    np.testing.assert_allclose(hgx16.link_capacity_Bps[nic], 400e9 / 8 * 0.92)


def test_rail_optimised_leaves_group_chips_by_local_index(hgx16: Topology) -> None:
    """Chip k of every node hangs off the same leaf (its rail), so 8 leaves serve 2 nodes."""
    assert hgx16.chip_leaf[:8].tolist() == list(range(8))
    assert hgx16.chip_leaf[8:].tolist() == list(range(8))
    s = hgx16.summary()
    assert s["leaves"] == 8 and s["switches"] == 2 + 8 + s["spines"]


def test_mi300x_full_mesh_has_seven_links_per_gpu_at_64_GBps() -> None:
    """MI300X platform: 7 Infinity Fabric links per GPU, 64 GB/s per direction each (RCCL issue 1210)."""
    topo = build_topology(TopologyConfig(chip="mi300x", count=8))
    su = _tier(topo, "scaleup")
    assert su.sum() == 8 * 7
    np.testing.assert_allclose(topo.link_line_rate_Bps[su], 64e9)
    assert topo.summary()["switches"] == 8 + topo.summary()["spines"]  # no scale-up switch, 8 leaves


def test_trn2_torus_and_ultraserver_ring() -> None:
    """trn2: 4 torus links per chip at 128 GB/s; the UltraServer adds 2 ring links per chip (AWS Neuron docs)."""
    topo = build_topology(TopologyConfig(chip="trainium2", count=16))
    su = _tier(topo, "scaleup")
    assert su.sum() == 16 * 4
    np.testing.assert_allclose(topo.link_line_rate_Bps[su], 128e9)
    us = build_topology(TopologyConfig(chip="trainium2", count=64, system="trn2-ultraserver"))
    su = _tier(us, "scaleup")
    assert su.sum() == 64 * 6
    assert np.isclose(us.link_line_rate_Bps[su], 64e9).sum() == 64 * 2
    # the +x neighbour of chip 3 (x=3) wraps to chip 0
    assert int(us.link_dst[us.torus_link[3, 0]]) == 0
    # the +ring neighbour of chip 5 in instance 0 is chip 21 in instance 1
    assert int(us.link_dst[us.torus_link[5, 4]]) == 21


def test_trn3_switch_domains_of_64_and_144() -> None:
    """Trn3 UltraServers: one NeuronSwitch domain of 64 (gen 1) or 144 (gen 2) chips."""
    for system, dom in (("trn3-ultraserver", 64), ("trn3-ultraserver-144", 144)):
        topo = build_topology(TopologyConfig(chip="trainium3", count=2 * dom, system=system))
        assert topo.chips_per_domain == dom
        assert topo.node_count["sw"] == 2
        assert topo.domain_of(np.array([0, dom - 1, dom])).tolist() == [0, 0, 1]


def test_oversubscription_sets_leaf_port_split() -> None:
    """A 128-port (400G) Tomahawk 5 leaf at 3:1 gives 96 ports down and 32 up."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=1536, oversubscription=3.0))
    assert (topo.leaf_down_ports, topo.leaf_up_ports) == (96, 32)
    up = topo.link_capacity_Bps[topo.up2].sum(axis=1)
    np.testing.assert_allclose(up, 32 * 50e9 * 0.92)


def test_link_and_node_names_round_trip(two_groups: Topology) -> None:
    """Link names are <src>-<dst> and link_id_by_name inverts link_name for every tier."""
    for lid in (0, int(two_groups.nic_up[5]), int(two_groups.up2[3, 1]), int(two_groups.down2[9, 2])):
        name = two_groups.link_name(lid)
        assert two_groups.link_id_by_name(name) == lid
        assert two_groups.link_id_by_name("links/" + name) == lid
    assert two_groups.link_name(int(two_groups.up2[3, 1])) == "leaf3-spine1"
    assert two_groups.node_id_by_name("switches/spine1") == two_groups.node_base["spine"] + 1
    with pytest.raises(SpecError) as exc:
        two_groups.link_id_by_name("leaf3-leaf4")
    assert exc.value.field == "link"


def test_bad_config_raises_spec_error_naming_the_field() -> None:
    """Unknown names, non-multiples and impossible trees raise SpecError naming the field."""
    cases = [
        ({"chip": "h100", "count": 8}, "chip"),
        ({"chip": "h100-sxm", "count": 12}, "count"),
        ({"chip": "h100-sxm", "count": 8, "system": "trn2"}, "system"),
        ({"chip": "h100-sxm", "count": 8, "tiers": 4}, "tiers"),
        ({"chip": "h100-sxm", "count": 8, "oversubscription": 0.5}, "oversubscription"),
        ({"chip": "h100-sxm", "count": 8, "routing": "valiant"}, "routing"),
        ({"chip": "h100-sxm", "count": 8, "nic": "cx9"}, "nic"),
        ({"chip": "h100-sxm", "count": 8, "colour": "red"}, "colour"),
        ({"count": 8}, "chip"),
        ({"chip": "trainium2", "count": 8}, "count"),
    ]
    for d, field in cases:
        with pytest.raises(SpecError) as exc:
            TopologyConfig.from_dict(d)
        assert exc.value.field == field, d
    with pytest.raises(SpecError) as exc:
        build_topology(TopologyConfig(chip="h100-sxm", count=16384, tiers=2))
    assert exc.value.field == "tiers" and "tiers=3" in str(exc.value)


def test_three_tier_tree_of_131072_chips_has_k_ary_shape() -> None:
    """131,072 H100 on 400G Tomahawk 5: 2,048 leaves in 32 pods of 64 aggregation switches, 2,048 cores."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=131072, tiers=3))
    s = topo.summary()
    assert (s["leaves"], s["aggs"], s["cores"]) == (2048, 32 * 64, 64 * 16)
    # non-blocking: bisection = half of all NIC capacity
    assert s["bisection_Bps"] == pytest.approx(0.5 * 131072 * 50e9 * 0.92, rel=1e-9)
    assert topo.n_links == 2 * 131072 * 2 + 2 * 2048 * 64 + 2 * 2048 * 16
