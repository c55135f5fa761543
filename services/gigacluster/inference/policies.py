"""Routing policies: which replica serves a request. One base class, a registry keyed by name.

A policy sees a :class:`ReplicaView` per candidate replica (what a router can know cheaply: load
counters and KV use) and keeps any memory of its own; ``prefix_aware`` keeps an approximate index
of which prompt blocks each replica has recently been sent (as SGLang's cache-aware router and
llm-d's prefix scorer do), bounded per replica by LRU eviction, never asking the replicas.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from gigacluster.inference.engine import ReplicaStats, Request
from gigacluster.model import SpecError
from gigacluster.registry import Registry


@dataclasses.dataclass(frozen=True)
class ReplicaView:
    """What the router knows about one replica when it routes."""

    replica_id: int
    outstanding_requests: int = 0
    queue_depth: int = 0
    running: int = 0
    kv_used_frac: float = 0.0
    kv_blocks_total: int = 0
    block_size: int = 16

    def __post_init__(self) -> None:
        if self.outstanding_requests < 0 or self.queue_depth < 0 or self.running < 0:
            raise SpecError("replica", "load counters must be >= 0")
        if not 0.0 <= self.kv_used_frac <= 1.0:
            raise SpecError("replica.kv_used_frac", f"must be in [0, 1], got {self.kv_used_frac}")

    @classmethod
    def from_stats(cls, replica_id: int, stats: ReplicaStats, block_size: int = 16) -> ReplicaView:
        return cls(replica_id, stats.outstanding_requests, stats.queue_depth, stats.running,
                   stats.kv_used_frac, stats.kv_blocks_total, block_size)


class RoutingPolicy(ABC):
    """Base of the routing policies. ``pick`` returns an index into ``replicas``."""

    name: ClassVar[str]

    @abstractmethod
    def pick(self, req: Request, replicas: Sequence[ReplicaView], rng: np.random.Generator) -> int:
        """Index (into ``replicas``) of the replica that should serve ``req``."""

    def on_routed(self, req: Request, replica_id: int) -> None:  # noqa: B027 - optional hook
        """Called after ``req`` was admitted by ``replica_id``."""

    def on_finished(self, request_id: str, replica_id: int) -> None:  # noqa: B027 - optional hook
        """Called when a request routed to ``replica_id`` finished or was cancelled."""


POLICIES: Registry[type[RoutingPolicy]] = Registry(
    "policy", field="policy", group="gigacluster.routing",
    accepts=lambda o: isinstance(o, type) and issubclass(o, RoutingPolicy))
"""The routing policies by name (a deployment's ``policy``); docs/extending.md adds one from outside."""


def _least(values: np.ndarray, rng: np.random.Generator) -> int:
    """Index of the minimum, ties broken at random (so equal replicas share load)."""
    best = np.flatnonzero(values == values.min())
    # best[integers(n)] draws exactly what rng.choice(best) draws, at a fifth of its cost.
    return int(best[0] if best.size == 1 else best[rng.integers(0, best.size)])


def _outstanding(replicas: Sequence[ReplicaView]) -> np.ndarray:
    return np.fromiter((r.outstanding_requests for r in replicas), dtype=np.int64, count=len(replicas))


@POLICIES.register("round_robin")
class RoundRobin(RoutingPolicy):
    """Each replica in turn, ignoring load."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, req: Request, replicas: Sequence[ReplicaView], rng: np.random.Generator) -> int:
        i = self._next % len(replicas)
        self._next = i + 1
        return i


@POLICIES.register("least_outstanding")
class LeastOutstanding(RoutingPolicy):
    """The replica with the fewest queued plus running requests."""

    name = "least_outstanding"

    def pick(self, req: Request, replicas: Sequence[ReplicaView], rng: np.random.Generator) -> int:
        return _least(_outstanding(replicas), rng)


@POLICIES.register("kv_usage")
class KVUsage(RoutingPolicy):
    """The replica with the most free KV cache; queue depth breaks ties (then at random)."""

    name = "kv_usage"

    def pick(self, req: Request, replicas: Sequence[ReplicaView], rng: np.random.Generator) -> int:
        kv = np.fromiter((r.kv_used_frac for r in replicas), dtype=np.float64, count=len(replicas))
        q = np.fromiter((r.queue_depth for r in replicas), dtype=np.float64, count=len(replicas))
        # A queued request will take KV soon: count each as one more unit of pressure at the margin.
        return _least(np.round(kv, 2) + q, rng)


@POLICIES.register("power_of_two")
class PowerOfTwo(RoutingPolicy):
    """Two replicas at random, the less loaded of them (Mitzenmacher's power of two choices)."""

    name = "power_of_two"

    def pick(self, req: Request, replicas: Sequence[ReplicaView], rng: np.random.Generator) -> int:
        if len(replicas) == 1:
            return 0
        a, b = rng.choice(len(replicas), size=2, replace=False).tolist()
        oa, ob = replicas[a].outstanding_requests, replicas[b].outstanding_requests
        return a if oa <= ob else b


@POLICIES.register("prefix_aware")
class PrefixAware(RoutingPolicy):
    """Send a request where its prompt prefix is probably cached, unless load is imbalanced.

    SGLang's cache-aware rule: when the busiest and idlest replicas differ by more than
    ``balance_abs`` outstanding requests and by a factor ``balance_rel``, route to the least
    loaded; otherwise route to the replica whose approximate index matches the longest prefix,
    if that match covers at least ``match_threshold`` of the prompt's blocks, else round robin.
    The index holds at most ``capacity_blocks`` hashes per replica (LRU), by default the
    replica's KV capacity in blocks as reported by its view.
    """

    name = "prefix_aware"

    def __init__(self, *, balance_abs: int = 32, balance_rel: float = 1.5, match_threshold: float = 0.3,
                 capacity_blocks: int | None = None) -> None:
        if balance_abs < 0 or balance_rel < 1.0:
            raise SpecError("policy.balance", "balance_abs must be >= 0 and balance_rel >= 1")
        if not 0.0 <= match_threshold <= 1.0:
            raise SpecError("policy.match_threshold", f"must be in [0, 1], got {match_threshold}")
        self.balance_abs = balance_abs
        self.balance_rel = balance_rel
        self.match_threshold = match_threshold
        self.capacity_blocks = capacity_blocks
        self._index: dict[int, OrderedDict[int, None]] = {}
        self._capacity: dict[int, int] = {}
        self._block_size = 16
        self._last_pick: dict[int, int] = {}
        self._picks = 0
        self.matched_blocks = 0
        self.queried_blocks = 0

    def pick(self, req: Request, replicas: Sequence[ReplicaView], rng: np.random.Generator) -> int:
        load = _outstanding(replicas)
        for r in replicas:
            if r.replica_id not in self._capacity:
                cap = self.capacity_blocks if self.capacity_blocks is not None else max(1, r.kv_blocks_total)
                self._capacity[r.replica_id] = cap
        lo, hi = int(load.min()), int(load.max())
        if hi - lo > self.balance_abs and hi > lo * self.balance_rel:
            return _least(load, rng)
        self._block_size = replicas[0].block_size
        hashes = req.block_hashes(self._block_size)
        if not hashes:
            return _least(load, rng)
        match = np.zeros(len(replicas), dtype=np.int64)
        for i, r in enumerate(replicas):
            idx = self._index.get(r.replica_id)
            if not idx:
                continue
            n = 0
            for h in hashes:
                if h not in idx:
                    break
                n += 1
            match[i] = n
        self.queried_blocks += len(hashes)
        best = int(match.max())
        if best / len(hashes) < self.match_threshold:
            return self._fallback(load, replicas)
        self.matched_blocks += best
        cand = np.flatnonzero(match == best)
        return self._remember(int(cand[_least(load[cand], rng)]), replicas)

    def _fallback(self, load: np.ndarray, replicas: Sequence[ReplicaView]) -> int:
        """No useful cache match and balanced load: the replica picked longest ago (round robin).

        On a balanced cluster, round robin's even spacing of arrivals per replica gives lower TTFT
        than chasing a noisy outstanding count (see docs/inference.md, uniform workload)."""
        age = [self._last_pick.get(r.replica_id, -1) for r in replicas]
        return self._remember(int(np.argmin(age)), replicas)

    def _remember(self, i: int, replicas: Sequence[ReplicaView]) -> int:
        self._picks += 1
        self._last_pick[replicas[i].replica_id] = self._picks
        return i

    def on_routed(self, req: Request, replica_id: int) -> None:
        idx = self._index.get(replica_id)
        if idx is None:
            idx = self._index[replica_id] = OrderedDict()
        cap = self._capacity.get(replica_id, self.capacity_blocks or 1 << 16)
        for h in req.block_hashes(self._block_size):
            if h in idx:
                idx.move_to_end(h)
            else:
                idx[h] = None
        while len(idx) > cap:
            idx.popitem(last=False)

    def index_size(self, replica_id: int) -> int:
        """Hashes the index holds for ``replica_id`` (bounded by its capacity)."""
        return len(self._index.get(replica_id, ()))


def make_policy(name: str) -> RoutingPolicy:
    """A new policy instance by registry name; :class:`~gigacluster.registry.UnknownName` (a
    ``SpecError`` on ``policy``) for an unknown one."""
    return POLICIES.lookup(name)()
