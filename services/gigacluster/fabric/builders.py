"""The builders of :func:`gigacluster.fabric.topology.build_topology`, one per topology family.

Scale-up (catalog ``scaleup``, table :data:`SCALEUP_BUILDERS`): a switch per domain, a full mesh,
or a 2D torus per instance (with a ring over instances for ``torus2d_ring``). Scale-out (``tiers``,
table :data:`SCALEOUT_BUILDERS`): the sizing of a two- or three-tier rail-optimised fat-tree, whose
links :func:`scaleout_links` lays out after the scale-up ones. Each builder appends link blocks to
one :class:`LinkBuilder`, so link ids follow the order of the calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from gigacluster.hw import catalog
from gigacluster.model import SpecError
from gigacluster.model.comm import scaleup_bus_fraction

if TYPE_CHECKING:
    from gigacluster.fabric.topology import TopologyConfig


def _f(x: Any) -> float:
    return float(x)  # the catalog's YAML 1.1 reads "5.12e13" as a string


class LinkBuilder:
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


@dataclasses.dataclass
class BuildContext:
    """What every builder of one topology needs: the config, catalog parts and the chip numbering."""

    cfg: TopologyConfig
    chip: Any
    sysm: Any
    p: Mapping[str, Any]
    n: int
    dom: int
    chips: np.ndarray
    chip_domain: np.ndarray
    chip_local: np.ndarray
    prop: float
    cable: dict[str, float]
    sw_lat: float
    nic_bps: float
    nic_lat: float
    nic_eff: float
    su_eff: float
    port_Bps: float
    ports: int


def _scaleup_efficiency(chip: str, sysm: Any) -> float:
    """The chip's own scale-up bus fraction (catalog ``efficiency.comm.chips``), else the system's link efficiency."""
    own = scaleup_bus_fraction(chip)
    return own if own is not None else _f(sysm.params.get("link_efficiency", 1.0))


def context(cfg: TopologyConfig) -> BuildContext:
    chip = catalog.get_chip(cfg.chip)
    sysm = catalog.get_system(str(cfg.system))
    net = catalog.network()
    n = int(cfg.count)
    dom = min(sysm.chips, n)
    chips = np.arange(n, dtype=np.int64)
    sw = net["switches"][cfg.switch]
    nic_part = net["nics"][cfg.nic] if cfg.nic is not None else net["nics"]["nic400"]
    nic_bps = _f(nic_part["bps"]) if cfg.nic is not None else chip.nic_bps
    if cfg.nics_per_node:  # fewer NICs than chips: the chips of a domain share them (PXN), rail by rail
        nic_bps *= min(1.0, cfg.nics_per_node / sysm.chips)
    ports = int(_f(sw["capacity_bps"]) // nic_bps)
    if ports < 4:
        raise SpecError("switch", f"{cfg.switch} has only {ports} ports at {nic_bps / 1e9:.0f} Gb/s")
    return BuildContext(
        cfg=cfg, chip=chip, sysm=sysm, p=sysm.params, n=n, dom=dom, chips=chips, chip_domain=chips // dom,
        chip_local=chips % dom, prop=_f(net["propagation_s_per_m"]),
        cable={k: _f(v) for k, v in net["cable_m"].items()}, sw_lat=_f(sw["latency_s"]), nic_bps=nic_bps,
        nic_lat=_f(nic_part["latency_s"]), nic_eff=_f(net.get("nic_efficiency", 1.0)),
        su_eff=_scaleup_efficiency(cfg.chip, sysm), port_Bps=nic_bps / 8.0, ports=ports,
    )


@dataclasses.dataclass
class _ScaleUp:
    """Scale-up links of every chip (``-1`` where the family has none)."""

    su_up: np.ndarray
    su_down: np.ndarray
    mesh_link: np.ndarray
    torus_link: np.ndarray
    torus_dims: tuple[int, int, int] = (0, 0, 1)

    @classmethod
    def empty(cls, c: BuildContext) -> _ScaleUp:
        neg = np.full(c.n, -1, dtype=np.int64)
        mesh = (np.full((c.n, c.dom), -1, dtype=np.int64) if c.sysm.scaleup == "full_mesh"
                else np.full((c.n, 0), -1))
        return cls(neg.copy(), neg.copy(), mesh, np.full((c.n, 6), -1, dtype=np.int64))


def _scaleup_switch(c: BuildContext, lb: LinkBuilder, base_sw: int) -> _ScaleUp:
    """Every chip up to and down from its domain's scale-up switch (NVLink switch, NeuronLink switch)."""
    out = _ScaleUp.empty(c)
    per_dev = _f(c.p.get("per_device_Bps", c.chip.scaleup_Bps))
    su_lat = _f(c.p.get("switch_latency_s", c.sw_lat))
    swn = base_sw + c.chip_domain
    out.su_up = lb.add(c.chips, swn, per_dev, c.su_eff, c.prop * c.cable["intra_rack"] + su_lat, 0)
    out.su_down = lb.add(swn, c.chips, per_dev, c.su_eff, c.prop * c.cable["intra_rack"], 0)
    return out


