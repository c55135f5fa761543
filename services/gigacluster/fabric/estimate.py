"""One collective on an otherwise idle fabric, nccl-tests style: the offline ``gigacluster estimate
collective`` command.

It runs :class:`~gigacluster.fabric.sim.FlowSim`, the same code the live fabric service runs; it
lives here, not in ``collectives`` (which ``sim`` imports), so the two modules form no cycle.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gigacluster.fabric.sim import FlowSim
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
    cfg = TopologyConfig(chip=chip, count=built, system=sysname, **topo_kw)
    topo = build_topology(cfg)
    sim = FlowSim(topo)
    h = sim.start_collective(op, np.arange(count), float(bytes_), start_s=0.0, algo=algo)
    sim.run_until_idle()
    if h.state != "done":
        raise SpecError("ranks", f"collective did not complete: {h.error}")
    return CollectiveEstimate(op, float(bytes_), count, h.algorithm, h.end_s - h.start_s, chip, sysname)


__all__ = ["CollectiveEstimate", "estimate_collective"]
