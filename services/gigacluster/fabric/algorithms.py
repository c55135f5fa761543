"""Collective algorithms: how one collective decomposes into phases of point-to-point sub-flows.

The registry :data:`ALGORITHMS` holds one instance per algorithm (``ring``, ``tree`` alias
``double_binary_tree``, ``hierarchical``, ``rail_rings``, ``halving_doubling``, ``direct``,
``mesh_rings``, ``torus_rings``, ``one_shot``, ``nvls``, ``nvls_tree``); :mod:`gigacluster.fabric.collectives` costs,
selects and plans them (see its docstring for the cost model and the table of algorithms).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import numpy as np

from gigacluster.arrays import count_distinct
from gigacluster.fabric.protocols import DEFAULT_PROTOCOL
from gigacluster.fabric.routing import route
from gigacluster.fabric.topology import Topology
from gigacluster.model import SpecError
from gigacluster.model.nvls import (
    double_binary_tree,
    nvls_link_bytes,
    nvls_min_local_ranks,
    nvls_pipeline,
    nvls_runs,
    nvls_size_breaks,
    nvls_stage_bytes,
    nvls_sync_s,
    nvls_tree_call_latency_s,
    nvls_tree_cap_s,
    nvls_tree_levels,
    nvls_tree_runs,
)
from gigacluster.registry import Registry


@dataclasses.dataclass(frozen=True, eq=False)
class Phase:
    """Sub-flows ``src[i] -> dst[i]`` (chip ids) that each carry ``bytes_per_hop`` bytes.

    ``flow_of`` (optional) groups the sub-flows of a lockstep phase into several max-min flows, one
    per copy of a collective planned for many groups at once (:mod:`gigacluster.fabric.groups`).
    ``weight`` (optional, lockstep only) scales each sub-flow's bytes: sub-flow ``i`` carries
    ``bytes_per_hop * weight[i]`` in the time the phase takes, for algorithms whose pipelined hops
    move different amounts (NVLSTree: the NVLS pairs inside a node and the NICs between nodes).
    ``step_s`` is the phase's own least cost per step (0: none), for an algorithm whose library prices its
    steps above the protocol's figure (NVLS, NVLSTree: NCCL's NVLS and network hwLat). ``call_s`` (first phase
    only) replaces the protocol's per-call cost for an algorithm whose library prices its call itself (NVLS:
    NCCL's baseLat 0); None keeps the protocol's.
    """

    src: np.ndarray
    dst: np.ndarray
    bytes_per_hop: float
    steps: int
    lockstep: bool = True
    flow_of: np.ndarray | None = None
    proto: str = DEFAULT_PROTOCOL
    weight: np.ndarray | None = None
    step_s: float = 0.0
    call_s: float | None = None

    def __post_init__(self) -> None:
        if self.src.shape != self.dst.shape:
            raise ValueError("src and dst must have the same shape")
        if self.bytes_per_hop < 0 or self.steps < 0 or not 0 <= self.step_s < 1e-3:
            raise ValueError("bytes_per_hop and steps must be >= 0, step_s in [0, 1 ms)")
        if self.call_s is not None and not 0 <= self.call_s < 1e-3:
            raise ValueError("call_s must be None or in [0, 1 ms)")
        if self.flow_of is not None and self.flow_of.shape != self.src.shape:
            raise ValueError("flow_of must give one flow per sub-flow")
        if self.weight is not None:
            if self.weight.shape != self.src.shape or not self.lockstep:
                raise ValueError("weight must give one factor per sub-flow of a lockstep phase")
            if not (np.isfinite(self.weight).all() and (self.weight > 0).all()):
                raise ValueError("weight must be finite and > 0")

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
    protocols: ClassVar[tuple[str, ...]] = ()  # the protocols it runs (empty: every one in the catalog)

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        return op in self.ops and ranks.size >= 2

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        raise NotImplementedError

    def size_breaks(self, op: str, ranks: np.ndarray, topo: Topology) -> tuple[float, ...]:
        """Message sizes at which the plan's shape changes (ascending); between two its contention-free
        cost is affine in the bytes. None for most algorithms (NVLS: NCCL's chunk ladder)."""
        return ()


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
        ds = dom[order]
        starts = np.flatnonzero(ds[1:] != ds[:-1]) + 1  # where each domain's ranks begin, the first's aside
        g = starts.size + 1
        if g < 2 or ranks.size % g or (starts != np.arange(1, g) * (ranks.size // g)).any():
            return None  # fewer than two domains, or domains holding different numbers of the ranks
        return ranks[order].reshape(g, ranks.size // g)

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


def walecki_paths(m: int) -> list[tuple[int, ...]]:
    """The m/2 zigzag Hamiltonian paths that split the complete graph on ``m`` (even) vertices edge-disjointly
    (Walecki's construction, as in Alspach, "The wonderful Walecki construction", Bull. ICA 52, 2008): path j
    runs j, j+1, j-1, j+2, j-2, ..., j+m/2 (mod m). Run both ways, they are m directed paths that use every
    directed link of the mesh exactly once."""
    if m < 2 or m % 2:
        raise ValueError(f"walecki_paths needs an even m >= 2, got {m}")
    out = []
    for j in range(m // 2):
        seq = [j]
        for k in range(1, m // 2):
            seq += [(j + k) % m, (j - k) % m]
        seq.append((j + m // 2) % m)
        out.append(tuple(seq))
    return out


def _mesh_rail_rings(grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, ring) of the m rail rings over ``grid`` (domains x local ranks) of full-mesh domains: ring r
    follows directed path r of :func:`walecki_paths` inside a domain, reversed in the next, so it leaves a
    domain from the chip where the next one's path starts (one rail per hop, no scale-up hand-over) and the
    m rings use every directed mesh link of a domain once and every NIC once each way. With an odd number of
    domains the closing hop leaves the last domain on one rail and reaches the first on another (a hand-over
    inside the domain instead would put a second ring on a link another path already uses)."""
    g, m = grid.shape
    paths = [p for q in walecki_paths(m) for p in (q, q[::-1])]
    srcs, dsts, rings = [], [], []
    for r, path in enumerate(paths):
        fwd, rev = np.asarray(path), np.asarray(path[::-1])
        chain = np.concatenate([grid[dom, fwd if dom % 2 == 0 else rev] for dom in range(g)])
        srcs.append(chain)
        dsts.append(np.roll(chain, -1))
        rings.append(np.full(chain.size, r, dtype=np.int64))
    return np.concatenate(srcs), np.concatenate(dsts), np.concatenate(rings)


class RailRings(Algorithm):
    """NCCL's multi-channel rings across domains, rail-aligned with PXN: one ring per local rank c of
    the m ranks a domain holds, each carrying S/m. Ring c visits every domain's ranks starting at
    local c; its last rank in a domain hands the data over scale-up to local c (PXN), whose NIC
    sends it on rail c to local c of the next domain. So every ring stays on one rail, the m rings
    use all m NICs of a domain, and a domain's scale-up links carry the rest. On full-mesh domains
    (MI300X-class, an even m) the rings instead follow edge-disjoint Hamiltonian paths inside each domain
    (:func:`_mesh_rail_rings`), as RCCL lays its ring channels over every xGMI link: the chain above
    would put seven of the eight rings on the same link between neighbouring local ranks (48 GB/s busbw on
    2 x 8 MI300X, where rccl-tests measure 356). Needs >= 2 domains holding the same number (>= 2) of
    the ranks, or, on switched domains, >= 2 domains holding different numbers of them (at most one rank in
    none, at least two in one): a job of 512 GPUs on NVL72 racks fills seven and 8 GPUs of an eighth. Then
    there are as many rings as the fullest domain holds ranks, ring c entering and leaving each domain at its
    local rank c modulo the domain's count, so a domain with fewer ranks carries several rings on one NIC: the
    thinnest domain paces the collective, as it does NCCL's channels (a single ring instead crossed every
    domain boundary on one NIC, and 256 ranks on 7 racks and a bit reduce-scattered at one NIC's speed).
    """

    name = "rail_rings"
    ops = ("all_reduce", "reduce_scatter", "all_gather")

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        if not super().supports(op, ranks, topo):
            return False
        grid = Hierarchical._grid(ranks, topo)
        if grid is not None:
            return grid.shape[1] >= 2
        return self._ragged(ranks, topo) is not None

    @staticmethod
    def _ragged(ranks: np.ndarray, topo: Topology) -> list[np.ndarray] | None:
        """The ranks of each domain in domain order, when >= 2 switched domains hold different numbers of them (at
        least two in the fullest); None otherwise (equal domains take the grid)."""
        if topo.scaleup == "full_mesh":
            return None
        dom = topo.chip_domain[ranks]
        if dom.min() == dom.max():  # one domain (most tensor- and context-parallel groups): nothing to sort
            return None
        order = np.argsort(dom, kind="stable")
        ds = dom[order]
        starts = np.flatnonzero(ds[1:] != ds[:-1]) + 1
        parts = np.split(ranks[order], starts)
        if len(parts) < 2 or max(p.size for p in parts) < 2 or len({p.size for p in parts}) == 1:
            return None
        return parts

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        grid = Hierarchical._grid(ranks, topo)
        if grid is None or grid.shape[1] < 2:
            parts = self._ragged(ranks, topo) if grid is None else None
            if parts is None:
                raise SpecError("algo", "rail_rings needs >= 2 domains holding the same number (>= 2) of ranks, "
                                        "or switched domains holding different numbers of them")
            return [self._ragged_phase(op, parts, bytes_)]
        g, m = grid.shape
        n = g * m
        factor, steps = (2.0 * (n - 1) / n, 2 * (n - 1)) if op == "all_reduce" else ((n - 1) / n, n - 1)
        if topo.scaleup == "full_mesh" and m % 2 == 0:
            s, d, f = _mesh_rail_rings(grid)
            return [Phase(s, d, factor * bytes_ / m, steps, flow_of=f)]
        # Ring c (one per local rank, all at once: axis 0): every domain's ranks starting at local c, along the
        # domain's chain; the chain's last -> local c over scale-up (PXN); local c -> local c of the next domain.
        order = grid.take((np.arange(m)[:, None] + np.arange(m)[None, :]) % m, axis=1).transpose(1, 0, 2)
        s_in, d_in = order[:, :, :-1].reshape(m, -1), order[:, :, 1:].reshape(m, -1)
        head = order[:, :, 0]
        src = np.concatenate([s_in, order[:, :, -1], head], axis=1)
        dst = np.concatenate([d_in, head, np.roll(head, -1, axis=1)], axis=1)
        return [Phase(src.ravel(), dst.ravel(), factor * bytes_ / m, steps,
                      flow_of=np.repeat(np.arange(m, dtype=np.int64), src.shape[1]))]

    @staticmethod
    def _ragged_phase(op: str, parts: list[np.ndarray], bytes_: float) -> Phase:
        """The rings over domains holding different numbers of the ranks (see the class docstring): ring c runs
        each domain's ranks from local c mod its count, hands over to that local rank (PXN), and goes on from
        it to the next domain's."""
        n = sum(p.size for p in parts)
        m = max(p.size for p in parts)
        factor, steps = (2.0 * (n - 1) / n, 2 * (n - 1)) if op == "all_reduce" else ((n - 1) / n, n - 1)
        srcs, dsts, rings = [], [], []
        for c in range(m):
            chains = [np.roll(p, -(c % p.size)) for p in parts]
            heads = np.array([ch[0] for ch in chains])
            s = np.concatenate([*(ch[:-1] for ch in chains), [ch[-1] for ch in chains], heads])
            d = np.concatenate([*(ch[1:] for ch in chains), heads, np.roll(heads, -1)])
            keep = s != d  # a domain of one rank: no hand-over to itself
            srcs.append(s[keep])
            dsts.append(d[keep])
            rings.append(np.full(int(keep.sum()), c, dtype=np.int64))
        return Phase(np.concatenate(srcs), np.concatenate(dsts), factor * bytes_ / m, steps,
                     flow_of=np.concatenate(rings))


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
    return topo.scaleup == "full_mesh" and count_distinct(topo.chip_domain[ranks]) == 1


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


class MeshRings(Algorithm):
    """RCCL's rings on a full mesh (what it runs above its MSCCL++ threshold): its channels lay rings over
    every link, so n-1 rings (ring k sends
    rank i to rank i+k) each carry S/(n-1) with a ring's steps. All n-1 links of every rank run at
    once as in the direct two-shot, but a reduction pays the ring's 2(n-1) sequential steps instead of
    two: mid-size messages are step-bound (8 MiB on 8 x MI300X: 14 steps of a few microseconds each
    against 44 us of bandwidth time)."""

    name = "mesh_rings"
    ops = ("all_reduce", "reduce_scatter", "all_gather")

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        return super().supports(op, ranks, topo) and ranks.size >= 3 and _in_one_full_mesh(ranks, topo)

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        n = ranks.size
        srcs = np.tile(ranks, n - 1)
        dsts = np.concatenate([np.roll(ranks, -k) for k in range(1, n)])
        rings = np.repeat(np.arange(n - 1, dtype=np.int64), n)
        factor, steps = (2.0 * (n - 1) / n, 2 * (n - 1)) if op == "all_reduce" else ((n - 1) / n, n - 1)
        return [Phase(srcs, dsts, factor * bytes_ / (n - 1), steps, flow_of=rings)]


_HAMILTON_BUDGET = 200_000  # DFS expansions before a torus is declared undecomposed (4x4 needs a few hundred)


@functools.cache
def torus_hamiltonian_pair(nx: int, ny: int) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Two edge-disjoint Hamiltonian cycles of the ``nx`` x ``ny`` torus (positions ``y * nx + x``) that
    together use every link, or None if none is found within the search budget.

    A 2D torus is 4-regular, so the links a Hamiltonian cycle leaves unused form 2-regular cycles; the
    search walks Hamiltonian cycles from position 0 until the rest is a single cycle too. Such a pair
    exists on every torus of two cycles (Kotzig; Bermond, Favaron and Maheo, 1989, "Hamiltonian
    decomposition of Cayley graphs of degree 4"); the Neuron docs name the pair on the 16-chip torus."""
    n = nx * ny
    nbrs = [sorted({(p // nx) * nx + (p % nx + 1) % nx, (p // nx) * nx + (p % nx - 1) % nx,
                    ((p // nx + 1) % ny) * nx + p % nx, ((p // nx - 1) % ny) * nx + p % nx}) for p in range(n)]
    path, seen, budget = [0], [False] * n, [_HAMILTON_BUDGET]
    seen[0] = True

    def rest_is_one_cycle(cycle: list[int]) -> tuple[int, ...] | None:
        used = {frozenset((cycle[i], cycle[(i + 1) % n])) for i in range(n)}
        rest = [[q for q in nbrs[p] if frozenset((p, q)) not in used] for p in range(n)]
        if any(len(r) != 2 for r in rest):
            return None
        walk, prev, cur = [0], -1, 0
        while True:
            nxt = rest[cur][0] if rest[cur][0] != prev else rest[cur][1]
            if nxt == 0:
                break
            walk.append(nxt)
            prev, cur = cur, nxt
        return tuple(walk) if len(walk) == n else None

    def dfs() -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        budget[0] -= 1
        if budget[0] < 0:
            return None
        if len(path) == n:
            other = rest_is_one_cycle(path) if 0 in nbrs[path[-1]] else None
            return (tuple(path), other) if other is not None else None
        for q in nbrs[path[-1]]:
            if not seen[q]:
                seen[q] = True
                path.append(q)
                found = dfs()
                if found is not None:
                    return found
                path.pop()
                seen[q] = False
        return None

    return dfs()


def _torus_positions(ranks: np.ndarray, topo: Topology) -> np.ndarray | None:
    """Each rank's position ``y * nx + x`` in its torus when the ranks are exactly one whole torus (one
    instance of a ``torus2d`` or ``torus2d_ring`` domain), else None."""
    nx, ny, inst = topo.torus_dims
    if topo.scaleup not in ("torus2d", "torus2d_ring") or nx * ny != ranks.size:
        return None
    dom = nx * ny * inst
    local = ranks % dom
    if count_distinct(ranks // dom) != 1 or count_distinct(local // (nx * ny)) != 1:
        return None
    return local % (nx * ny)  # distinct ranks of one instance: every position once


class TorusRings(Algorithm):
    """Neuron's rings on a whole 2D torus: four rings over mutually exclusive links, each carrying S/4 with a
    ring's steps. The torus splits into two edge-disjoint Hamiltonian cycles (:func:`torus_hamiltonian_pair`),
    each run in both directions, so every chip drives all four of its links at once (a single ring uses one).
    The Neuron docs ("Intra-node Collective Communications with AWS Neuron"): "we run multiple cycles with
    mutually exclusive wires in parallel for full wire bandwidth", and "when using all 16 Neuron Devices,
    there are 2 non-overlapping Hamiltonian cycles on 2D Torus". Runs on groups that are exactly one
    instance's torus (Neuron's TP groups of 16 chips on Trn1/Trn2)."""

    name = "torus_rings"
    ops = ("all_reduce", "reduce_scatter", "all_gather")

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        if not super().supports(op, ranks, topo) or _torus_positions(ranks, topo) is None:
            return False
        nx, ny, _ = topo.torus_dims
        return torus_hamiltonian_pair(nx, ny) is not None

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        pos = _torus_positions(ranks, topo)
        nx, ny, _ = topo.torus_dims
        pair = torus_hamiltonian_pair(nx, ny) if pos is not None else None
        if pos is None or pair is None:
            raise SpecError("algo", "torus_rings needs the ranks of exactly one whole 2D torus")
        at = np.empty(ranks.size, dtype=np.int64)
        at[pos] = ranks  # the rank at each torus position
        cycles = [np.asarray(c, dtype=np.int64) for c in pair]
        rings = [at[c] for c in cycles] + [at[c[::-1]] for c in cycles]
        n = ranks.size
        srcs = np.concatenate(rings)
        dsts = np.concatenate([np.roll(r, -1) for r in rings])
        flow = np.repeat(np.arange(len(rings), dtype=np.int64), n)
        factor, steps = (2.0 * (n - 1) / n, 2 * (n - 1)) if op == "all_reduce" else ((n - 1) / n, n - 1)
        return [Phase(srcs, dsts, factor * bytes_ / len(rings), steps, flow_of=flow)]


class OneShot(Algorithm):
    """One-shot all-reduce on a full mesh: every rank sends its whole buffer to each peer and reduces
    locally; one step, n-1 times the bytes, so it wins only for small messages (RCCL's one-shot)."""

    name = "one_shot"
    ops = ("all_reduce",)

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        return super().supports(op, ranks, topo) and _in_one_full_mesh(ranks, topo)

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        return [_pairs(ranks, bytes_)]


class NVLS(Algorithm):
    """NVLink SHARP all-reduce (NCCL's NVLS, the default on NVSwitch 3+ from NCCL 2.17): the switch
    reduces. Each GPU reads its S/n shard reduced from all GPUs (multimem load-reduce: S up, S/n
    down per GPU) and writes the result once for the switch to multicast (S/n up, S down), so every
    GPU link carries (1 + 1/n) S each way instead of the ring's 2(n-1)/n S. The flow model has no
    switch endpoints, so the phase spreads those bytes over pair flows that load each GPU's up and
    down links exactly that much; the switch path reaches a lower share of the line rate than
    point-to-point copies (catalog ``efficiency.comm.nvls.efficiency``, on top of the link's; Blackwell has its
    own, ``efficiency.comm.nvls.chip_efficiency``, from NCCL's per-architecture NVLS efficiency).
    Runs within one switched domain of a chip listed in ``efficiency.comm.nvls.chips``, on at least
    ``efficiency.comm.nvls.min_local_ranks`` (3) GPUs, as NCCL sets it up; Simple only. The rules and
    constants are :mod:`gigacluster.model.nvls`, which the alpha-beta model shares.
    """

    name = "nvls"
    ops = ("all_reduce",)
    protocols = (DEFAULT_PROTOCOL,)

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        return (super().supports(op, ranks, topo) and nvls_runs(topo.config.chip, topo.scaleup, ranks.size)
                and count_distinct(topo.chip_domain[ranks]) == 1)

    def size_breaks(self, op: str, ranks: np.ndarray, topo: Topology) -> tuple[float, ...]:
        return nvls_size_breaks(ranks.size)

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        n = ranks.size
        pipe = nvls_pipeline()
        # the pipeline's chunks (at least one loop, plus its fill) at the links' rate ...
        per_gpu = nvls_link_bytes(nvls_stage_bytes(bytes_, n), n, topo.config.chip)
        pairs = _pairs(ranks, per_gpu / (n - 1))
        # ... and each chunk's synchronisation, booked as the bytes the pair flows would move meanwhile
        r = route(topo, pairs.src, pairs.dst, np.arange(pairs.n_subflows))
        extra = 0.0
        if r.ok.all() and r.e_link.size:
            used, inv = np.unique(r.e_link, return_inverse=True)
            load = np.bincount(inv, weights=r.e_coef, minlength=used.size)
            extra = nvls_sync_s(bytes_, n) * float((topo.link_capacity_Bps[used] / load).min())
        # load-reduce, then multicast: NCCL's NVLS latency over the two steps, its own per-call cost
        return [dataclasses.replace(pairs, bytes_per_hop=pairs.bytes_per_hop + extra, steps=2,
                                    step_s=pipe.latency_s / 2, call_s=pipe.call_s)]


class NVLSTree(Algorithm):
    """NCCL's NVLSTree all-reduce across nodes of NVLS-capable systems (its default there from NCCL 2.18):
    NVLS inside each node, a tree between the nodes. Every local rank c is the head of one channel and owns
    the shard S/m of it (one channel per NIC: NCCL's NVLS graph search pairs each NIC with its local GPU): the
    switch reduces the node's shards (NVLS, (1 + 1/m) S per GPU link as in :class:`NVLS`), head c exchanges
    its shard with head c of the other nodes over its own rail (NCCL's double binary tree over the nodes, each
    tree half the shard: S/m each way per NIC on two nodes, where a ring carries 2(n-1)/n x S/m), and the
    switch multicasts the result. The three stages are pipelined, so the phase is one lockstep phase whose
    sub-flows carry different bytes (:attr:`Phase.weight`, relative to the shard).

    NCCL's own tuner bounds a channel by ``perChMaxNVLSTreeBws`` (catalog ``efficiency.comm.nvls_tree``,
    busbw per channel by architecture and node count): below the NIC's rate (Hopper, 57.7 GB/s on two nodes)
    the ceiling holds the channel, so the tree's NIC bytes are booked up to the time the ceiling allows (the
    flow model has no per-channel resource to carry it); a NIC slower than the ceiling (Blackwell, 96) keeps
    its own rate. Its steps cost NCCL's own NVLSTree latency (catalog ``efficiency.comm.nvls_tree.latency_s``),
    so small messages keep the tree or the rings. Runs on >= 2 switched domains of a chip with a ceiling, each
    holding the same number (>= 3, NCCL's NVLS minimum) of the ranks; Simple only. The ceiling, latency, tree
    and eligibility are :mod:`gigacluster.model.nvls`, shared with the alpha-beta model's closed form."""

    name = "nvls_tree"
    ops = ("all_reduce",)
    protocols = (DEFAULT_PROTOCOL,)

    def supports(self, op: str, ranks: np.ndarray, topo: Topology) -> bool:
        if not super().supports(op, ranks, topo):
            return False
        grid = Hierarchical._grid(ranks, topo)
        return grid is not None and nvls_tree_runs(topo.config.chip, topo.scaleup, *grid.shape)

    def phases(self, op: str, ranks: np.ndarray, bytes_: float, topo: Topology) -> list[Phase]:
        grid = Hierarchical._grid(ranks, topo)
        if grid is None or not nvls_tree_runs(topo.config.chip, topo.scaleup, *grid.shape):
            raise SpecError("algo", f"nvls_tree needs >= 2 NVLS domains holding the same number (>= "
                                    f"{nvls_min_local_ranks()}) of ranks")
        g, m = grid.shape
        shard = bytes_ / m
        # NVLS inside each domain: every ordered pair, (1 + 1/m) S per GPU link, in units of the shard
        i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
        keep = (i != j).ravel()
        nv_s = grid.take(i.ravel()[keep], axis=1).ravel()
        nv_d = grid.take(j.ravel()[keep], axis=1).ravel()
        nv_w = np.full(nv_s.size, nvls_link_bytes(1.0, m, topo.config.chip) * m / (m - 1))
        # the double binary tree over the domains, per rail: each tree half the shard, up and down
        tr_s, tr_d = [], []
        for child_dom, parent_dom in double_binary_tree(g):
            child, par = grid[child_dom], grid[parent_dom]  # (edges, m): one column per rail
            tr_s += [child.ravel(), par.ravel()]
            tr_d += [par.ravel(), child.ravel()]
        t_s, t_d = np.concatenate(tr_s), np.concatenate(tr_d)
        t_w = np.full(t_s.size, 0.5)
        # NCCL's channel ceiling: heads (one per NIC) x head busbw
        heads = min(m, topo.config.nics_per_node) if topo.config.nics_per_node else m
        cap_s = nvls_tree_cap_s(topo.config.chip, g, m, heads, bytes_)
        r = route(topo, t_s, t_d, np.arange(t_s.size))
        if r.ok.all() and r.e_link.size and bytes_ > 0:
            used, inv = np.unique(r.e_link, return_inverse=True)
            load = np.bincount(inv, weights=r.e_coef * t_w[r.e_flow], minlength=used.size)
            tree_s = shard / float((topo.link_capacity_Bps[used] / load).min())
            t_w *= max(1.0, cap_s / tree_s)
        # NCCL's latency for it: intraLat + 2 log2(nNodes) interLat (nvls.cc), spread over the phase's steps
        steps = 1 + 2 * nvls_tree_levels(g)
        return [Phase(np.concatenate([nv_s, t_s]), np.concatenate([nv_d, t_d]), shard, steps,
                      weight=np.concatenate([nv_w, t_w]), step_s=nvls_tree_call_latency_s(g) / steps)]


ALGORITHMS: Registry[Algorithm] = Registry("algorithm", field="algo", group="gigacluster.collectives",
                                           accepts=lambda o: isinstance(o, Algorithm))
"""Collective algorithms (instances) by name; ``double_binary_tree`` is another name of ``tree``."""
for _algo in (Ring(), DoubleBinaryTree(), Hierarchical(), RailRings(), HalvingDoubling(), Direct(), MeshRings(),
              TorusRings(), OneShot(), NVLS(), NVLSTree()):
    ALGORITHMS.register(_algo.name, _algo)
ALGORITHMS.register("double_binary_tree", ALGORITHMS["tree"])
