"""Collectives over many identical groups, planned once per *shape* (a StartCollective with ``groups``).

A request names the ranks of group 0 and ``groups`` copies spaced ``stride`` chips apart (the TP,
DP or PP groups of a training job). Planning every copy separately (all five algorithms, each
routed and costed) made a 100k-chip job's step cost minutes of fabric time. Here the copies are
sorted into shapes first, with array work over all of them at once: a copy's *shape* is where its
ranks sit relative to its first rank (domain offsets, positions inside the domain, leaf and pod
offsets). Everything the algorithm's phases depend on is in the shape, so one representative per
shape (its first copy) is planned and costed; the others take its algorithm and phase structure,
translated to their own ranks. What the shape does not hold is the ECMP hash of each copy's flows,
so copies of one shape may collide on spines differently; they still run the representative's
algorithm (as NCCL picks one algorithm per communicator size, not per placement), while the
simulator routes and times every copy's own flows.

The plans are cached by shape, bytes, op, algorithm request and the simulator's network version
(bumped by every fault), so the calls of one step that repeat a shape (the DP groups of every
pipeline stage) plan it once, and a job that starts the same collectives every step plans nothing
after its first step. A cached plan keeps the algorithm its first representative was costed with.

Each shape becomes one :class:`GroupsPlan`: phases over all its copies at once, where a lockstep
phase is one max-min flow *per copy* (:attr:`Phase.flow_of`), and the copies move from phase to
phase together.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections import OrderedDict

import numpy as np

from gigacluster.fabric import FlowCancelledError
from gigacluster.fabric.collectives import (
    DEFAULT_POLICY,
    POLICIES,
    FastestPolicy,
    Phase,
    check_request,
    choose_algorithm,
    plan_label,
    plan_phases,
)
from gigacluster.fabric.protocols import DEFAULT_PROTOCOL
from gigacluster.fabric.topology import Topology
from gigacluster.model import SpecError

PLAN_CACHE_SIZE = 4096


@dataclasses.dataclass(frozen=True, eq=False)
class Template:
    """An algorithm's phases in rank-index space, and the representative's per-phase estimates (s)."""

    algorithm: str
    src_idx: tuple[np.ndarray, ...]
    dst_idx: tuple[np.ndarray, ...]
    bytes_per_hop: tuple[float, ...]
    steps: tuple[int, ...]
    lockstep: tuple[bool, ...]
    est_s: tuple[float, ...]
    protos: tuple[str, ...] = ()
    flow_idx: tuple[np.ndarray | None, ...] = ()  # a lockstep phase's own flows (rail_rings: one per ring)
    weights: tuple[np.ndarray | None, ...] = ()  # each sub-flow's share of its phase's bytes (Phase.weight)
    step_floor_s: tuple[float, ...] = ()  # each phase's own least cost per step (Phase.step_s)
    call_s: tuple[float | None, ...] = ()  # each phase's own per-call cost (Phase.call_s; None: the protocol's)


@dataclasses.dataclass(frozen=True, eq=False)
class GroupsPlan:
    """One shape of a request: its copies (``rows`` of the request, ``ranks`` rows x n) and phases over all."""

    op: str
    algorithm: str
    rows: np.ndarray
    ranks: np.ndarray
    bytes_: float
    phases: tuple[Phase, ...]
    est_s: tuple[float, ...]


def check_groups(op: str, ranks0: np.ndarray, stride: int, groups: int, bytes_: float, topo: Topology) -> np.ndarray:
    """Validate a request (the checks of ``plan_collective``; the last copy must fit) -> ranks0 as int64."""
    if not isinstance(groups, int | np.integer) or isinstance(groups, bool) or groups < 1:
        raise SpecError("groups", f"must be an integer >= 1, got {groups!r}")
    if groups > 1 and not (isinstance(stride, int | np.integer) and stride >= 1):
        raise SpecError("group_stride", f"must be an integer >= 1 when groups > 1, got {stride!r}")
    r = np.asarray(ranks0, dtype=np.int64).ravel()
    top = int(r.max()) + int(stride) * (int(groups) - 1) if r.size else None
    return check_request(op, r, bytes_, topo, top=top)


def shapes(topo: Topology, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(representative row per shape, shape index per row, shape features per shape) of a rows x n rank
    matrix, as array work.

    A row's shape is its domains, leaves and pods relative to its first rank (and, inside a full-mesh or
    torus domain, its positions there). Rows are grouped by a 64-bit hash of those features (one integer
    matrix product; int64 wraps as uint64 would) and the grouping is then checked exactly, part by part."""
    dom = topo.chip_domain[ranks]
    leaf = topo.chip_leaf[ranks]
    pod = topo.leaf_pod[leaf]
    parts = [dom - dom[:, :1], leaf - leaf[:, :1], pod - pod[:, :1]]
    if topo.scaleup != "switch":  # paths inside a full-mesh or torus domain depend on the positions in it
        parts.append(topo.chip_local[ranks])
    n = ranks.shape[1]
    mult = _shape_multipliers(n * len(parts))
    key = parts[0] @ mult[:n]
    for i in range(1, len(parts)):
        key += parts[i] @ mult[i * n:(i + 1) * n]
    if (key == key[0]).all():  # one shape (every copy of the request alike: the common case), no sort
        first, inv = np.zeros(1, dtype=np.int64), np.zeros(key.size, dtype=np.int64)
        exact = all((p == p[:1]).all() for p in parts)
    else:
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        inv = np.asarray(inv).ravel()
        exact = all((p == p[first[inv]]).all() for p in parts)
    if not exact:  # a hash collision (never seen): sort exactly
        _, first, inv = np.unique(np.concatenate(parts, axis=1), axis=0, return_index=True, return_inverse=True)
        inv = np.asarray(inv).ravel()
    order = np.argsort(first, kind="stable")  # shapes in order of their first copy
    rank_of = np.empty_like(order)
    rank_of[order] = np.arange(order.size)
    reps = first[order]
    return reps, rank_of[inv], np.concatenate([p[reps] for p in parts], axis=1)


