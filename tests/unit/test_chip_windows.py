"""The chip shard's steady-state windows: K repetitions booked exactly, and cut back to what ran."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.chip.shard import ChipShard
from gigacluster.errors import WINDOW_NOT_STEADY, FailedPrecondition, InvalidArgument
from gigacluster.hw.catalog import get_chip, get_system
from gigacluster.model.roofline import Work

GEMM = Work(2 * 8192**3, 3 * 8192**2 * 2, "bf16", "matmul", 10, (8192, 8192, 8192))
IDX = np.arange(8)


def shard() -> ChipShard:
    return ChipShard(get_chip("h100-sxm"), get_system("hgx"), offset=0, count=16, start_s=0.0)


def per_step(k: int, period: float) -> ChipShard:
    """The reference: the same work booked one ExecuteWork per step."""
    s = shard()
    for j in range(k):
        s.execute(IDX, [GEMM], not_before_s=j * period, now_s=0.0)
    return s


def test_a_window_books_exactly_k_repetitions_of_the_step() -> None:
    """Busy time, energy and busy-until of a K-step window equal K ExecuteWork calls of the same work."""
    s = shard()
    wid, first = s.execute_window(IDX, [GEMM], not_before_s=0.0, now_s=0.0, period_s=1.0, repeat=50)
    ref = per_step(50, 1.0)
    assert s.busy_s[IDX] == pytest.approx(ref.busy_s[IDX], rel=1e-12)
    assert s.above_idle_j[IDX] == pytest.approx(ref.above_idle_j[IDX], rel=1e-12)
    assert s.busy_until_s[IDX] == pytest.approx(ref.busy_until_s[IDX])
    assert s.energy_j(60.0).sum() == pytest.approx(ref.energy_j(60.0).sum(), rel=1e-12)
    assert s.accrued(60.0)[0] == pytest.approx(ref.accrued(60.0)[0])
    assert first.start_s == 0.0 and s.windows[wid].repeat == 50


def test_a_cut_keeps_the_repetitions_started_before_it_and_unbooks_the_rest() -> None:
    """Cut at 20.5 s: 21 repetitions stay booked (the 21st started at 20 s), as 21 per-step calls would be."""
    s = shard()
    wid, _ = s.execute_window(IDX, [GEMM], not_before_s=0.0, now_s=0.0, period_s=1.0, repeat=50)
    assert s.cut_windows(np.array([3]), 20.5) == {wid: 21}
    ref = per_step(21, 1.0)
    assert s.busy_s[IDX] == pytest.approx(ref.busy_s[IDX], rel=1e-12)
    assert s.above_idle_j[IDX] == pytest.approx(ref.above_idle_j[IDX], rel=1e-12)
    assert s.busy_until_s[IDX] == pytest.approx(ref.busy_until_s[IDX])
    nxt = s.execute(IDX, [GEMM], not_before_s=21.0, now_s=21.0)
    assert nxt.start_s == 21.0  # the per-step path goes on at once
    assert s.cut_windows(IDX, 40.0) == {}  # nothing left beyond: a later cut changes nothing


def test_a_cut_at_a_step_boundary_keeps_that_step_out_and_a_window_elsewhere_is_untouched() -> None:
    """A cut exactly at a repetition's start drops it (float noise in the boundary does not keep it); windows on
    other devices stay; a cut at the window's start drops it whole."""
    s = shard()
    wid, _ = s.execute_window(IDX, [GEMM], not_before_s=0.0, now_s=0.0, period_s=0.1, repeat=30)
    other, _ = s.execute_window(np.arange(8, 16), [GEMM], not_before_s=0.0, now_s=0.0, period_s=0.1, repeat=30)
    assert s.cut_windows(IDX, 0.1 * 7 * (1 + 1e-15)) == {wid: 7}
    assert s.windows[other].repeat == 30
    assert s.cut_windows(np.arange(8, 16), 0.0) == {other: 0} and other not in s.windows


def test_a_release_unbooks_a_windows_future_repetitions() -> None:
    """reset_timing (an instance released) at 10.5 s leaves the busy time of the repetitions run by then."""
    s = shard()
    s.execute_window(IDX, [GEMM], not_before_s=0.0, now_s=0.0, period_s=1.0, repeat=50)
    s.reset_timing(IDX, 10.5)
    ref = per_step(11, 1.0)
    ref.reset_timing(IDX, 10.5)
    assert s.busy_s[IDX] == pytest.approx(ref.busy_s[IDX], rel=1e-9)
    assert s.above_idle_j[IDX] == pytest.approx(ref.above_idle_j[IDX], rel=1e-9)


def test_a_window_needs_a_period_no_shorter_than_its_work_and_leaves_nothing_booked_if_refused() -> None:
    """period_s not positive or repeat 0 is INVALID_ARGUMENT; a period shorter than the work takes on the devices
    now (a slow chip) is FAILED_PRECONDITION with reason WINDOW_NOT_STEADY, for the caller to run single steps;
    nothing is booked either way."""
    s = shard()
    with pytest.raises(FailedPrecondition, match="period_s") as exc:
        s.execute_window(IDX, [GEMM], not_before_s=0.0, now_s=0.0, period_s=1e-6, repeat=5)
    assert exc.value.reason == WINDOW_NOT_STEADY
    with pytest.raises(InvalidArgument, match="period_s"):
        s.execute_window(IDX, [GEMM], not_before_s=0.0, now_s=0.0, period_s=-1.0, repeat=5)
    with pytest.raises(InvalidArgument, match="repeat"):
        s.execute_window(IDX, [GEMM], not_before_s=0.0, now_s=0.0, period_s=1.0, repeat=0)
    assert s.busy_s.sum() == 0.0 and s.above_idle_j.sum() == pytest.approx(0.0) and not s.windows


def test_a_window_with_checkpoint_pauses_books_as_per_step_calls_at_the_paused_starts() -> None:
    """Pauses of 0.5 s after repetitions 2 and 5: the same books as ExecuteWork at those starts; a cut inside the
    second pause keeps 6 repetitions; bad pause lists are INVALID_ARGUMENT with nothing booked."""
    s = shard()
    wid, _ = s.execute_window(IDX, [GEMM], not_before_s=0.0, now_s=0.0, period_s=1.0, repeat=10, pause_after=[2, 5],
                              pause_s=0.5)
    ref = shard()
    for j in range(10):
        ref.execute(IDX, [GEMM], not_before_s=j + 0.5 * ((j > 2) + (j > 5)), now_s=0.0)
    assert s.busy_until_s[IDX] == pytest.approx(ref.busy_until_s[IDX])
    assert s.busy_s[IDX] == pytest.approx(ref.busy_s[IDX], rel=1e-12)
    assert s.cut_windows(IDX, 6.8) == {wid: 6}  # rep 5 started at 6.0, rep 6 starts at 7.0
    for bad in ([5, 2], [9], [-1]):
        with pytest.raises(InvalidArgument, match="pause_after"):
            shard().execute_window(IDX, [GEMM], not_before_s=0.0, now_s=0.0, period_s=1.0, repeat=10,
                                   pause_after=bad, pause_s=0.5)
    with pytest.raises(InvalidArgument, match="pause_s"):
        shard().execute_window(IDX, [GEMM], not_before_s=0.0, now_s=0.0, period_s=1.0, repeat=10, pause_after=[2],
                               pause_s=float("nan"))
