"""The scheduler's window rules without the mesh: when steps repeat, how many a window holds."""

from __future__ import annotations

import dataclasses

from gigacluster.model.training import StepBreakdown
from gigacluster.scheduler.checkpoint import AsyncCheckpoints
from gigacluster.scheduler.runner import StepResult
from gigacluster.scheduler.window import same_step, shifted, window_steps
from tests.unit.test_scheduler_core import job

BD = StepBreakdown(step_time_s=0.68, compute_s=0.41, exposed_comm_s=0.27, bubble_s=0.0)
REF = StepResult(10.0, BD, 5965.0, {"dp": 0.06}, ((10.2, 10.26), (10.0, 10.03)), 0.41)


def test_a_step_repeats_another_when_its_times_energy_and_collectives_agree() -> None:
    """The next step, moved by one period, repeats the reference; a slower collective or energy does not."""
    nxt = shifted(REF, REF.end_s)
    assert nxt.calls[0] == (REF.calls[0][0] + 0.68, REF.calls[0][1] + 0.68) and same_step(REF, nxt)
    slow = dataclasses.replace(nxt, calls=((nxt.calls[0][0], nxt.calls[0][1] + 0.01), nxt.calls[1]))
    assert not same_step(REF, slow)
    assert not same_step(REF, dataclasses.replace(nxt, above_idle_j=6000.0))
    assert not same_step(REF, dataclasses.replace(nxt, calls=nxt.calls[:1]))


def test_a_window_ends_at_the_next_checkpoint_step_and_the_jobs_last_step() -> None:
    """At step 13 of 100 with checkpoints every 10: 7 steps; the bound and the job's end cut it; one step is
    not a window."""
    j = job(step=13)
    j.steps_total, j.checkpoint_interval_steps = 100, 10
    ck = AsyncCheckpoints()
    assert window_steps(j, ck, 1000, 0.0, 0.68) == 7
    assert window_steps(j, ck, 5, 0.0, 0.68) == 5
    assert window_steps(j, ck, 0, 0.0, 0.68) == 0
    j.step = 98
    assert window_steps(j, ck, 1000, 0.0, 0.68) == 2
    j.step = 99
    assert window_steps(j, ck, 1000, 0.0, 0.68) == 0


def test_a_deferred_checkpoint_ends_the_window_at_the_first_step_after_the_write_in_flight() -> None:
    """A write in flight ending at 3.0 s is durable (and a checkpoint deferred behind it due) after the 5th step of
    0.68 s from 0: the window ends there."""
    j = job(step=20)
    j.steps_total, j.checkpoint_interval_steps = 100, 10
    ck = AsyncCheckpoints(inflight=(10, 3.0), deferred=True)
    assert window_steps(j, ck, 1000, 0.0, 0.68) == 5
    assert window_steps(j, AsyncCheckpoints(deferred=True), 1000, 0.0, 0.68) == 0
    assert window_steps(j, AsyncCheckpoints(inflight=(20, 3.0)), 1000, 0.0, 0.68) == 5  # durable after step 25
