"""Chip, host and facility power and energy.

Chip power while running a work item::

    P = idle_w + (tdp_w - idle_w) x min(1, a_c x u_c x cf^g + a_m x u_m)

``u_c`` is how busy the matrix units are relative to the kind's ceiling (a large GEMM: 1.0),
``u_m`` the fraction of HBM bandwidth in use, ``cf`` the clock factor, and ``a_c``, ``a_m``, ``g``
the catalog's ``power_compute_share``, ``power_memory_share`` and ``power_clock_exponent``. HBM
energy is inside the ``a_m`` term (the chip TDP includes its HBM). Link energy is separate
(:func:`link_energy_j`, pJ per bit). A job's facility energy is
``(chips x (chip energy + host overhead) + link energy) x PUE``; the chip service integrates
``idle_w x elapsed + sum(work_energy_above_idle_j)`` per device, the same sum used offline.
"""

from __future__ import annotations

from gigacluster.hw.catalog import Chip, _raw, facility
from gigacluster.model import SpecError
from gigacluster.model.roofline import EfficiencyParams, Work, compute_bound_fraction, memo, work_time_s

J_PER_KWH = 3.6e6
J_PER_MWH = 3.6e9


def active_power_w(chip: Chip, work: Work, *, clock_factor: float = 1.0) -> float:
    """Chip power while running ``work`` at ``clock_factor`` (watts, idle_w..tdp_w)."""
    p = EfficiencyParams.for_chip(chip)
    u_c, u_m = compute_bound_fraction(chip, work, clock_factor=clock_factor)
    act = p.power_compute_share * u_c * clock_factor**p.power_clock_exponent + p.power_memory_share * u_m
    return chip.idle_w + (chip.tdp_w - chip.idle_w) * min(1.0, act)


def work_energy_above_idle_j(chip: Chip, work: Work, *, clock_factor: float = 1.0) -> float:
    """Energy above idle to run ``work`` (all repetitions) at ``clock_factor``, joules."""
    return memo(_energy_memo, chip, work, clock_factor, _price_energy_j)


_energy_memo: dict[tuple[int, Work, float], tuple[Chip, float]] = {}


def _price_energy_j(chip: Chip, work: Work, clock_factor: float) -> float:
    t = work_time_s(chip, work, clock_factor=clock_factor)
    return (active_power_w(chip, work, clock_factor=clock_factor) - chip.idle_w) * t


def works_energy_above_idle_j(chip: Chip, works: tuple[Work, ...] | list[Work], *, clock_factor: float = 1.0) -> float:
    """Sum of :func:`work_energy_above_idle_j` over a sequence of work items."""
    return sum(work_energy_above_idle_j(chip, w, clock_factor=clock_factor) for w in works)


def link_energy_j(bytes_scaleup: float, bytes_scaleout: float) -> float:
    """Energy to move bytes over scale-up links and the scale-out network (catalog pJ/bit)."""
    pj = _raw().get("thermal", {}).get("link_energy_pj_per_bit", {"scaleup": 0.0, "scaleout": 0.0})
    return (bytes_scaleup * float(pj["scaleup"]) + bytes_scaleout * float(pj["scaleout"])) * 8 * 1e-12


def host_overhead_w() -> float:
    """Host CPU, DRAM, NIC and fan power per accelerator at training load (catalog facility)."""
    return facility().host_overhead_w_per_chip


def facility_energy_j(it_energy_j: float, pue: float) -> float:
    """Facility energy from IT energy and PUE."""
    if pue < 1.0:
        raise SpecError("pue", f"must be >= 1.0, got {pue!r}")
    return it_energy_j * pue


def energy_mwh(chips: int, avg_power_w_per_chip: float, duration_s: float, pue: float) -> float:
    """Facility energy in MWh of ``chips`` at an average per-chip system power (Patterson et al. 2021)."""
    if chips < 0 or avg_power_w_per_chip < 0 or duration_s < 0:
        raise SpecError("energy", "chips, power and duration must be >= 0")
    return facility_energy_j(chips * avg_power_w_per_chip * duration_s, pue) / J_PER_MWH


def j_to_kwh(energy_j: float) -> float:
    """Joules to kWh."""
    return energy_j / J_PER_KWH


def j_to_mwh(energy_j: float) -> float:
    """Joules to MWh."""
    return energy_j / J_PER_MWH
