"""The flow simulator's values: traffic-class policies, events, link statistics, flow-group state.

:class:`~gigacluster.fabric.sim.FlowSim` owns the mutable :class:`Group` records and hands out
:class:`FlowGroupHandle` views of them; everything here is plain data (no simulation logic).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from gigacluster.fabric.collectives import Phase, bus_factor
from gigacluster.fabric.topology import TIER_NAMES, Topology
from gigacluster.model import SpecError


class _Predicts(Protocol):
    """What a handle asks its simulator (FlowSim): the predicted end of its group."""

    def predicted_end_s(self, handle_id: str) -> float: ...


@dataclasses.dataclass(frozen=True)
class ClassPolicy:
    """How one traffic class shares links: strict ``priority`` (higher first), then ``weight``."""

    priority: int = 0
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.priority, int) or isinstance(self.priority, bool):
            raise SpecError("priority", f"must be an integer, got {self.priority!r}")
        if not (isinstance(self.weight, int | float) and math.isfinite(self.weight) and self.weight > 0):
            raise SpecError("weight", f"must be a number > 0, got {self.weight!r}")


DEFAULT_CLASSES: Mapping[str, ClassPolicy] = {
    "training": ClassPolicy(priority=0, weight=1.0),
    "inference": ClassPolicy(priority=0, weight=4.0),
    "storage": ClassPolicy(priority=0, weight=1.0),
}

EVENT_KINDS = (
    "completed", "failed", "rerouted", "link_down", "link_degraded", "link_restored", "switch_down",
    "switch_restored",
)


@dataclasses.dataclass(frozen=True)
class FlowEvent:
    """Something that happened at ``time_s``: a group completed/failed/was rerouted, or a fault."""

    time_s: float
    kind: str
    group_id: str = ""
    message: str = ""
    link_id: int = -1
    node_id: int = -1


@dataclasses.dataclass(frozen=True)
class TierStats:
    """Link utilisation aggregated over one tier (utilisation = carried rate / current capacity)."""

    tier: str
    links: int
    capacity_Bps: float
    used_Bps: float
    mean_utilization: float
    max_utilization: float
    links_down: int
    links_degraded: int
    # Cumulative since the simulator's time 0 (FlowSim.tier_totals; the fabric service adds its open windows'
    # completed steps): link-seconds of utilisation (each link's bytes over its capacity in the topology, summed
    # over the tier's links) and bytes carried. The time-average utilisation over an interval is the difference
    # of two reads of ``busy_link_s`` over (``links`` x the interval).
    busy_link_s: float = 0.0
    bytes_carried: float = 0.0
    # The highest link utilisation the steady-state windows open now reach within their step (0: none open).
    windows_max_utilization: float = 0.0


@dataclasses.dataclass(frozen=True, eq=False)
class LinkStats:
    """Per-link arrays at ``time_s`` and their per-tier aggregates. ``state``: 0 up, 1 degraded, 2 down."""

    time_s: float
    rate_Bps: np.ndarray
    capacity_Bps: np.ndarray
    utilization: np.ndarray
    active_flows: np.ndarray
    bytes_carried: np.ndarray
    state: np.ndarray
    tiers: tuple[TierStats, ...]
    active_flows_total: int


@dataclasses.dataclass(slots=True, eq=False)
class Group:
    """Mutable simulator state of one flow group (the public view is :class:`FlowGroupHandle`)."""

    id: str
    seq: int
    kind: str
    op: str
    algorithm: str
    bytes_: float
    n_ranks: int
    traffic_class: str
    tag: str
    start_s: float
    state: str
    error: str
    end_s: float
    phases: tuple[Phase, ...]
    phase_idx: int
    phase_lat_s: float
    phase_est_s: list[float]
    timer_s: float
    n_pool: int
    priority: int
    weight: float
    overhead: bool
    repeats: int = 1  # statistics only: the caller runs it this many times (FlowSim.start_planned)


class FlowGroupHandle:
    """Live view of a transfer or collective: read ``state``, ``predicted_end_s``, ``error``..."""

    __slots__ = ("_g", "_sim")

    def __init__(self, sim: _Predicts, group: Group) -> None:
        self._sim = sim
        self._g = group

    id = property(lambda self: self._g.id, doc="group id, e.g. f-42")
    kind = property(lambda self: self._g.kind, doc="transfer or collective")
    op = property(lambda self: self._g.op)
    algorithm = property(lambda self: self._g.algorithm)
    bytes_ = property(lambda self: self._g.bytes_)
    n_ranks = property(lambda self: self._g.n_ranks)
    traffic_class = property(lambda self: self._g.traffic_class)
    tag = property(lambda self: self._g.tag)
    start_s = property(lambda self: self._g.start_s)
    state = property(lambda self: self._g.state, doc="pending, running, done or failed")
    error = property(lambda self: self._g.error)
    end_s = property(lambda self: self._g.end_s, doc="virtual time it completed or failed (nan before)")

    @property
    def predicted_end_s(self) -> float:
        """Completion time given the flows active now (updated as flows start and end)."""
        return self._sim.predicted_end_s(self._g.id)

    @property
    def algbw_GBps(self) -> float:
        """nccl-tests algbw (GB/s, 1e9 B/s) once done; 0 before."""
        g = self._g
        dt = g.end_s - g.start_s
        return g.bytes_ / dt / 1e9 if g.state == "done" and dt > 0 else 0.0

    @property
    def busbw_GBps(self) -> float:
        """nccl-tests busbw (GB/s) once done; 0 before."""
        return self.algbw_GBps * bus_factor(self._g.op, self._g.n_ranks)

    def __repr__(self) -> str:
        g = self._g
        return f"FlowGroupHandle({g.id}, {g.op}/{g.algorithm}, {g.state}, end={g.end_s})"


@dataclasses.dataclass(frozen=True, eq=False)
class TierStatic:
    """What a tier's aggregates take from the link state (fixed between faults): each link's tier, and per
    tier its link count, capacity and links down or degraded. :meth:`aggregate` adds the traffic."""

    link_tier: np.ndarray
    tiers: tuple[int, ...]  # indices into TIER_NAMES of the tiers that have links
    links: np.ndarray
    capacity_Bps: np.ndarray
    down: np.ndarray
    degraded: np.ndarray

    @classmethod
    def of(cls, topo: Topology, cap: np.ndarray, state: np.ndarray) -> TierStatic:
        n = len(TIER_NAMES)
        lt = topo.link_tier
        links = np.bincount(lt, minlength=n)
        return cls(lt, tuple(int(t) for t in np.flatnonzero(links)), links,
                   np.bincount(lt, weights=cap, minlength=n), np.bincount(lt[state == 2], minlength=n),
                   np.bincount(lt[state == 1], minlength=n))

    def aggregate(self, links: np.ndarray, rate: np.ndarray, cap: np.ndarray) -> tuple[TierStats, ...]:
        """Per-tier statistics given the carried ``rate`` and current ``cap`` of ``links``, which must hold every
        link with a non-zero rate (a link left out counts as idle)."""
        n = len(TIER_NAMES)
        util = np.divide(rate, cap, out=np.zeros_like(rate, dtype=float), where=cap > 0)
        lt = self.link_tier[links]
        used = np.bincount(lt, weights=rate, minlength=n)
        util_sum = np.bincount(lt, weights=util, minlength=n)
        peak = np.zeros(n)
        np.maximum.at(peak, lt, util)
        return tuple(TierStats(
            tier=TIER_NAMES[t], links=int(self.links[t]), capacity_Bps=float(self.capacity_Bps[t]),
            used_Bps=float(used[t]), mean_utilization=float(util_sum[t] / self.links[t]),
            max_utilization=float(peak[t]), links_down=int(self.down[t]), links_degraded=int(self.degraded[t]),
        ) for t in self.tiers)


def tier_stats(topo: Topology, cap: np.ndarray, rate: np.ndarray, state: np.ndarray) -> tuple[TierStats, ...]:
    """Per-tier aggregates of per-link capacity, carried rate, utilisation (rate / capacity) and state."""
    used = np.flatnonzero(rate)
    return TierStatic.of(topo, cap, state).aggregate(used, rate[used], cap[used])


__all__ = ["DEFAULT_CLASSES", "EVENT_KINDS", "ClassPolicy", "FlowEvent", "FlowGroupHandle", "Group", "LinkStats",
           "TierStatic", "TierStats", "tier_stats"]
