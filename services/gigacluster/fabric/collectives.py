"""Collectives as phases of flows, algorithm policies, and nccl-tests' algbw / busbw.

A collective becomes a :class:`CollectivePlan`: a sequence of :class:`Phase` objects that run
one after another. A phase is a set of point-to-point sub-flows that all carry the same bytes and
pay ``steps`` latency terms. Pipelined algorithms (ring, tree, the hierarchical rings) move in
*lockstep*: every hop forwards a chunk as soon as it arrives, so the whole phase runs at the pace
of its slowest hop. A lockstep phase is therefore ONE flow for the max-min solver, whose
incidence is the sum of its hops' links (a link used by two hops of the ring counts twice). An
all-to-all phase is independent flows, since each pair finishes on its own.

Cost model of a phase (the alpha-beta model of the NCCL tuner, with the beta term from max-min)::

    time = bytes_per_hop / rate + steps * (path latency + per-step cost) [+ launch cost, phase 0]

Algorithms (registry :data:`ALGORITHMS`, keyed by name; ``tree`` is the double binary tree):

==================  ============================  ==============================  =========
algorithm           ops                           bytes per hop                   steps
==================  ============================  ==============================  =========
ring                all_reduce                    2(n-1)/n * S                    2(n-1)
ring                reduce_scatter, all_gather    (n-1)/n * S                     n-1
ring                broadcast (a pipelined chain) S                               n-1
tree                all_reduce                    S/2 per tree edge, both ways    2 depth
hierarchical        all_reduce                    intra RS, inter ring AR, intra AG (3 phases)
halving_doubling    all_reduce (n a power of 2)   S/2, S/4, ... then back         2 log2 n
direct              all_to_all                    S/n per ordered pair            1
direct              send_recv (2 ranks)           S                               1
==================  ============================  ==============================  =========

The ring visits the ranks in the order given (pass them domain-major, as chip ids are, for the
NCCL-like ring that crosses each domain boundary once). Selection: a forced name, or the
:class:`FastestPolicy` (the default, registry :data:`POLICIES`) that costs every algorithm that
supports the op, rank count and topology with the contention-free model above and takes the
fastest; so small messages pick the tree or halving-doubling (fewer latency steps) and large
ones the ring or the hierarchical ring (least bytes on the slowest links).

algbw and busbw follow nccl-tests (doc/PERFORMANCE.md): ``algbw = S / time``; ``busbw = algbw *
bus_factor(op, n)`` with factor 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter, all-gather
and all-to-all, 1 for broadcast and send/recv.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from gigacluster.fabric.protocols import DEFAULT_PROTOCOL, get_protocol, launch_s, protocols
from gigacluster.fabric.routing import route
from gigacluster.fabric.topology import Topology
from gigacluster.model import SpecError
from gigacluster.model.comm import OPS, bus_factor
from gigacluster.model.comm import check_op as _check_op
from gigacluster.registry import Registry


@dataclasses.dataclass(frozen=True, eq=False)
class Phase:
    """Sub-flows ``src[i] -> dst[i]`` (chip ids) that each carry ``bytes_per_hop`` bytes.

    ``flow_of`` (optional) groups the sub-flows of a lockstep phase into several max-min flows, one
    per copy of a collective planned for many groups at once (:mod:`gigacluster.fabric.groups`).
    """

    src: np.ndarray
    dst: np.ndarray
    bytes_per_hop: float
    steps: int
    lockstep: bool = True
    flow_of: np.ndarray | None = None
    proto: str = DEFAULT_PROTOCOL

    def __post_init__(self) -> None:
        if self.src.shape != self.dst.shape:
            raise ValueError("src and dst must have the same shape")
        if self.bytes_per_hop < 0 or self.steps < 0:
            raise ValueError("bytes_per_hop and steps must be >= 0")
        if self.flow_of is not None and self.flow_of.shape != self.src.shape:
            raise ValueError("flow_of must give one flow per sub-flow")

    @property
    def n_subflows(self) -> int:
        return int(self.src.size)

    @property
    def n_flows(self) -> int:
        """Max-min flows of the phase: 1 if lockstep (one per copy with ``flow_of``), else one per sub-flow."""
        if self.flow_of is not None:
            return int(self.flow_of.max()) + 1 if self.flow_of.size else 0
        return (1 if self.n_subflows else 0) if self.lockstep else self.n_subflows

    def flow_index(self) -> np.ndarray:
        """The max-min flow (0 .. n_flows - 1) each sub-flow belongs to."""
        if self.flow_of is not None:
            return self.flow_of
        k = self.n_subflows
        return np.zeros(k, dtype=np.int64) if self.lockstep else np.arange(k, dtype=np.int64)


@dataclasses.dataclass(frozen=True, eq=False)
class CollectivePlan:
    """A collective as phases run back to back."""

    op: str
    algorithm: str
    ranks: np.ndarray
    bytes_: float
    phases: tuple[Phase, ...]


def _ring_edges(ranks: np.ndarray, closed: bool = True) -> tuple[np.ndarray, np.ndarray]:
    src = ranks
    dst = np.roll(ranks, -1)
    if not closed:
        return src[:-1], dst[:-1]
    return src, dst


class Algorithm:
    """Base of collective algorithms: which ops it supports and how it decomposes into phases.

    Phases must use only the given ranks, and depend only on their order and on which domain each
    sits in: a request over many groups plans one group per shape and lays its phases over the
    others by rank position (:mod:`gigacluster.fabric.groups`).
    """

    name: ClassVar[str] = ""
    ops: ClassVar[tuple[str, ...]] = ()

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        return op in self.ops and ranks.size >= 2

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        raise NotImplementedError


class Ring(Algorithm):
    """Pipelined ring (a chain for broadcast) in the order the ranks are given."""

    name = "ring"
    ops = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        n = ranks.size
        if op == "broadcast":
            s, d = _ring_edges(ranks, closed=False)
            return [Phase(s, d, bytes_, n - 1)]
        s, d = _ring_edges(ranks)
        if op == "all_reduce":
            return [Phase(s, d, 2.0 * (n - 1) / n * bytes_, 2 * (n - 1))]
        return [Phase(s, d, (n - 1) / n * bytes_, n - 1)]


class DoubleBinaryTree(Algorithm):
    """NCCL's double binary tree: two complementary trees, each reducing and broadcasting S/2.

    Tree 1 is the heap-ordered binary tree over rank positions; tree 2 is the same tree over the
    positions shifted by one, so most interior ranks of one tree are leaves of the other.
    """

    name = "tree"
    ops = ("all_reduce",)

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        n = ranks.size
        pos = np.arange(1, n)
        parent = (pos - 1) // 2
        srcs, dsts = [], []
        for shift in (0, 1):
            child = ranks[(pos + shift) % n]
            par = ranks[(parent + shift) % n]
            srcs += [child, par]  # reduce up, broadcast down, pipelined together
            dsts += [par, child]
        depth = int(np.ceil(np.log2(n + 1)))
        return [Phase(np.concatenate(srcs), np.concatenate(dsts), bytes_ / 2.0, 2 * depth)]


class Hierarchical(Algorithm):
    """Reduce-scatter inside each domain, ring all-reduce across domains per rail, all-gather inside.

    Needs at least two domains, each holding the same number (>= 1) of the ranks.
    """

    name = "hierarchical"
    ops = ("all_reduce",)

    @staticmethod
    def _grid(ranks: np.ndarray, topo: Topology) -> np.ndarray | None:
        dom = topo.chip_domain[ranks]
        order = np.argsort(dom, kind="stable")
        doms, counts = np.unique(dom, return_counts=True)
        if doms.size < 2 or counts.min() != counts.max():
            return None
        return ranks[order].reshape(doms.size, counts[0])

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        return super().supports(op, ranks, topo) and self._grid(ranks, topo) is not None

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        grid = self._grid(ranks, topo)
        if grid is None:
            raise SpecError("algo", "hierarchical needs >= 2 domains holding the same number of ranks")
        g, m = grid.shape
        out = []
        if m > 1:
            s, d = grid.ravel(), np.roll(grid, -1, axis=1).ravel()
            out.append(Phase(s, d, (m - 1) / m * bytes_, m - 1))
        s, d = grid.ravel(), np.roll(grid, -1, axis=0).ravel()
        out.append(Phase(s, d, 2.0 * (g - 1) / g * bytes_ / m, 2 * (g - 1)))
        if m > 1:
            s, d = grid.ravel(), np.roll(grid, -1, axis=1).ravel()
            out.append(Phase(s, d, (m - 1) / m * bytes_, m - 1))
        return out


class RailRings(Algorithm):
    """NCCL's multi-channel rings across domains, rail-aligned with PXN: one ring per local rank c of
    the m ranks a domain holds, each carrying S/m. Ring c visits every domain's ranks starting at
    local c; its last rank in a domain hands the data over scale-up to local c (PXN), whose NIC
    sends it on rail c to local c of the next domain. So every ring stays on one rail, the m rings
    use all m NICs of a domain, and a domain's scale-up links carry the rest. Needs >= 2 domains
    holding the same number (>= 2) of the ranks.
    """

    name = "rail_rings"
    ops = ("all_reduce", "reduce_scatter", "all_gather")

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        grid = Hierarchical._grid(ranks, topo) if super().supports(op, ranks, topo) else None
        return grid is not None and grid.shape[1] >= 2

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        grid = Hierarchical._grid(ranks, topo)
        if grid is None or grid.shape[1] < 2:
            raise SpecError("algo", "rail_rings needs >= 2 domains holding the same number (>= 2) of ranks")
        g, m = grid.shape
        n = g * m
        srcs, dsts, rings = [], [], []
        for c in range(m):
            order = np.roll(grid, -c, axis=1)  # every domain's ranks, starting at local c
            s_in, d_in = order[:, :-1].ravel(), order[:, 1:].ravel()  # along the domain's chain
            pxn_s, pxn_d = order[:, -1], order[:, 0]  # last of the chain -> local c, over scale-up
            rail_s, rail_d = order[:, 0], np.roll(order[:, 0], -1)  # local c -> local c of the next domain
            s = np.concatenate([s_in, pxn_s, rail_s])
            srcs.append(s)
            dsts.append(np.concatenate([d_in, pxn_d, rail_d]))
            rings.append(np.full(s.size, c, dtype=np.int64))
        factor, steps = (2.0 * (n - 1) / n, 2 * (n - 1)) if op == "all_reduce" else ((n - 1) / n, n - 1)
        return [Phase(np.concatenate(srcs), np.concatenate(dsts), factor * bytes_ / m, steps,
                      flow_of=np.concatenate(rings))]


class HalvingDoubling(Algorithm):
    """Rabenseifner: recursive-halving reduce-scatter, then recursive-doubling all-gather.

    Partners at distance 1, 2, 4, ... exchange S/2, S/4, ... so the largest exchanges stay
    between neighbouring ranks (inside a domain when ranks are domain-major).
    """

    name = "halving_doubling"
    ops = ("all_reduce", "reduce_scatter", "all_gather")

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        n = ranks.size
        return super().supports(op, ranks, topo) and (n & (n - 1)) == 0

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        n = ranks.size
        if n & (n - 1):
            raise SpecError("algo", f"halving_doubling needs a power-of-two rank count, got {n}")
        idx = np.arange(n)
        k_steps = int(np.log2(n))
        halving = [Phase(ranks, ranks[idx ^ (1 << k)], bytes_ / 2 ** (k + 1), 1) for k in range(k_steps)]
        if op == "reduce_scatter":
            return halving
        doubling = halving[::-1]
        return doubling if op == "all_gather" else halving + doubling


def _in_one_full_mesh(ranks: np.ndarray, topo: Topology) -> bool:
    """Whether every rank sits in the same full-mesh scale-up domain (a direct link to each peer)."""
    return topo.scaleup == "full_mesh" and np.unique(topo.chip_domain[ranks]).size == 1


def _pairs(ranks: np.ndarray, bytes_: float) -> Phase:
    """Every rank sends ``bytes_`` straight to each other rank, in one step."""
    n = ranks.size
    s = np.repeat(ranks, n)
    d = np.tile(ranks, n)
    keep = s != d
    return Phase(s[keep], d[keep], bytes_, 1, lockstep=False)


class Direct(Algorithm):
    """Every rank sends straight to each peer: all-to-all and send/recv anywhere; on a full mesh
    (MI300X-class Infinity Fabric) also reduce-scatter, all-gather (S/n per pair, one step) and the
    two-shot all-reduce (reduce-scatter then all-gather), which drive all n-1 links of every rank at
    once as RCCL's direct and multi-ring algorithms do (a ring uses one link of each rank)."""

    name = "direct"
    ops = ("all_to_all", "send_recv", "reduce_scatter", "all_gather", "all_reduce")
    _mesh_ops = ("reduce_scatter", "all_gather", "all_reduce")

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        if op == "send_recv":
            return ranks.size == 2
        if op in self._mesh_ops and not _in_one_full_mesh(ranks, topo):
            return False
        return super().supports(op, ranks, topo)

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        n = ranks.size
        if op == "send_recv":
            return [Phase(ranks[:1], ranks[1:2], bytes_, 1)]
        if op == "all_reduce":
            return [_pairs(ranks, bytes_ / n), _pairs(ranks, bytes_ / n)]
        return [_pairs(ranks, bytes_ / n)]


