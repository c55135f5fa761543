"""First-order RC thermal model of an accelerator and its clock throttling.

Each chip is one thermal mass ``C`` behind one thermal resistance ``R`` to its coolant::

    C dT/dt = P - (T - T_inlet) / R

``R`` is set so that a chip at sustained TDP would settle at ``temp_at_tdp_c`` (catalog section
``thermal``, per cooling class), and ``C = tau_s / R``. Clocks hold nominal up to
``throttle_start_c`` and fall linearly to ``min_clock_factor`` at ``throttle_full_c``. With the
catalog's parameters an air-cooled chip at sustained TDP crosses the throttle point (it settles
a few percent below nominal clock, because throttling also lowers its power), while a
liquid-cooled chip stays well below it and holds its clocks.

A chip's power is piecewise constant in virtual time (idle, or a work item's mean power while it runs), so its
temperature has a closed form between any two instants: :func:`temperature_at` integrates it exactly over a
run of busy repetitions (one work item, or a steady-state window's cadence) from a known temperature. The chip
shard takes the temperature, and so the clock, from that history at the virtual times work starts, never from
when a telemetry tick happened to run (the event clock's reproducibility, docs/architecture.md).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Protocol

import numpy as np

from gigacluster.hw.catalog import Chip, _raw
from gigacluster.model import SpecError
from gigacluster.model.cadence import Cadence


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


Affine = tuple[float, float]  # T -> a * T + b: what a stretch of known power does to any starting temperature


def _then(f: Affine, g: Affine) -> Affine:
    """``f`` followed by ``g``."""
    return g[0] * f[0], g[0] * f[1] + g[1]


def _hold(params: ThermalParams, target_c: float, dt_s: float) -> Affine:
    """``dt_s`` seconds at the power whose settled temperature is ``target_c`` (the exact RC solution)."""
    a = math.exp(-max(dt_s, 0.0) / params.tau_s)
    return a, (1.0 - a) * target_c


def _times(params: ThermalParams, f: Affine, period_s: float, m: int) -> Affine:
    """``f`` (a map over ``period_s`` seconds) ``m`` times over: a geometric series, in closed form."""
    if m <= 0:
        return 1.0, 0.0
    if m == 1:
        return f
    x = -period_s / params.tau_s
    return math.exp(m * x), f[1] * math.expm1(m * x) / math.expm1(x)


class Run(Protocol):
    """``repeat`` busy intervals of ``dur_s`` at ``power_w``, repetition j starting at ``cadence.start(j)``, idle
    power in between: one work item (``repeat`` 1) or a steady-state window's steps (the chip shard's window,
    whose ``repeat`` shrinks when it is cut)."""

    @property
    def cadence(self) -> Cadence: ...
    @property
    def repeat(self) -> int: ...
    @property
    def dur_s(self) -> float: ...
    @property
    def power_w(self) -> float: ...


@dataclasses.dataclass(frozen=True)
class BusyRun:
    """A :class:`Run` of its own (one work item, or a test's)."""

    cadence: Cadence
    repeat: int
    dur_s: float
    power_w: float

    @classmethod
    def item(cls, start_s: float, dur_s: float, power_w: float) -> BusyRun:
        """One busy interval ``[start_s, start_s + dur_s)``."""
        return cls(Cadence(start_s, dur_s, 1), 1, dur_s, power_w)


def run_affine(params: ThermalParams, run: Run, idle_w: float, t_s: float) -> Affine:
    """The map from the temperature at ``run.start_s`` to the temperature at ``t_s >= run.start_s``; cost in the
    number of pauses the run has, never in its repetitions."""
    idle_c = params.inlet_c + params.r_c_per_w * idle_w
    busy_c = params.inlet_c + params.r_c_per_w * run.power_w
    cad, d = run.cadence, run.dur_s
    n = min(cad.started_before(t_s), run.repeat)  # repetitions begun by t_s (the last one perhaps in progress)
    if n == 0 or t_s <= cad.start_s:
        return 1.0, 0.0
    busy = _hold(params, busy_c, d)
    f: Affine = (1.0, 0.0)
    j = 0  # repetitions 0 .. n-2 are whole: busy, then idle up to the next one's start
    pauses = cad.pause_after[: bisect.bisect_left(cad.pause_after, n - 1)]
    for p in (*pauses, n - 1):
        plain = _then(busy, _hold(params, idle_c, cad.period_s - d))
        f = _then(f, _times(params, plain, cad.period_s, p - j))  # repetitions j .. p-1 are plain periods
        if p < n - 1:  # repetition p: its period plus the pause
            f = _then(f, _then(busy, _hold(params, idle_c, cad.period_s - d + cad.pause_s)))
        j = p + 1
    into = t_s - cad.start(n - 1)  # the last repetition begun: busy up to d, idle after
    f = _then(f, _hold(params, busy_c, min(into, d)))
    return _then(f, _hold(params, idle_c, into - d))


def temperature_at(params: ThermalParams, temp0_c: np.ndarray, t0_s: np.ndarray | float, run: Run | None,
                   idle_w: float, t_s: float) -> np.ndarray:
    """Temperatures at ``t_s`` of chips that were at ``temp0_c`` at ``t0_s`` (at or before ``run.start_s``), idle
    until ``run`` and then running it (``None``: idle throughout). Exact, and a function of these arguments only,
    so the same history gives the same temperature however often, and whenever, anyone asks."""
    idle_c = params.inlet_c + params.r_c_per_w * idle_w
    temp = np.asarray(temp0_c, dtype=float)
    until = t_s if run is None else min(t_s, run.cadence.start_s)
    lead = np.clip(until - np.asarray(t0_s, dtype=float), 0.0, None)
    temp = idle_c + (temp - idle_c) * np.exp(-lead / params.tau_s)
    if run is None or t_s <= run.cadence.start_s:
        return temp
    a, b = run_affine(params, run, idle_w, t_s)
    return a * temp + b


def throttle_change_s(params: ThermalParams, run: Run, idle_w: float, temps_c: np.ndarray,
                      factors: np.ndarray, clock0: float, rel_tol: float = 1e-9) -> float:
    """The start of the first repetition of ``run`` (after the first) at which the group's clock, the slowest of
    ``clock_factor(T) x factor`` over chips at ``temps_c`` at the run's start with fault factors ``factors``, would
    differ from ``clock0`` by more than ``rel_tol``: where a window booked at ``clock0`` stops being what single
    steps would run. ``inf`` when it never does (a chip that cannot reach its throttle point: no search at all)."""
    idle_c = params.inlet_c + params.r_c_per_w * idle_w
    busy_c = params.inlet_c + params.r_c_per_w * run.power_w
    t0 = np.asarray(temps_c, dtype=float)
    if (max(float(t0.max()), busy_c, idle_c) <= params.throttle_start_c
            and abs(float(np.min(factors)) - clock0) <= rel_tol * clock0):
        return math.inf  # every repetition starts below the throttle point: the clock never moves
    # The clock falls with temperature and every chip sees the same map, so the hottest chip of each fault
    # factor decides the group's clock.
    fs = np.unique(factors)
    hottest = np.array([t0[factors == f].max() for f in fs])
    cad, d = run.cadence, run.dur_s
    busy = _hold(params, busy_c, d)
    plain = _then(busy, _hold(params, idle_c, cad.period_s - d))
    paused = _then(busy, _hold(params, idle_c, cad.period_s - d + cad.pause_s))
    pause_at = set(cad.pause_after)
    a, b = 1.0, 0.0
    last = None
    for j in range(1, run.repeat):
        a, b = _then((a, b), paused if (j - 1) in pause_at else plain)
        temps = a * hottest + b
        cf = float(np.min(clock_factor(params, temps) * fs))
        if abs(cf - clock0) > rel_tol * clock0:
            return cad.start(j)
        if last is not None and float(np.max(np.abs(temps - last))) < 1e-12 and not pause_at:
            return math.inf  # settled: every later repetition starts at this temperature
        last = temps
    return math.inf
