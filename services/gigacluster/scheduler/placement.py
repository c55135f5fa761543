"""Gang placement: which free devices a job gets, and in which rank order (no gRPC).

A job's ranks are laid out Megatron-style (TP fastest, then CP, DP, PP), so consecutive ranks
must share a scale-up domain. Every policy places whole TP groups inside one domain (a domain
offers ``free // tp`` TP slots) and returns device ids in rank order; they differ in *which*
domains they pick:

* ``topology`` keeps the gang in as few leaf groups (domains whose rail-matched NICs share the
  same leaves) as possible, best fit first, and orders domains by leaf group so consecutive PP
  stages sit on neighbouring nodes and each DP group crosses the spine as rarely as possible;
* ``binpack`` fills the most-used domains and leaf groups first (least fragmentation left);
* ``spread`` deals domains out round-robin over leaf groups (failure-domain spreading, and the
  worst case for spine traffic: a baseline).

Everything is numpy over per-domain arrays: placing 100k chips on a 1M-chip cluster is a few
vectorised passes (benchmarks/bench_placement.py). When each leaf group is a run of consecutive
domains (what both :class:`Layout` constructors build) a policy first picks leaf groups from per-group
sums and sorts only the domains of the groups it takes, so a 1,024-chip job on a million chips does a
few linear passes over the 131,072 per-domain counts and no sort of them; other layouts take the
every-domain path, which makes the same choice (tests/scheduler/test_placement.py).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import numpy as np

from gigacluster.arrays import count_distinct
from gigacluster.registry import Registry


@dataclasses.dataclass(frozen=True, eq=False)
class Layout:
    """Where the devices of one chip type sit: ``n_domains`` domains of ``chips_per_domain``
    consecutive device ids from ``offset``, each in a leaf group (``domain_group``); leaf groups
    in pods (``group_pod``, all 0 on a two-tier tree)."""

    offset: int
    chips_per_domain: int
    domain_group: np.ndarray
    group_pod: np.ndarray

    @property
    def n_domains(self) -> int:
        return int(self.domain_group.size)

    @property
    def n_devices(self) -> int:
        return self.n_domains * self.chips_per_domain

    @functools.cached_property
    def group_bounds(self) -> np.ndarray | None:
        """``bounds[g]:bounds[g + 1]`` are the domains of leaf group g when every group is one run of
        consecutive domains, numbered 0, 1, ... in domain order with none empty (what both
        constructors build); else None. The policies then choose leaf groups first and sort only the
        domains of the groups they take, instead of every domain of the cluster."""
        g = self.domain_group
        n_groups = self.group_pod.size
        if g.size == 0 or g[0] != 0 or g[-1] != n_groups - 1:
            return None
        step = np.diff(g)
        if ((step != 0) & (step != 1)).any():
            return None
        return np.r_[0, np.flatnonzero(step) + 1, g.size].astype(np.int64)

    @classmethod
    def uniform(cls, n_devices: int, chips_per_domain: int, domains_per_group: int, groups_per_pod: int = 0,
                offset: int = 0) -> Layout:
        """A regular layout (what the rail-optimised fat-tree builds), by arithmetic."""
        n_dom = n_devices // chips_per_domain
        group = np.arange(n_dom, dtype=np.int64) // max(domains_per_group, 1)
        n_groups = int(group[-1]) + 1 if n_dom else 0
        pod = (np.arange(n_groups, dtype=np.int64) // groups_per_pod if groups_per_pod
               else np.zeros(n_groups, dtype=np.int64))
        return cls(offset, chips_per_domain, group, pod)

    @classmethod
    def from_topology(cls, topo: object, offset: int = 0) -> Layout:
        """The layout of a built :class:`gigacluster.fabric.topology.Topology`."""
        dom = int(topo.chips_per_domain)  # type: ignore[attr-defined]
        first = np.arange(0, int(topo.n_chips), dom)  # type: ignore[attr-defined]
        leaves = np.asarray(topo.chip_leaf)  # type: ignore[attr-defined]
        rails = max(1, count_distinct(leaves[:dom]))
        group_of_leaf = leaves[first] // rails
        _, group = np.unique(group_of_leaf, return_inverse=True)
        pod_of_group = np.zeros(int(group.max()) + 1 if group.size else 0, dtype=np.int64)
        pod_of_group[group] = np.asarray(topo.leaf_pod)[leaves[first]]  # type: ignore[attr-defined]
        return cls(offset, dom, group.astype(np.int64), pod_of_group)


@dataclasses.dataclass(frozen=True)
class PlacementStats:
    """How well a gang sits: domains and leaf groups it spans, and spine crossings of its DP
    groups (per DP group, the leaf groups it spans minus one, summed)."""

    domains: int
    leaf_groups: int
    dp_spine_crossings: int


class PlacementPolicy:
    """Base class: pick ``count`` free devices for a job with TP degree ``tp``.

    A subclass implements :meth:`choose` and is registered in :data:`PLACEMENTS` (see
    docs/extending.md for one written in another package).
    """

    name: ClassVar[str] = ""

    def place(self, layout: Layout, free: np.ndarray, count: int, tp: int = 1) -> np.ndarray | None:
        """Device ids (global) in rank order, or None if the gang does not fit now.

        ``free`` is a bool per device of the layout (False for held or unhealthy devices).
        """
        dom = layout.chips_per_domain
        if count <= 0 or tp <= 0 or count % tp or tp > dom:
            return None
        per_dom = free.reshape(layout.n_domains, dom)
        slots = tp_slots(free, dom, tp)
        need = count // tp
        if int(slots.sum()) < need:
            return None
        domains, take = self.choose(layout, slots, need, dom // tp)
        if domains is None:
            return None
        # the first take[i]*tp free chips of each chosen domain, domain by domain (rank order)
        sub = per_dom[domains]
        rank_in_dom = np.cumsum(sub, axis=1) - 1
        pick = sub & (rank_in_dom < (take * tp)[:, None])
        rows, cols = np.nonzero(pick)
        ids = domains[rows] * dom + cols
        return ids.astype(np.int64) + layout.offset

    def choose(self, layout: Layout, slots: np.ndarray, need: int, full: int) -> tuple[np.ndarray | None, np.ndarray]:
        """(domains in rank order, TP slots taken in each) covering ``need`` slots."""
        raise NotImplementedError


PLACEMENTS: Registry[type[PlacementPolicy]] = Registry(
    "placement policy", field="placement", group="gigacluster.placement",
    accepts=lambda o: isinstance(o, type) and issubclass(o, PlacementPolicy))
"""The placement policies by name (config ``placement``)."""


def free_per_domain(free: np.ndarray, dom: int) -> np.ndarray:
    """Free devices in each domain of ``dom`` consecutive devices (int64).

    A bool array is one byte per device, so eight devices are one 64-bit word and a popcount
    counts them: about 50x faster than a sum over the (domains, dom) view at a million devices,
    and a dispatcher pass counts once per job it places.
    """
    if dom % 8 == 0 and free.dtype == np.bool_ and free.flags.c_contiguous:
        words = np.bitwise_count(free.view(np.uint64)).reshape(-1, dom // 8)
        return words.sum(axis=1, dtype=np.int64) if dom > 8 else words.ravel().astype(np.int64)
    return np.count_nonzero(free.reshape(-1, dom), axis=1).astype(np.int64)


def tp_slots(free: np.ndarray, dom: int, tp: int) -> np.ndarray:
    """Whole free TP groups of ``tp`` in each domain (int64): ``free_per_domain(free, dom) // tp``,
    counted and divided in one-byte integers (a 64-bit integer division over 131,072 domains costs
    more than the popcount)."""
    if dom % 8 == 0 and dom < 1 << 16 and free.dtype == np.bool_ and free.flags.c_contiguous:
        words = np.bitwise_count(free.view(np.uint64))
        counts = words if dom == 8 else words.reshape(-1, dom // 8).sum(axis=1, dtype=np.uint16)
        return (counts // tp if tp > 1 else counts).astype(np.int64)
    return free_per_domain(free, dom) // tp


def _ranges(bounds: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """The domains of ``groups`` (contiguous groups), group after group, each in domain order."""
    lo, hi = bounds[groups], bounds[groups + 1]
    lens = hi - lo
    return np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(lo - (np.cumsum(lens) - lens), lens)


def _group_sums(bounds: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Sum of ``values`` over each contiguous group (int64; converting first is 6x faster than
    reducing a bool array into int64)."""
    return np.add.reduceat(values.astype(np.int64, copy=False), bounds[:-1])