class OneShot(Algorithm):
    """One-shot all-reduce on a full mesh: every rank sends its whole buffer to each peer and reduces
    locally; one step, n-1 times the bytes, so it wins only for small messages (RCCL's one-shot)."""

    name = "one_shot"
    ops = ("all_reduce",)

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        return super().supports(op, ranks, topo) and _in_one_full_mesh(ranks, topo)

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        return [_pairs(ranks, bytes_)]


ALGORITHMS: Registry[Algorithm] = Registry("algorithm", field="algo", group="gigacluster.collectives",
                                           accepts=lambda o: isinstance(o, Algorithm))
"""Collective algorithms (instances) by name; ``double_binary_tree`` is another name of ``tree``."""
for _algo in (Ring(), DoubleBinaryTree(), Hierarchical(), RailRings(), HalvingDoubling(), Direct(), OneShot()):
    ALGORITHMS.register(_algo.name, _algo)
ALGORITHMS.register("double_binary_tree", ALGORITHMS["tree"])


def collective_constants(proto: str = DEFAULT_PROTOCOL) -> tuple[float, float]:
    """(launch_s, step_s): the catalog's per-call cost and the per-step cost of protocol ``proto``."""
    return launch_s(), get_protocol(proto).step_s


def with_protocol(phases: Sequence[Phase], proto: str) -> list[Phase]:
    """``phases`` run with protocol ``proto``: wire bytes = payload / its wire efficiency."""
    eff = get_protocol(proto).wire_efficiency
    return [dataclasses.replace(p, bytes_per_hop=p.bytes_per_hop / eff, proto=proto) for p in phases]


