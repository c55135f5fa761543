"""The ``network`` section of a training spec: the scale-out network the job's collectives cross.

::

    network:
      nic: nic400            # a catalog NIC part (network.nics); default: the chip's own NIC rate
      nics_per_node: 8       # NICs per scale-up domain; default: one per chip (rail-optimised)
      routing: adaptive      # ecmp (hash per flow), adaptive (least-loaded path) or spray
      tiers: 2               # fat-tree tiers, 2 or 3; default: the smallest tree that holds the job
      oversubscription: 1.0  # leaf down:up port ratio
      switch: tomahawk5      # a catalog switch part (network.switches)

The default is what clusters at 10k+ GPUs run (the Llama 3 paper's RoCE fabric with enhanced
ECMP and deep buffers, Spectrum-X and Tomahawk 5/6 adaptive routing, Thor Ultra packet spraying):
``adaptive`` routing, one NIC per chip on its rail, and rings that stay on their rail (the fabric's
``rail_rings`` and the per-rail data-parallel groups of the flow model). ``ecmp`` is the per-flow
hash of a plain Clos network, where two flows can land on one spine link.

The offline estimate (``gigacluster estimate train``, :func:`gigacluster.planning.estimate_train`)
builds its fabric from this section. A live job runs on the cluster's own fabric, whose routing is
set when the cluster starts (``gigacluster up --routing``), so the section does not reach the
scheduler.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from gigacluster.hw.catalog import network
from gigacluster.model import SpecError

ROUTINGS = ("ecmp", "adaptive", "spray")
DEFAULT_ROUTING = "adaptive"
NETWORK_KEYS = ("nic", "nics_per_node", "routing", "tiers", "oversubscription", "switch")
MAX_NICS_PER_NODE = 1024


def _show(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


@dataclasses.dataclass(frozen=True)
class NetworkSpec:
    """The scale-out network of a training estimate (see module docstring); ``None`` fields: the default."""

    nic: str | None = None
    nics_per_node: int | None = None
    routing: str = DEFAULT_ROUTING
    tiers: int | None = None
    oversubscription: float = 1.0
    switch: str | None = None

    def __post_init__(self) -> None:
        net = network()
        if self.nic is not None and self.nic not in net["nics"]:
            raise SpecError("network.nic", f"unknown NIC {_show(self.nic)}; allowed: {', '.join(sorted(net['nics']))}")
        if self.switch is not None and self.switch not in net["switches"]:
            raise SpecError("network.switch",
                            f"unknown switch {_show(self.switch)}; allowed: {', '.join(sorted(net['switches']))}")
        if self.routing not in ROUTINGS:
            raise SpecError("network.routing", f"allowed: {', '.join(ROUTINGS)}; got {_show(self.routing)}")
        if self.tiers not in (None, 2, 3):
            raise SpecError("network.tiers", f"allowed: 2, 3; got {_show(self.tiers)}")
        n = self.nics_per_node
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_NICS_PER_NODE):
            raise SpecError("network.nics_per_node", f"must be an integer in [1, {MAX_NICS_PER_NODE}], got {_show(n)}")
        o = self.oversubscription
        if isinstance(o, bool) or not isinstance(o, int | float) or not math.isfinite(o) or o < 1:
            raise SpecError("network.oversubscription", f"must be a number >= 1, got {_show(o)}")

    def topology_kw(self) -> dict[str, Any]:
        """The :class:`~gigacluster.fabric.topology.TopologyConfig` fields this section sets."""
        kw: dict[str, Any] = {"routing": self.routing, "oversubscription": float(self.oversubscription)}
        for name in ("nic", "nics_per_node", "tiers", "switch"):
            if getattr(self, name) is not None:
                kw[name] = getattr(self, name)
        return kw

    def to_dict(self) -> dict[str, Any]:
        """JSON form: every field, defaults included."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> NetworkSpec:
        """The ``network`` section; raises SpecError naming ``network.<field>``."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise SpecError("network", f"must be a mapping with fields {', '.join(NETWORK_KEYS)}")
        extra = sorted(str(k)[:40] for k in set(d) - set(NETWORK_KEYS))
        if extra:
            raise SpecError(f"network.{extra[0]}", f"unknown field; allowed: {', '.join(NETWORK_KEYS)}")
        for key in ("nic", "routing", "switch"):
            v = d.get(key)
            if v is not None and (not isinstance(v, str) or len(v) > 64):
                raise SpecError(f"network.{key}", f"must be a catalog name (a short string), got {_show(v)}")
        routing = str(d.get("routing", DEFAULT_ROUTING)).lower()
        return cls(nic=d.get("nic"), nics_per_node=d.get("nics_per_node"), routing=routing, tiers=d.get("tiers"),
                   oversubscription=d.get("oversubscription", 1.0), switch=d.get("switch"))


__all__ = ["DEFAULT_ROUTING", "NETWORK_KEYS", "ROUTINGS", "NetworkSpec"]