def _scaleup_full_mesh(c: BuildContext, lb: LinkBuilder, base_sw: int) -> _ScaleUp:
    """A direct link from every chip to each other chip of its domain (Infinity Fabric)."""
    out = _ScaleUp.empty(c)
    n, dom = c.n, c.dom
    per_link = c.chip.scaleup_Bps / (c.sysm.chips - 1)
    lat = _f(c.p.get("link_latency_s", 5e-7))
    if dom > 1:
        src = np.repeat(c.chips, dom)
        peer_local = np.tile(np.arange(dom), n)
        dst = c.chip_domain.repeat(dom) * dom + peer_local
        keep = src != dst
        ids = lb.add(src[keep], dst[keep], per_link, c.su_eff, lat, 0)
        flat = np.full(n * dom, -1, dtype=np.int64)
        flat[keep] = ids
        out.mesh_link = flat.reshape(n, dom)
    return out


def _scaleup_torus(c: BuildContext, lb: LinkBuilder, base_sw: int) -> _ScaleUp:
    """A 2D torus per instance (+x, -x, +y, -y), and for ``torus2d_ring`` a ring over instances."""
    out = _ScaleUp.empty(c)
    p, dom = c.p, c.dom
    dims = [int(x) for x in p["torus_dims"]]
    if len(dims) != 2 or min(dims) < 3:
        raise SpecError("system", f"{c.cfg.system}: torus_dims must be two sizes >= 3, got {dims}")
    nx, ny = dims
    out.torus_dims = (nx, ny, int(p.get("instances", 1)))
    per_dev = _f(p["per_device_Bps"])
    lat = _f(p.get("link_latency_s", 5e-7))
    per_inst = nx * ny
    inst = c.chip_local // per_inst
    loc = c.chip_local % per_inst
    x, y = loc % nx, loc // nx
    first = c.chip_domain * dom + inst * per_inst
    nbrs = [
        first + y * nx + (x + 1) % nx,
        first + y * nx + (x - 1) % nx,
        first + ((y + 1) % ny) * nx + x,
        first + ((y - 1) % ny) * nx + x,
    ]
    for k, dst in enumerate(nbrs):
        out.torus_link[:, k] = lb.add(c.chips, dst, per_dev / 4.0, c.su_eff, lat, 0)
    if c.sysm.scaleup == "torus2d_ring":
        n_inst = int(p["instances"])
        if n_inst < 3:
            raise SpecError("system", f"{c.cfg.system}: a ring needs >= 3 instances, got {n_inst}")
        ring_Bps = _f(p["inter_instance_Bps"]) / 2.0  # split between the two ring neighbours
        for k, step in ((4, 1), (5, -1)):
            dst = c.chip_domain * dom + ((inst + step) % n_inst) * per_inst + loc
            out.torus_link[:, k] = lb.add(c.chips, dst, ring_Bps, c.su_eff, lat, 0)
    return out


SCALEUP_BUILDERS: dict[str, Callable[[BuildContext, LinkBuilder, int], _ScaleUp]] = {
    "switch": _scaleup_switch,
    "full_mesh": _scaleup_full_mesh,
    "torus2d": _scaleup_torus,
    "torus2d_ring": _scaleup_torus,
}
"""One builder per scale-up family (catalog ``scaleup``), keyed as :data:`SCALEUP_KINDS`."""


@dataclasses.dataclass
class _Tree:
    """Sizes of the rail-optimised fat-tree: ports per leaf, leaves, pods, tier-2 and core switches."""

    down: int
    up: int
    rails: int
    chip_leaf: np.ndarray
    n_leaves: int
    leaf_pod: np.ndarray
    a: int  # tier-2 switches per pod (spines, or aggregation switches)
    n_t2: int
    c: int  # cores per plane (three tiers)
    n_core: int


