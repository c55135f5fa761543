"""Incremental max-min: after starts and finishes, the pool's rates equal a from-scratch solve."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.fabric.maxmin import maxmin_rates, progressive_filling_py
from gigacluster.fabric.pool import FlowPool, _compact, _kept_ranges
from gigacluster.fabric.routing import route
from gigacluster.fabric.sim import FlowSim
from gigacluster.fabric.topology import Topology


def _add_random(pool: FlowPool, topo: Topology, rng: np.random.Generator, n: int, label0: int) -> None:
    """``n`` flows: point-to-point or small lockstep rings (several sub-flows, one flow), random weights."""
    for i in range(n):
        k = int(rng.choice([1, 1, 4, 8]))
        ranks = rng.choice(topo.n_chips, k + 1 if k == 1 else k, replace=False)
        src, dst = (ranks[:1], ranks[1:2]) if k == 1 else (ranks, np.roll(ranks, -1))
        labels = np.arange(label0 + 10 * i, label0 + 10 * i + src.size)
        r = route(topo, src, dst, labels)
        pool.add(i, 1, 1e9, float(rng.choice([1.0, 4.0])), 0, np.zeros(src.size, dtype=np.int64), r, src, dst, labels)


def _solved_pool(topo: Topology, seed: int, n: int) -> tuple[np.random.Generator, np.ndarray, FlowPool]:
    """(rng, capacities, pool of ``n`` random flows solved from scratch)."""
    rng = np.random.default_rng(seed)
    cap = topo.link_capacity_Bps.copy()
    pool = FlowPool(topo.n_links)
    _add_random(pool, topo, rng, n, 0)
    pool.solve(cap, 0.0)
    return rng, cap, pool


def _full(pool: FlowPool, cap: np.ndarray) -> np.ndarray:
    return maxmin_rates(pool.size, pool.e_pos, pool.e_link, pool.e_coef, cap, weight=pool.w)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("topo_name", ["two_groups", "oversub_spray"])
def test_incremental_rates_equal_a_full_solve(seed: int, topo_name: str, request: pytest.FixtureRequest) -> None:
    """Random starts and finishes (ECMP and sprayed routes, weights 1 and 4): rates equal a full solve to 1e-9."""
    topo: Topology = request.getfixturevalue(topo_name)
    rng, cap, pool = _solved_pool(topo, seed, 200)
    for step in range(12):
        pool.flush()
        if step % 3 != 2:
            _add_random(pool, topo, rng, int(rng.integers(1, 6)), 10_000 * (step + 1))
        if step % 2:
            pool.remove(rng.random(pool.size) < 0.05)
        pool.solve(cap, 0.0)
        np.testing.assert_allclose(pool.rate, _full(pool, cap), rtol=1e-9)
        fin = np.isfinite(pool.rate[pool.e_pos])
        want = np.bincount(pool.e_link[fin], weights=pool.e_coef[fin] * pool.rate[pool.e_pos[fin]],
                           minlength=topo.n_links)
        np.testing.assert_allclose(pool.link_rate, want, rtol=1e-6, atol=1e-3)


def test_capacities_changed_in_place_reach_the_next_solves(two_groups: Topology) -> None:
    """The pool keeps each local link's capacity between solves (gathering only the links met since): a change of
    capacities (in place, then :meth:`FlowPool.invalidate`, as the simulator's faults do) reaches the next solve
    and the incremental ones after it; a new capacity array is gathered afresh."""
    rng, cap, pool = _solved_pool(two_groups, 11, 150)
    for step in range(6):
        pool.flush()
        if step == 1:  # degrade the busiest links in place, as FlowSim.degrade_link does
            cap[np.argsort(pool.link_rate)[-40:]] *= 0.25
            pool.invalidate()
        if step == 4:  # another array altogether
            cap = cap * 0.5
            pool.invalidate()
        _add_random(pool, two_groups, rng, 3, 10_000 * (step + 1))
        pool.solve(cap, 0.0)
        np.testing.assert_allclose(pool.rate, _full(pool, cap), rtol=1e-9)
        assert pool.tracked >= 0 or step in (1, 4)  # the starts after a change replay incrementally


def test_flow_index_follows_the_pool_through_starts_and_finishes(two_groups: Topology) -> None:
    """The flow-major view kept across solves (extended on starts, built again after finishes) is, after every
    solve, each flow's entries in order: what a stable sort of the whole incidence by flow gives."""
    rng, cap, pool = _solved_pool(two_groups, 5, 120)
    replays = 0
    for step in range(10):
        _add_random(pool, two_groups, rng, int(rng.integers(1, 4)), 10_000 * (step + 1))
        pool.flush()
        if step % 3 == 1:
            pool.remove(rng.random(pool.size) < 0.1)
        pool.solve(cap, 0.0)
        replays += pool.tracked >= 0
        assert pool._fix is not None
        ptr, order = pool._fix.view(pool.e_pos, pool.size)
        assert np.array_equal(ptr, np.r_[0, np.cumsum(np.bincount(pool.e_pos, minlength=pool.size))])
        assert np.array_equal(order, np.argsort(pool.e_pos, kind="stable"))
    assert replays >= 8


@pytest.mark.parametrize("seed", range(4))
def test_compaction_by_ranges_equals_masking(seed: int) -> None:
    """A finish copies the pool's arrays around the runs that go (few runs) or masks them (many): both give
    ``arr[mask]`` exactly, for blocks at either end, in the middle, scattered, none and all."""
    rng = np.random.default_rng(seed)
    n = 1000
    arr = rng.integers(0, 10**9, n)
    masks = [np.ones(n, dtype=bool), np.zeros(n, dtype=bool), rng.random(n) < 0.5, rng.random(n) < 0.99]
    for a, b in ((0, 10), (990, 1000), (400, 650), (0, 1000)):
        m = np.ones(n, dtype=bool)
        m[a:b] = False
        masks.append(m)
    for m in masks:
        ranges = _kept_ranges(np.flatnonzero(~m), n)
        assert np.array_equal(_compact(arr, ranges, m), arr[m])
        assert np.array_equal(_compact(arr, _kept_ranges(np.flatnonzero(~m), n, max_runs=1), m), arr[m])


def test_incremental_and_full_simulations_end_at_the_same_times(two_groups: Topology) -> None:
    """The same collectives and transfers through FlowSim with and without incremental solves end at equal times."""
    ends = []
    for incremental in (True, False):
        sim = FlowSim(two_groups, incremental=incremental)
        rng = np.random.default_rng(7)
        hs = [sim.start_collective("all_reduce", rng.choice(1024, 16, replace=False), 2e8, start_s=0.001 * i)
              for i in range(20)]
        hs += [sim.start_transfer(int(a), int(b), 5e8, start_s=0.0005 * i)
               for i, (a, b) in enumerate(rng.integers(0, 1024, (30, 2))) if a != b]
        sim.run_until_idle()
        ends.append(np.array([h.end_s for h in hs]))
    np.testing.assert_allclose(ends[0], ends[1], rtol=1e-9)


def test_level_cut_keeps_only_flows_below_the_change(two_groups: Topology) -> None:
    """Against the plain-Python reference: a pool solved incrementally after one start matches it to 1e-9."""
    rng = np.random.default_rng(3)
    pool = FlowPool(two_groups.n_links)
    _add_random(pool, two_groups, rng, 150, 0)
    cap = two_groups.link_capacity_Bps
    pool.solve(cap, 0.0)
    _add_random(pool, two_groups, rng, 1, 99_000)
    pool.solve(cap, 0.0)
    paths: list[list[tuple[int, float]]] = [[] for _ in range(pool.size)]
    for f, lk, c in zip(pool.e_pos.tolist(), pool.e_link.tolist(), pool.e_coef.tolist(), strict=True):
        paths[f].append((lk, c))
    ref = progressive_filling_py(paths, cap.tolist(), pool.w.tolist())
    np.testing.assert_allclose(pool.rate, ref, rtol=1e-9)


def test_replay_touches_only_what_a_cross_group_ring_changes(two_groups: Topology) -> None:
    """A ring across both leaf groups among 3,000 random flows: rates equal a full solve, and the replay
    re-solves a small part of the pool (the connected component of the change is most of it)."""
    rng = np.random.default_rng(11)
    n = 3000
    src = rng.integers(0, two_groups.n_chips, n)
    dst = (src + 1 + rng.integers(0, two_groups.n_chips - 1, n)) % two_groups.n_chips
    r = route(two_groups, src, dst, np.arange(n))
    cap = two_groups.link_capacity_Bps
    pool = FlowPool(two_groups.n_links)
    pool.add(1, n, 1e9, 1.0, 0, np.arange(n), r, src, dst, np.arange(n))
    pool.solve(cap, 0.0)
    ranks = np.arange(8) * 128 + 5
    lab = np.arange(8) + 10**6
    pool.add(2, 1, 1e9, 1.0, 0, np.zeros(8, dtype=np.int64), route(two_groups, ranks, np.roll(ranks, -1), lab),
             ranks, np.roll(ranks, -1), lab)
    pool.solve(cap, 0.0)
    np.testing.assert_allclose(pool.rate, _full(pool, cap), rtol=1e-9)
    assert 0 < pool.tracked < n // 4
    pool.remove(pool.gseq == 2)
    pool.solve(cap, 0.0)
    np.testing.assert_allclose(pool.rate, _full(pool, cap), rtol=1e-9)
    assert 0 < pool.tracked < n // 4


def test_finish_of_a_flow_tied_at_its_bottleneck_frees_its_partner(two_groups: Topology) -> None:
    """Two flows co-bottlenecked on one link at one level: when one finishes, the other rises to a full solve's rate
    (the finished flow's links join together, before its partner's freeze at the old level is taken)."""
    cap = two_groups.link_capacity_Bps
    pool = FlowPool(two_groups.n_links)
    a, b = np.array([0, 0]), np.array([8, 16])  # chip 0's NIC is the shared bottleneck
    for i in range(2):
        r = route(two_groups, a[i:i + 1], b[i:i + 1], np.array([i]))
        pool.add(i, 1, 1e9, 1.0, 0, np.zeros(1, dtype=np.int64), r, a[i:i + 1], b[i:i + 1], np.array([i]))
    pool.solve(cap, 0.0)
    shared = float(pool.rate[1])
    assert pool.rate[0] == pytest.approx(shared)
    pool.remove(pool.gseq == 0)
    pool.solve(cap, 0.0)
    np.testing.assert_allclose(pool.rate, _full(pool, cap), rtol=1e-9)
    assert pool.rate[0] == pytest.approx(2 * shared) and pool.tracked == 1
