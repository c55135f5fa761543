"""Honest checkpoint durability: a checkpoint counts when its write ends, writes never supersede one
another, and the steps a failure loses are exactly those after the last durable checkpoint."""

from __future__ import annotations

import pytest

from gigacluster.scheduler.checkpoint import AsyncCheckpoints


def simulate(steps: int, step_s: float, interval: int, write_s: float, fail_at_s: float) -> tuple[int, int]:
    """(durable step, lost steps) of a job stepping every ``step_s`` that fails at ``fail_at_s``."""
    c = AsyncCheckpoints()
    t, step = 0.0, 0
    while step < steps and t + step_s <= fail_at_s:
        t += step_s
        step += 1
        c.settle(t)
        if c.due(step, interval, steps):
            c.start(step, t, write_s)
    return c.durable_step, c.lost_steps(step, fail_at_s)


def test_a_write_longer_than_the_interval_still_becomes_durable() -> None:
    """The reported case: interval 10 steps of 1 s, a 16 s write. The old code superseded every write
    (durable stayed 0 to step 98); now the step-10 write ends at 26 s and counts."""
    durable, lost = simulate(1000, 1.0, 10, 16.0, 98.5)
    assert durable > 0
    # writes: step 10 (ends 26), deferred to 26 (ends 42), 42 (58), 58 (74), 74 (90), 90 (106: in flight)
    assert durable == 74
    assert lost == 98 - 74


def test_lost_steps_are_exactly_the_steps_after_the_durable_checkpoint() -> None:
    """A write still in flight at the failure does not count; one that ended before it does."""
    c = AsyncCheckpoints()
    c.start(10, 10.0, 5.0)
    assert c.lost_steps(14, 14.9) == 14  # write of step 10 ends at 15: not durable yet
    assert c.durable_step == 0
    assert c.lost_steps(16, 15.0) == 6  # ended exactly at the failure: durable
    assert c.durable_step == 10


def test_a_checkpoint_due_during_a_write_is_deferred_not_stacked() -> None:
    """While a write is in flight no second one starts; the next starts at the first boundary after it ends."""
    c = AsyncCheckpoints()
    assert c.due(10, 10, 100)
    c.start(10, 10.0, 25.0)
    assert not c.due(20, 10, 100)  # due, but the step-10 write runs until 35
    with pytest.raises(ValueError):
        c.start(20, 20.0, 25.0)
    assert not c.due(21, 10, 100)
    c.settle(35.0)
    assert c.durable_step == 10
    assert c.due(35, 10, 100)  # the deferred checkpoint, at the first boundary after the write
    c.start(35, 35.0, 25.0)
    assert not c.due(36, 10, 100)


def test_no_checkpoint_at_the_last_step_or_without_an_interval() -> None:
    """The job's end is its own checkpoint; interval 0 means no checkpoints."""
    c = AsyncCheckpoints()
    assert not c.due(100, 10, 100)
    assert not c.due(10, 0, 100)


def test_preemption_flush_waits_for_the_write_in_flight() -> None:
    """A synchronous checkpoint at eviction starts after the in-flight write and then writes its own."""
    c = AsyncCheckpoints()
    c.start(10, 10.0, 20.0)
    assert c.flush_end(12.0, 20.0) == 50.0
    assert AsyncCheckpoints().flush_end(12.0, 20.0) == 32.0
