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


def _f(x: Any) -> float:
    return float(x)  # the catalog's YAML 1.1 reads "5.12e13" as a string


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


class _LinkBuilder:
    """Collects link blocks as arrays and hands back the id range of each block."""

    def __init__(self) -> None:
        self.blocks: list[tuple[np.ndarray, ...]] = []
        self.n = 0

    def add(self, src: np.ndarray, dst: np.ndarray, rate_Bps: float | np.ndarray, eff: float,
            lat_s: float | np.ndarray, tier: int) -> np.ndarray:
        src = np.asarray(src, dtype=np.int64).ravel()
        dst = np.asarray(dst, dtype=np.int64).ravel()
        k = src.size
        rate = np.broadcast_to(np.asarray(rate_Bps, dtype=np.float64), src.shape).ravel()
        lat = np.broadcast_to(np.asarray(lat_s, dtype=np.float64), src.shape).ravel()
        self.blocks.append((src, dst, rate * eff, rate, lat, np.full(k, tier, dtype=np.int8)))
        ids = np.arange(self.n, self.n + k, dtype=np.int64)
        self.n += k
        return ids

    def arrays(self) -> tuple[np.ndarray, ...]:
        return tuple(np.concatenate([b[i] for b in self.blocks]) for i in range(6))


def build_topology(cfg: TopologyConfig) -> Topology:
    """Build the arrays of ``cfg``'s topology; 100k+ chips take well under a few seconds."""
    chip = catalog.get_chip(cfg.chip)
    sysm = catalog.get_system(str(cfg.system))
    net = catalog.network()
    p = sysm.params
    n = int(cfg.count)
    dom = min(sysm.chips, n)
    n_dom = n // dom
    chips = np.arange(n, dtype=np.int64)
    chip_domain = chips // dom
    chip_local = chips % dom

    prop = _f(net["propagation_s_per_m"])
    cable = {k: _f(v) for k, v in net["cable_m"].items()}
    sw = net["switches"][cfg.switch]
    sw_lat = _f(sw["latency_s"])
    nic_part = net["nics"][cfg.nic] if cfg.nic is not None else net["nics"]["nic400"]
    nic_bps = _f(nic_part["bps"]) if cfg.nic is not None else chip.nic_bps
    nic_lat = _f(nic_part["latency_s"])
    nic_eff = _f(net.get("nic_efficiency", 1.0))
    su_eff = _f(p.get("link_efficiency", 1.0))
    port_Bps = nic_bps / 8.0
    ports = int(_f(sw["capacity_bps"]) // nic_bps)
    if ports < 4:
        raise SpecError("switch", f"{cfg.switch} has only {ports} ports at {nic_bps / 1e9:.0f} Gb/s")

    # node numbering: chips, scale-up switches, leaves, tier-2, cores
    n_su = n_dom if sysm.scaleup == "switch" else 0

    o = float(cfg.oversubscription)
    down = max(1, min(ports - 1, round(ports * o / (1.0 + o))))
    up = ports - down
    rails = min(dom, down)
    slots_per_dom = -(-dom // rails)
    slot = chip_domain * slots_per_dom + chip_local // rails
    rail = chip_local % rails
    n_groups = -(-(n_dom * slots_per_dom) // down)
    n_leaves = n_groups * rails
    chip_leaf = (slot // down) * rails + rail

    if cfg.tiers == 2:
        n_pods = 1
        leaves_per_pod = n_leaves
        a = max(1, -(-(n_leaves * up) // ports))
        if a > up:
            cap = ports * down
            raise SpecError(
                "tiers",
                f"{n} chips need {n_leaves} leaves, more than a two-tier {cfg.switch} tree holds "
                f"(about {cap} chips at oversubscription {o:g}); use tiers=3",
            )
        n_t2 = a
        n_core = 0
        c = 0
    else:
        leaves_per_pod = max(1, ports // 2)
        n_pods = -(-n_leaves // leaves_per_pod)
        a = up
        n_t2 = n_pods * a
        c = max(1, -(-(n_pods * (ports // 2)) // ports))
        if n_pods > ports:
            raise SpecError(
                "count",
                f"{n} chips need {n_pods} pods, more than a three-tier {cfg.switch} tree holds ({ports} pods)",
            )
        n_core = a * c
    leaf_pod = np.arange(n_leaves, dtype=np.int64) // leaves_per_pod

    base_sw = n
    base_leaf = base_sw + n_su
    base_t2 = base_leaf + n_leaves
    base_core = base_t2 + n_t2
    n_nodes = base_core + n_core
    node_kind = np.zeros(n_nodes, dtype=np.int8)
    node_kind[base_sw:base_leaf] = NODE_KINDS.index("sw")
    node_kind[base_leaf:base_t2] = NODE_KINDS.index("leaf")
    node_kind[base_t2:base_core] = NODE_KINDS.index("spine" if cfg.tiers == 2 else "agg")
    node_kind[base_core:] = NODE_KINDS.index("core")

    lb = _LinkBuilder()
    neg = np.full(n, -1, dtype=np.int64)
    su_up, su_down = neg.copy(), neg.copy()
    mesh_link = np.full((n, dom), -1, dtype=np.int64) if sysm.scaleup == "full_mesh" else np.full((n, 0), -1)
    torus_link = np.full((n, 6), -1, dtype=np.int64)
    torus_dims = (0, 0, 1)

    # ---- scale-up ----------------------------------------------------------------------
    if sysm.scaleup == "switch":
        per_dev = _f(p.get("per_device_Bps", chip.scaleup_Bps))
        su_lat = _f(p.get("switch_latency_s", sw_lat))
        swn = base_sw + chip_domain
        su_up = lb.add(chips, swn, per_dev, su_eff, prop * cable["intra_rack"] + su_lat, 0)
        su_down = lb.add(swn, chips, per_dev, su_eff, prop * cable["intra_rack"], 0)
    elif sysm.scaleup == "full_mesh":
        per_link = chip.scaleup_Bps / (sysm.chips - 1)
        lat = _f(p.get("link_latency_s", 5e-7))
        if dom > 1:
            src = np.repeat(chips, dom)
            peer_local = np.tile(np.arange(dom), n)
            dst = chip_domain.repeat(dom) * dom + peer_local
            keep = src != dst
            ids = lb.add(src[keep], dst[keep], per_link, su_eff, lat, 0)
            flat = np.full(n * dom, -1, dtype=np.int64)
            flat[keep] = ids
            mesh_link = flat.reshape(n, dom)
    else:
        dims = [int(x) for x in p["torus_dims"]]
        if len(dims) != 2 or min(dims) < 3:
            raise SpecError("system", f"{cfg.system}: torus_dims must be two sizes >= 3, got {dims}")
        nx, ny = dims
        torus_dims = (nx, ny, int(p.get("instances", 1)))
        per_dev = _f(p["per_device_Bps"])
        lat = _f(p.get("link_latency_s", 5e-7))
        per_inst = nx * ny
        inst = chip_local // per_inst
        loc = chip_local % per_inst
        x, y = loc % nx, loc // nx
        first = chip_domain * dom + inst * per_inst
        nbrs = [
            first + y * nx + (x + 1) % nx,
            first + y * nx + (x - 1) % nx,
            first + ((y + 1) % ny) * nx + x,
            first + ((y - 1) % ny) * nx + x,
        ]
        for k, dst in enumerate(nbrs):
            torus_link[:, k] = lb.add(chips, dst, per_dev / 4.0, su_eff, lat, 0)
        if sysm.scaleup == "torus2d_ring":
            n_inst = int(p["instances"])
            if n_inst < 3:
                raise SpecError("system", f"{cfg.system}: a ring needs >= 3 instances, got {n_inst}")
            ring_Bps = _f(p["inter_instance_Bps"]) / 2.0  # split between the two ring neighbours
            for k, step in ((4, 1), (5, -1)):
                dst = chip_domain * dom + ((inst + step) % n_inst) * per_inst + loc
                torus_link[:, k] = lb.add(chips, dst, ring_Bps, su_eff, lat, 0)

    # ---- NIC <-> leaf --------------------------------------------------------------------
    leaf_node = base_leaf + chip_leaf
    nic_up = lb.add(chips, leaf_node, port_Bps, nic_eff, nic_lat + prop * cable["intra_rack"] + sw_lat, 1)
    nic_down = lb.add(leaf_node, chips, port_Bps, nic_eff, nic_lat + prop * cable["intra_rack"], 1)

    # ---- leaf <-> tier 2 -----------------------------------------------------------------
    leaves = np.arange(n_leaves, dtype=np.int64)
    t2_of = (leaf_pod[:, None] * a + np.arange(a)[None, :]) + base_t2  # (n_leaves, a) node ids
    l2_Bps = up * port_Bps / a
    lat2 = prop * cable["leaf_spine"] + sw_lat
    src_leaf = np.repeat(leaves + base_leaf, a)
    up2 = lb.add(src_leaf, t2_of.ravel(), l2_Bps, nic_eff, lat2, 2).reshape(n_leaves, a)
    down2 = lb.add(t2_of.ravel(), src_leaf, l2_Bps, nic_eff, lat2, 2).reshape(n_leaves, a)

    # ---- tier 2 <-> core (three tiers) ---------------------------------------------------
    if cfg.tiers == 3:
        t2 = np.arange(n_t2, dtype=np.int64)
        plane = t2 % a
        core_of = (plane[:, None] * c + np.arange(c)[None, :]) + base_core
        l3_Bps = (ports // 2) * port_Bps / c
        lat3 = prop * cable["spine_core"] + sw_lat
        src_t2 = np.repeat(t2 + base_t2, c)
        up3 = lb.add(src_t2, core_of.ravel(), l3_Bps, nic_eff, lat3, 3).reshape(n_t2, c)
        down3 = lb.add(core_of.ravel(), src_t2, l3_Bps, nic_eff, lat3, 3).reshape(n_t2, c)
    else:
        up3 = np.full((n_t2, 0), -1, dtype=np.int64)
        down3 = np.full((n_t2, 0), -1, dtype=np.int64)

    src, dst, cap_a, line, lat_a, tier = lb.arrays()
    t2_kind = "spine" if cfg.tiers == 2 else "agg"
    node_base = {"chip": 0, "sw": base_sw, "leaf": base_leaf, "spine": base_t2, "agg": base_t2, "core": base_core}
    node_count = {"chip": n, "sw": n_su, "leaf": n_leaves, "spine": 0, "agg": 0, "core": n_core}
    node_count[t2_kind] = n_t2
    return Topology(
        config=cfg,
        n_chips=n,
        n_nodes=n_nodes,
        chips_per_domain=dom,
        scaleup=sysm.scaleup,
        node_kind=node_kind,
        link_src=src,
        link_dst=dst,
        link_capacity_Bps=cap_a,
        link_line_rate_Bps=line,
        link_latency_s=lat_a,
        link_tier=tier,
        chip_domain=chip_domain,
        chip_local=chip_local,
        chip_leaf=chip_leaf,
        nic_up=nic_up,
        nic_down=nic_down,
        su_up=su_up,
        su_down=su_down,
        mesh_link=mesh_link,
        torus_link=torus_link,
        leaf_pod=leaf_pod,
        up2=up2,
        down2=down2,
        up3=up3,
        down3=down3,
        node_base=node_base,
        node_count=node_count,
        leaf_down_ports=down,
        leaf_up_ports=up,
        port_Bps=port_Bps,
        torus_dims=torus_dims,
    )


def domain_size(chip: str, system: str | None = None) -> int:
    """Chips per scale-up domain of ``system`` (default: the chip's default system)."""
    return catalog.get_system(system or catalog.default_system(chip)).chips


__all__ = ["NODE_KINDS", "ROUTING_MODES", "TIER_NAMES", "Topology", "TopologyConfig", "build_topology",
           "domain_size"]
