"""The event-clock dispatcher's unprompted passes (scheduler/passes.py)."""

from __future__ import annotations

import math

from gigacluster.scheduler.passes import NextPass, next_event_pass

KW = {"interval_s": 10.0, "wall_interval_s": 10.0}


def test_a_queued_job_on_an_otherwise_idle_mesh_makes_no_virtual_wakeup() -> None:
    """With nothing else pending in the mesh, the retry of a job that cannot start waits in wall time: a
    virtual poll would be the mesh's only event, and time would race from poll to poll (an idle stack with a
    blocked job advanced ~70 times a wall second, virtual time ~700x wall time, for as long as it was left)."""
    nxt = next_event_pass(now_s=100.0, queued=True, others_wake_s=math.inf, quarantine_ends_s=[None], **KW)
    assert nxt == NextPass(at_s=None, wall_s=10.0)


def test_while_time_moves_the_queue_is_looked_at_every_interval_of_virtual_time() -> None:
    """Another process's pending wake-up moves time anyway: the pass polls every ``interval_s`` virtual s."""
    nxt = next_event_pass(now_s=100.0, queued=True, others_wake_s=100.5, quarantine_ends_s=[], **KW)
    assert nxt == NextPass(at_s=110.0)


def test_on_an_idle_mesh_time_jumps_straight_to_a_quarantine_end() -> None:
    """The earliest quarantine still ahead is the one time-driven change left: one wake-up, not a poll per
    interval up to it (ended quarantines and ones lifted by the chip's health are not waited for)."""
    nxt = next_event_pass(now_s=100.0, queued=True, others_wake_s=math.inf,
                          quarantine_ends_s=[None, 50.0, 3700.0, 1900.0], **KW)
    assert nxt == NextPass(at_s=1900.0, wall_s=10.0)


def test_an_empty_queue_waits_for_a_kick_only() -> None:
    """No job queued (or the interval set to 0): only a change passes, whatever else is pending."""
    assert next_event_pass(now_s=0.0, queued=False, others_wake_s=5.0, quarantine_ends_s=[9.0], **KW) == NextPass()
    assert next_event_pass(now_s=0.0, queued=True, others_wake_s=5.0, quarantine_ends_s=[],
                           interval_s=0.0, wall_interval_s=10.0) == NextPass()
