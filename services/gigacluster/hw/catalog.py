"""Typed access to ``catalog.yaml``, the single home of every hardware constant.

Values are read once and cached; callers get frozen dataclasses. Prices can be overridden per
process with ``GIGACLUSTER_PRICE_<CHIP>`` (chip name upper-cased, ``-`` as ``_``) or per call
with :meth:`Chip.with_price`.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from importlib import resources
from typing import Any

import yaml

PRECISIONS = ("fp32", "tf32", "fp16", "bf16", "fp8", "mxfp6", "mxfp4", "nvfp4")
"""Every number format a chip's ``peak_tflops`` may list: fp8 is FP8 with block (or MX) scaling;
mxfp6 / mxfp4 the OCP microscaling formats; nvfp4 NVIDIA's FP4 with 16-element FP8 scales.
A chip supports exactly the formats its catalog entry lists (see :meth:`Chip.precisions`)."""


class CatalogError(ValueError):
    """The catalog or a lookup into it is invalid."""


class UnknownHardwareError(CatalogError):
    """A chip, system or part name that the catalog does not hold."""


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator type. Bandwidths are bytes per second, per direction."""

    name: str
    vendor: str
    peak_tflops: dict[str, float]
    hbm_bytes: int
    hbm_Bps: float
    scaleup_Bps: float
    nic_bps: float
    tdp_w: float
    idle_w: float
    cooling: str
    price_per_hour_usd: float
    sources: dict[str, str]
    assumptions: dict[str, str]

    def __post_init__(self) -> None:
        if self.cooling not in ("air", "liquid"):
            raise CatalogError(f"chip {self.name}: cooling must be air or liquid, got {self.cooling!r}")
        if not 0 < self.idle_w < self.tdp_w:
            raise CatalogError(f"chip {self.name}: need 0 < idle_w < tdp_w")
        for p in ("fp32", "bf16", "fp8"):
            if self.peak_tflops.get(p, 0) <= 0:
                raise CatalogError(f"chip {self.name}: peak_tflops.{p} missing")
        unknown = set(self.peak_tflops) - set(PRECISIONS)
        if unknown:
            raise CatalogError(
                f"chip {self.name}: unknown precision {sorted(unknown)[0]!r}; allowed: {', '.join(PRECISIONS)}"
            )

    def precisions(self) -> tuple[str, ...]:
        """The number formats this chip has a peak for, in :data:`PRECISIONS` order."""
        return tuple(p for p in PRECISIONS if p in self.peak_tflops)

    def peak_flops(self, precision: str) -> float:
        """Dense peak FLOP/s at ``precision`` (one of :meth:`precisions`)."""
        if precision not in self.peak_tflops:
            raise CatalogError(
                f"chip {self.name} has no {precision!r} rate; it supports: {', '.join(self.precisions())}"
            )
        return self.peak_tflops[precision] * 1e12

    @property
    def nic_Bps(self) -> float:
        """NIC bandwidth in bytes per second, per direction."""
        return self.nic_bps / 8.0

    def with_price(self, price_per_hour_usd: float) -> Chip:
        """A copy with an overridden price per chip-hour."""
        if price_per_hour_usd < 0:
            raise CatalogError("price_per_hour_usd must be >= 0")
        return dataclasses.replace(self, price_per_hour_usd=price_per_hour_usd)


@dataclasses.dataclass(frozen=True)
class System:
    """A scale-up domain: chips that share a high-bandwidth interconnect."""

    name: str
    chips: int
    chip_types: tuple[str, ...]
    scaleup: str  # torus2d | torus2d_ring | switch | full_mesh
    params: dict[str, Any]
    source: str


@dataclasses.dataclass(frozen=True)
class Facility:
    pue_default: float
    host_overhead_w_per_chip: float
    energy_price_usd_per_kwh: float


@functools.cache
def _raw() -> dict[str, Any]:
    text = resources.files("gigacluster.hw").joinpath("catalog.yaml").read_text()
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or "chips" not in data:
        raise CatalogError("catalog.yaml has no chips section")
    return data


def _price_override(name: str) -> float | None:
    raw = os.environ.get("GIGACLUSTER_PRICE_" + name.upper().replace("-", "_"))
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError as exc:
        raise CatalogError(f"GIGACLUSTER_PRICE_{name.upper()} must be a number, got {raw!r}") from exc


@functools.cache
def _chip(name: str) -> Chip:
    chips = _raw()["chips"]
    if name not in chips:
        raise UnknownHardwareError(f"unknown chip {name!r}; allowed: {', '.join(sorted(chips))}")
    c = dict(chips[name])
    chip = Chip(
        name=name,
        vendor=c["vendor"],
        peak_tflops={k: float(v) for k, v in c["peak_tflops"].items()},
        hbm_bytes=int(c["hbm_bytes"]),
        hbm_Bps=float(c["hbm_Bps"]),
        scaleup_Bps=float(c["scaleup_Bps"]),
        nic_bps=float(c["nic_bps"]),
        tdp_w=float(c["tdp_w"]),
        idle_w=float(c["idle_w"]),
        cooling=c["cooling"],
        price_per_hour_usd=float(c["price_per_hour_usd"]),
        sources=dict(c.get("sources", {})),
        assumptions=dict(c.get("assumptions", {})),
    )
    return chip


def get_chip(name: str) -> Chip:
    """The catalog entry for chip ``name``, with any environment price override applied."""
    chip = _chip(name)
    price = _price_override(name)
    return chip.with_price(price) if price is not None else chip


def chip_names() -> list[str]:
    return sorted(_raw()["chips"])


@functools.cache
def get_system(name: str) -> System:
    systems = _raw()["systems"]
    if name not in systems:
        raise UnknownHardwareError(f"unknown system {name!r}; allowed: {', '.join(sorted(systems))}")
    s = {k: _num(v) for k, v in dict(systems[name]).items()}
    return System(
        name=name,
        chips=int(s.pop("chips")),
        chip_types=tuple(s.pop("chip_types")),
        scaleup=s.pop("scaleup"),
        source=s.pop("source"),
        params=s,
    )


def _num(value: Any) -> Any:
    """YAML 1.1 reads ``5.12e11`` (no exponent sign) as a string; numbers are numbers here."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def system_names() -> list[str]:
    return sorted(_raw()["systems"])


def default_system(chip: str) -> str:
    """The scale-up system a chip ships in by default."""
    for name in system_names():
        if chip in get_system(name).chip_types:
            return name
    raise UnknownHardwareError(f"no system in the catalog holds chip {chip!r}")


def network() -> dict[str, Any]:
    """Scale-out parts (switches, NICs, cabling), as raw mappings with their sources."""
    return dict(_raw()["network"])


def failure_repair_s() -> dict[str, float]:
    """Repair time per failure component of the built-in failure table (``failures.repair_s``; sources there)."""
    return {k: float(v) for k, v in _raw()["failures"]["repair_s"].items()}


@functools.cache
def facility() -> Facility:
    f = _raw()["facility"]
    return Facility(
        pue_default=float(f["pue_default"]),
        host_overhead_w_per_chip=float(f["host_overhead_w_per_chip"]),
        energy_price_usd_per_kwh=float(f["energy_price_usd_per_kwh"]),
    )
