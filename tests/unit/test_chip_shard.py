"""The chip shard's pure behaviour: lock-step timing, busy-until, energy booking, faults."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.chip.shard import FAILED, FAULT_FAILED, FAULT_SLOW, ChipShard
from gigacluster.errors import FailedPrecondition, InvalidArgument, NotFound
from gigacluster.hw.catalog import get_chip, get_system
from gigacluster.model.power import work_energy_above_idle_j
from gigacluster.model.roofline import Work, work_time_s

GEMM = Work(2 * 8192**3, 3 * 8192**2 * 2, "bf16", "matmul", 10, (8192, 8192, 8192))


def shard(n: int = 64, offset: int = 128) -> ChipShard:
    return ChipShard(get_chip("h100-sxm"), get_system("hgx"), offset=offset, count=n, start_s=0.0)


def test_work_lasts_its_roofline_time_and_queues_behind_busy_devices() -> None:
    """A group runs for work_time_s; a second call on an overlapping group starts when the first ends."""
    s = shard()
    chip = get_chip("h100-sxm")
    d = work_time_s(chip, GEMM)
    r1 = s.execute(np.arange(0, 8), [GEMM], not_before_s=5.0, now_s=1.0)
    assert (r1.start_s, r1.end_s) == (5.0, pytest.approx(5.0 + d))
    r2 = s.execute(np.arange(4, 12), [GEMM], not_before_s=5.0, now_s=1.0)
    assert r2.start_s == pytest.approx(r1.end_s)
    assert r1.energy_j == pytest.approx(8 * work_energy_above_idle_j(chip, GEMM))


def test_late_calls_are_backdated_to_not_before() -> None:
    """RPC latency does not leak: a call arriving at now=10 with not_before=9 starts at 9 on idle devices."""
    r = shard().execute(np.arange(8), [GEMM], not_before_s=9.0, now_s=10.0)
    assert r.start_s == 9.0


def test_energy_is_idle_floor_plus_work_above_idle() -> None:
    """Shard energy at t = idle power x devices x t + the energy booked by work."""
    s = shard(n=8)
    r = s.execute(np.arange(8), [GEMM], not_before_s=0.0, now_s=0.0)
    e = s.energy_j(100.0).sum()
    assert e == pytest.approx(get_chip("h100-sxm").idle_w * 8 * 100.0 + r.energy_j)


def test_slow_fault_stretches_work_and_failed_device_refuses_it() -> None:
    """A SLOW fault at clock 0.5 doubles compute-bound work; a FAILED device fails the group's work."""
    s = shard(n=16)
    base = s.execute(np.arange(0, 8), [GEMM], not_before_s=0.0, now_s=0.0)
    s.inject_fault(np.arange(8, 16), FAULT_SLOW, 0.5)
    slow = s.execute(np.arange(8, 16), [GEMM], not_before_s=0.0, now_s=0.0)
    assert (slow.end_s - slow.start_s) > 1.9 * (base.end_s - base.start_s)
    s.inject_fault(np.array([3]), FAULT_FAILED)
    assert s.state()[3] == FAILED
    with pytest.raises(FailedPrecondition, match="device 131 has failed"):
        s.execute(np.arange(0, 8), [GEMM], not_before_s=0.0, now_s=0.0)
    assert s.clear_fault(np.arange(16)) == 9
    s.execute(np.arange(0, 8), [GEMM], not_before_s=0.0, now_s=0.0)


def test_addressing_names_the_bad_range() -> None:
    """Ranges outside the shard are NOT_FOUND with the shard's range; empty or inverted ranges INVALID_ARGUMENT."""
    s = shard(n=64, offset=128)
    assert list(s.local([(130, 132)])) == [2, 3]
    with pytest.raises(NotFound, match=r"hosts 128\.\.191"):
        s.local([(100, 140)])
    with pytest.raises(InvalidArgument, match=r"devices\[0\]"):
        s.local([(140, 140)])
    with pytest.raises(InvalidArgument):
        s.local([])


def test_tick_reports_utilization_and_power_and_heats_busy_chips() -> None:
    """After a busy interval, the tick reports utilisation 1 on busy devices, more power, and a warmer chip."""
    s = shard(n=8)
    for _ in range(20):
        s.execute(np.arange(4), [GEMM], not_before_s=0.0, now_s=0.0)
    busy_until = float(s.busy_until_s[:4].max())
    snap = s.tick(busy_until)
    assert s.utilization[:4] == pytest.approx(1.0) and s.utilization[4:].max() == 0.0
    assert snap.power_w > 8 * get_chip("h100-sxm").idle_w
    assert s.temp_c[:4].min() > s.temp_c[4:].max()


def test_nitro_virtualization_has_a_measurable_cost() -> None:
    """With the Nitro-like overhead on, the same work takes 1/0.99 as long plus 20 us per call
    (security/overhead.py assumptions); bare metal has none."""
    from gigacluster.security.overhead import VirtualizationOverhead

    bare = shard(n=8)
    nitro = ChipShard(get_chip("h100-sxm"), get_system("hgx"), offset=128, count=8, start_s=0.0,
                      overhead=VirtualizationOverhead())
    a = bare.execute(np.arange(8), [GEMM], not_before_s=0.0, now_s=0.0)
    b = nitro.execute(np.arange(8), [GEMM], not_before_s=0.0, now_s=0.0)
    ratio = (b.end_s - b.start_s - 20e-6) / (a.end_s - a.start_s)
    assert 1.0 < ratio <= 1 / 0.99 + 1e-9
