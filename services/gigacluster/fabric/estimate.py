"""One collective on an otherwise idle fabric, nccl-tests style: the offline ``gigacluster estimate
collective`` command.

It runs :class:`~gigacluster.fabric.sim.FlowSim`, the same code the live fabric service runs; it
lives here, not in ``collectives`` (which ``sim`` imports), so the two modules form no cycle.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from gigacluster.fabric.collectives import ALGORITHMS, LibraryPolicy, linear_costs
from gigacluster.fabric.sim import FlowSim
from gigacluster.fabric.sizing import choose_scaleout
from gigacluster.fabric.topology import TopologyConfig, build_topology
from gigacluster.hw import catalog
from gigacluster.model import SpecError
from gigacluster.model.comm import bus_factor
from gigacluster.model.comm import check_op as _check_op


@dataclasses.dataclass(frozen=True)
class CollectiveEstimate:
    """Result of one collective on an otherwise idle fabric, nccl-tests style."""

    op: str
    bytes_: float
    n_ranks: int
    algorithm: str
    time_s: float
    chip: str
    system: str

    @property
    def algbw_GBps(self) -> float:
        return self.bytes_ / self.time_s / 1e9 if self.time_s > 0 else 0.0

    @property
    def busbw_GBps(self) -> float:
        return self.algbw_GBps * bus_factor(self.op, self.n_ranks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "bytes": self.bytes_,
            "ranks": self.n_ranks,
            "chip": self.chip,
            "system": self.system,
            "algorithm": self.algorithm,
            "time_s": self.time_s,
            "algbw_GBps": self.algbw_GBps,
            "busbw_GBps": self.busbw_GBps,
        }


def _topology_for(chip: str, count: int, system: str | None, **topo_kw: Any) -> tuple[Any, str]:
    """The smallest topology that holds ``count`` chips of ``chip`` (whole domains unless they fit in
    one switched or full-mesh domain), and its system name; SpecError naming a bad field."""
    if not isinstance(count, int | np.integer) or isinstance(count, bool) or count < 1:
        raise SpecError("count", f"must be an integer >= 1, got {count!r}")
    if chip not in catalog.chip_names():
        raise SpecError("chip", f"unknown chip {chip!r}; allowed: {', '.join(catalog.chip_names())}")
    sysname = system or catalog.default_system(chip)
    if sysname not in catalog.system_names():
        raise SpecError("system", f"unknown system {sysname!r}; allowed: {', '.join(catalog.system_names())}")
    dom = catalog.get_system(sysname).chips
    scaleup = catalog.get_system(sysname).scaleup
    built = count if (count < dom and scaleup in ("switch", "full_mesh")) else -(-count // dom) * dom
    topo_kw = {k: v for k, v in topo_kw.items() if v is not None}
    if "switch" not in topo_kw and "tiers" not in topo_kw and not topo_kw.get("nics_per_node"):
        # the smallest tree that holds them, as `up` and the training estimates size theirs
        tree = choose_scaleout(chip, built, system=sysname, nic=topo_kw.get("nic") or "",
                               oversubscription=float(topo_kw.get("oversubscription", 1.0)))
        topo_kw.update(switch=tree.switch, tiers=tree.tiers)
    return build_topology(TopologyConfig(chip=chip, count=built, system=sysname, **topo_kw)), sysname


@functools.cache
def _cost_lines(op: str, chip: str, count: int,
                system: str | None) -> tuple[tuple[str, float, float, float, float], ...]:
    topo, _ = _topology_for(chip, count, system)
    ranks = np.arange(count)
    lines = []
    for name in LibraryPolicy.names:
        if ALGORITHMS[name].supports(op, ranks, topo):
            lines += [(name, *line) for line in linear_costs(name, op, ranks, topo)]
    return tuple(lines)


def collective_estimate_s(op: str, bytes_: float, chip: str, count: int, system: str | None = None) -> float:
    """Contention-free seconds of one ``op`` of ``bytes_`` over the first ``count`` chips under the default
    (library) policy: the analytical twin of :func:`estimate_collective` (the same algorithms, protocols
    and per-call and per-step costs), cached per (op, chip, count) for callers that price many sizes,
    such as a serving replica's tensor-parallel all-reduces. 0 for one chip or no bytes."""
    _check_op(op)
    if count <= 1 or bytes_ <= 0:
        return 0.0
    policy = LibraryPolicy()
    costs = [a + b * bytes_ for name, a, b, lo, hi in _cost_lines(op, chip, count, system)
             if lo <= bytes_ < hi and policy.considers(name, op, bytes_)]
    if not costs:
        raise SpecError("ranks", f"no algorithm runs {op} over {count} {chip}")
    return min(costs)


def estimate_collective(
    op: str, bytes_: float, chip: str, count: int, system: str | None = None, algo: str | None = None,
    **topo_kw: Any,
) -> CollectiveEstimate:
    """Time one collective over ``count`` chips (whole domains are built; the first ``count`` ranks run).

    ``topo_kw`` are further :class:`TopologyConfig` fields (nic, switch, tiers, oversubscription,
    routing). The run goes through :class:`~gigacluster.fabric.sim.FlowSim`, so it is the same
    code the live fabric service runs.
    """
    _check_op(op)
    topo, sysname = _topology_for(chip, count, system, **topo_kw)
    sim = FlowSim(topo)
    h = sim.start_collective(op, np.arange(count), float(bytes_), start_s=0.0, algo=algo)
    sim.run_until_idle()
    if h.state != "done":
        raise SpecError("ranks", f"collective did not complete: {h.error}")
    return CollectiveEstimate(op, float(bytes_), count, h.algorithm, h.end_s - h.start_s, chip, sysname)


__all__ = ["CollectiveEstimate", "collective_estimate_s", "estimate_collective"]
