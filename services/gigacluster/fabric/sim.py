"""FlowSim: an event-driven flow-level simulator of the fabric, in virtual seconds.

Transfers and collectives are *flow groups*. A group runs its phases back to back (a transfer has
one phase of one flow; see :mod:`gigacluster.fabric.collectives` for collectives). While a phase
runs, its flows sit in the *pool*: the active flows, which share link capacity max-min fairly
(:func:`~gigacluster.fabric.maxmin.maxmin_rates`, weights and strict priority from the traffic
class). Rates are recomputed only when the pool or the links change (a phase starts, a flow
drains, a fault), lazily, at the next query. Between events every rate is constant, so the next
event time is exact: ``min(remaining / rate)`` over the pool, or the earliest timer. When the
last flow of a phase drains, the phase's latency terms run as a timer (the alpha part of the
alpha-beta model), then the next phase starts; after the last phase the group completes.

Time rules: ``start_*`` with ``start_s`` earlier than :attr:`FlowSim.now_s` starts at ``now_s``; a
later ``start_s`` starts then (a timer). :meth:`FlowSim.advance` processes every event up to
``until_s`` and returns completions and failures in time order; when nothing is due it only
moves the clock (O(1)). Faults act at ``now_s``: flows crossing a downed link or switch are
rerouted over the live equal-cost paths, and a group that has a flow with no live path fails
with a :class:`~gigacluster.fabric.NoPathError` message. Restored links carry new flows only
(ECMP does not move flows back).

Traffic classes (:class:`ClassPolicy`): higher ``priority`` is served strictly first; within a
priority, rates are proportional to ``weight``. Defaults: ``training`` and ``storage`` weight 1,
``inference`` weight 4, all priority 0, so inference is favoured but training never starves;
pass ``classes`` to change it (e.g. ``inference`` priority 1 for strict priority).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import threading
from collections.abc import Mapping, Sequence

import numpy as np

from gigacluster.arrays import distinct
from gigacluster.fabric import FlowCancelledError, NoPathError, UnknownFlowGroupError
from gigacluster.fabric.collectives import (
    DEFAULT_POLICY,
    CollectivePlan,
    Phase,
    collective_constants,
    step_latency_s,
    system_step_s,
)
from gigacluster.fabric.flows import (
    DEFAULT_CLASSES,
    EVENT_KINDS,
    ClassPolicy,
    FlowEvent,
    FlowGroupHandle,
    Group,
    LinkStats,
    TierStatic,
    TierStats,
    tier_stats,
)
from gigacluster.fabric.groups import GroupPlanner, GroupsPlan
from gigacluster.fabric.pool import FlowPool
from gigacluster.fabric.routing import phase_labels, route
from gigacluster.fabric.topology import TIER_NAMES, Topology
from gigacluster.model import SpecError

_DRAIN_REL = 1e-9
_TIME_EPS = 1e-15
N_TIERS = len(TIER_NAMES)


@dataclasses.dataclass(frozen=True, eq=False)
class PlannedCollectives:
    """Plans of one request (one per shape) and the network version they were made under."""

    request: tuple[str, np.ndarray, int, int, float, str | None]
    plans: tuple[GroupsPlan, ...]
    version: int


class FlowSim:
    """Event-driven max-min flow simulator of one topology, in virtual seconds."""

    _stats: tuple[tuple[object, ...], LinkStats] | None
    _tiers: tuple[tuple[object, ...], tuple[tuple[TierStats, ...], int]] | None

    def __init__(
        self, topo: Topology, *, classes: Mapping[str, ClassPolicy] | None = None, policy: str = DEFAULT_POLICY,
        incremental: bool = True, track_links: bool = False,
    ) -> None:
        self.topo = topo
        self.classes: dict[str, ClassPolicy] = dict(DEFAULT_CLASSES if classes is None else classes)
        for name, cp in self.classes.items():
            if not isinstance(cp, ClassPolicy):
                raise SpecError("classes", f"class {name!r} must be a ClassPolicy, got {type(cp).__name__}")
        self.policy = policy
        self.now_s = 0.0
        nl = topo.n_links
        self._alive = np.ones(nl, dtype=bool)
        self._factor = np.ones(nl)
        self._cap = topo.link_capacity_Bps.copy()
        cap0 = topo.link_capacity_Bps
        self._inv_cap = np.divide(1.0, cap0, out=np.zeros(nl), where=cap0 > 0)
        self._track_links = track_links
        self._incremental = incremental  # False: every solve from scratch (the reference in tests)
        self._version = 0  # bumped by every change of link state: plans made before it are stale
        self._new_traffic()
        self._tier_static: tuple[int, TierStatic] | None = None  # per-tier link state, per network version
        self._faults: tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None  # link_faults()
        self.planner = GroupPlanner(topo, policy=policy)
        # Links held by steady-state windows (fabric/service/windows.py): a phase whose flows enter one
        # is noted in ``reserved_hits`` as (time, group id, links hit) for the owner to cut the window.
        self.reserved: np.ndarray | None = None
        self.reserved_hits: list[tuple[float, str, np.ndarray]] = []

    # ---- public: start ---------------------------------------------------------------------
    def start_transfer(
        self, src_chip: int, dst_chip: int, bytes_: float, *, start_s: float, traffic_class: str = "training",
        tag: str = "",
    ) -> FlowGroupHandle:
        """Start one point-to-point transfer; its latency is the path latency only (no collective costs)."""
        n = self.topo.n_chips
        for field, c in (("src_chip", src_chip), ("dst_chip", dst_chip)):
            if not isinstance(c, int | np.integer) or not 0 <= int(c) < n:
                raise SpecError(field, f"must be a chip id in [0, {n}), got {c!r}")
        if not (isinstance(bytes_, int | float | np.number) and math.isfinite(bytes_) and bytes_ >= 0):
            raise SpecError("bytes", f"must be a finite number >= 0, got {bytes_!r}")
        ranks = np.array([int(src_chip), int(dst_chip)], dtype=np.int64)
        plan = CollectivePlan("send_recv", "direct", ranks, float(bytes_),
                              (Phase(ranks[:1], ranks[1:], float(bytes_), 1),))
        return self._add_group(plan, "transfer", start_s, traffic_class, tag, overhead=False)

    def start_collective(
        self, op: str, ranks: Sequence[int] | np.ndarray, bytes_: float, *, start_s: float, algo: str | None = None,
        traffic_class: str = "training", tag: str = "", repeats: int = 1,
    ) -> FlowGroupHandle:
        """Start a collective over ``ranks`` (chip ids); ``algo`` forces an algorithm, else the policy picks."""
        return self.start_collectives(op, ranks, 0, 1, bytes_, start_s=start_s, algo=algo,
                                      traffic_class=traffic_class, tag=tag, repeats=repeats)[0]

    def plan_collectives(
        self, op: str, ranks: Sequence[int] | np.ndarray, stride: int, groups: int, bytes_: float, *,
        algo: str | None = None, stop: threading.Event | None = None,
    ) -> PlannedCollectives:
        """Plan ``groups`` copies of a collective (``ranks + stride * k``), one plan per shape.

        Reads the simulator's link state but changes nothing, so a worker thread may run it while the
        event loop keeps the simulator; :meth:`start_planned` re-plans if a fault came in between.
        """
        version = self._version
        plans = self.planner.plan(op, np.asarray(ranks), stride, groups, bytes_, algo=algo, alive=self._alive,
                                  capacity_Bps=self._cap, version=version, stop=stop)
        return PlannedCollectives((op, np.asarray(ranks), stride, groups, bytes_, algo), tuple(plans), version)

    def start_planned(self, planned: PlannedCollectives, *, start_s: float, traffic_class: str = "training",
                      tag: str = "", repeats: int = 1) -> list[FlowGroupHandle]:
        """Start planned collectives: one group (one handle) per shape, its copies moving phase by phase.

        ``repeats``: the caller runs this collective that many times for the one timed here (an inline
        collective of a training step, ``count`` per step). The flows and the timing are one call's; each
        phase, as it starts, also credits the other ``repeats - 1`` calls' bytes to the links it uses
        (:meth:`credit_bytes`), so link and tier statistics count every call."""
        if planned.version != self._version:
            op, ranks, stride, groups, bytes_, algo = planned.request
            planned = self.plan_collectives(op, ranks, stride, groups, bytes_, algo=algo)
        return [self._add_group(p, "collective", start_s, traffic_class, tag, overhead=True, repeats=repeats)
                for p in planned.plans]

    def start_collectives(
        self, op: str, ranks: Sequence[int] | np.ndarray, stride: int, groups: int, bytes_: float, *,
        start_s: float, algo: str | None = None, traffic_class: str = "training", tag: str = "", repeats: int = 1,
    ) -> list[FlowGroupHandle]:
        """Plan and start ``groups`` copies of a collective at once (:meth:`plan_collectives`)."""
        planned = self.plan_collectives(op, ranks, stride, groups, bytes_, algo=algo)
        return self.start_planned(planned, start_s=start_s, traffic_class=traffic_class, tag=tag, repeats=repeats)

    # ---- public: time --------------------------------------------------------------------
    def next_event_s(self) -> float | None:
        """Virtual time of the next event (a flow draining, a phase or start timer), or None if idle."""
        self._solve()
        t = math.inf
        if self._pool.size:
            t = float(self._pool.drain.min())
        while self._timers and not self._timer_live(self._timers[0]):
            heapq.heappop(self._timers)
        if self._timers:
            t = min(t, self._timers[0][0])
        return None if math.isinf(t) else max(t, self._t_ref)

    def advance(self, until_s: float) -> list[FlowEvent]:
        """Process every event up to ``until_s`` and move the clock there; returns events in time order."""
        if not until_s >= self.now_s:
            raise SpecError("until_s", f"must be >= now_s ({self.now_s}), got {until_s!r}")
        events: list[FlowEvent] = []
        while True:
            t = self.next_event_s()
            if t is None or t > until_s:
                break
            self._materialise(t)
            self.now_s = max(self.now_s, t)
            events += self._process_due(t)
        self.now_s = float(until_s)
        return events

    def run_until_idle(self, max_events: int = 10_000_000) -> list[FlowEvent]:
        """Advance until nothing is left to do (convenience for offline estimates and tests)."""
        events: list[FlowEvent] = []
        for _ in range(max_events):
            t = self.next_event_s()
            if t is None:
                return events
            events += self.advance(max(t, self.now_s))
        raise RuntimeError("run_until_idle: too many events")

    def predicted_end_s(self, handle_id: str) -> float:
        """Predicted completion of a group, given the current flows; the actual end once it ended."""
        g = self._get(handle_id)
        if g.state in ("done", "failed"):
            return float(g.end_s)
        self._solve()
        later = sum(g.phase_est_s[g.phase_idx + 1:])
        if g.n_pool:
            return self._pool.grp_drain[g.seq] + g.phase_lat_s + later
        return float(g.timer_s) + later

    def get(self, handle_id: str) -> FlowGroupHandle:
        """The handle of a group by id (raises UnknownFlowGroupError)."""
        return FlowGroupHandle(self, self._get(handle_id))

    def groups(self, *, active_only: bool = False) -> list[FlowGroupHandle]:
        """Handles of all groups (or only pending/running ones), oldest first."""
        return [FlowGroupHandle(self, g) for g in self._groups.values()
                if not active_only or g.state in ("pending", "running")]

    def forget(self, handle_id: str) -> None:
        """Drop a finished group's record (a long-running service calls this to bound memory)."""
        g = self._get(handle_id)
        if g.state in ("pending", "running"):
            raise SpecError("handle_id", f"{handle_id} is still {g.state}")
        del self._groups[g.id]
        del self._by_seq[g.seq]

    def cancel(self, handle_id: str, reason: str) -> list[FlowEvent]:
        """End a pending or running group now, as failed with ``reason``; its flows leave the links at once.

        A finished group is left as it is (empty list)."""
        g = self._get(handle_id)
        if g.state not in ("pending", "running"):
            return []
        return self._fail(g, self.now_s, FlowCancelledError(reason))

    # ---- public: stats -------------------------------------------------------------------
    def link_stats(self) -> LinkStats:
        """Per-link rate, utilisation, active sub-flows, bytes carried and state; and per tier. Kept while nothing
        changed (time, link state, flows started or removed, bytes credited): telemetry, metrics and clients read
        it every few seconds, and on a 10M-link site each computation is a second of a core."""
        key = self._stats_key()
        if self._stats is not None and self._stats[0] == key:
            return self._stats[1]
        stats = self._link_stats()
        self._stats = (key, stats)
        return stats

    def _stats_key(self) -> tuple[object, ...]:
        """What the statistics are made of: time, link state, flows started or removed, bytes credited."""
        return (self.now_s, self._version, self._subflows_started, self._pool.size, self._credits)

    def tier_stats(self) -> tuple[tuple[TierStats, ...], int]:
        """(per-tier aggregates, active sub-flows): what telemetry, metrics and ``GetLinkStats`` report, equal to
        ``link_stats().tiers`` but computed over the links that carry traffic only (and the link state once per
        network version), so a 10M-link site pays for its busy links, not for every link, each time."""
        key = self._stats_key()
        if self._tiers is not None and self._tiers[0] == key:
            return self._tiers[1]
        if self._stats is not None and self._stats[0] == key:
            out = (self._stats[1].tiers, self._stats[1].active_flows_total)
        else:
            self._solve()
            static = self._tier_state()
            used = self._pool.used_links()
            out = (static.aggregate(used, self._pool.used_rates(), self._cap[used]), int(self._pool.s_pos.size))
        self._tiers = (key, out)
        return out

    def _tier_state(self) -> TierStatic:
        if self._tier_static is None or self._tier_static[0] != self._version:
            state = np.where(~self._alive, 2, np.where(self._factor < 1.0, 1, 0)).astype(np.int8)
            self._tier_static = (self._version, TierStatic.of(self.topo, self._cap, state))
        return self._tier_static[1]

    def _link_stats(self) -> LinkStats:
        self._solve()
        topo = self.topo
        cap = self._cap
        rate = self._pool.link_rate
        util = np.divide(rate, cap, out=np.zeros_like(rate), where=cap > 0)
        flows = np.bincount(self._pool.e_link, minlength=topo.n_links)
        carried = self._bytes_carried + rate * (self.now_s - self._t_ref)
        state = np.where(~self._alive, 2, np.where(self._factor < 1.0, 1, 0)).astype(np.int8)
        return LinkStats(self.now_s, rate, cap.copy(), util, flows, carried, state,
                         tier_stats(topo, cap, rate, state),
                         int(self._pool.s_pos.size))

    def carried(self) -> tuple[np.ndarray, np.ndarray]:
        """(links, bytes) of every link that has carried bytes, in link order: ``bytes_carried()`` at its
        non-zero links, read from the links the flows met (a simulator made with ``track_links=True``)
        rather than from a scan of every link of a 10M-link site."""
        if self._touched is None:
            b = self.bytes_carried()
            ids = np.flatnonzero(b > 0)
            return ids, b[ids]
        self._solve()
        used = self._pool.used_links()
        self._touched[used] = True
        ids = np.flatnonzero(self._touched)  # one pass over a byte per link (a sort of every phase's links cost more)
        b = self._bytes_carried[ids]
        dt = self.now_s - self._t_ref
        if dt > 0:
            b[np.searchsorted(ids, used)] += self._pool.used_rates() * dt
        keep = b > 0
        return ids[keep], b[keep]

    def clear_traffic(self) -> None:
        """Back to time 0 with no flow, group, timer or carried byte, keeping the link state and the planner's
        plans made under it: a scratch simulator reused for the next alone run costs what a new one would
        have cost to fill, not the topology-sized arrays a new one allocates."""
        self.now_s = 0.0
        self._new_traffic()
        self.reserved = None
        self.reserved_hits = []

    def _new_traffic(self) -> None:
        """No flow, group, timer or carried byte, and the statistics made of them forgotten (start-up, and
        :meth:`clear_traffic`)."""
        nl = self.topo.n_links
        self._groups: dict[str, Group] = {}
        self._by_seq: dict[int, Group] = {}
        self._seq = 0
        self._subflows_started = 0
        self._timers: list[tuple[float, int]] = []
        self._pool = FlowPool(nl)
        self._pool.incremental = self._incremental
        self._t_ref = 0.0
        self._bytes_carried = np.zeros(nl)
        # The links bytes were carried on, as the flows moved (track_links: a scratch simulator's alone runs).
        self._touched: np.ndarray | None = np.zeros(nl, dtype=bool) if self._track_links else None
        # Per tier, from time 0 to _t_ref: link-seconds of utilisation (bytes over the link's capacity in the
        # topology, summed over the tier's links) and bytes carried, flows and credited bytes alike; and, on a
        # simulator that tracks its links, the highest utilisation (rate over present capacity) any link reached.
        self._busy_s = np.zeros(N_TIERS)
        self._tier_bytes = np.zeros(N_TIERS)
        self._peak: np.ndarray | None = np.zeros(N_TIERS) if self._track_links else None
        self._tier_rate: tuple[int, np.ndarray, np.ndarray, np.ndarray | None] | None = None  # per solve
        self._credits = 0  # bumped by every credit of bytes moved outside the simulator
        self._stats = None  # link_stats() and what it was made of
        self._tiers = None  # tier_stats()

    def bytes_carried(self) -> np.ndarray:
        """Bytes each link has carried so far (``link_stats().bytes_carried`` without the per-link and per-tier
        statistics: a scratch simulator's alone run reads only this, on a 10M-link site)."""
        self._solve()
        return self._bytes_carried + self._pool.link_rate * (self.now_s - self._t_ref)

    def link_state(self) -> tuple[np.ndarray, np.ndarray]:
        """(state per link: 0 up, 1 degraded, 2 down; capacity in bytes/s), copies: what a scratch simulator
        needs of the live one, without solving."""
        state = np.where(~self._alive, 2, np.where(self._factor < 1.0, 1, 0)).astype(np.int8)
        return state, self._cap.copy()

    def link_faults(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(links down, links degraded and up, their capacity factors): the link state as the few links that
        differ from the topology's, kept per network version (a scratch simulator starts from it; on a
        10M-link site copying and hashing every link's state per window request cost more than the request)."""
        if self._faults is None or self._faults[0] != self._version:
            down = np.flatnonzero(~self._alive)
            degraded = np.flatnonzero(self._alive & (self._factor < 1.0))
            self._faults = (self._version, (down, degraded, self._factor[degraded].copy()))
        return self._faults[1]

    def flows_on(self, links: np.ndarray) -> bool:
        """Whether any sub-flow now crosses one of ``links`` (``link_stats().active_flows[links].any()``
        without counting every link's flows)."""
        if not links.size:
            return False
        self._solve()
        return self._pool.crosses(links)

    def credit_bytes(self, links: np.ndarray, bytes_: np.ndarray) -> None:
        """Add bytes moved outside the simulator (a steady-state window's steps) to the links' carried bytes and
        to their tiers' utilisation totals (:meth:`tier_totals`)."""
        np.add.at(self._bytes_carried, links, bytes_)
        busy, byt = self.tier_sums(links, bytes_)
        self._busy_s += busy
        self._tier_bytes += byt
        self._credits += 1

    def tier_sums(self, links: np.ndarray, bytes_: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per tier (indexed as ``TIER_NAMES``): the link-seconds of utilisation ``bytes_`` on ``links`` make (each
        link's bytes over its capacity in the topology) and the bytes themselves."""
        lt = self.topo.link_tier[links]
        b = np.asarray(bytes_, dtype=np.float64)
        return (np.bincount(lt, weights=b * self._inv_cap[links], minlength=N_TIERS),
                np.bincount(lt, weights=b, minlength=N_TIERS))

    def tier_totals(self) -> tuple[np.ndarray, np.ndarray]:
        """(link-seconds of utilisation, bytes carried) per tier (indexed as ``TIER_NAMES``) from time 0 to
        :attr:`now_s`: the flows' bytes, exact (rates are constant between events: each rate times the time it
        held), and the bytes credited (:meth:`credit_bytes`). A link's utilisation is its bytes over its capacity in
        the topology (goodput, not reduced by a degradation), so a tier's time-average link utilisation over an
        interval is the difference of two reads over (its links x the interval). O(tiers) per read, plus one pass
        over the busy links after each change of rates."""
        self._solve()
        _, busy, byt, _ = self._tier_rates()
        dt = self.now_s - self._t_ref
        return self._busy_s + busy * dt, self._tier_bytes + byt * dt

    def tier_peak(self) -> np.ndarray:
        """Per tier, the highest utilisation (rate over present capacity) any link reached since time 0, on a
        simulator made with ``track_links=True`` (what a steady-state window's step reaches, run alone); zeros on
        others."""
        if self._peak is None:
            return np.zeros(N_TIERS)
        self._solve()
        peak = self._tier_rates()[3]
        return np.maximum(self._peak, peak) if peak is not None and self.now_s > self._t_ref else self._peak.copy()

    def _tier_rates(self) -> tuple[int, np.ndarray, np.ndarray, np.ndarray | None]:
        """(solve, utilisation per second, bytes per second, highest link utilisation) per tier at the current rates,
        kept until the next solve (the caller solves first)."""
        gen = self._pool.generation
        if self._tier_rate is None or self._tier_rate[0] != gen:
            used = self._pool.used_links()
            busy, byt = self.tier_sums(used, self._pool.used_rates())
            peak = None
            if self._peak is not None:
                peak = np.zeros(N_TIERS)
                lt = self.topo.link_tier[used]
                util = np.divide(self._pool.used_rates(), self._cap[used], out=np.zeros(used.size),
                                 where=self._cap[used] > 0)
                for t in distinct(lt).tolist():  # a few tiers: masks, not np.maximum.at over every busy link
                    peak[t] = util[lt == t].max()
            self._tier_rate = (gen, busy, byt, peak)
        return self._tier_rate

    # ---- public: faults ------------------------------------------------------------------
    def fail_link(self, link_id: int) -> list[FlowEvent]:
        """Take a link down now: reroute its flows, fail groups left without a path."""
        lid = self._check_link(link_id)
        if not self._alive[lid]:
            return []
        self._materialise(self.now_s)
        self._alive[lid] = False
        self._cap[lid] = 0.0
        self._net_changed()
        ev = [FlowEvent(self.now_s, "link_down", message=self.topo.link_name(lid), link_id=lid)]
        return ev + self._reroute(np.array([lid]))

    def degrade_link(self, link_id: int, factor: float) -> list[FlowEvent]:
        """Leave ``factor`` (0 < factor <= 1) of a link's capacity; flows keep their paths."""
        lid = self._check_link(link_id)
        if not (isinstance(factor, int | float) and 0 < factor <= 1):
            raise SpecError("capacity_factor", f"must be in (0, 1], got {factor!r}")
        self._materialise(self.now_s)
        self._factor[lid] = float(factor)
        if self._alive[lid]:
            self._cap[lid] = self.topo.link_capacity_Bps[lid] * factor
        self._net_changed()
        return [FlowEvent(self.now_s, "link_degraded", message=f"{self.topo.link_name(lid)} x{factor:g}",
                          link_id=lid)]

    def restore_link(self, link_id: int) -> list[FlowEvent]:
        """Bring a link back to full capacity; new flows may use it, existing ones stay put."""
        lid = self._check_link(link_id)
        self._materialise(self.now_s)
        self._alive[lid] = True
        self._factor[lid] = 1.0
        self._cap[lid] = self.topo.link_capacity_Bps[lid]
        self._net_changed()
        return [FlowEvent(self.now_s, "link_restored", message=self.topo.link_name(lid), link_id=lid)]

    def fail_switch(self, node_id: int) -> list[FlowEvent]:
        """Take a switch (every link into or out of it) down now; reroute or fail its flows."""
        node = self._check_switch(node_id)
        links = self.topo.links_of_node(node)
        self._materialise(self.now_s)
        self._alive[links] = False
        self._cap[links] = 0.0
        self._net_changed()
        ev = [FlowEvent(self.now_s, "switch_down", message=self.topo.node_name(node), node_id=node)]
        return ev + self._reroute(links)

    def restore_switch(self, node_id: int) -> list[FlowEvent]:
        """Bring a switch and its links back."""
        node = self._check_switch(node_id)
        links = self.topo.links_of_node(node)
        self._materialise(self.now_s)
        self._alive[links] = True
        self._factor[links] = 1.0
        self._cap[links] = self.topo.link_capacity_Bps[links]
        self._net_changed()
        return [FlowEvent(self.now_s, "switch_restored", message=self.topo.node_name(node), node_id=node)]

    @property
    def link_alive(self) -> np.ndarray:
        """Read-only copy of the per-link up/down state."""
        return self._alive.copy()

    @property
    def link_factor(self) -> np.ndarray:
        """Read-only copy of the per-link capacity factor (below 1: degraded)."""
        return self._factor.copy()

    def cut_off_chips(self) -> np.ndarray:
        """Per chip, whether its NIC link up or down is dead (a NIC, cable or leaf fault): the chip is cut off
        from the scale-out network until the link is repaired. Two gathers over the chips."""
        up, down = self.topo.nic_up, self.topo.nic_down
        dead = ~self._alive[np.maximum(up, 0)] | ~self._alive[np.maximum(down, 0)]
        return dead & (up >= 0) & (down >= 0)

    # ---- internals -----------------------------------------------------------------------
    def _get(self, handle_id: str) -> Group:
        g = self._groups.get(str(handle_id).rsplit("/", 1)[-1])
        if g is None:
            raise UnknownFlowGroupError(f"unknown flow group {handle_id!r}")
        return g

    def _check_link(self, link_id: int) -> int:
        if not isinstance(link_id, int | np.integer) or not 0 <= int(link_id) < self.topo.n_links:
            raise SpecError("link", f"must be a link id in [0, {self.topo.n_links}), got {link_id!r}")
        return int(link_id)

    def _check_switch(self, node_id: int) -> int:
        topo = self.topo
        if not isinstance(node_id, int | np.integer) or not topo.n_chips <= int(node_id) < topo.n_nodes:
            raise SpecError("switch", f"must be a switch node id in [{topo.n_chips}, {topo.n_nodes}), got {node_id!r}")
        return int(node_id)

    def _timer_live(self, entry: tuple[float, int]) -> bool:
        g = self._by_seq.get(entry[1])
        return g is not None and g.state in ("pending", "running") and g.timer_s == entry[0] and g.n_pool == 0

    def _net_changed(self) -> None:
        self._pool.invalidate()
        self._version += 1

    def _add_group(
        self, plan: CollectivePlan | GroupsPlan, kind: str, start_s: float, traffic_class: str, tag: str, *,
        overhead: bool, repeats: int = 1,
    ) -> FlowGroupHandle:
        if traffic_class not in self.classes:
            raise SpecError("traffic_class", f"unknown class {traffic_class!r}; allowed: {', '.join(self.classes)}")
        if not (isinstance(start_s, int | float | np.number) and math.isfinite(start_s)):
            raise SpecError("start_s", f"must be a finite number, got {start_s!r}")
        cp = self.classes[traffic_class]
        self._seq += 1
        start = max(float(start_s), self.now_s)
        if isinstance(plan, GroupsPlan):
            est, n_ranks = list(plan.est_s), int(plan.ranks.shape[1])
        else:
            est, n_ranks = [self._transfer_estimate(p) for p in plan.phases], int(plan.ranks.size)
        g = Group(
            id=f"f-{self._seq}", seq=self._seq, kind=kind, op=plan.op, algorithm=plan.algorithm,
            bytes_=plan.bytes_, n_ranks=n_ranks, traffic_class=traffic_class, tag=tag,
            start_s=start, state="pending", error="", end_s=math.nan, phases=plan.phases, phase_idx=-1,
            phase_lat_s=0.0, phase_est_s=est, timer_s=start, n_pool=0, priority=cp.priority,
            weight=cp.weight, overhead=overhead, repeats=max(1, int(repeats)),
        )
        self._groups[g.id] = g
        self._by_seq[g.seq] = g
        if start > self.now_s:
            heapq.heappush(self._timers, (start, g.seq))
        else:
            self._materialise(self.now_s)
            self._next_phase(g, self.now_s)
        return FlowGroupHandle(self, g)

    def _transfer_estimate(self, phase: Phase) -> float:
        r = route(self.topo, phase.src, phase.dst, np.arange(phase.n_subflows), alive=self._alive)
        if not r.ok.all() or phase.n_subflows == 0:
            return 0.0
        rate = float(self._cap[r.e_link].min()) if r.e_link.size else math.inf
        return phase.steps * float(r.latency_s.max()) + (phase.bytes_per_hop / rate if rate > 0 else math.inf)

    def _next_phase(self, g: Group, t: float) -> list[FlowEvent]:
        """Start ``g``'s next phase at ``t`` (or complete it); returns a completion/failure event."""
        g.phase_idx += 1
        g.state = "running"
        if g.phase_idx >= len(g.phases):
            g.state, g.end_s = "done", t
            g.phases = ()  # a finished group's record may be kept long: drop its per-copy sub-flow arrays
            return [FlowEvent(t, "completed", g.id, f"{g.op}/{g.algorithm} of {g.bytes_:.6g} bytes")]
        ph = g.phases[g.phase_idx]
        k = ph.n_subflows
        labels = phase_labels(g, k)
        self._subflows_started += k
        r = route(self.topo, ph.src, ph.dst, labels, alive=self._alive)
        if not r.ok.all():
            bad = int(np.flatnonzero(~r.ok)[0])
            return self._fail(g, t, NoPathError(
                f"no live path from chip {int(ph.src[bad])} to chip {int(ph.dst[bad])}",
                src_chip=int(ph.src[bad]), dst_chip=int(ph.dst[bad])))
        if self.reserved is not None and r.e_link.size:
            hit = r.e_link[self.reserved[r.e_link]]
            if hit.size:
                self.reserved_hits.append((t, g.id, distinct(hit)))
        base_s, step_s = collective_constants(ph.proto) if g.overhead else (0.0, 0.0)
        sys_s = system_step_s(self.topo) if g.overhead else 0.0
        lat = ph.steps * step_latency_s(float(r.latency_s.max()) if k else 0.0, step_s,
                                        max(sys_s, ph.step_s) if g.overhead else 0.0)
        call_s = base_s if ph.call_s is None or not g.overhead else ph.call_s
        g.phase_lat_s = lat + (call_s if g.phase_idx == 0 else 0.0)
        if k == 0 or ph.bytes_per_hop <= 0:
            self._set_timer(g, t + g.phase_lat_s)
            return []
        n_new = ph.n_flows
        self._pool.add(g.seq, n_new, ph.bytes_per_hop, g.weight, g.priority, ph.flow_index(), r, ph.src, ph.dst,
                       labels, ph.weight)
        g.n_pool = n_new
        if g.repeats > 1 and r.e_link.size:  # the other calls the caller runs: their bytes, on the same links
            coef = r.e_coef if ph.weight is None else r.e_coef * np.asarray(ph.weight, dtype=np.float64)[r.e_flow]
            self.credit_bytes(r.e_link, (g.repeats - 1) * ph.bytes_per_hop * coef)
        return []

    def _set_timer(self, g: Group, t: float) -> None:
        g.timer_s = t
        heapq.heappush(self._timers, (t, g.seq))

    def _fail(self, g: Group, t: float, err: Exception) -> list[FlowEvent]:
        if g.n_pool:
            self._pool.remove_group(g.seq)
        g.state, g.end_s, g.error, g.n_pool = "failed", t, str(err), 0
        g.phases = ()
        return [FlowEvent(t, "failed", g.id, str(err))]

    def _solve(self) -> None:
        self._pool.solve(self._cap, self._t_ref)

    def _materialise(self, t: float) -> None:
        """Bring remaining bytes and carried bytes forward from the last event to ``t``."""
        dt = t - self._t_ref
        if dt <= 0:
            return
        self._solve()
        _, busy, byt, peak = self._tier_rates()
        self._busy_s += busy * dt
        self._tier_bytes += byt * dt
        if peak is not None and self._peak is not None:
            np.maximum(self._peak, peak, out=self._peak)
        links, moved = self._pool.move(dt)
        self._bytes_carried[links] += moved
        if self._touched is not None:
            self._touched[links] = True
        self._t_ref = t

    def _process_due(self, t: float) -> list[FlowEvent]:
        events: list[FlowEvent] = []
        pool = self._pool
        if pool.size:
            done = (pool.drain <= t + _TIME_EPS * max(1.0, t)) | (pool.rem <= _DRAIN_REL * pool.bytes_)
            if done.any():
                seqs, counts = np.unique(pool.gseq[done], return_counts=True)
                pool.remove(done)
                for s, c in zip(seqs.tolist(), counts.tolist(), strict=True):
                    g = self._by_seq[s]
                    g.n_pool -= c
                    if g.n_pool == 0:
                        self._set_timer(g, t + g.phase_lat_s)
        while self._timers and self._timers[0][0] <= t + _TIME_EPS * max(1.0, t):
            entry = heapq.heappop(self._timers)
            if not self._timer_live(entry):
                continue
            events += self._next_phase(self._by_seq[entry[1]], t)
        return events

    def _reroute(self, dead: np.ndarray) -> list[FlowEvent]:
        """Move pool flows off dead links; fail the groups of flows that have no live path left."""
        pool = self._pool
        pool.flush()
        hit = np.isin(pool.e_link, dead)
        if not hit.any():
            return []
        pos = distinct(pool.e_pos[hit])
        affected = np.zeros(pool.size, dtype=bool)
        affected[pos] = True
        subs = np.flatnonzero(affected[pool.s_pos])
        r = route(self.topo, pool.s_src[subs], pool.s_dst[subs], pool.s_label[subs], alive=self._alive)
        events: list[FlowEvent] = []
        sub_seq = pool.gseq[pool.s_pos[subs]]
        first_bad: dict[int, tuple[int, int]] = {}
        for i in np.flatnonzero(~r.ok).tolist():
            first_bad.setdefault(int(sub_seq[i]), (int(pool.s_src[subs[i]]), int(pool.s_dst[subs[i]])))
        moved = {int(s): int(c) for s, c in zip(*np.unique(sub_seq, return_counts=True), strict=True)}
        okf = r.ok[r.e_flow]
        pool.replace_incidence(~affected[pool.e_pos], pool.s_pos[subs][r.e_flow[okf]], r.e_link[okf],
                               r.e_coef[okf] * pool.s_w[subs][r.e_flow[okf]])
        for s, (src, dst) in sorted(first_bad.items()):
            events += self._fail(self._by_seq[s], self.now_s, NoPathError(
                f"no live path from chip {src} to chip {dst} after the fault", src_chip=src, dst_chip=dst))
        for s, c in sorted(moved.items()):
            if s not in first_bad:
                msg = f"{c} sub-flows moved to live paths"
                events.append(FlowEvent(self.now_s, "rerouted", self._by_seq[s].id, msg))
        return events


# ClassPolicy, FlowEvent, LinkStats... live in fabric.flows; re-exported as the simulator's API.
__all__ = ["DEFAULT_CLASSES", "EVENT_KINDS", "ClassPolicy", "FlowEvent", "FlowGroupHandle", "FlowSim", "LinkStats",
           "TierStats"]