def _leaves(c: BuildContext) -> tuple[int, int, int, np.ndarray, int]:
    """(down, up, rails, chip_leaf, n_leaves): NIC rails matched to leaves at the oversubscription."""
    o = float(c.cfg.oversubscription)
    ports = c.ports
    down = max(1, min(ports - 1, round(ports * o / (1.0 + o))))
    up = ports - down
    rails = min(c.dom, down)
    slots_per_dom = -(-c.dom // rails)
    n_dom = c.n // c.dom
    slot = c.chip_domain * slots_per_dom + c.chip_local // rails
    rail = c.chip_local % rails
    n_groups = -(-(n_dom * slots_per_dom) // down)
    return down, up, rails, (slot // down) * rails + rail, n_groups * rails


def _two_tier(c: BuildContext) -> _Tree:
    """Leaves and one layer of spines shared by all leaves."""
    down, up, rails, chip_leaf, n_leaves = _leaves(c)
    a = max(1, -(-(n_leaves * up) // c.ports))
    if a > up:
        cap = c.ports * down
        raise SpecError(
            "tiers",
            f"{c.n} chips need {n_leaves} leaves, more than a two-tier {c.cfg.switch} tree holds "
            f"(about {cap} chips at oversubscription {float(c.cfg.oversubscription):g}); use tiers=3",
        )
    leaf_pod = np.arange(n_leaves, dtype=np.int64) // n_leaves
    return _Tree(down, up, rails, chip_leaf, n_leaves, leaf_pod, a, a, 0, 0)


def _three_tier(c: BuildContext) -> _Tree:
    """Pods of leaves and aggregation switches, joined by planes of core switches."""
    down, up, rails, chip_leaf, n_leaves = _leaves(c)
    ports = c.ports
    leaves_per_pod = max(1, ports // 2)
    n_pods = -(-n_leaves // leaves_per_pod)
    a = up
    cores = max(1, -(-(n_pods * (ports // 2)) // ports))
    if n_pods > ports:
        raise SpecError(
            "count",
            f"{c.n} chips need {n_pods} pods, more than a three-tier {c.cfg.switch} tree holds ({ports} pods)",
        )
    leaf_pod = np.arange(n_leaves, dtype=np.int64) // leaves_per_pod
    return _Tree(down, up, rails, chip_leaf, n_leaves, leaf_pod, a, n_pods * a, cores, a * cores)


SCALEOUT_BUILDERS: dict[int, Callable[[BuildContext], _Tree]] = {2: _two_tier, 3: _three_tier}
"""One sizing per scale-out family, keyed by ``tiers``."""


def scaleout_links(c: BuildContext, t: _Tree, lb: LinkBuilder, base_leaf: int, base_t2: int,
                    base_core: int) -> tuple[np.ndarray, ...]:
    """NIC <-> leaf, leaf <-> tier 2, and (three tiers) tier 2 <-> core links, in that order."""
    a, lat_sw = t.a, c.sw_lat
    leaf_node = base_leaf + t.chip_leaf
    nic_up = lb.add(c.chips, leaf_node, c.port_Bps, c.nic_eff, c.nic_lat + c.prop * c.cable["intra_rack"] + lat_sw, 1)
    nic_down = lb.add(leaf_node, c.chips, c.port_Bps, c.nic_eff, c.nic_lat + c.prop * c.cable["intra_rack"], 1)
    leaves = np.arange(t.n_leaves, dtype=np.int64)
    t2_of = (t.leaf_pod[:, None] * a + np.arange(a)[None, :]) + base_t2  # (n_leaves, a) node ids
    l2_Bps = t.up * c.port_Bps / a
    lat2 = c.prop * c.cable["leaf_spine"] + lat_sw
    src_leaf = np.repeat(leaves + base_leaf, a)
    up2 = lb.add(src_leaf, t2_of.ravel(), l2_Bps, c.nic_eff, lat2, 2).reshape(t.n_leaves, a)
    down2 = lb.add(t2_of.ravel(), src_leaf, l2_Bps, c.nic_eff, lat2, 2).reshape(t.n_leaves, a)
    if c.cfg.tiers == 3:
        t2 = np.arange(t.n_t2, dtype=np.int64)
        plane = t2 % a
        core_of = (plane[:, None] * t.c + np.arange(t.c)[None, :]) + base_core
        l3_Bps = (c.ports // 2) * c.port_Bps / t.c
        lat3 = c.prop * c.cable["spine_core"] + lat_sw
        src_t2 = np.repeat(t2 + base_t2, t.c)
        up3 = lb.add(src_t2, core_of.ravel(), l3_Bps, c.nic_eff, lat3, 3).reshape(t.n_t2, t.c)
        down3 = lb.add(core_of.ravel(), src_t2, l3_Bps, c.nic_eff, lat3, 3).reshape(t.n_t2, t.c)
    else:
        up3 = np.full((t.n_t2, 0), -1, dtype=np.int64)
        down3 = np.full((t.n_t2, 0), -1, dtype=np.int64)
    return nic_up, nic_down, up2, down2, up3, down3


__all__ = ["SCALEOUT_BUILDERS", "SCALEUP_BUILDERS", "BuildContext", "LinkBuilder", "context", "scaleout_links"]