@functools.lru_cache(maxsize=64)
def _shape_multipliers(k: int) -> np.ndarray:
    """Fixed random 62-bit multipliers of the shape hash (seeded: the same on every run)."""
    m = np.random.default_rng(0x5EED).integers(1, 2**62, k, dtype=np.int64)
    m.setflags(write=False)
    return m


class GroupPlanner:
    """Plans requests shape by shape, with an LRU cache of representatives' templates.

    Safe to call from a worker thread while the event loop owns the simulator: it reads the topology
    and the ``alive`` / capacity arrays (the caller checks the network version did not move while it
    ran) and touches only its own cache, under a lock.
    """

    def __init__(self, topo: Topology, *, policy: str = DEFAULT_POLICY, cache_size: int = PLAN_CACHE_SIZE) -> None:
        self.topo = topo
        self.policy = policy
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[object, ...], Template] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def n_cached(self) -> int:
        """Shapes in the plan cache."""
        return len(self._cache)

    def plan(
        self, op: str, ranks0: np.ndarray, stride: int, groups: int, bytes_: float, *, algo: str | None,
        alive: np.ndarray, capacity_Bps: np.ndarray, version: int, stop: threading.Event | None = None,
    ) -> list[GroupsPlan]:
        """One :class:`GroupsPlan` per shape of the request; ``stop`` set -> FlowCancelledError.

        ``version`` is the simulator's network version: 0 means no link was ever touched (the intact
        fabric), which lets the fastest policy's own estimates serve as the plan's."""
        r0 = check_groups(op, ranks0, stride, groups, bytes_, self.topo)
        ranks = r0[None, :] + int(stride) * np.arange(int(groups), dtype=np.int64)[:, None]
        reps, shape_of, feats = shapes(self.topo, ranks)
        out = []
        for s, rep in enumerate(reps.tolist()):
            if stop is not None and stop.is_set():
                raise FlowCancelledError("the caller cancelled the request")
            rows = np.flatnonzero(shape_of == s)
            tpl = self.template(op, ranks[rep], feats[s], float(bytes_), algo, alive, capacity_Bps, version)
            out.append(expand(op, tpl, rows, ranks[rows], float(bytes_)))
        return out

    def template(self, op: str, rep: np.ndarray, shape: np.ndarray, bytes_: float, algo: str | None,
                 alive: np.ndarray, capacity_Bps: np.ndarray, version: int) -> Template:
        """The plan of a shape (cached; made on the first representative seen): the algorithm chosen or
        forced, its phases by rank index."""
        key = (op, bytes_, algo, self.policy, version, rep.size, shape.tobytes())
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        tpl = _template(op, rep, bytes_, algo, self.policy, self.topo, alive, capacity_Bps, version == 0)
        with self._lock:
            self._cache[key] = tpl
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return tpl


