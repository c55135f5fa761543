"""Collectives as phases of flows, algorithm policies, and nccl-tests' algbw / busbw.

A collective becomes a :class:`CollectivePlan`: a sequence of :class:`Phase` objects that run
one after another. A phase is a set of point-to-point sub-flows that all carry the same bytes and
pay ``steps`` latency terms. Pipelined algorithms (ring, tree, the hierarchical rings) move in
*lockstep*: every hop forwards a chunk as soon as it arrives, so the whole phase runs at the pace
of its slowest hop. A lockstep phase is therefore ONE flow for the max-min solver, whose
incidence is the sum of its hops' links (a link used by two hops of the ring counts twice). An
all-to-all phase is independent flows, since each pair finishes on its own.

Cost model of a phase (the alpha-beta model of the NCCL tuner, with the beta term from max-min)::

    time = wire bytes_per_hop / rate + steps * max(path latency, protocol step cost, system step latency)
           [+ protocol base cost, phase 0]

with the protocol (LL, LL128, Simple: :mod:`gigacluster.fabric.protocols`) chosen per algorithm by
the same cost. Algorithms (:mod:`gigacluster.fabric.algorithms`, registry :data:`ALGORITHMS`;
``tree`` is the double binary tree, also named ``double_binary_tree``):

==================  ============================  ==============================  =========
algorithm           ops                           bytes per hop                   steps
==================  ============================  ==============================  =========
ring                all_reduce                    2(n-1)/n * S                    2(n-1)
ring                reduce_scatter, all_gather    (n-1)/n * S                     n-1
ring                broadcast (a pipelined chain) S                               n-1
rail_rings          AR, RS, AG across domains     as ring, S/m per ring, m rings  as ring
                    (full-mesh domains: each ring on its own xGMI links, Walecki paths)
tree                all_reduce                    S/2 per tree edge, both ways    2 depth
nvls                all_reduce, one NVSwitch 3+   (1 + 1/n) S per GPU link        2
nvls_tree           all_reduce, >= 2 NVLS domains NVLS inside, S/m per NIC each   2 + 2 log2 g
                    way between domains (two), NCCL's per-channel ceiling
hierarchical        all_reduce                    intra RS, inter ring AR, intra AG (3 phases)
halving_doubling    all_reduce (n a power of 2)   S/2, S/4, ... then back         2 log2 n
direct              all_to_all                    S/n per ordered pair            1
direct              send_recv (2 ranks)           S                               1
direct              RS, AG; AR (two-shot), mesh   S/n per ordered pair (per shot) 1 per shot
mesh_rings          AR, RS, AG, full mesh         as ring, S/(n-1) per ring       as ring
torus_rings         AR, RS, AG, a whole 2D torus  as ring, S/4 per ring, 4 rings  as ring
one_shot            all_reduce, full mesh         S per ordered pair              1
==================  ============================  ==============================  =========

The ring visits the ranks in the order given (pass them domain-major, as chip ids are, for the
NCCL-like ring that crosses each domain boundary once). Selection: a forced name, or a policy
(registry :data:`POLICIES`) that costs every algorithm it considers with the contention-free
model above and takes the fastest: :class:`LibraryPolicy` (the default: what NCCL and RCCL ship),
:class:`FastestPolicy` (also halving-doubling and the hierarchical ring), or the ring only. So
small messages pick the tree or one-shot on LL and large ones NVLS, direct or the rings on Simple.

algbw and busbw follow nccl-tests (doc/PERFORMANCE.md): ``algbw = S / time``; ``busbw = algbw *
bus_factor(op, n)`` with factor 2(n-1)/n for all-reduce, (n-1)/n for reduce-scatter, all-gather
and all-to-all, 1 for broadcast and send/recv.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import threading
import weakref
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from gigacluster.arrays import all_distinct
from gigacluster.fabric.algorithms import ALGORITHMS, Algorithm, CollectivePlan, Phase
from gigacluster.fabric.protocols import DEFAULT_PROTOCOL, get_protocol, protocols_for
from gigacluster.fabric.routing import route
from gigacluster.fabric.topology import Topology
from gigacluster.hw import catalog
from gigacluster.hw.catalog import _raw
from gigacluster.model import SpecError
from gigacluster.model.comm import OPS, bus_factor
from gigacluster.model.comm import check_op as _check_op
from gigacluster.registry import Registry


def collective_constants(proto: str = DEFAULT_PROTOCOL) -> tuple[float, float]:
    """(base_s, step_s): the per-call and per-step costs of protocol ``proto`` (catalog, from NCCL's tuner)."""
    p = get_protocol(proto)
    return p.base_s, p.step_s


def step_latency_s(path_s: float, step_s: float, system_s: float = 0.0) -> float:
    """One algorithm step: the protocol's per-hop cost, the path's latency, or the system's own per-hop step
    latency, whichever is longest (NCCL's per-hop figures were measured over NVLink, so they already hold a
    short path's traversal; a system whose library publishes its own step latency pays at least that)."""
    return max(path_s, step_s, system_s)


@functools.cache
def _system_step_s(system: str, chip: str) -> float:
    own = (_raw()["efficiency"]["comm"].get("chips") or {}).get(chip, {}).get("step_latency_s")
    value = float(own if own is not None else catalog.get_system(system).params.get("step_latency_s", 0.0))
    if not (value >= 0 and value < 1e-3):
        raise SpecError(f"systems.{system}.step_latency_s", f"must be in [0, 1 ms), got {value!r}")
    return value


def system_step_s(topo: Topology) -> float:
    """The per-hop latency of one collective step on the scale-up system: the chip's own figure (catalog
    ``efficiency.comm.chips.<chip>.step_latency_s``) where its NVLink generation has one, else the system's
    (``systems.<name>.step_latency_s``, the library's published per-hop figure), else 0; sourced there."""
    return _system_step_s(str(topo.config.system), topo.config.chip)


def direct_max_bytes() -> float:
    """Largest message the default policy runs as a direct reduction on a full mesh (catalog
    ``efficiency.comm.full_mesh.direct_max_bytes``: RCCL's MSCCL++ threshold)."""
    return float((_raw()["efficiency"]["comm"].get("full_mesh") or {}).get("direct_max_bytes", float("inf")))


def with_protocol(phases: Sequence[Phase], proto: str) -> list[Phase]:
    """``phases`` run with protocol ``proto``: wire bytes = payload / its wire efficiency."""
    eff = get_protocol(proto).wire_efficiency
    return [dataclasses.replace(p, bytes_per_hop=p.bytes_per_hop / eff, proto=proto) for p in phases]


def plan_phases(name: str, op: str, ranks: np.ndarray, bytes_: float, topo: Topology, *,
                alive: np.ndarray | None = None,
                capacity_Bps: np.ndarray | None = None) -> tuple[list[Phase], list[float]]:
    """Algorithm ``name``'s phases under its fastest protocol, with their contention-free estimates.

    Each phase is routed once; its cost under every protocol follows from the same rate and path
    latency (a protocol changes only the wire bytes and the step cost)."""
    algo = ALGORITHMS[name]
    base = algo.phases(op, ranks, bytes_, topo)
    terms = [phase_terms(p, topo, alive=alive, capacity_Bps=capacity_Bps) for p in base]
    proto, est = _best_protocol(algo, base, terms, topo)
    return with_protocol(base, proto), est


def _best_protocol(algo: Algorithm, base: Sequence[Phase], terms: Sequence[tuple[float, float]],
                   topo: Topology) -> tuple[str, list[float]]:
    """(protocol, per-phase estimates) of the protocol that makes ``base`` fastest with routed ``terms``."""
    sys_s = system_step_s(topo)
    best: tuple[str, list[float]] | None = None
    for proto in algo.protocols or protocols_for(topo.config.chip):  # costed as with_protocol's phases would be
        est = [_phase_cost(p, t, first=(i == 0), system_s=sys_s, proto=proto)
               for i, (p, t) in enumerate(zip(base, terms, strict=True))]
        if best is None or sum(est) < sum(best[1]):
            best = (proto, est)
    assert best is not None
    return best


def linear_costs(name: str, op: str, ranks: np.ndarray,
                 topo: Topology) -> list[tuple[float, float, float, float]]:
    """(seconds at zero bytes, seconds per byte, from bytes, below bytes) of algorithm ``name`` under each
    protocol the chip runs, on the intact fabric: between two of the algorithm's size breaks
    (:meth:`Algorithm.size_breaks`) a plan's contention-free cost is affine in the bytes (its phases, steps and
    rates do not change), so two numbers per protocol and size range give its estimate at every size. Protocols
    with no live path are left out."""
    algo = ALGORITHMS[name]
    edges = [0.0, *algo.size_breaks(op, ranks, topo), float("inf")]
    sys_s = system_step_s(topo)
    out = []
    for lo, hi in itertools.pairwise(edges):
        if not edges[1:-1]:
            sizes = (0.0, 1.0)  # one byte: bytes_per_hop is the per-byte load
        else:  # two sizes inside the range, where the plan's shape holds
            sizes = (lo + (hi - lo) / 4, lo + (hi - lo) / 2) if np.isfinite(hi) else (lo, 2 * lo)
        bases = [algo.phases(op, ranks, max(x, 1.0), topo) for x in sizes]
        terms = [phase_terms(p, topo) for p in bases[0]]
        if any(rate == 0.0 for rate, _ in terms):
            return []
        for proto in algo.protocols or protocols_for(topo.config.chip):
            costs = []
            for x, base in zip(sizes, bases, strict=True):
                phases = with_protocol(base, proto)
                cost = sum(_phase_cost(p, t, first=(i == 0), system_s=sys_s)
                           for i, (p, t) in enumerate(zip(phases, terms, strict=True)))
                costs.append((max(x, 1.0), cost))
            if not edges[1:-1]:
                # the one-byte plan: its bytes are the per-byte load, its latency the zero-byte cost
                alpha = sum(_phase_cost(dataclasses.replace(p, bytes_per_hop=0.0), t, first=(i == 0), system_s=sys_s)
                            for i, (p, t) in enumerate(zip(with_protocol(bases[1], proto), terms, strict=True)))
                beta = sum(p.bytes_per_hop / t[0] for p, t in zip(with_protocol(bases[1], proto), terms, strict=True)
                           if p.n_subflows)
            else:
                (x1, c1), (x2, c2) = costs
                beta = (c2 - c1) / (x2 - x1)
                alpha = c1 - beta * x1
            out.append((alpha, beta, lo, hi))
    return out


def plan_label(name: str, phases: Sequence[Phase]) -> str:
    """The algorithm as reported: ``ring`` for Simple, ``ring/ll`` or ``ring/ll128`` otherwise."""
    proto = phases[0].proto if phases else DEFAULT_PROTOCOL
    return name if proto == DEFAULT_PROTOCOL else f"{name}/{proto}"


# Routed terms of phases on an intact fabric, per topology (by id, dropped with it): a request's
# reduce-scatter and all-gather, and algorithms that lay the same pairs (a ring and rail rings of one rank
# per domain), route the same sub-flows; planning a 100k-chip step routed them again for each.
_TERMS: dict[int, tuple[weakref.ref[Topology], collections.OrderedDict[bytes, tuple[float, float]]]] = {}
_TERMS_PER_TOPOLOGY = 4096
_TERMS_LOCK = threading.Lock()


def _terms_cache(topo: Topology) -> collections.OrderedDict[bytes, tuple[float, float]]:
    with _TERMS_LOCK:
        hit = _TERMS.get(id(topo))
        if hit is not None and hit[0]() is topo:
            return hit[1]
        cache: collections.OrderedDict[bytes, tuple[float, float]] = collections.OrderedDict()
        key = id(topo)
        _TERMS[key] = (weakref.ref(topo, lambda _r: _TERMS.pop(key, None)), cache)
        return cache


def clear_terms_cache(topo: Topology) -> None:
    """Forget ``topo``'s cached phase terms (benchmarks that time planning from nothing)."""
    with _TERMS_LOCK:
        _TERMS.pop(id(topo), None)


def phase_terms(phase: Phase, topo: Topology, *, alive: np.ndarray | None = None,
                capacity_Bps: np.ndarray | None = None) -> tuple[float, float]:
    """(rate B/s of the phase's slowest flow, slowest path latency s) on the intact or given fabric;
    rate 0 when some sub-flow has no live path, inf when no link carries bytes. On the intact fabric the
    terms of a phase's geometry are cached (the same sub-flows route the same way)."""
    if phase.n_subflows == 0:
        return float("inf"), 0.0
    if alive is not None or capacity_Bps is not None:
        return _phase_terms(phase, topo, alive=alive, capacity_Bps=capacity_Bps)
    key = b"".join((np.int64(phase.n_subflows).tobytes(), bytes([phase.lockstep]), phase.src.tobytes(),
                    phase.dst.tobytes(), b"" if phase.weight is None else phase.weight.tobytes()))
    cache = _terms_cache(topo)
    with _TERMS_LOCK:
        got = cache.get(key)
        if got is not None:
            cache.move_to_end(key)
            return got
    got = _phase_terms(phase, topo)
    with _TERMS_LOCK:
        cache[key] = got
        while len(cache) > _TERMS_PER_TOPOLOGY:
            cache.popitem(last=False)
    return got


_SCRATCH = threading.local()


def _link_scratch(n: int) -> np.ndarray:
    """A zeroed float array of ``n`` links owned by the calling thread (callers leave it zeroed)."""
    buf: np.ndarray | None = getattr(_SCRATCH, "load", None)
    if buf is None or buf.size != n:
        buf = _SCRATCH.load = np.zeros(n)
    return buf


def _capacity_over_load(cap: np.ndarray, links: np.ndarray, coef: np.ndarray | float) -> np.ndarray:
    """Per entry, its link's capacity over the link's load (the entries' ``coef`` summed per link). The load is summed
    into this thread's zeroed scratch array over all links and zeroed again after: O(entries), with no sort of the
    entries (np.unique) and no allocation the size of the topology."""
    load = _link_scratch(cap.size)
    np.add.at(load, links, coef)
    out: np.ndarray = cap[links] / load[links]
    load[links] = 0.0
    return out


def _phase_terms(phase: Phase, topo: Topology, *, alive: np.ndarray | None = None,
                 capacity_Bps: np.ndarray | None = None) -> tuple[float, float]:
    r = route(topo, phase.src, phase.dst, np.arange(phase.n_subflows), alive=alive)
    if not r.ok.all():
        return 0.0, 0.0
    path_s = float(r.latency_s.max())
    if r.e_link.size == 0:
        return float("inf"), path_s
    cap = topo.link_capacity_Bps if capacity_Bps is None else capacity_Bps
    coef = r.e_coef if phase.weight is None else r.e_coef * phase.weight[r.e_flow]
    per_entry = _capacity_over_load(cap, r.e_link, coef)
    if phase.lockstep:
        return float(per_entry.min()), path_s
    rate_f = np.full(phase.n_subflows, np.inf)
    np.minimum.at(rate_f, r.e_flow, per_entry)
    return float(rate_f.min()), path_s


def _phase_bound(phase: Phase, topo: Topology, *, tight: bool = True) -> tuple[float, float]:
    """Terms no routing of ``phase`` on the intact fabric can beat: (a rate at least its slowest flow's, a path latency
    at most its longest), from each sub-flow's first hop alone, without routing it.

    Every routed sub-flow's first link carries it with coefficient 1 (its weight, if the phase has weights): the chip's
    scale-up port inside a switched domain, its NIC to leave the domain. So that link's load is at least the sub-flows
    that start on it, and the phase's rate, the least of capacity over load across its links, is at most the least of
    capacity over that count across first links; a sub-flow's latency is at least its first link's. Sub-flows whose
    first link depends on the route taken (inside a full-mesh or torus domain) are left out, which only loosens it.
    ``tight=False`` takes the count as 1 (no scatter over the links): looser, and cheaper."""
    if phase.n_subflows == 0:
        return float("inf"), 0.0
    src, dst = phase.src, phase.dst
    dom = topo.chip_domain
    same = dom[src] == dom[dst]
    if topo.scaleup == "switch":
        first = np.where(same, topo.su_up[src], topo.nic_up[src])
        moves = src != dst
    else:
        first = topo.nic_up[src]
        moves = ~same
    if not moves.all():
        first = first[moves]
    if first.size == 0:
        return float("inf"), 0.0
    if not tight:
        return float(topo.link_capacity_Bps[first].min()), float(topo.link_latency_s[first].max())
    coef = 1.0 if phase.weight is None else phase.weight[moves]
    rate = float(_capacity_over_load(topo.link_capacity_Bps, first, coef).min())
    return rate, float(topo.link_latency_s[first].max())


def _phase_cost(phase: Phase, terms: tuple[float, float], *, first: bool, system_s: float = 0.0,
                proto: str | None = None) -> float:
    """Time of ``phase`` from its routed terms: bandwidth + steps x step latency (+ the call's base cost);
    ``system_s`` is the system's own per-hop step latency (:func:`system_step_s`). ``proto``: the time of
    ``with_protocol([phase], proto)[0]`` (the same arithmetic), without building that phase."""
    rate, path_s = terms
    bytes_per_hop = phase.bytes_per_hop
    if proto is None:
        proto = phase.proto
    else:
        bytes_per_hop = bytes_per_hop / get_protocol(proto).wire_efficiency
    base_s, step_s = collective_constants(proto)
    lat = (base_s if phase.call_s is None else phase.call_s) if first else 0.0
    if phase.n_subflows == 0:
        return lat
    if rate == 0.0:
        return float("inf")
    lat += phase.steps * step_latency_s(path_s, step_s, max(system_s, phase.step_s))
    return lat if bytes_per_hop == 0 else lat + bytes_per_hop / rate


def phase_estimate_s(
    phase: Phase, topo: Topology, *, alive: np.ndarray | None = None, first: bool = False,
    capacity_Bps: np.ndarray | None = None,
) -> float:
    """Contention-free time of one phase: bandwidth term + latency terms (+ launch if first)."""
    return _phase_cost(phase, phase_terms(phase, topo, alive=alive, capacity_Bps=capacity_Bps), first=first,
                       system_s=system_step_s(topo))


def plan_estimate_s(plan: CollectivePlan, topo: Topology, *, alive: np.ndarray | None = None) -> float:
    """Contention-free time of a whole plan (phases back to back)."""
    return sum(phase_estimate_s(p, topo, alive=alive, first=(i == 0)) for i, p in enumerate(plan.phases))


class SelectionPolicy:
    """Base of algorithm selection policies: pick an algorithm name for (op, ranks, bytes, topology)."""

    name: ClassVar[str] = ""

    def choose(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> str:
        raise NotImplementedError


_HINTS_MAX = 4096  # (operation, group size) pairs whose last winner a policy remembers


class FastestPolicy(SelectionPolicy):
    """Cost every supporting algorithm with the contention-free model; take the fastest."""

    name = "fastest"
    names: ClassVar[tuple[str, ...]] = (
        "ring", "tree", "hierarchical", "rail_rings", "halving_doubling", "direct", "mesh_rings", "torus_rings",
        "one_shot", "nvls", "nvls_tree")

    def __init__(self) -> None:
        self._last: dict[tuple[str, int], str] = {}  # (op, ranks) -> the last winner: costed first next time

    def choose(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> str:
        return self.best(op, ranks, bytes_, topo)[0]

    def best(self, op: str, ranks: np.ndarray, bytes_: float,
             topo: Topology) -> tuple[str, list[Phase] | None, list[float] | None]:
        """(name, phases, per-phase estimates on the intact fabric) of the fastest algorithm; ``("ring",
        None, None)`` when none applies."""
        # Branch and bound, exact: the candidates are costed in any order, and one is routed only if a bound on its
        # time (``_phase_bound``: no routing) could still beat the best so far; ties go to the earlier name, as when
        # the names were costed in order. The last winner for the same operation and size goes first, so a losing
        # algorithm (one ring of 800 ranks beside 8 rail-aligned rings) is usually bounded and never routed.
        cands = [(i, name) for i, name in enumerate(self.names)
                 if self.considers(name, op, bytes_) and ALGORITHMS[name].supports(op, ranks, topo)]
        hint = self._last.get((op, ranks.size))
        cands.sort(key=lambda c: c[1] != hint)
        best: tuple[str, list[Phase] | None, list[float] | None] = ("ring", None, None)
        best_t, best_i = float("inf"), len(self.names)
        for i, name in cands:
            algo = ALGORITHMS[name]
            base = algo.phases(op, ranks, bytes_, topo)
            if best_i < len(self.names) and any(
                    self._beaten(algo, base, topo, tight, i, best_t, best_i) for tight in (False, True)):
                continue
            proto, est = _best_protocol(algo, base, [phase_terms(p, topo) for p in base], topo)
            t = sum(est)
            if t < best_t or (t == best_t and i < best_i):
                best, best_t, best_i = (name, with_protocol(base, proto), est), t, i
        if best[1] is not None:
            if len(self._last) >= _HINTS_MAX:  # a hint only: forgetting costs a routing, never a different choice
                self._last.clear()
            self._last[(op, ranks.size)] = best[0]
        return best

    @staticmethod
    def _beaten(algo: Algorithm, base: Sequence[Phase], topo: Topology, tight: bool, i: int, best_t: float,
                best_i: int) -> bool:
        """Whether ``base`` (the ``i``-th name's phases) cannot beat ``best_t`` of name ``best_i``, by a bound."""
        bound = sum(_best_protocol(algo, base, [_phase_bound(p, topo, tight=tight) for p in base], topo)[1])
        return bound > best_t or (bound == best_t and i > best_i)

    def considers(self, name: str, op: str, bytes_: float) -> bool:
        """Whether the policy weighs algorithm ``name`` for ``op`` of ``bytes_`` (all of ``names`` here)."""
        return True


class LibraryPolicy(FastestPolicy):
    """The fastest of the algorithms NCCL and RCCL run by default: ring, the rail-aligned
    multi-channel rings across domains, the double binary tree, NVLS, NVLSTree across NVLS domains, and on a
    full mesh RCCL's rings over every link and its one-shot for small messages; direct for all-to-all and send/recv. Not
    halving-doubling nor the three-phase hierarchical ring, which neither library runs. The direct
    reductions on a mesh are RCCL's MSCCL++ path, which it takes only up to RCCL_MSCCLPP_THRESHOLD
    (catalog ``efficiency.comm.full_mesh.direct_max_bytes``); above it RCCL runs its rings. So
    estimates compare with nccl-tests and rccl-tests as published."""

    name = "library"
    names = ("ring", "rail_rings", "tree", "nvls", "nvls_tree", "direct", "mesh_rings", "torus_rings", "one_shot")
    _mesh_reductions = frozenset({"all_reduce", "reduce_scatter", "all_gather"})

    def considers(self, name: str, op: str, bytes_: float) -> bool:
        return not (name == "direct" and op in self._mesh_reductions and bytes_ > direct_max_bytes())


DEFAULT_POLICY = LibraryPolicy.name


class RingOnlyPolicy(SelectionPolicy):
    """Always the ring where it applies (NCCL with NCCL_ALGO=Ring): rail-aligned rings across domains
    holding equal shares of the ranks, RCCL's rings over every link inside one full mesh (its Ring
    algorithm lays its channels over all xGMI links), one ring otherwise, direct for the ops a ring
    cannot run."""

    name = "ring"

    def choose(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> str:
        for name in ("rail_rings", "mesh_rings", "ring"):
            if ALGORITHMS[name].supports(op, ranks, topo):
                return name
        return "direct"


POLICIES: Registry[SelectionPolicy] = Registry("policy", field="policy",
                                               group="gigacluster.collective_policies",
                                               accepts=lambda o: isinstance(o, SelectionPolicy))
"""Algorithm selection policies (instances) by name."""
for _pol in (FastestPolicy(), LibraryPolicy(), RingOnlyPolicy()):
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
    if not all_distinct(r):
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
    policy: str = DEFAULT_POLICY,
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
    "DEFAULT_POLICY",
    "OPS",
    "POLICIES",
    "Algorithm",
    "CollectivePlan",
    "FastestPolicy",
    "LibraryPolicy",
    "Phase",
    "SelectionPolicy",
    "bus_factor",
    "check_request",
    "choose_algorithm",
    "linear_costs",
    "phase_estimate_s",
    "phase_terms",
    "plan_collective",
    "plan_estimate_s",
    "plan_label",
    "plan_phases",
    "step_latency_s",
    "system_step_s",
    "with_protocol",
]
