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

import heapq
import math
from collections.abc import Mapping, Sequence

import numpy as np

from gigacluster.fabric import FlowCancelledError, NoPathError, UnknownFlowGroupError
from gigacluster.fabric.collectives import (
    CollectivePlan,
    Phase,
    collective_constants,
    phase_estimate_s,
    plan_collective,
)
from gigacluster.fabric.flows import (
    DEFAULT_CLASSES,
    EVENT_KINDS,
    ClassPolicy,
    FlowEvent,
    FlowGroupHandle,
    Group,
    LinkStats,
    TierStats,
    tier_stats,
)
from gigacluster.fabric.maxmin import maxmin_rates
from gigacluster.fabric.routing import route
from gigacluster.fabric.topology import Topology
from gigacluster.model import SpecError

_DRAIN_REL = 1e-9
_TIME_EPS = 1e-15


class FlowSim:
    """Event-driven max-min flow simulator of one topology, in virtual seconds."""

    def __init__(
        self, topo: Topology, *, classes: Mapping[str, ClassPolicy] | None = None, policy: str = "fastest"
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
        self._groups: dict[str, Group] = {}
        self._by_seq: dict[int, Group] = {}
        self._seq = 0
        self._label = 0
        self._timers: list[tuple[float, int]] = []
        # pool of active flows
        self._p_gseq = np.zeros(0, dtype=np.int64)
        self._p_rem = np.zeros(0)
        self._p_bytes = np.zeros(0)
        self._p_rate = np.zeros(0)
        self._p_w = np.zeros(0)
        self._p_prio = np.zeros(0, dtype=np.int64)
        self._e_pos = np.zeros(0, dtype=np.int64)
        self._e_link = np.zeros(0, dtype=np.int64)
        self._e_coef = np.zeros(0)
        self._s_pos = np.zeros(0, dtype=np.int64)
        self._s_src = np.zeros(0, dtype=np.int64)
        self._s_dst = np.zeros(0, dtype=np.int64)
        self._s_label = np.zeros(0, dtype=np.int64)
        self._t_ref = 0.0
        self._dirty = False
        self._link_rate = np.zeros(nl)
        self._bytes_carried = np.zeros(nl)
        self._p_drain = np.zeros(0)
        self._grp_drain: dict[int, float] = {}

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
        traffic_class: str = "training", tag: str = "",
    ) -> FlowGroupHandle:
        """Start a collective over ``ranks`` (chip ids); ``algo`` forces an algorithm, else the policy picks."""
        plan = plan_collective(op, ranks, bytes_, self.topo, algo=algo, policy=self.policy)
        return self._add_group(plan, "collective", start_s, traffic_class, tag, overhead=True)

    # ---- public: time --------------------------------------------------------------------
    def next_event_s(self) -> float | None:
        """Virtual time of the next event (a flow draining, a phase or start timer), or None if idle."""
        self._solve()
        t = math.inf
        if self._p_drain.size:
            t = float(self._p_drain.min())
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
            return self._grp_drain[g.seq] + g.phase_lat_s + later
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
        """Per-link rate, utilisation, active sub-flows, bytes carried and state; and per tier."""
        self._solve()
        topo = self.topo
        cap = self._cap
        rate = self._link_rate.copy()
        util = np.divide(rate, cap, out=np.zeros_like(rate), where=cap > 0)
        flows = np.bincount(self._e_link, minlength=topo.n_links)
        carried = self._bytes_carried + rate * (self.now_s - self._t_ref)
        state = np.where(~self._alive, 2, np.where(self._factor < 1.0, 1, 0)).astype(np.int8)
        return LinkStats(self.now_s, rate, cap.copy(), util, flows, carried, state,
                         tier_stats(topo, cap, rate, util, state),
                         int(self._s_pos.size))

    # ---- public: faults ------------------------------------------------------------------
    def fail_link(self, link_id: int) -> list[FlowEvent]:
        """Take a link down now: reroute its flows, fail groups left without a path."""
        lid = self._check_link(link_id)
        if not self._alive[lid]:
            return []
        self._materialise(self.now_s)
        self._alive[lid] = False
        self._cap[lid] = 0.0
        self._dirty = True
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
        self._dirty = True
        return [FlowEvent(self.now_s, "link_degraded", message=f"{self.topo.link_name(lid)} x{factor:g}",
                          link_id=lid)]

    def restore_link(self, link_id: int) -> list[FlowEvent]:
        """Bring a link back to full capacity; new flows may use it, existing ones stay put."""
        lid = self._check_link(link_id)
        self._materialise(self.now_s)
        self._alive[lid] = True
        self._factor[lid] = 1.0
        self._cap[lid] = self.topo.link_capacity_Bps[lid]
        self._dirty = True
        return [FlowEvent(self.now_s, "link_restored", message=self.topo.link_name(lid), link_id=lid)]

    def fail_switch(self, node_id: int) -> list[FlowEvent]:
        """Take a switch (every link into or out of it) down now; reroute or fail its flows."""
        node = self._check_switch(node_id)
        links = self.topo.links_of_node(node)
        self._materialise(self.now_s)
        self._alive[links] = False
        self._cap[links] = 0.0
        self._dirty = True
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
        self._dirty = True
        return [FlowEvent(self.now_s, "switch_restored", message=self.topo.node_name(node), node_id=node)]

    @property
    def link_alive(self) -> np.ndarray:
        """Read-only copy of the per-link up/down state."""
        return self._alive.copy()

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

    def _add_group(
        self, plan: CollectivePlan, kind: str, start_s: float, traffic_class: str, tag: str, *, overhead: bool
    ) -> FlowGroupHandle:
        if traffic_class not in self.classes:
            raise SpecError("traffic_class", f"unknown class {traffic_class!r}; allowed: {', '.join(self.classes)}")
        if not (isinstance(start_s, int | float | np.number) and math.isfinite(start_s)):
            raise SpecError("start_s", f"must be a finite number, got {start_s!r}")
        cp = self.classes[traffic_class]
        self._seq += 1
        start = max(float(start_s), self.now_s)
        est = [self._phase_estimate(p, i == 0 and overhead, overhead) for i, p in enumerate(plan.phases)]
        g = Group(
            id=f"f-{self._seq}", seq=self._seq, kind=kind, op=plan.op, algorithm=plan.algorithm,
            bytes_=plan.bytes_, n_ranks=int(plan.ranks.size), traffic_class=traffic_class, tag=tag,
            start_s=start, state="pending", error="", end_s=math.nan, phases=plan.phases, phase_idx=-1,
            phase_lat_s=0.0, phase_est_s=est, timer_s=start, n_pool=0, priority=cp.priority,
            weight=cp.weight, overhead=overhead,
        )
        self._groups[g.id] = g
        self._by_seq[g.seq] = g
        if start > self.now_s:
            heapq.heappush(self._timers, (start, g.seq))
        else:
            self._materialise(self.now_s)
            self._next_phase(g, self.now_s)
        return FlowGroupHandle(self, g)

    def _phase_estimate(self, phase: Phase, first: bool, overhead: bool) -> float:
        if overhead:
            return phase_estimate_s(phase, self.topo, alive=self._alive, first=first, capacity_Bps=self._cap)
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
            return [FlowEvent(t, "completed", g.id, f"{g.op}/{g.algorithm} of {g.bytes_:.6g} bytes")]
        ph = g.phases[g.phase_idx]
        k = ph.n_subflows
        labels = np.arange(self._label, self._label + k, dtype=np.int64)
        self._label += k
        r = route(self.topo, ph.src, ph.dst, labels, alive=self._alive)
        if not r.ok.all():
            bad = int(np.flatnonzero(~r.ok)[0])
            return self._fail(g, t, NoPathError(
                f"no live path from chip {int(ph.src[bad])} to chip {int(ph.dst[bad])}",
                src_chip=int(ph.src[bad]), dst_chip=int(ph.dst[bad])))
        launch_s, step_s = collective_constants() if g.overhead else (0.0, 0.0)
        lat = ph.steps * ((float(r.latency_s.max()) if k else 0.0) + step_s)
        g.phase_lat_s = lat + (launch_s if g.phase_idx == 0 else 0.0)
        if k == 0 or ph.bytes_per_hop <= 0:
            self._set_timer(g, t + g.phase_lat_s)
            return []
        n_new = 1 if ph.lockstep else k
        base = self._p_rem.size
        sub_pos = np.full(k, base, dtype=np.int64) if ph.lockstep else base + np.arange(k, dtype=np.int64)
        self._p_gseq = np.concatenate([self._p_gseq, np.full(n_new, g.seq, dtype=np.int64)])
        self._p_rem = np.concatenate([self._p_rem, np.full(n_new, ph.bytes_per_hop)])
        self._p_bytes = np.concatenate([self._p_bytes, np.full(n_new, ph.bytes_per_hop)])
        self._p_w = np.concatenate([self._p_w, np.full(n_new, g.weight)])
        self._p_prio = np.concatenate([self._p_prio, np.full(n_new, g.priority, dtype=np.int64)])
        self._e_pos = np.concatenate([self._e_pos, sub_pos[r.e_flow]])
        self._e_link = np.concatenate([self._e_link, r.e_link])
        self._e_coef = np.concatenate([self._e_coef, r.e_coef])
        self._s_pos = np.concatenate([self._s_pos, sub_pos])
        self._s_src = np.concatenate([self._s_src, ph.src])
        self._s_dst = np.concatenate([self._s_dst, ph.dst])
        self._s_label = np.concatenate([self._s_label, labels])
        g.n_pool = n_new
        self._dirty = True
        return []

    def _set_timer(self, g: Group, t: float) -> None:
        g.timer_s = t
        heapq.heappush(self._timers, (t, g.seq))

    def _fail(self, g: Group, t: float, err: Exception) -> list[FlowEvent]:
        if g.n_pool:
            self._remove_pool(self._p_gseq == g.seq)
        g.state, g.end_s, g.error, g.n_pool = "failed", t, str(err), 0
        return [FlowEvent(t, "failed", g.id, str(err))]

    def _solve(self) -> None:
        if not self._dirty:
            return
        n = self._p_rem.size
        prio = self._p_prio if n and self._p_prio.min() != self._p_prio.max() else None
        rate = maxmin_rates(n, self._e_pos, self._e_link, self._e_coef, self._cap, weight=self._p_w, priority=prio)
        self._p_rate = rate
        fin = np.isfinite(rate[self._e_pos])
        self._link_rate = np.bincount(self._e_link[fin], weights=self._e_coef[fin] * rate[self._e_pos[fin]],
                                      minlength=self.topo.n_links).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            dt = np.where(np.isinf(rate), 0.0, np.where(rate > 0, self._p_rem / rate, np.inf))
        self._p_drain = self._t_ref + dt
        self._grp_drain = {}
        if n:
            order = np.argsort(self._p_gseq, kind="stable")
            gs = self._p_gseq[order]
            starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
            mx = np.maximum.reduceat(self._p_drain[order], starts)
            self._grp_drain = dict(zip(gs[starts].tolist(), mx.tolist(), strict=True))
        self._dirty = False

    def _materialise(self, t: float) -> None:
        """Bring remaining bytes and carried bytes forward from the last event to ``t``."""
        dt = t - self._t_ref
        if dt <= 0:
            return
        self._solve()
        if self._p_rem.size:
            moved = np.where(np.isinf(self._p_rate), self._p_rem, self._p_rate * dt)
            self._p_rem = np.maximum(self._p_rem - moved, 0.0)
        self._bytes_carried += self._link_rate * dt
        self._t_ref = t

    def _process_due(self, t: float) -> list[FlowEvent]:
        events: list[FlowEvent] = []
        if self._p_rem.size:
            done = (self._p_drain <= t + _TIME_EPS * max(1.0, t)) | (self._p_rem <= _DRAIN_REL * self._p_bytes)
            if done.any():
                seqs, counts = np.unique(self._p_gseq[done], return_counts=True)
                self._remove_pool(done)
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

    def _remove_pool(self, remove: np.ndarray) -> None:
        keep = ~remove
        newpos = np.cumsum(keep) - 1
        ek = keep[self._e_pos]
        sk = keep[self._s_pos]
        for name in ("_p_gseq", "_p_rem", "_p_bytes", "_p_w", "_p_prio"):
            setattr(self, name, getattr(self, name)[keep])
        if self._p_rate.size == keep.size:
            self._p_rate = self._p_rate[keep]
            self._p_drain = self._p_drain[keep]
        self._e_pos = newpos[self._e_pos[ek]]
        self._e_link, self._e_coef = self._e_link[ek], self._e_coef[ek]
        self._s_pos = newpos[self._s_pos[sk]]
        self._s_src, self._s_dst, self._s_label = self._s_src[sk], self._s_dst[sk], self._s_label[sk]
        self._dirty = True

    def _reroute(self, dead: np.ndarray) -> list[FlowEvent]:
        """Move pool flows off dead links; fail the groups of flows that have no live path left."""
        hit = np.isin(self._e_link, dead)
        if not hit.any():
            return []
        pos = np.unique(self._e_pos[hit])
        affected = np.zeros(self._p_rem.size, dtype=bool)
        affected[pos] = True
        subs = np.flatnonzero(affected[self._s_pos])
        r = route(self.topo, self._s_src[subs], self._s_dst[subs], self._s_label[subs], alive=self._alive)
        events: list[FlowEvent] = []
        sub_seq = self._p_gseq[self._s_pos[subs]]
        first_bad: dict[int, tuple[int, int]] = {}
        for i in np.flatnonzero(~r.ok).tolist():
            first_bad.setdefault(int(sub_seq[i]), (int(self._s_src[subs[i]]), int(self._s_dst[subs[i]])))
        moved = {int(s): int(c) for s, c in zip(*np.unique(sub_seq, return_counts=True), strict=True)}
        keep_e = ~affected[self._e_pos]
        okf = r.ok[r.e_flow]
        self._e_pos = np.concatenate([self._e_pos[keep_e], self._s_pos[subs][r.e_flow[okf]]])
        self._e_link = np.concatenate([self._e_link[keep_e], r.e_link[okf]])
        self._e_coef = np.concatenate([self._e_coef[keep_e], r.e_coef[okf]])
        self._dirty = True
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
