"""The scheduler's window rules without the mesh: when steps repeat, how many a window holds."""

from __future__ import annotations

import dataclasses
import itertools
import types
from typing import Any

import pytest

from gigacluster.model.training import StepBreakdown
from gigacluster.scheduler.checkpoint import AsyncCheckpoints
from gigacluster.scheduler.core import JobRecord
from gigacluster.scheduler.runner import StepResult
from gigacluster.scheduler.window import alike, alone_reference, carried_reference, shifted, window_plan
from tests.unit.test_scheduler_core import job

BD = StepBreakdown(step_time_s=0.68, compute_s=0.41, exposed_comm_s=0.27, bubble_s=0.0)
REF = StepResult(10.0, BD, 5965.0, {"dp": 0.06}, ((10.2, 10.26), (10.0, 10.03)), 0.41)


def test_a_step_is_alike_another_when_its_compute_energy_and_call_times_agree() -> None:
    """The next step, moved by one period, is alike; one whose collective took longer still is (the window asks
    the fabric for the step alone); other energy, a call starting later or a missing call is not."""
    nxt = shifted(REF, REF.end_s)
    assert nxt.calls[0] == (REF.calls[0][0] + 0.68, REF.calls[0][1] + 0.68) and alike(REF, nxt)
    slow = dataclasses.replace(nxt, calls=((nxt.calls[0][0], nxt.calls[0][1] + 0.01), nxt.calls[1]))
    assert alike(REF, slow)
    late = dataclasses.replace(nxt, calls=((nxt.calls[0][0] + 0.01, nxt.calls[0][1] + 0.01), nxt.calls[1]))
    assert not alike(REF, late)
    assert not alike(REF, dataclasses.replace(nxt, above_idle_j=6000.0))
    assert not alike(REF, dataclasses.replace(nxt, calls=nxt.calls[:1]))


def _per_step(j: JobRecord, ck: AsyncCheckpoints, k: int, t: float, period: float, pause: float,
              write: float) -> list[int]:
    """The window steps (0-based) a per-step loop pauses after: after_step's order (settle, due, start)."""
    out = []
    for i in range(k - 1):
        t += period
        ck.settle(t)
        if ck.due(j.step + i + 1, j.checkpoint_interval_steps, j.steps_total):
            out.append(i)
            t += pause
            ck.start(j.step + i + 1, t, write)
    return out


def test_a_window_spans_checkpoints_with_their_pauses_and_ends_at_the_jobs_last_step() -> None:
    """At step 13 of 100 with checkpoints every 10: 87 steps pausing after steps 20, 30, ..., 90 (not after the last);
    the bound and the job's end cut it; one step is not a window."""
    j = job(step=13)
    j.steps_total, j.checkpoint_interval_steps = 100, 10
    ck = AsyncCheckpoints()
    assert window_plan(j, ck, 1000, 0.0, 0.68, 0.5, 1.0) == (87, (6, 16, 26, 36, 46, 56, 66, 76))
    assert window_plan(j, ck, 5, 0.0, 0.68, 0.5, 1.0) == (5, ())
    assert window_plan(j, ck, 0, 0.0, 0.68, 0.5, 1.0) == (0, ())
    assert ck == AsyncCheckpoints()  # planning does not touch the job's own checkpoint state
    j.step = 98
    assert window_plan(j, ck, 1000, 0.0, 0.68, 0.5, 1.0) == (2, ())
    j.step = 99
    assert window_plan(j, ck, 1000, 0.0, 0.68, 0.5, 1.0) == (0, ())