def _take_in_order(order: np.ndarray, slots: np.ndarray, need: int) -> tuple[np.ndarray | None, np.ndarray]:
    s = slots[order]
    cum = np.cumsum(s)
    k = int(np.searchsorted(cum, need))
    if k >= order.size:
        return None, np.empty(0, dtype=np.int64)
    chosen = order[: k + 1]
    take = s[: k + 1].copy()
    take[-1] -= int(cum[k]) - need
    keep = take > 0
    return chosen[keep], take[keep]


@PLACEMENTS.register("topology")
class TopologyPolicy(PlacementPolicy):
    """Fewest leaf groups (best fit), whole free domains first, domains ordered by leaf group."""

    name = "topology"

    def choose(self, layout: Layout, slots: np.ndarray, need: int, full: int) -> tuple[np.ndarray | None, np.ndarray]:
        if need <= full:
            # one domain: the fullest-used domain that still fits (best fit), no scale-out at all
            one = int(np.argmin(np.where(slots >= need, slots, full + 1)))  # the first of the least room
            if slots[one] >= need:
                return np.array([one], dtype=np.int64), np.array([need], dtype=np.int64)
        bounds = layout.group_bounds
        if bounds is None:
            return self.choose_any(layout, slots, need)
        gslots = _group_sums(bounds, slots)
        fits = np.flatnonzero(gslots >= need)
        if fits.size:  # best fit: the leaf group with the least room that holds the whole gang
            g = fits[np.argmin(gslots[fits])]
            cand = np.arange(bounds[g], bounds[g + 1], dtype=np.int64)
            return _take_in_order(cand[np.lexsort((cand, -slots[cand]))], slots, need)
        # span leaf groups: pods with most room first, inside them the groups with most room; the gang
        # ends in the first group where the running total of room reaches need, so only the domains of
        # the groups up to there are sorted
        g_order = self._group_order(layout, gslots)
        k = int(np.searchsorted(np.cumsum(gslots[g_order]), need))
        groups = g_order[: k + 1]
        d = _ranges(bounds, groups)
        rank = np.repeat(np.arange(groups.size), bounds[groups + 1] - bounds[groups])
        keep = slots[d] > 0
        d, rank = d[keep], rank[keep]
        return _take_in_order(d[np.lexsort((d, -slots[d], rank))], slots, need)

    @staticmethod
    def _group_order(layout: Layout, gslots: np.ndarray) -> np.ndarray:
        pod = layout.group_pod
        pslots = np.bincount(pod, weights=gslots).astype(np.int64)
        return np.lexsort((np.arange(gslots.size), -gslots, -pslots[pod]))

    def choose_any(self, layout: Layout, slots: np.ndarray, need: int) -> tuple[np.ndarray | None, np.ndarray]:
        """The same choice over every domain, for layouts whose leaf groups are not runs of domains."""
        group = layout.domain_group
        gslots = np.bincount(group, weights=slots, minlength=layout.group_pod.size).astype(np.int64)
        fits = np.flatnonzero(gslots >= need)
        if fits.size:
            g = fits[np.argmin(gslots[fits])]
            cand = np.flatnonzero(group == g)
            order = cand[np.lexsort((cand, -slots[cand]))]
            return _take_in_order(order, slots, need)
        g_order = self._group_order(layout, gslots)
        g_rank = np.empty_like(g_order)
        g_rank[g_order] = np.arange(g_order.size)
        d = np.flatnonzero(slots > 0)
        order = d[np.lexsort((d, -slots[d], g_rank[group[d]]))]
        return _take_in_order(order, slots, need)