def plan_phases(name: str, op: str, ranks: np.ndarray, bytes_: float, topo: Topology, *,
                alive: np.ndarray | None = None,
                capacity_Bps: np.ndarray | None = None) -> tuple[list[Phase], list[float]]:
    """Algorithm ``name``'s phases under its fastest protocol, with their contention-free estimates."""
    base = ALGORITHMS[name].phases(op, ranks, bytes_, topo)
    best: tuple[list[Phase], list[float]] | None = None
    for proto in protocols():
        phases = with_protocol(base, proto)
        est = [phase_estimate_s(p, topo, alive=alive, first=(i == 0), capacity_Bps=capacity_Bps)
               for i, p in enumerate(phases)]
        if best is None or sum(est) < sum(best[1]):
            best = (phases, est)
    assert best is not None
    return best


def plan_label(name: str, phases: Sequence[Phase]) -> str:
    """The algorithm as reported: ``ring`` for Simple, ``ring/ll`` or ``ring/ll128`` otherwise."""
    proto = phases[0].proto if phases else DEFAULT_PROTOCOL
    return name if proto == DEFAULT_PROTOCOL else f"{name}/{proto}"


def phase_estimate_s(
    phase: Phase, topo: Topology, *, alive: np.ndarray | None = None, first: bool = False,
    capacity_Bps: np.ndarray | None = None,
) -> float:
    """Contention-free time of one phase: bandwidth term + latency terms (+ launch if first)."""
    launch, step_s = collective_constants(phase.proto)
    lat = launch if first else 0.0
    if phase.n_subflows == 0:
        return lat
    r = route(topo, phase.src, phase.dst, np.arange(phase.n_subflows), alive=alive)
    if not r.ok.all():
        return float("inf")
    cap = topo.link_capacity_Bps if capacity_Bps is None else capacity_Bps
    lat += phase.steps * (float(r.latency_s.max()) + step_s)
    if r.e_link.size == 0 or phase.bytes_per_hop == 0:
        return lat
    # per used link only (a bincount over every link cost O(topology) per phase)
    used, inv = np.unique(r.e_link, return_inverse=True)
    load = np.bincount(inv, weights=r.e_coef, minlength=used.size)
    if phase.lockstep:
        rate = float((cap[used] / load).min())
        return lat + phase.bytes_per_hop / rate
    per_entry = cap[r.e_link] / load[inv]
    rate_f = np.full(phase.n_subflows, np.inf)
    np.minimum.at(rate_f, r.e_flow, per_entry)
    return lat + phase.bytes_per_hop / float(rate_f.min())


