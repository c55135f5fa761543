"""Whole sites: the presets of ``gigacluster up --preset`` and the scale-out a cluster size needs.

A preset is a power budget and a chip; the number of chips is what that budget feeds
(:func:`gigacluster.planning.chips_fed`, the same sum as ``gigacluster plan --power-mw``), rounded
down to whole scale-up domains in every chip shard. The fat-tree is the smallest that holds the
chips (:func:`gigacluster.fabric.sizing.choose_scaleout`); a flag given explicitly wins.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gigacluster.fabric.sizing import choose_scaleout
from gigacluster.hw import catalog
from gigacluster.model import SpecError
from gigacluster.planning import chips_fed


@dataclasses.dataclass(frozen=True)
class SitePreset:
    """A whole site for ``up --preset``: what ``power_mw`` of ``chip`` feeds, in ``shards`` chip processes."""

    name: str
    chip: str
    power_mw: float
    shards: int
    nic: str  # "" = the chip's own catalog NIC
    description: str
    # Packet spraying over every equal-cost path: what AI fabrics of this size run (AWS EFA's SRD sprays
    # each flow over many paths; Broadcom Tomahawk 5/6 and NVIDIA Spectrum-X spread load adaptively), not
    # one ECMP hash per flow, whose collisions cost a 102,400-chip job 27% per step (docs/performance.md).
    routing: str = "spray"

    def domain(self) -> int:
        """Chips per scale-up domain of the chip's default system."""
        return catalog.get_system(catalog.default_system(self.chip)).chips

    def chips(self) -> int:
        """Chips fed by the power budget, rounded down to whole domains in every shard."""
        unit = self.domain() * self.shards
        return chips_fed(self.power_mw, self.chip) // unit * unit

    def resolve(self) -> dict[str, Any]:
        """The ``up`` settings this preset stands for (chip, chips, shards, system, tree, NIC, routing)."""
        n = self.chips()
        out = choose_scaleout(self.chip, n, nic=self.nic)
        return {"chip": self.chip, "chips": n, "shards": self.shards, "system": catalog.default_system(self.chip),
                "tiers": out.tiers, "switch": out.switch, "nic": self.nic, "routing": self.routing}


PRESETS: dict[str, SitePreset] = {p.name: p for p in (
    SitePreset("2gw-trainium3", "trainium3", 2000.0, 16, "",
               "2 GW of Trainium3 UltraServers (64 chips on NeuronLink switches, EFA 200 Gb/s per chip)"),
    SitePreset("2gw-mi355x", "mi355x", 2000.0, 16, "nic400",
               "2 GW of MI355X platforms (8 GPUs over Infinity Fabric) on a Broadcom Ethernet fabric "
               "(400 Gb/s Thor 2-class NICs, Tomahawk switches)"),
    SitePreset("2gw-b200", "b200", 2000.0, 16, "",
               "2 GW of B200 HGX nodes (8 GPUs on NVSwitch, 400 Gb/s per GPU)"),
)}


def get_preset(name: str) -> SitePreset:
    """The preset called ``name``; an unknown name lists the allowed ones."""
    if name not in PRESETS:
        raise SpecError("preset", f"unknown preset {name[:40]!r}; allowed: {', '.join(PRESETS)}")
    return PRESETS[name]


__all__ = ["PRESETS", "SitePreset", "get_preset"]
