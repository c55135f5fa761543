"""Thermal RC model, power and cost."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.hw.catalog import facility, get_chip
from gigacluster.model import SpecError
from gigacluster.model.cost import job_cost
from gigacluster.model.power import active_power_w, link_energy_j, work_energy_above_idle_j
from gigacluster.model.roofline import Work, work_time_s
from gigacluster.model.thermal import (
    ThermalParams,
    clock_factor,
    steady_state,
    steady_state_with_feedback,
    thermal_step,
)

H100 = get_chip("h100-sxm")
TRN3 = get_chip("trainium3")
BIG = Work(2.0 * 8192**3, 4.0 * 8192**2, "bf16", "matmul", 1, (8192, 8192, 8192))
STREAM = Work(1e6, 1e10, "bf16", "elementwise")


def test_air_cooled_chip_throttles_at_sustained_tdp() -> None:
    """An air-cooled H100 held at its 700 W TDP settles above the throttle point, below nominal clock."""
    temp, cf = steady_state(ThermalParams.for_chip(H100), H100.tdp_w)
    assert temp > 85.0
    assert cf < 0.8


def test_liquid_cooled_chip_holds_clock_at_tdp() -> None:
    """A liquid-cooled Trainium3 at its TDP stays below the throttle point and holds nominal clock."""
    temp, cf = steady_state(ThermalParams.for_chip(TRN3), TRN3.tdp_w)
    assert temp < 85.0
    assert cf == 1.0


def test_feedback_settles_between_unthrottled_and_fully_throttled() -> None:
    """Throttling lowers power: sustained GEMMs on H100 settle a little below nominal clock, not at the floor."""
    p = ThermalParams.for_chip(H100)
    temp, cf = steady_state_with_feedback(p, lambda c: active_power_w(H100, BIG, clock_factor=c))
    assert 0.85 < cf < 1.0
    assert clock_factor(p, np.asarray(temp)) == pytest.approx(cf, abs=1e-6)


def test_thermal_step_is_exact_and_vectorised() -> None:
    """One step of tau moves 1 - 1/e of the way to the target, for every chip of an array."""
    p = ThermalParams.for_chip(H100)
    temps = np.array([30.0, 60.0, 90.0])
    power = np.array([700.0, 300.0, 90.0])
    out = thermal_step(p, temps, power, p.tau_s)
    target = p.inlet_c + p.r_c_per_w * power
    assert out.shape == (3,)
    np.testing.assert_allclose(out, target + (temps - target) * np.exp(-1.0))
    np.testing.assert_allclose(thermal_step(p, temps, power, 1e6), target)


def test_clock_factor_is_monotone_and_bounded() -> None:
    """Clock is 1 below the throttle start, the floor above the end, and falls in between."""
    p = ThermalParams.for_chip(H100)
    cf = clock_factor(p, np.array([50.0, 85.0, 90.0, 95.0, 120.0]))
    assert cf[0] == cf[1] == 1.0
    assert cf[1] > cf[2] > cf[3] > cf[4]
    assert cf[4] == pytest.approx(p.min_clock_factor)


def test_power_between_idle_and_tdp_and_gemm_near_tdp() -> None:
    """A large GEMM draws near TDP; a streaming kernel draws much less; both within idle..TDP."""
    g = active_power_w(H100, BIG)
    s = active_power_w(H100, STREAM)
    assert H100.idle_w < s < g <= H100.tdp_w
    assert g > 0.85 * H100.tdp_w


def test_lower_clock_lowers_power() -> None:
    """Dynamic power falls with the clock factor."""
    assert active_power_w(H100, BIG, clock_factor=0.8) < active_power_w(H100, BIG)


def test_energy_above_idle_is_power_times_time() -> None:
    """work_energy_above_idle_j = (P - idle) x work time, the sum the chip service integrates."""
    e = work_energy_above_idle_j(H100, BIG, clock_factor=0.9)
    expect = (active_power_w(H100, BIG, clock_factor=0.9) - H100.idle_w) * work_time_s(H100, BIG, clock_factor=0.9)
    assert e == pytest.approx(expect)


def test_link_energy_uses_pj_per_bit() -> None:
    """1 GB over scale-out at 15 pJ/bit costs 0.12 J."""
    assert link_energy_j(0.0, 1e9) == pytest.approx(0.12)


def test_job_cost_is_chip_hours_plus_energy() -> None:
    """Cost = chips x hours x price + kWh x $/kWh."""
    c = job_cost(H100.with_price(2.0), 100, 3600.0, 3.6e9, energy_price_usd_per_kwh=0.1)
    assert c.chip_usd == pytest.approx(200.0)
    assert c.energy_kwh == pytest.approx(1000.0)
    assert c.total_usd == pytest.approx(300.0)
    default = job_cost(H100, 1, 0.0, 3.6e6)
    assert default.energy_usd == pytest.approx(facility().energy_price_usd_per_kwh)
    with pytest.raises(SpecError):
        job_cost(H100, 1, 1.0, 1.0, energy_price_usd_per_kwh=-1)