def plan_estimate_s(plan: CollectivePlan, topo: Topology, *, alive: np.ndarray | None = None) -> float:
    """Contention-free time of a whole plan (phases back to back)."""
    return sum(phase_estimate_s(p, topo, alive=alive, first=(i == 0)) for i, p in enumerate(plan.phases))


class SelectionPolicy:
    """Base of algorithm selection policies: pick an algorithm name for (op, ranks, bytes, topology)."""

    name: ClassVar[str] = ""

    def choose(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> str:
        raise NotImplementedError


class FastestPolicy(SelectionPolicy):
    """Cost every supporting algorithm with the contention-free model; take the fastest."""

    name = "fastest"

    def choose(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> str:
        return self.best(op, ranks, bytes_, topo)[0]

    def best(self, op: str, ranks: np.ndarray, bytes_: float,
             topo: Topology) -> tuple[str, list[Phase] | None, list[float] | None]:
        """(name, phases, per-phase estimates on the intact fabric) of the fastest algorithm; ``("ring",
        None, None)`` when none applies."""
        best: tuple[str, list[Phase] | None, list[float] | None] = ("ring", None, None)
        best_t = float("inf")
        for name in ("ring", "tree", "hierarchical", "rail_rings", "halving_doubling", "direct", "one_shot"):
            algo = ALGORITHMS[name]
            if not algo.supports(op, ranks, topo):
                continue
            phases, est = plan_phases(name, op, ranks, bytes_, topo)
            t = sum(est)
            if t < best_t:
                best, best_t = (name, phases, est), t
        return best


class RingOnlyPolicy(SelectionPolicy):
    """Always the ring where it applies (direct otherwise): NCCL with NCCL_ALGO=Ring."""

    name = "ring"

    def choose(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> str:
        return "ring" if ALGORITHMS["ring"].supports(op, ranks, topo) else "direct"


POLICIES: Registry[SelectionPolicy] = Registry("policy", field="policy",
                                               group="gigacluster.collective_policies",
                                               accepts=lambda o: isinstance(o, SelectionPolicy))
"""Algorithm selection policies (instances) by name."""
for _pol in (FastestPolicy(), RingOnlyPolicy()):
    POLICIES.register(_pol.name, _pol)


def check_request(op: str, ranks: Sequence[int] | np.ndarray, bytes_: float, topo: Topology, *,
                  top: int | None = None) -> np.ndarray:
    """The checked ranks (int64) of a collective request; ``top``: the highest chip any copy uses."""
    _check_op(op)
    r = np.asarray(ranks, dtype=np.int64).ravel()
    if r.size < 1:
        raise SpecError("ranks", "need at least one rank")
    hi = int(r.max()) if top is None else top
    if r.min() < 0 or hi >= topo.n_chips:
        raise SpecError("ranks", f"chip ids must be in [0, {topo.n_chips}), got {r.min()}..{hi}")
    if np.unique(r).size != r.size:
        raise SpecError("ranks", "ranks must be distinct chips")
    if not (isinstance(bytes_, int | float | np.number) and np.isfinite(bytes_) and bytes_ >= 0):
        raise SpecError("bytes", f"must be a finite number >= 0, got {bytes_!r}")
    if op == "send_recv" and r.size != 2:
        raise SpecError("ranks", f"send_recv takes exactly 2 ranks (src, dst), got {r.size}")
    return r


def choose_algorithm(op: str, ranks: np.ndarray, bytes_: float, topo: Topology, *, algo: str | None,
                     policy: str) -> str:
    """The algorithm of a checked request: ``algo`` if it can run it (else SpecError), or ``policy``'s choice."""
    if algo is None:
        return POLICIES.lookup(policy).choose(op, ranks, bytes_, topo)
    chosen = ALGORITHMS.lookup(algo)
    if not chosen.supports(op, ranks, topo):
        allowed = [n for n, a in ALGORITHMS.items() if a.supports(op, ranks, topo)]
        raise SpecError("algo", f"{algo} cannot run {op} on these {ranks.size} ranks; allowed: {', '.join(allowed)}")
    return chosen.name


def plan_collective(
    op: str, ranks: Sequence[int] | np.ndarray, bytes_: float, topo: Topology, *, algo: str | None = None,
    policy: str = "fastest",
) -> CollectivePlan:
    """Validate the request and decompose it into phases (forced ``algo`` or ``policy``'s choice)."""
    r = check_request(op, ranks, bytes_, topo)
    if r.size == 1:
        return CollectivePlan(op, algo or "none", r, float(bytes_), ())
    name = choose_algorithm(op, r, float(bytes_), topo, algo=algo, policy=policy)
    phases, _ = plan_phases(name, op, r, float(bytes_), topo)
    return CollectivePlan(op, plan_label(name, phases), r, float(bytes_), tuple(phases))


__all__ = [
    "ALGORITHMS",
    "OPS",
    "POLICIES",
    "Algorithm",
    "CollectivePlan",
    "FastestPolicy",
    "Phase",
    "SelectionPolicy",
    "bus_factor",
    "check_request",
    "choose_algorithm",
    "phase_estimate_s",
    "plan_collective",
    "plan_estimate_s",
    "plan_label",
    "plan_phases",
    "with_protocol",
]
