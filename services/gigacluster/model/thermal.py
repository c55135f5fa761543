"""First-order RC thermal model of an accelerator and its clock throttling.

Each chip is one thermal mass ``C`` behind one thermal resistance ``R`` to its coolant::

    C dT/dt = P - (T - T_inlet) / R

``R`` is set so that a chip at sustained TDP would settle at ``temp_at_tdp_c`` (catalog section
``thermal``, per cooling class), and ``C = tau_s / R``. Clocks hold nominal up to
``throttle_start_c`` and fall linearly to ``min_clock_factor`` at ``throttle_full_c``. With the
catalog's parameters an air-cooled chip at sustained TDP crosses the throttle point (it settles
a few percent below nominal clock, because throttling also lowers its power), while a
liquid-cooled chip stays well below it and holds its clocks.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from gigacluster.hw.catalog import Chip, _raw
from gigacluster.model import SpecError


@dataclasses.dataclass(frozen=True)
class ThermalParams:
    """RC parameters of one chip type (see module docstring)."""

    inlet_c: float
    r_c_per_w: float
    c_j_per_c: float
    throttle_start_c: float
    throttle_full_c: float
    min_clock_factor: float

    def __post_init__(self) -> None:
        if self.r_c_per_w <= 0 or self.c_j_per_c <= 0:
            raise SpecError("thermal", "r_c_per_w and c_j_per_c must be > 0")
        if not self.throttle_start_c < self.throttle_full_c:
            raise SpecError("thermal.throttle_full_c", "must be above throttle_start_c")
        if not 0 < self.min_clock_factor <= 1:
            raise SpecError("thermal.min_clock_factor", "must be in (0, 1]")

    @property
    def tau_s(self) -> float:
        """Thermal time constant R x C."""
        return self.r_c_per_w * self.c_j_per_c

    @classmethod
    def for_chip(cls, chip: Chip) -> ThermalParams:
        """Parameters for ``chip`` from its cooling class and TDP."""
        section = _raw().get("thermal", {})
        if chip.cooling not in section:
            raise SpecError("thermal", f"catalog has no thermal class {chip.cooling!r}")
        c = section[chip.cooling]
        inlet = float(c["inlet_c"])
        r = (float(c["temp_at_tdp_c"]) - inlet) / chip.tdp_w
        return cls(
            inlet_c=inlet,
            r_c_per_w=r,
            c_j_per_c=float(c["tau_s"]) / r,
            throttle_start_c=float(c["throttle_start_c"]),
            throttle_full_c=float(c["throttle_full_c"]),
            min_clock_factor=float(c["min_clock_factor"]),
        )


def thermal_step(params: ThermalParams, temp_c: np.ndarray, power_w: np.ndarray, dt_s: float) -> np.ndarray:
    """Temperatures after ``dt_s`` seconds at constant ``power_w`` (exact solution, any dt)."""
    if dt_s < 0:
        raise SpecError("dt_s", f"must be >= 0, got {dt_s!r}")
    temp = np.asarray(temp_c, dtype=float)
    target = params.inlet_c + params.r_c_per_w * np.asarray(power_w, dtype=float)
    decay = math.exp(-dt_s / params.tau_s)
    return target + (temp - target) * decay


def clock_factor(params: ThermalParams, temp_c: np.ndarray) -> np.ndarray:
    """Clock as a fraction of nominal at ``temp_c`` (1.0 = nominal)."""
    temp = np.asarray(temp_c, dtype=float)
    span = params.throttle_full_c - params.throttle_start_c
    drop = np.clip((temp - params.throttle_start_c) / span, 0.0, 1.0) * (1.0 - params.min_clock_factor)
    return 1.0 - drop


def steady_state(params: ThermalParams, power_w: float) -> tuple[float, float]:
    """(temperature, clock factor) a chip settles at under constant ``power_w``."""
    temp = params.inlet_c + params.r_c_per_w * power_w
    return temp, float(clock_factor(params, np.asarray(temp)))


def steady_state_with_feedback(params: ThermalParams, power_at_clock_w: object) -> tuple[float, float]:
    """Fixed point where the chip's power at its throttled clock holds it at that clock.

    ``power_at_clock_w(cf) -> watts`` must rise with ``cf``. Throttling lowers the power, which
    lowers the temperature, so the settled clock lies between the two; found by bisection.
    """
    f = power_at_clock_w
    if not callable(f):
        raise SpecError("power_at_clock_w", "must be callable")

    def gap(cf: float) -> float:
        return steady_state(params, float(f(cf)))[1] - cf

    if gap(1.0) >= 0:
        return steady_state(params, float(f(1.0)))[0], 1.0
    lo, hi = params.min_clock_factor, 1.0
    if gap(lo) <= 0:
        return steady_state(params, float(f(lo)))[0], lo
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if gap(mid) > 0:
            lo = mid
        else:
            hi = mid
    cf = 0.5 * (lo + hi)
    return steady_state(params, float(f(cf)))[0], cf
