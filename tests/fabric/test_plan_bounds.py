"""The planner's shortcuts give what the long way gives.

* ``_phase_bound`` is a bound: no routing of a phase is faster than it says;
* ``FastestPolicy.best`` with its bounds chooses, phases and costs exactly as costing every candidate in name order;
* ``Hierarchical._grid`` without ``np.unique``; ``route``'s two-hop path through a domain's switch; ``shapes`` with
  one shape and several.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from gigacluster.fabric.algorithms import ALGORITHMS, Hierarchical
from gigacluster.fabric.collectives import (
    POLICIES,
    _phase_bound,
    phase_terms,
    plan_phases,
)
from gigacluster.fabric.groups import shapes
from gigacluster.fabric.routing import route
from gigacluster.fabric.topology import Topology, TopologyConfig, build_topology

TOPOLOGIES = {  # one of each scale-up kind
    "switch": ("trainium3", 2048),
    "full_mesh": ("mi355x", 512),
    "torus": ("trainium2", 512),
    "nvls": ("b200", 512),
}


@functools.cache
def topo_of(kind: str) -> Topology:
    chip, count = TOPOLOGIES[kind]
    return build_topology(TopologyConfig(chip=chip, count=count, tiers=2))


def rank_sets(topo: Topology, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    dom = topo.chips_per_domain
    return [
        np.arange(8) + dom,  # inside one domain
        np.arange(0, 8 * dom, dom),  # one chip of each of 8 domains
        (np.arange(4)[:, None] * dom + np.arange(4)[None, :]).ravel(),  # 4 chips in each of 4 domains (a grid)
        np.sort(rng.choice(topo.n_chips, 24, replace=False)),  # scattered
        rng.choice(topo.n_chips, 2, replace=False),
    ]


@pytest.mark.parametrize("kind", sorted(TOPOLOGIES))
def test_no_routing_beats_the_bound(kind: str) -> None:
    topo = topo_of(kind)
    checked = 0
    for ranks in rank_sets(topo, 1):
        for name, algo in ALGORITHMS.items():
            for op in algo.ops:
                if not algo.supports(op, ranks, topo):
                    continue
                for ph in algo.phases(op, ranks, 1e6, topo):
                    rate, path_s = phase_terms(ph, topo)
                    loose, tight = _phase_bound(ph, topo, tight=False), _phase_bound(ph, topo)
                    assert tight[0] <= loose[0] and tight[1] == loose[1], (name, op)
                    assert rate <= tight[0] and path_s >= tight[1], (name, op, rate, tight, path_s)
                    checked += 1
    assert checked > 20


def exhaustive_best(policy: str, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> tuple[str, list, list]:
    """What ``FastestPolicy.best`` gave before its bounds: every candidate costed, in name order, the first fastest."""
    pol = POLICIES.lookup(policy)
    best: tuple[str, list | None, list | None] = ("ring", None, None)
    best_t = float("inf")
    for name in pol.names:  # type: ignore[attr-defined]
        if not pol.considers(name, op, bytes_) or not ALGORITHMS[name].supports(op, ranks, topo):  # type: ignore[attr-defined]
            continue
        phases, est = plan_phases(name, op, ranks, bytes_, topo)
        if sum(est) < best_t:
            best, best_t = (name, phases, est), sum(est)
    return best  # type: ignore[return-value]


@pytest.mark.parametrize("kind", sorted(TOPOLOGIES))
@pytest.mark.parametrize("policy", ["library", "fastest"])
def test_bounded_choice_is_the_exhaustive_choice(kind: str, policy: str) -> None:
    topo = topo_of(kind)
    pol = POLICIES.lookup(policy)
    for ranks in rank_sets(topo, 2):
        for op in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all"):
            for bytes_ in (1e3, 1e6, 1e9):
                want = exhaustive_best(policy, op, ranks, bytes_, topo)
                for _ in range(2):  # the second time the last winner goes first
                    got = pol.best(op, ranks, bytes_, topo)  # type: ignore[attr-defined]
                    assert got[0] == want[0] and got[2] == want[2], (op, ranks.size, bytes_)
                    if want[1] is not None:
                        for a, b in zip(got[1], want[1], strict=True):
                            assert (np.array_equal(a.src, b.src) and np.array_equal(a.dst, b.dst)
                                    and a.bytes_per_hop == b.bytes_per_hop and a.proto == b.proto), op


@pytest.mark.parametrize("kind", sorted(TOPOLOGIES))
def test_grid_is_the_domains_in_order(kind: str) -> None:
    topo = topo_of(kind)
    rng = np.random.default_rng(3)
    for ranks in [*rank_sets(topo, 3), rng.permutation(np.arange(3 * topo.chips_per_domain)),
                  np.r_[np.arange(4), topo.chips_per_domain + np.arange(3)]]:
        dom = topo.chip_domain[ranks]
        doms, counts = np.unique(dom, return_counts=True)
        grid = Hierarchical._grid(ranks, topo)
        if doms.size < 2 or counts.min() != counts.max():
            assert grid is None
        else:
            assert grid is not None
            assert np.array_equal(grid, ranks[np.argsort(dom, kind="stable")].reshape(doms.size, counts[0]))


def test_switch_fast_path_gives_the_general_entries() -> None:
    """Inside switched domains with every link up, ``route`` takes its two-hop shortcut; with one scale-up link down,
    the general path: every flow that link does not touch keeps the same entries, in the same order."""
    topo = topo_of("switch")
    rng = np.random.default_rng(4)
    src = rng.integers(0, topo.n_chips, 400)
    dst = np.where(rng.random(400) < 0.7, (src // topo.chips_per_domain) * topo.chips_per_domain
                   + rng.integers(0, topo.chips_per_domain, 400), rng.integers(0, topo.n_chips, 400))
    label = np.arange(400)
    fast = route(topo, src, dst, label)
    inside = np.flatnonzero((topo.chip_domain[src] == topo.chip_domain[dst]) & (src != dst))
    alive = np.ones(topo.n_links, dtype=bool)
    down = topo.su_up[src[inside[0]]]
    alive[down] = False
    general = route(topo, src, dst, label, alive=alive)
    hit = np.zeros(400, dtype=bool)
    hit[fast.e_flow[fast.e_link == down]] = True
    kept = []
    for r in (fast, general):
        keep = ~hit[r.e_flow]
        kept.append((r.e_flow[keep], r.e_link[keep], r.e_coef[keep]))
    for a, b in zip(*kept, strict=True):
        assert np.array_equal(a, b)
    assert np.array_equal(fast.latency_s[~hit], general.latency_s[~hit])
    assert hit.sum() >= 1 and inside.size > 200


def test_shapes_one_and_several() -> None:
    topo = topo_of("switch")
    dom = topo.chips_per_domain
    alike = np.arange(8)[None, :] + dom * np.arange(6)[:, None]  # six copies, each inside its own domain
    reps, shape_of, _ = shapes(topo, alike)
    assert reps.tolist() == [0] and shape_of.tolist() == [0] * 6
    mixed = np.vstack([alike, alike[:2] + dom - 4])  # two more copies straddling two domains
    reps, shape_of, _ = shapes(topo, mixed)
    assert reps.tolist() == [0, 6] and shape_of.tolist() == [0] * 6 + [1, 1]


def test_the_winner_hints_stay_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client asking for every group size cannot grow the policy's memory without bound: the hints are a cache."""
    from gigacluster.fabric import collectives

    topo = topo_of("switch")
    pol = POLICIES.lookup("library")
    pol._last.clear()  # type: ignore[attr-defined]
    for size in range(2, 40):
        pol.best("all_gather", np.arange(size), 1e6, topo)  # type: ignore[attr-defined]
    assert len(pol._last) == 38  # type: ignore[attr-defined]
    monkeypatch.setattr(collectives, "_HINTS_MAX", 10)
    for size in range(2, 40):
        pol.best("all_gather", np.arange(size), 1e6, topo)  # type: ignore[attr-defined]
    assert len(pol._last) <= 10  # type: ignore[attr-defined]
