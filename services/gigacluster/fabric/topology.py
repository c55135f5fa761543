"""Cluster topologies as flat numpy arrays: scale-up domains plus a rail-optimised fat-tree.

A topology is a directed graph. Nodes are numbered chips first (node id == chip id), then the
scale-up switches (one per domain, for switched systems), then leaves, then the second switch
tier (spines in a two-tier tree, aggregation switches in a three-tier one), then cores. Every
physical cable is two directed links, each with its own capacity (bytes/s per direction,
already reduced to goodput by the link efficiency in the catalog) and latency.

Scale-up domains come from the catalog's ``systems`` section:

* ``switch`` (NVSwitch on HGX, NeuronSwitch on Trn3): chip -> domain switch -> chip;
* ``full_mesh`` (MI300X platform): one direct link per pair, ``scaleup_Bps / 7`` each;
* ``torus2d`` (trn2): a 4x4 torus with wrap-around, a quarter of the device bandwidth per link;
* ``torus2d_ring`` (Trn2 UltraServer): four such tori, chip k of each instance on a ring of four.

Scale-out is a rail-optimised fat-tree with one NIC per accelerator: chip ``k`` of every domain
(its *rail*) connects to the same leaf of its group, so rail-matched traffic between domains
stays on one leaf or crosses the spine once. Switch ports run at the NIC rate (a Tomahawk 5 has
128 ports at 400G or 64 at 800G). A leaf gives ``P * o / (1 + o)`` ports to chips and the rest
to the tier above (``o`` = oversubscription). Parallel cables between one pair of switches are
modelled as one link of the summed capacity (ECMP over parallel ports is a sum at flow level).
Two tiers hold up to ``P`` leaves; three tiers group ``P/2`` leaves into a pod with ``u``
aggregation switches (one per leaf uplink), and aggregation switch ``j`` of every pod connects
to core plane ``j`` (the classic k-ary fat-tree; oversubscription applies at the leaf only).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import numpy as np

from gigacluster.fabric.builders import (
    SCALEOUT_BUILDERS,
    SCALEUP_BUILDERS,
    LinkBuilder,
    context,
    scaleout_links,
)
from gigacluster.fabric.routing_modes import ROUTING_MODES
from gigacluster.hw import catalog
from gigacluster.model import SpecError

TIER_NAMES = ("scaleup", "nic", "leaf-spine", "spine-core")
"""Link tiers: 0 = scale-up, 1 = NIC-leaf, 2 = leaf-spine (or leaf-aggregation), 3 = aggregation-core."""

NODE_KINDS = ("chip", "sw", "leaf", "spine", "agg", "core")
SCALEUP_KINDS = ("switch", "full_mesh", "torus2d", "torus2d_ring")

_NAME_RE = re.compile(r"^(chip|sw|leaf|spine|agg|core)(\d+)$")


@dataclasses.dataclass(frozen=True)
class TopologyConfig:
    """What to build: ``count`` chips of type ``chip`` in ``system`` domains, on a fat-tree.

    ``nic`` is a part from the catalog's ``network.nics`` (``nic400``, ``thor-ultra``); ``None``
    uses the chip's own catalog NIC rate (e.g. 200 Gb/s EFA per Trainium chip). ``routing`` is
    ``ecmp`` (one path per flow, chosen by a hash of the flow) or ``spray`` (every flow spread
    evenly over all equal-cost spine choices, as packet spraying does).
    """

    chip: str
    count: int
    system: str | None = None
    nic: str | None = None
    switch: str = "tomahawk5"
    tiers: int = 2
    oversubscription: float = 1.0
    routing: str = "ecmp"
    nics_per_node: int = 0  # NICs per scale-up domain sharing the chips' scale-out (0: one per chip)

    def __post_init__(self) -> None:
        chips = catalog.chip_names()
        if self.chip not in chips:
            raise SpecError("chip", f"unknown chip {self.chip!r}; allowed: {', '.join(chips)}")
        if not isinstance(self.count, int | np.integer) or isinstance(self.count, bool) or self.count < 1:
            raise SpecError("count", f"must be an integer >= 1, got {self.count!r}")
        if self.system is None:
            object.__setattr__(self, "system", catalog.default_system(self.chip))
        systems = catalog.system_names()
        if self.system not in systems:
            raise SpecError("system", f"unknown system {self.system!r}; allowed: {', '.join(systems)}")
        sysm = catalog.get_system(str(self.system))
        if self.chip not in sysm.chip_types:
            raise SpecError(
                "system",
                f"system {self.system!r} holds {', '.join(sysm.chip_types)}, not {self.chip!r}; "
                f"allowed for {self.chip}: "
                + ", ".join(s for s in systems if self.chip in catalog.get_system(s).chip_types),
            )
        net = catalog.network()
        if self.nic is not None and self.nic not in net["nics"]:
            raise SpecError("nic", f"unknown NIC {self.nic!r}; allowed: {', '.join(sorted(net['nics']))}")
        if self.switch not in net["switches"]:
            raise SpecError(
                "switch", f"unknown switch {self.switch!r}; allowed: {', '.join(sorted(net['switches']))}"
            )
        if self.tiers not in (2, 3):
            raise SpecError("tiers", f"allowed: 2, 3; got {self.tiers!r}")
        if not (isinstance(self.oversubscription, int | float) and 1.0 <= self.oversubscription <= 64.0):
            raise SpecError("oversubscription", f"must be a number in [1, 64], got {self.oversubscription!r}")
        ROUTING_MODES.lookup(self.routing)  # UnknownName (a SpecError on "routing") lists the modes
        if isinstance(self.nics_per_node, bool) or not isinstance(self.nics_per_node, int | np.integer) or not (
                0 <= self.nics_per_node <= 1024):
            raise SpecError("nics_per_node", f"must be an integer in [0, 1024] (0: one per chip), got "
                            f"{str(self.nics_per_node)[:40]!r}")
        dom = sysm.chips
        if self.count > dom and self.count % dom:
            raise SpecError(
                "count", f"must be a multiple of the {self.system} domain size {dom} (or smaller), got {self.count}"
            )
        if self.count < dom and sysm.scaleup in ("torus2d", "torus2d_ring"):
            raise SpecError("count", f"a {self.system} torus needs whole domains of {dom} chips, got {self.count}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TopologyConfig:
        """Build from a mapping (YAML, JSON, RPC); unknown keys and bad values raise SpecError."""
        if not isinstance(d, dict):
            raise SpecError("topology", f"must be a mapping, got {type(d).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise SpecError(unknown[0], f"unknown topology field; allowed: {', '.join(sorted(fields))}")
        for required in ("chip", "count"):
            if required not in d:
                raise SpecError(required, "required")
        kw = dict(d)
        for key, typ in (("count", int), ("tiers", int), ("oversubscription", float)):
            if key in kw:
                try:
                    kw[key] = typ(kw[key])
                except (TypeError, ValueError) as exc:
                    raise SpecError(key, f"must be a number, got {kw[key]!r}") from exc
        return cls(**kw)


@dataclasses.dataclass(frozen=True, eq=False)
class Topology:
    """A built topology: node and link arrays plus the index tables routing needs.

    Link arrays (length ``n_links``): ``link_src``, ``link_dst`` (node ids), ``link_capacity_Bps``
    (goodput per direction), ``link_line_rate_Bps`` (before the efficiency), ``link_latency_s``,
    ``link_tier`` (index into :data:`TIER_NAMES`). Index tables hold link ids, ``-1`` where absent.
    """

    config: TopologyConfig
    n_chips: int
    n_nodes: int
    chips_per_domain: int
    scaleup: str
    node_kind: np.ndarray
    link_src: np.ndarray
    link_dst: np.ndarray
    link_capacity_Bps: np.ndarray
    link_line_rate_Bps: np.ndarray
    link_latency_s: np.ndarray
    link_tier: np.ndarray
    # per chip
    chip_domain: np.ndarray
    chip_local: np.ndarray
    chip_leaf: np.ndarray
    nic_up: np.ndarray
    nic_down: np.ndarray
    su_up: np.ndarray
    su_down: np.ndarray
    mesh_link: np.ndarray  # (n_chips, chips_per_domain): link to local peer k
    torus_link: np.ndarray  # (n_chips, 6): +x, -x, +y, -y, +ring, -ring
    # per leaf / per tier-2 switch
    leaf_pod: np.ndarray
    up2: np.ndarray  # (n_leaves, A): leaf -> tier-2 switch j of its pod
    down2: np.ndarray  # (n_leaves, A): tier-2 switch j of its pod -> leaf
    up3: np.ndarray  # (n_t2, C): aggregation switch -> core c of its plane
    down3: np.ndarray  # (n_t2, C): core c of its plane -> aggregation switch
    node_base: dict[str, int]
    node_count: dict[str, int]
    leaf_down_ports: int
    leaf_up_ports: int
    port_Bps: float
    torus_dims: tuple[int, int, int] = (0, 0, 1)  # (nx, ny, instances on the ring)

    @property
    def n_links(self) -> int:
        return int(self.link_src.size)

    @property
    def n_domains(self) -> int:
        return int(self.chip_domain[-1]) + 1

    @property
    def n_leaves(self) -> int:
        return int(self.up2.shape[0])

    @property
    def t2_per_pod(self) -> int:
        return int(self.up2.shape[1])

    @property
    def n_switches(self) -> int:
        return self.n_nodes - self.n_chips

    def domain_of(self, chip_ids: np.ndarray) -> np.ndarray:
        """Scale-up domain index of each chip id."""
        ids = np.asarray(chip_ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_chips):
            raise SpecError("chip", f"chip ids must be in [0, {self.n_chips}), got {ids.min()}..{ids.max()}")
        return self.chip_domain[ids]

    # ---- names -------------------------------------------------------------------------
    def node_name(self, node_id: int) -> str:
        """Stable human name of a node: chip12, sw1, leaf3, spine1, agg7, core2."""
        node_id = int(node_id)
        if not 0 <= node_id < self.n_nodes:
            raise SpecError("node", f"node id must be in [0, {self.n_nodes}), got {node_id}")
        kind = NODE_KINDS[int(self.node_kind[node_id])]
        return f"{kind}{node_id - self.node_base[kind]}"

    def node_id_by_name(self, name: str) -> int:
        """Inverse of :meth:`node_name` (accepts a ``switches/`` or ``chips/`` prefix)."""
        short = name.rsplit("/", 1)[-1]
        m = _NAME_RE.match(short)
        if m is None or int(m.group(2)) >= self.node_count.get(m.group(1), 0):
            raise SpecError("node", f"unknown node {name!r}; names look like chip0, sw0, leaf0, spine0, agg0, core0")
        return self.node_base[m.group(1)] + int(m.group(2))

    def link_name(self, link_id: int) -> str:
        """Stable human name of a link, ``<src>-<dst>``, e.g. ``leaf3-spine1``."""
        link_id = int(link_id)
        if not 0 <= link_id < self.n_links:
            raise SpecError("link", f"link id must be in [0, {self.n_links}), got {link_id}")
        return f"{self.node_name(self.link_src[link_id])}-{self.node_name(self.link_dst[link_id])}"

    def link_tier_name(self, link_id: int) -> str:
        """The tier of a link, one of :data:`TIER_NAMES`."""
        return TIER_NAMES[int(self.link_tier[link_id])]

    def link_id_by_name(self, name: str) -> int:
        """Inverse of :meth:`link_name` (accepts a ``links/`` prefix)."""
        short = name.rsplit("/", 1)[-1]
        parts = short.split("-")
        if len(parts) != 2:
            raise SpecError("link", f"unknown link {name!r}; names look like leaf3-spine1")
        src, dst = (self.node_id_by_name(p) for p in parts)
        key = src * self.n_nodes + dst
        keys, order = self._link_keys
        pos = int(np.searchsorted(keys, key))
        if pos >= keys.size or keys[pos] != key:
            raise SpecError("link", f"no link {name!r} in this topology")
        return int(order[pos])

    @functools.cached_property
    def _link_keys(self) -> tuple[np.ndarray, np.ndarray]:
        keys = self.link_src.astype(np.int64) * self.n_nodes + self.link_dst
        order = np.argsort(keys, kind="stable")
        return keys[order], order

    def links_of_node(self, node_id: int) -> np.ndarray:
        """Ids of every link into or out of a node."""
        return np.flatnonzero((self.link_src == node_id) | (self.link_dst == node_id))

    # ---- summary -----------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Counts per tier, capacities and bisection bandwidth, as plain JSON-able values.

        ``bisection_Bps`` is half the smallest total upward capacity over the scale-out tiers
        (NIC, leaf uplinks, aggregation uplinks), per direction: what a worst-case half/half
        split of the chips can exchange through the fat-tree.
        """
        tiers = []
        up_totals = []
        for t, name in enumerate(TIER_NAMES):
            mask = self.link_tier == t
            n = int(mask.sum())
            if not n:
                continue
            cap = float(self.link_capacity_Bps[mask].sum())
            tiers.append({"tier": name, "links": n, "capacity_Bps": cap})
            if t >= 1:
                up_totals.append(cap / 2.0)  # half of the directed links point up
        cfg = self.config
        return {
            "chip": cfg.chip,
            "system": cfg.system,
            "chips": self.n_chips,
            "domains": self.n_domains,
            "chips_per_domain": self.chips_per_domain,
            "scaleup": self.scaleup,
            "nodes": self.n_nodes,
            "switches": self.n_switches,
            "links": self.n_links,
            "leaves": self.node_count["leaf"],
            "spines": self.node_count["spine"],
            "aggs": self.node_count["agg"],
            "cores": self.node_count["core"],
            "tiers": tiers,
            "switch_tiers": cfg.tiers,
            "switch": cfg.switch,
            "oversubscription": cfg.oversubscription,
            "leaf_down_ports": self.leaf_down_ports,
            "leaf_up_ports": self.leaf_up_ports,
            "nic_Bps": self.port_Bps,
            "bisection_Bps": 0.5 * min(up_totals) if up_totals else 0.0,
            "routing": cfg.routing,
        }