def test_deferred_checkpoints_pause_where_the_per_step_loop_would() -> None:
    """A write longer than the interval defers checkpoints to the first step after it ends: the window's pauses are
    the per-step loop's, from a write in flight, a deferred one, or none; a deferred one due now is the loop's."""
    j = job(step=20)
    j.steps_total, j.checkpoint_interval_steps = 500, 10
    for ck in (AsyncCheckpoints(inflight=(10, 3.0), deferred=True), AsyncCheckpoints(inflight=(20, 3.0)),
               AsyncCheckpoints()):
        k, pauses = window_plan(j, ck, 400, 0.0, 0.68, 0.5, 10.0)
        assert k == 400 and pauses == tuple(_per_step(j, dataclasses.replace(ck), k, 0.0, 0.68, 0.5, 10.0))
        assert pauses and all(b - a > 10 for a, b in itertools.pairwise(pauses))  # writes outlast 10 steps
    assert window_plan(j, AsyncCheckpoints(inflight=(10, 3.0), deferred=True), 400, 0.0, 0.68, 0.5, 10.0)[1][0] == 4
    assert window_plan(j, AsyncCheckpoints(deferred=True), 1000, 0.0, 0.68, 0.5, 1.0) == (0, ())


def _runner(names: list[str]) -> Any:
    """The parts of a JobRunner the reference builders read: its calls (names) and the job's plan."""
    return types.SimpleNamespace(collective_calls=[(n, None) for n in names], call_samples=[0] * len(names),
                                 job=job())


def test_a_steady_step_is_carried_onto_a_placement_with_another_number_of_calls_per_demand() -> None:
    """After a restart the data-parallel demand splits into three calls instead of one: each new call takes its
    demand's offset and duration; the step is composed as the per-step path would; a missing demand gives None."""
    names = ("tp", "dp_grad", "dp_param")
    ref = StepResult(10.0, BD, 5965.0, {}, ((10.2, 10.201), (10.3, 10.36), (10.0, 10.03)), 0.41)
    new = _runner(["tp", "dp_grad", "dp_grad", "dp_grad", "dp_param"])
    got = carried_reference(new, ref, names)
    assert got is not None and got.start_s == 10.0 and got.chip_s == 0.41 and got.above_idle_j == 5965.0
    assert [round(b - a, 6) for a, b in got.calls] == [0.001, 0.06, 0.06, 0.06, 0.03]
    assert [round(a - 10.0, 6) for a, _ in got.calls] == [0.2, 0.3, 0.3, 0.3, 0.0]
    assert got.comm_s["tp"] == pytest.approx(0.001 * 2560) and got.comm_s["dp_grad"] == pytest.approx(0.06)
    assert carried_reference(_runner(["tp", "ep"]), ref, names) is None


def test_the_alone_reference_takes_the_fabrics_durations() -> None:
    """The fabric's durations alone replace the reference's; the step time follows them."""
    ref = StepResult(10.0, BD, 5965.0, {}, ((10.2, 10.201), (10.3, 10.36), (10.0, 10.03)), 0.41)
    r = _runner(["tp", "dp_grad", "dp_param"])
    slow = alone_reference(r, ref, (0.001, 0.5, 0.03))
    fast = alone_reference(r, ref, (0.001, 0.06, 0.03))
    assert slow.calls[1] == pytest.approx((10.3, 10.8)) and slow.comm_s["dp_grad"] == pytest.approx(0.5)
    assert slow.breakdown.step_time_s >= fast.breakdown.step_time_s


def test_a_windows_steps_are_the_reference_moved_with_their_calls_moved_when_read() -> None:
    """shifted() copies the reference's fields and moves its calls only when read: equal, field for field, to the
    reference rebuilt at the new start with every call moved; a shift of a shift moves the moved calls (the same
    sums as one move at a time), without a chain."""
    from gigacluster.scheduler.window import ShiftedCalls

    def moved(r: StepResult, t: float) -> StepResult:  # what shifted() made before
        dt = t - r.start_s
        return dataclasses.replace(r, start_s=t, calls=tuple((a + dt, b + dt) for a, b in r.calls))

    one, two = shifted(REF, 10.68), moved(REF, 10.68)
    assert one == two and one.end_s == two.end_s and len(one.calls) == 2 and one.calls[1] == two.calls[1]
    again = shifted(one, 11.36)
    assert again == moved(two, 11.36) and list(again.calls) == list(moved(two, 11.36).calls)
    assert isinstance(again.calls, ShiftedCalls) and not isinstance(again.calls._base, ShiftedCalls)
    assert hash(one.calls) == hash(two.calls) and repr(one.calls) == repr(two.calls)
