"""FabricCommModel: the training model's CommModel backed by the flow-level fabric.

For a :class:`~gigacluster.model.comm.GroupLayout` ``(size, ranks_per_domain,
groups_sharing_domain)`` it builds the smallest topology that holds the layout (``size /
ranks_per_domain`` domains of the system, cached), places ``groups_sharing_domain`` groups side by
side (group ``k`` uses local chips ``k*r .. k*r + r - 1`` of every domain, so a DP group with one
rank per node sits on one rail), starts all their collectives at once in a
:class:`~gigacluster.fabric.sim.FlowSim` and returns when the last one ends. The time therefore
includes ECMP collisions and the sharing of leaf and spine links between the concurrent groups,
which the alpha-beta model cannot see.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from gigacluster.fabric.sim import FlowSim
from gigacluster.fabric.sizing import choose_scaleout
from gigacluster.fabric.topology import Topology, TopologyConfig, build_topology
from gigacluster.hw import catalog
from gigacluster.hw.catalog import Chip
from gigacluster.model import SpecError
from gigacluster.model.network_spec import DEFAULT_ROUTING


class _Layout(Protocol):
    size: int
    ranks_per_domain: int
    groups_sharing_domain: int


class FabricCommModel:
    """CommModel whose collective times come from FlowSim on a representative topology.

    ``algo`` forces an algorithm (default: the fastest-policy choice per collective); the other
    keywords are :class:`TopologyConfig` fields for the scale-out network (``routing`` defaults to
    adaptive, as a training spec's ``network`` section does).
    """

    def __init__(self, *, algo: str | None = None, **topo_kw: Any) -> None:
        self.algo = algo
        self.topo_kw = dict(topo_kw)
        self.topo_kw.setdefault("routing", DEFAULT_ROUTING)
        self._topos: dict[tuple[Any, ...], Topology] = {}
        self._times: dict[tuple[Any, ...], float] = {}

    def topology(self, chip: str, system: str, domains: int) -> Topology:
        """The cached topology of ``domains`` whole domains: the smallest tree that holds them (fabric.sizing)."""
        key = (chip, system, domains)
        topo = self._topos.get(key)
        if topo is None:
            dom = catalog.get_system(system).chips
            kw = dict(self.topo_kw)
            if "tiers" not in kw and "switch" not in kw:
                # the smallest tree that holds them, as `up` and the fabric service size theirs (800 Gb/s NICs
                # fill a Tomahawk 5 tree at half the chips 400 Gb/s ones do)
                tree = choose_scaleout(chip, domains * dom, system=system, nic=kw.get("nic") or "",
                                       oversubscription=float(kw.get("oversubscription", 1.0)))
                kw.update(tiers=tree.tiers, switch=tree.switch)
                topo = build_topology(TopologyConfig(chip=chip, count=domains * dom, system=system, **kw))
            else:
                kw.setdefault("tiers", 2)
                try:
                    topo = build_topology(TopologyConfig(chip=chip, count=domains * dom, system=system, **kw))
                except SpecError as exc:
                    if exc.field != "tiers" or "tiers" in self.topo_kw:
                        raise
                    kw["tiers"] = 3
                    topo = build_topology(TopologyConfig(chip=chip, count=domains * dom, system=system, **kw))
            self._topos[key] = topo
        return topo

    def collective_time_s(self, chip: Chip, system: str, op: str, bytes_: float, layout: _Layout) -> float:
        """Seconds until every concurrent group of ``layout`` has finished one ``op`` of ``bytes_``."""
        size, rpd, groups = int(layout.size), int(layout.ranks_per_domain), int(layout.groups_sharing_domain)
        if size <= 1 or bytes_ <= 0:
            return 0.0
        key = (chip.name, system, op, float(bytes_), size, rpd, groups)
        if key in self._times:
            return self._times[key]
        dom = catalog.get_system(system).chips
        if rpd * groups > dom:
            raise SpecError(
                "layout.groups_sharing_domain",
                f"{groups} groups x {rpd} ranks per domain exceed the {dom} chips of a {system} domain",
            )
        domains = -(-size // rpd)
        topo = self.topology(chip.name, system, domains)
        sim = FlowSim(topo)
        local = np.arange(rpd)
        handles = []
        for k in range(groups):
            ranks = (np.arange(domains)[:, None] * dom + k * rpd + local[None, :]).ravel()[:size]
            handles.append(sim.start_collective(op, ranks, float(bytes_), start_s=0.0, algo=self.algo))
        sim.run_until_idle()
        for h in handles:
            if h.state != "done":
                raise SpecError("layout", f"collective did not complete: {h.error}")
        t = max(h.end_s for h in handles)
        self._times[key] = t
        return t


__all__ = ["FabricCommModel"]