def _template(op: str, rep: np.ndarray, bytes_: float, algo: str | None, policy: str, topo: Topology,
              alive: np.ndarray, capacity_Bps: np.ndarray, pristine: bool) -> Template:
    if rep.size == 1:
        return Template(algo or "none", (), (), (), (), (), (), (), ())
    chooser = POLICIES.lookup(policy)
    phases: list[Phase] | None = None
    est: tuple[float, ...] = ()
    if algo is None and pristine and isinstance(chooser, FastestPolicy):
        name, phases, est_list = chooser.best(op, rep, bytes_, topo)  # its estimates are ours on an intact fabric
        est = tuple(est_list or ())
    if phases is None:
        name = choose_algorithm(op, rep, bytes_, topo, algo=algo, policy=policy)
        phases, est_l = plan_phases(name, op, rep, bytes_, topo, alive=alive, capacity_Bps=capacity_Bps)
        est = tuple(est_l)
    # chip -> its index in the group: a table over the group's chip span when that is not much larger than
    # the group (a gather per phase), else a search in the sorted ranks
    lo, span = int(rep.min()), int(rep.max()) - int(rep.min()) + 1
    if span <= 256 * rep.size + 65536:
        slot = np.full(span, -1, dtype=np.int64)
        slot[rep - lo] = np.arange(rep.size, dtype=np.int64)
    else:
        pos = np.argsort(rep)
        sorted_rep = rep[pos]

    def index(chips: np.ndarray) -> np.ndarray:
        if span > 256 * rep.size + 65536:
            at = np.minimum(np.searchsorted(sorted_rep, chips), rep.size - 1)
            if not (sorted_rep[at] == chips).all():
                raise ValueError(f"algorithm {name} made a phase with chips outside the group's ranks")
            return pos[at]
        off = chips - lo
        inside = (off >= 0) & (off < span)
        at = slot[np.where(inside, off, 0)]
        if not inside.all() or (at < 0).any():
            raise ValueError(f"algorithm {name} made a phase with chips outside the group's ranks")
        return at

    return Template(
        plan_label(name, phases),
        tuple(index(p.src) for p in phases),
        tuple(index(p.dst) for p in phases),
        tuple(float(p.bytes_per_hop) for p in phases), tuple(int(p.steps) for p in phases),
        tuple(bool(p.lockstep) for p in phases), est, tuple(p.proto for p in phases),
        tuple(p.flow_of for p in phases), tuple(p.weight for p in phases), tuple(p.step_s for p in phases),
        tuple(p.call_s for p in phases),
    )


def expand(op: str, tpl: Template, rows: np.ndarray, ranks: np.ndarray, bytes_: float) -> GroupsPlan:
    """A template laid over copies ``ranks`` (rows x n): each phase's sub-flows for every copy at once."""
    g = ranks.shape[0]
    phases = []
    protos = tpl.protos or (DEFAULT_PROTOCOL,) * len(tpl.steps)
    flows = tpl.flow_idx or (None,) * len(tpl.steps)
    weights = tpl.weights or (None,) * len(tpl.steps)
    floors = tpl.step_floor_s or (0.0,) * len(tpl.steps)
    calls = tpl.call_s or (None,) * len(tpl.steps)
    for si, di, b, st, ls, pr, fi, wt, fl, cs in zip(tpl.src_idx, tpl.dst_idx, tpl.bytes_per_hop, tpl.steps,
                                                     tpl.lockstep, protos, flows, weights, floors, calls,
                                                     strict=True):
        k = si.size
        flow_of = None
        if ls and fi is not None:  # copy j's own flows follow copy j-1's
            per = int(fi.max()) + 1 if fi.size else 1
            flow_of = (np.arange(g, dtype=np.int64)[:, None] * per + fi[None, :]).ravel()
        elif ls and g > 1:
            flow_of = np.repeat(np.arange(g, dtype=np.int64), k)
        # take, not ranks[:, si]: fancy indexing on axis 1 comes out transposed and ravel copies it again (20x slower)
        phases.append(Phase(ranks.take(si, axis=1).ravel(), ranks.take(di, axis=1).ravel(), b, st, ls, flow_of, pr,
                            None if wt is None else np.tile(wt, g), fl, cs))
    return GroupsPlan(op, tpl.algorithm, rows, ranks, bytes_, tuple(phases), tpl.est_s)


__all__ = ["PLAN_CACHE_SIZE", "GroupPlanner", "GroupsPlan", "Template", "check_groups", "expand", "shapes"]