@PLACEMENTS.register("binpack")
class BinpackPolicy(PlacementPolicy):
    """Most-used domains (and leaf groups) first, leaving whole domains free for big gangs."""

    name = "binpack"

    def choose(self, layout: Layout, slots: np.ndarray, need: int, full: int) -> tuple[np.ndarray | None, np.ndarray]:
        bounds = layout.group_bounds
        if bounds is None:
            return self.choose_any(layout, slots, need)
        # The order is (free slots, free slots of the leaf group, domain). Domains with fewer free slots
        # than the one where need is reached are all taken; of the domains with that many, only those of
        # the first leaf groups (least room first) that hold enough of them are sorted.
        below, s = 0, 1
        while True:  # the room s of the domain where need is reached, and the slots in domains with less
            at_s = slots == s
            n_s = int(np.count_nonzero(at_s))
            if below + s * n_s >= need:
                break
            below += s * n_s
            s += 1
        gslots = _group_sums(bounds, slots)
        g_order = np.argsort(gslots, kind="stable")
        per_group = _group_sums(bounds, at_s)[g_order]
        k = int(np.searchsorted(np.cumsum(per_group), -(-(need - below) // s)))
        d = _ranges(bounds, g_order[: k + 1])
        d = d[at_s[d]]
        cand = np.concatenate((np.flatnonzero((slots > 0) & (slots < s)), d)) if s > 1 else d
        order = cand[np.lexsort((cand, gslots[layout.domain_group[cand]], slots[cand]))]
        return _take_in_order(order, slots, need)

    def choose_any(self, layout: Layout, slots: np.ndarray, need: int) -> tuple[np.ndarray | None, np.ndarray]:
        """The same choice over every domain, for layouts whose leaf groups are not runs of domains."""
        gslots = np.bincount(layout.domain_group, weights=slots, minlength=layout.group_pod.size)
        d = np.flatnonzero(slots > 0)
        order = d[np.lexsort((d, gslots[layout.domain_group[d]], slots[d]))]
        return _take_in_order(order, slots, need)


@PLACEMENTS.register("spread")
class SpreadPolicy(PlacementPolicy):
    """Domains dealt round-robin over leaf groups (first free domain of each group, then the second)."""

    name = "spread"

    def choose(self, layout: Layout, slots: np.ndarray, need: int, full: int) -> tuple[np.ndarray | None, np.ndarray]:
        bounds = layout.group_bounds
        if bounds is None:
            return self.choose_any(layout, slots, need)
        d = np.flatnonzero(slots > 0)
        start = np.searchsorted(d, bounds)  # group g's free domains are d[start[g]:start[g + 1]]
        n_free = np.diff(start)
        # every domain holds at least one slot, so need is reached within the first P rounds of the deal,
        # P the first round count that deals need domains: only domains dealt before P are sorted
        dealt = np.cumsum(np.bincount(n_free)[::-1])[::-1][1:]  # groups dealt in round p
        rounds = min(int(np.searchsorted(np.cumsum(dealt), need)) + 1, dealt.size)
        take = np.minimum(n_free, rounds)
        first = np.repeat(start[:-1] - (np.cumsum(take) - take), take)
        idx = np.arange(int(take.sum()), dtype=np.int64) + first
        nth = idx - np.repeat(start[:-1], take)
        cand = d[idx]
        order = cand[np.lexsort((cand, nth))]
        return _take_in_order(order, slots, need)

    def choose_any(self, layout: Layout, slots: np.ndarray, need: int) -> tuple[np.ndarray | None, np.ndarray]:
        """The same choice over every domain, for layouts whose leaf groups are not runs of domains."""
        d = np.flatnonzero(slots > 0)
        if d.size == 0:
            return None, np.empty(0, dtype=np.int64)
        g = layout.domain_group[d]
        # position of each domain within its group's free domains (d is sorted, groups contiguous in
        # domain order), then a (group, position) table read position-major: the round-robin deal, no sort
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        first = np.repeat(starts, np.diff(np.r_[starts, g.size]))
        nth = np.arange(d.size) - first
        gi = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, g.size]))
        table = np.full((starts.size, int(nth.max()) + 1), -1, dtype=np.int64)
        table[gi, nth] = d
        order = table.T.ravel()
        return _take_in_order(order[order >= 0], slots, need)


def get_policy(name: str) -> PlacementPolicy:
    """A new instance of the registered policy ``name`` (config ``placement``); else UnknownName."""
    return PLACEMENTS.lookup(name)()


def placement_stats(layout: Layout, devices: np.ndarray, *, tp: int, cp: int, dp: int, pp: int) -> PlacementStats:
    """Domains, leaf groups and DP spine crossings of a gang given in rank order."""
    local = np.asarray(devices, dtype=np.int64) - layout.offset
    dom = local // layout.chips_per_domain
    grp = layout.domain_group[dom]
    # ranks are (pp, dp, cp, tp): a DP (x CP) group varies over the middle axes for fixed (pp, tp)
    g = grp.reshape(pp, dp * cp, tp)
    s = np.sort(g, axis=1)
    spans = 1 + (np.diff(s, axis=1) != 0).sum(axis=1)
    return PlacementStats(domains=count_distinct(dom), leaf_groups=count_distinct(grp),
                          dp_spine_crossings=int((spans - 1).sum()))
