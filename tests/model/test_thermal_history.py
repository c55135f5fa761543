"""Exact thermal history: a chip's temperature and clock are a function of the virtual-time history of its work,
never of when (or how often) anyone looked at it."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from gigacluster.chip.shard import FAULT_SLOW, ChipShard
from gigacluster.hw.catalog import get_chip, get_system
from gigacluster.model import thermal
from gigacluster.model.cadence import Cadence
from gigacluster.model.roofline import Work

H100 = get_chip("h100-sxm")
P = thermal.ThermalParams.for_chip(H100)
GEMM = Work(2 * 8192**3, 3 * 8192**2 * 2, "bf16", "matmul", 10, (8192, 8192, 8192))


def piecewise(temp0: float, t0: float, run: thermal.BusyRun, t: float, dt: float = 1e-3) -> float:
    """The reference: the RC model's exact step over every constant-power piece, cut in ``dt`` slices."""
    temp, now = temp0, t0
    edges = sorted({t0, t, *(x for j in range(run.repeat) for x in (run.cadence.start(j),
                                                                   run.cadence.start(j) + run.dur_s))})
    for a, b in itertools.pairwise(edges):
        if a >= t:
            break
        b = min(b, t)
        busy = any(run.cadence.start(j) <= a < run.cadence.start(j) + run.dur_s for j in range(run.repeat))
        power = run.power_w if busy else H100.idle_w
        while now < b - 1e-12:
            step = min(dt, b - now)
            temp = float(thermal.thermal_step(P, np.asarray(temp), np.asarray(power), step))
            now += step
    return temp


@pytest.mark.parametrize("t", [0.5, 3.0, 7.25, 12.0, 19.9, 40.0])
def test_a_run_with_pauses_has_the_temperature_of_its_pieces_integrated_one_by_one(t: float) -> None:
    """temperature_at over a window's cadence (busy 1.5 s every 2 s, a 3 s pause after repetitions 2 and 5) equals
    the RC model stepped over each constant-power piece, at instants inside busy parts, gaps, pauses and after."""
    run = thermal.BusyRun(Cadence(1.0, 2.0, 8, (2, 5), 3.0), 8, 1.5, 650.0)
    got = float(thermal.temperature_at(P, np.asarray([40.0]), 0.0, run, H100.idle_w, t)[0])
    assert got == pytest.approx(piecewise(40.0, 0.0, run, t), rel=1e-9, abs=1e-9)


def test_a_hundred_thousand_repetitions_cost_no_more_than_a_few() -> None:
    """The closed form over a long uniform window settles where the periodic steady state's temperature is."""
    run = thermal.BusyRun(Cadence(0.0, 1.0, 100_000), 100_000, 0.8, 600.0)
    t = run.cadence.start(99_999)
    got = float(thermal.temperature_at(P, np.asarray([30.0]), 0.0, run, H100.idle_w, t)[0])
    a = math.exp(-1.0 / P.tau_s)
    busy_c, idle_c = P.inlet_c + P.r_c_per_w * 600.0, P.inlet_c + P.r_c_per_w * H100.idle_w
    one = thermal._then(thermal._hold(P, busy_c, 0.8), thermal._hold(P, idle_c, 0.2))
    assert one[0] == pytest.approx(a)
    assert got == pytest.approx(one[1] / (1 - a), rel=1e-9)  # the fixed point of one period's map


def hot_shard() -> ChipShard:
    return ChipShard(H100, get_system("hgx"), offset=0, count=4, start_s=0.0)


def run_steps(s: ChipShard, tick_at: list[float]) -> list[tuple[float, float, float]]:
    """Two devices step back to back (GEMMs at about TDP) with gaps, while ``tick_at`` virtual instants are looked
    at (the telemetry tick); returns every step's (start, end, clock)."""
    out, now, ticks = [], 0.0, sorted(tick_at)
    idx = np.arange(2)
    for k in range(500):
        res = s.execute(idx, [GEMM] * 30, not_before_s=now + (0.05 if k % 7 == 0 else 0.0), now_s=now)
        out.append((res.start_s, res.end_s, res.clock_factor))
        while ticks and ticks[0] <= res.end_s:
            s.tick(ticks.pop(0))
        now = res.end_s
    return out