def _node_kinds(n_nodes: int, bases: tuple[int, int, int, int], tiers: int) -> np.ndarray:
    base_sw, base_leaf, base_t2, base_core = bases
    node_kind = np.zeros(n_nodes, dtype=np.int8)
    node_kind[base_sw:base_leaf] = NODE_KINDS.index("sw")
    node_kind[base_leaf:base_t2] = NODE_KINDS.index("leaf")
    node_kind[base_t2:base_core] = NODE_KINDS.index("spine" if tiers == 2 else "agg")
    node_kind[base_core:] = NODE_KINDS.index("core")
    return node_kind


def build_topology(cfg: TopologyConfig) -> Topology:
    """Build the arrays of ``cfg``'s topology; 100k+ chips take well under a few seconds.

    Nodes are numbered chips, scale-up switches, leaves, tier-2, cores; links are laid out
    scale-up first (the family's builder in :data:`SCALEUP_BUILDERS`), then the fat-tree sized by
    :data:`SCALEOUT_BUILDERS`.
    """
    c = context(cfg)
    n, sysm = c.n, c.sysm
    tree = SCALEOUT_BUILDERS[cfg.tiers](c)
    n_su = n // c.dom if sysm.scaleup == "switch" else 0
    base_sw = n
    base_leaf = base_sw + n_su
    base_t2 = base_leaf + tree.n_leaves
    base_core = base_t2 + tree.n_t2
    n_nodes = base_core + tree.n_core
    lb = LinkBuilder()
    su = SCALEUP_BUILDERS[sysm.scaleup](c, lb, base_sw)
    nic_up, nic_down, up2, down2, up3, down3 = scaleout_links(c, tree, lb, base_leaf, base_t2, base_core)
    src, dst, cap_a, line, lat_a, tier = lb.arrays()
    t2_kind = "spine" if cfg.tiers == 2 else "agg"
    node_base = {"chip": 0, "sw": base_sw, "leaf": base_leaf, "spine": base_t2, "agg": base_t2, "core": base_core}
    node_count = {"chip": n, "sw": n_su, "leaf": tree.n_leaves, "spine": 0, "agg": 0, "core": tree.n_core}
    node_count[t2_kind] = tree.n_t2
    return Topology(
        config=cfg, n_chips=n, n_nodes=n_nodes, chips_per_domain=c.dom, scaleup=sysm.scaleup,
        node_kind=_node_kinds(n_nodes, (base_sw, base_leaf, base_t2, base_core), cfg.tiers),
        link_src=src, link_dst=dst, link_capacity_Bps=cap_a, link_line_rate_Bps=line, link_latency_s=lat_a,
        link_tier=tier, chip_domain=c.chip_domain, chip_local=c.chip_local, chip_leaf=tree.chip_leaf,
        nic_up=nic_up, nic_down=nic_down, su_up=su.su_up, su_down=su.su_down, mesh_link=su.mesh_link,
        torus_link=su.torus_link, leaf_pod=tree.leaf_pod, up2=up2, down2=down2, up3=up3, down3=down3,
        node_base=node_base, node_count=node_count, leaf_down_ports=tree.down, leaf_up_ports=tree.up,
        port_Bps=c.port_Bps, torus_dims=su.torus_dims,
    )


def domain_size(chip: str, system: str | None = None) -> int:
    """Chips per scale-up domain of ``system`` (default: the chip's default system)."""
    return catalog.get_system(system or catalog.default_system(chip)).chips


__all__ = ["NODE_KINDS", "ROUTING_MODES", "TIER_NAMES", "Topology", "TopologyConfig", "build_topology",
           "domain_size"]
