"""Placement policies: whole TP groups in one domain, gangs kept in few leaf groups, rank order."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.errors import InvalidArgument
from gigacluster.fabric.topology import TopologyConfig, build_topology
from gigacluster.scheduler.placement import Layout, get_policy, placement_stats


def test_layout_from_topology_groups_domains_that_share_leaves() -> None:
    """On 1,024 H100 (128 HGX domains) a Tomahawk 5 leaf group holds 64 domains: two leaf groups."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=1024))
    lay = Layout.from_topology(topo)
    assert lay.chips_per_domain == 8 and lay.n_domains == 128
    assert np.bincount(lay.domain_group).tolist() == [64, 64]


def test_every_policy_returns_whole_tp_groups_of_free_devices() -> None:
    """Each policy returns exactly count free, distinct devices, each TP group of 8 inside one domain."""
    lay = Layout.uniform(256, 8, 4)
    free = np.ones(256, dtype=bool)
    free[[3, 17, 40, 41]] = False  # fragmented domains 0, 2, 5
    for name in ("topology", "binpack", "spread"):
        devs = get_policy(name).place(lay, free, 64, tp=8)
        assert devs is not None and devs.size == 64 and np.unique(devs).size == 64 and free[devs].all(), name
        assert (np.ptp((devs // 8).reshape(-1, 8), axis=1) == 0).all(), name  # TP groups in one domain


def test_gang_is_all_or_nothing() -> None:
    """A gang larger than the free whole TP groups gets nothing (None), never a partial set."""
    lay = Layout.uniform(64, 8, 4)
    free = np.ones(64, dtype=bool)
    free[::8] = False  # one chip busy in each domain: no whole TP-8 group anywhere
    for name in ("topology", "binpack", "spread"):
        assert get_policy(name).place(lay, free, 8, tp=8) is None
        assert get_policy(name).place(lay, free, 32, tp=4) is not None  # TP-4 groups still fit


def test_topology_keeps_a_gang_in_one_leaf_group_where_spread_crosses_the_spine() -> None:
    """A 64-chip TP-8 DP-8 job on 16 leaf groups of 4 domains: topology uses 2 leaf groups, spread 8;
    DP spine crossings 8 (topology) vs 56 (spread)."""
    lay = Layout.uniform(512, 8, 4)
    free = np.ones(512, dtype=bool)
    topo = get_policy("topology").place(lay, free, 64, tp=8)
    spread = get_policy("spread").place(lay, free, 64, tp=8)
    assert topo is not None and spread is not None
    st_t = placement_stats(lay, topo, tp=8, cp=1, dp=8, pp=1)
    st_s = placement_stats(lay, spread, tp=8, cp=1, dp=8, pp=1)
    assert (st_t.domains, st_t.leaf_groups, st_t.dp_spine_crossings) == (8, 2, 8)
    assert (st_s.domains, st_s.leaf_groups, st_s.dp_spine_crossings) == (8, 8, 56)


def test_topology_best_fit_picks_the_fullest_group_that_holds_the_gang() -> None:
    """With one leaf group half used, a 2-domain gang goes into it (best fit) and leaves empty groups whole."""
    lay = Layout.uniform(128, 8, 4)  # 4 groups of 4 domains
    free = np.ones(128, dtype=bool)
    free[0:16] = False  # group 0: 2 of 4 domains used
    devs = get_policy("topology").place(lay, free, 16, tp=8)
    assert devs is not None and set((devs // 8).tolist()) == {2, 3}
    one = get_policy("topology").place(lay, free, 4, tp=4)  # fits in one domain: no scale-out
    assert one is not None and np.unique(one // 8).size == 1


def test_pp_stages_sit_on_neighbouring_domains() -> None:
    """Topology orders domains by leaf group: with PP 2 each stage of 4 domains fills one leaf group."""
    lay = Layout.uniform(256, 8, 4)
    devs = get_policy("topology").place(lay, np.ones(256, dtype=bool), 64, tp=8)
    assert devs is not None
    groups = lay.domain_group[devs // 8].reshape(2, 32)  # (pp, ranks of a stage)
    assert all(np.unique(g).size == 1 for g in groups)
    assert placement_stats(lay, devs, tp=8, cp=1, dp=4, pp=2).dp_spine_crossings == 0


def test_binpack_fills_used_domains_first() -> None:
    """Binpack puts a 4-chip job in the partly used domain; topology does too (best fit), spread need not."""
    lay = Layout.uniform(64, 8, 2)
    free = np.ones(64, dtype=bool)
    free[40:44] = False  # domain 5 half used
    devs = get_policy("binpack").place(lay, free, 4, tp=4)
    assert devs is not None and set((devs // 8).tolist()) == {5}


def test_unknown_policy_is_invalid_argument() -> None:
    """Config `placement` must name a registered policy."""
    with pytest.raises(InvalidArgument, match="binpack, spread, topology"):
        get_policy("random")