def test_ticks_at_any_virtual_instants_leave_steps_and_temperatures_unchanged() -> None:
    """The same work with no tick, a tick every 0.5 s and ticks at random instants gives bit-identical step times
    and clocks (the chips throttle along the way) and the same temperature at the same virtual time."""
    rng = np.random.default_rng(7)
    a, b, c = hot_shard(), hot_shard(), hot_shard()
    ra = run_steps(a, [])
    end = ra[-1][1]
    rb = run_steps(b, list(np.arange(0.5, end, 0.5)))
    rc = run_steps(c, list(rng.uniform(0.0, end, 300)))
    assert ra == rb == rc
    assert min(clock for _, _, clock in ra) < 0.999  # the history did heat the chips past the throttle point
    ta, tb, tc = (s.temperature_at(np.arange(4), end) for s in (a, b, c))
    assert np.array_equal(ta, tb) and np.array_equal(ta, tc)
    assert ta[0] > P.throttle_start_c > ta[3]  # busy devices hot, idle ones at the inlet


def test_a_window_on_a_heating_chip_is_cut_where_its_clock_would_change() -> None:
    """A window booked on a chip below its throttle point at full clock ends at the first repetition whose start
    temperature throttles it; a liquid-cooled chip never reaches it, and its windows have no such end."""
    s = hot_shard()
    idx = np.arange(2)
    res = s.execute(idx, [GEMM] * 20, not_before_s=0.0, now_s=0.0)
    dur = res.end_s - res.start_s
    wid, first = s.execute_window(idx, [GEMM] * 20, not_before_s=res.end_s, now_s=res.end_s, period_s=dur * 1.01,
                                  repeat=5000)
    win = s.windows[wid]
    assert first.clock_factor == 1.0 and res.end_s < win.throttle_at_s < win.rep_end_s(win.repeat)
    j = win.cadence.started_before(win.throttle_at_s + 1e-9) - 1
    assert win.cadence.start(j) == win.throttle_at_s
    before, at = (float(s.thermal_clock_at(idx, win.cadence.start(k))[0]) for k in (j - 1, j))
    assert at < 1.0 <= before
    s.cut_windows(idx, win.throttle_at_s)
    nxt = s.execute(idx, [GEMM] * 20, not_before_s=0.0, now_s=win.throttle_at_s)
    assert nxt.start_s == win.throttle_at_s and nxt.clock_factor < 1.0  # the next step, throttled
    liquid = ChipShard(get_chip("trainium3"), get_system("trn3-ultraserver"), offset=0, count=4, start_s=0.0)
    work = [Work(2 * 4096**3, 3 * 4096**2 * 2, "bf16", "matmul", 10, (4096, 4096, 4096))]
    r = liquid.execute(idx, work, not_before_s=0.0, now_s=0.0)
    wid, _ = liquid.execute_window(idx, work, not_before_s=r.end_s, now_s=r.end_s,
                                   period_s=(r.end_s - r.start_s) * 1.01, repeat=5000)
    assert liquid.windows[wid].throttle_at_s == math.inf


def test_a_slow_fault_alone_does_not_end_a_window() -> None:
    """A window on a slowed (not hot) chip holds its clock: the fault factor is part of the window's clock."""
    s = hot_shard()
    idx = np.arange(2)
    s.inject_fault(np.arange(1, 2), FAULT_SLOW, 0.7)
    wid, first = s.execute_window(idx, [GEMM], not_before_s=0.0, now_s=0.0, period_s=1.0, repeat=50)
    assert first.clock_factor == pytest.approx(0.7) and s.windows[wid].throttle_at_s == math.inf


def test_releasing_devices_forgets_the_heat_of_work_that_never_ran() -> None:
    """Work booked ahead and cancelled by a release does not heat the devices: their temperature later is that
    of the history up to the release, then idle."""
    s, ref = hot_shard(), hot_shard()
    idx = np.arange(2)
    for sh in (s, ref):
        sh.execute(idx, [GEMM] * 200, not_before_s=0.0, now_s=0.0)
    s.execute(idx, [GEMM] * 2000, not_before_s=0.0, now_s=5.0)  # booked ahead, then released at 30 s
    s.reset_timing(idx, 30.0)
    end = float(ref.busy_until_s[0])
    assert end < 30.0
    assert s.temperature_at(idx, 60.0)[0] > ref.temperature_at(idx, 60.0)[0]  # it did run from `end` to 30 s
    later = s.temperature_at(idx, 30.0)[0]
    assert s.temperature_at(idx, 90.0)[0] < later  # then idle: cooling
