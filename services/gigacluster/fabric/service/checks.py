"""Checks on the fabric's request fields against the topology and the config's bounds (no gRPC).

Each takes plain values and returns the checked value, or raises the domain error that names the
field and what to fix.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gigacluster.arrays import all_distinct
from gigacluster.errors import InvalidArgument, NotFound, ResourceExhausted
from gigacluster.fabric.topology import TIER_NAMES, Topology
from gigacluster.runtime.config import FabricConfig
from gigacluster.runtime.errors import preview
from gigacluster.security.capability import MAX_DEVICE_ID

MAX_WATCH_NAMES = 10_000


def start_s(not_before_s: float, *, now: float, horizon: float, sim_now: float) -> float:
    """When a flow starts: ``not_before_s`` (or now), never before the simulator's present."""
    if not math.isfinite(not_before_s) or not_before_s < 0:
        raise InvalidArgument("not_before_s", f"must be a finite number >= 0, got {not_before_s}")
    if not_before_s > now + horizon:
        raise InvalidArgument("not_before_s", f"at most {horizon:g} s ahead of now ({now:.3f}; "
                                              f"not_before_horizon_s), got {not_before_s:g}")
    return max(not_before_s or now, sim_now)


def flow_bytes(value: float, cap: float) -> float:
    if not math.isfinite(value) or not 0 < value <= cap:
        raise InvalidArgument("bytes", f"must be in (0, {cap:g}] (max_flow_bytes), got {value}")
    return float(value)


def device(field: str, value: int, n_chips: int) -> int:
    if value >= MAX_DEVICE_ID:
        raise InvalidArgument(field, f"device ids are below 2^40, got {value}")
    if value >= n_chips:
        raise NotFound(f"devices/{value}", f"{field}: device {value} is not in the topology (0..{n_chips - 1})")
    return int(value)


def tier(name: str) -> str:
    if name and name not in TIER_NAMES:
        raise InvalidArgument("tier", f"allowed: {', '.join(TIER_NAMES)}; got {preview(name, 64)!r}")
    return name


def link_ids(topo: Topology, tier_name: str) -> np.ndarray:
    """Every link of ``tier_name`` (all links when empty), in id order."""
    if tier_name:
        return np.flatnonzero(topo.link_tier == TIER_NAMES.index(tier(tier_name)))
    return np.arange(topo.n_links)


def watch_names(names: Sequence[str]) -> list[str]:
    if len(names) > MAX_WATCH_NAMES:
        raise InvalidArgument("names", f"at most {MAX_WATCH_NAMES} names per watch")
    return list(names)


MAX_REPEATS = 1_000_000  # calls per timed one (a step's inline collectives: thousands at most)


def repeats(value: int) -> int:
    """``StartCollectiveRequest.repeats``: 0 means once."""
    if value > MAX_REPEATS:
        raise InvalidArgument("repeats", f"must be at most {MAX_REPEATS:,} (calls the one timed stands for), "
                                         f"got {value}")
    return max(1, int(value))


def collective_ranks(rs: list[tuple[int, int]], groups: int, stride: int, cfg: FabricConfig,
                     n_chips: int) -> tuple[np.ndarray, int, int]:
    """(ranks of group 0, groups, stride), every size checked against config before expanding."""
    if len(rs) > cfg.max_rank_ranges:
        raise ResourceExhausted(f"ranks: at most {cfg.max_rank_ranges} ranges per collective (max_rank_ranges), "
                                f"got {len(rs)}", field="ranks")
    if not rs:
        raise InvalidArgument("ranks", "must name at least two ranks")
    for i, (a, b) in enumerate(rs):
        if b <= a:
            raise InvalidArgument(f"ranks[{i}]", f"end ({b}) must be > start ({a})")
        if b > MAX_DEVICE_ID:
            raise InvalidArgument(f"ranks[{i}]", f"device ids are below 2^40, got end {b}")
    groups = int(groups) or 1
    stride = int(stride)
    if groups > 1 and stride < 1:
        raise InvalidArgument("group_stride", "must be >= 1 when groups > 1")
    if groups > 1 and stride >= MAX_DEVICE_ID:
        raise InvalidArgument("group_stride", f"must be below 2^40, got {stride}")
    if groups > cfg.max_collective_groups:
        raise ResourceExhausted(f"groups: at most {cfg.max_collective_groups} per collective "
                                f"(max_collective_groups), got {groups}", field="groups")
    per_group = sum(b - a for a, b in rs)
    if per_group * groups > cfg.max_collective_ranks:
        raise ResourceExhausted(f"ranks: at most {cfg.max_collective_ranks} ranks per collective over all groups "
                                f"(max_collective_ranks), got {per_group} x {groups} groups", field="ranks")
    if per_group < 2:
        raise InvalidArgument("ranks", f"a collective needs at least 2 ranks, got {per_group}")
    top = max(b for _, b in rs) - 1 + stride * (groups - 1)
    if top >= n_chips:
        raise NotFound(f"devices/{top}", f"ranks: device {top} is not in the topology (0..{n_chips - 1})")
    ranks = np.concatenate([np.arange(a, b) for a, b in rs])
    if not all_distinct(ranks):
        raise InvalidArgument("ranks", "ranks must be distinct")
    return ranks, groups, (stride if groups > 1 else 0)


def target(topo: Topology, name: str) -> tuple[str, int]:
    """``("link", id)`` or ``("switch", id)`` for a fault target ``links/<name>`` or ``switches/<name>``."""
    if name.startswith("links/"):
        try:
            return "link", topo.link_id_by_name(name.removeprefix("links/"))
        except Exception as exc:
            raise NotFound(preview(name, 64), f"target: no link {preview(name, 64)!r} (see ListLinks)") from exc
    if name.startswith("switches/"):
        try:
            return "switch", topo.node_id_by_name(name.removeprefix("switches/"))
        except Exception as exc:
            raise NotFound(preview(name, 64), f"target: no switch {preview(name, 64)!r}") from exc
    raise InvalidArgument("target", f"must be 'links/<name>' or 'switches/<name>', got {preview(name, 64)!r}")
