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


def _all_domains(lay: Layout) -> Layout:
    """The same layout with its leaf-group runs hidden, so the policies take their every-domain path."""
    other = Layout(lay.offset, lay.chips_per_domain, lay.domain_group, lay.group_pod)
    other.__dict__["group_bounds"] = None  # the cached property, answered as for a non-contiguous layout
    return other


def _random_layout(rng: np.random.Generator) -> Layout:
    dom = int(rng.choice([4, 8, 16]))
    sizes = rng.integers(1, 10, int(rng.integers(1, 14)))
    group = np.repeat(np.arange(sizes.size), sizes).astype(np.int64)
    return Layout(0, dom, group, np.sort(rng.integers(0, 3, sizes.size)).astype(np.int64))


def test_group_bounds_mark_the_layouts_built_by_both_constructors() -> None:
    """Uniform and fat-tree layouts are runs of domains per leaf group (the fast path); interleaved ones are not."""
    assert Layout.uniform(128, 8, 4).group_bounds.tolist() == [0, 4, 8, 12, 16]  # type: ignore[union-attr]
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=1024))
    assert Layout.from_topology(topo).group_bounds.tolist() == [0, 64, 128]  # type: ignore[union-attr]
    assert Layout(0, 8, np.array([0, 1, 0, 1]), np.zeros(2, dtype=np.int64)).group_bounds is None
    assert Layout(0, 8, np.array([0, 0, 2, 2]), np.zeros(3, dtype=np.int64)).group_bounds is None  # group 1 empty


def test_group_path_places_exactly_what_the_every_domain_path_placed() -> None:
    """On 3,000 random layouts, masks, TP degrees and sizes, each policy returns the same devices in the
    same rank order whether it chooses leaf groups first or sorts every domain."""
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(3000):
        lay = _random_layout(rng)
        free = rng.random(lay.n_devices) < rng.uniform(0.1, 1.0)
        tp = int(rng.choice([t for t in (1, 2, 4, 8) if t <= lay.chips_per_domain]))
        room = int(free.reshape(-1, lay.chips_per_domain).sum(axis=1) // tp @ np.ones(lay.n_domains, dtype=np.int64))
        count = tp * int(rng.integers(1, room + 2))  # sometimes one TP group more than fits
        for name in ("topology", "binpack", "spread"):
            a = get_policy(name).place(lay, free, count, tp)
            b = get_policy(name).place(_all_domains(lay), free, count, tp)
            assert (a is None) == (b is None), name
            if a is not None:
                assert a.tolist() == b.tolist(), (name, count, tp)  # type: ignore[union-attr]
                checked += 1
    assert checked > 6000


def test_group_path_never_changes_a_dispatch_decision() -> None:
    """On random clusters and queues (running gangs, priorities, preemption, backfill), a whole dispatcher
    pass places, evicts, reserves and explains exactly as with the every-domain path."""
    from gigacluster.scheduler.policy import Pending, Running, decide

    rng = np.random.default_rng(11)
    for trial in range(60):
        lay = _random_layout(rng)
        dom = lay.chips_per_domain
        free = np.ones(lay.n_devices, dtype=bool)
        running = []
        for k, d in enumerate(rng.permutation(lay.n_domains)[: int(rng.integers(0, lay.n_domains))]):
            devs = np.arange(d * dom, d * dom + int(rng.integers(1, dom + 1)), dtype=np.int64)
            free[devs] = False
            running.append(Running(f"r{k}", f"tenants/t{k % 3}", "default", int(rng.integers(0, 2)), "c", devs,
                                   float(rng.uniform(10, 1000)), float(rng.uniform(0, 10)), draining=bool(k % 7 == 3)))
        free &= rng.random(lay.n_devices) > 0.05  # a few unhealthy chips
        pending = []
        for i in range(30):
            tp = int(rng.choice([t for t in (1, 2, 4, 8) if t <= dom]))
            pending.append(Pending(f"j{i}", f"tenants/t{int(rng.integers(0, 3))}", "default",
                                   int(rng.integers(0, 3)), i, "c",
                                   tp * int(rng.integers(1, max(2, lay.n_devices // tp // 3))), tp,
                                   float(rng.uniform(5, 2000))))
        for name in ("topology", "binpack", "spread"):
            out = [decide(0.0, pending, running, layouts={"c": la}, free={"c": free}, policy=get_policy(name),
                          queues={}, weights={}, usage={}) for la in (lay, _all_domains(lay))]
            a, b = out
            assert [(j, d.tolist()) for j, d, _ in a.place] == [(j, d.tolist()) for j, d, _ in b.place], (trial, name)
            assert a.preempt == b.preempt and a.reserved == b.reserved and a.reasons == b.reasons, (trial, name)
