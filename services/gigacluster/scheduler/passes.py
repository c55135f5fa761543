"""When the dispatcher's next unprompted pass is due on the event clock (no gRPC here).

A kick (a submission, a release, a job's end) always passes at once. Without one, a queued job is looked
at again every ``event_dispatch_interval_s`` of virtual time, as a wake-up the coordinator knows: that
catches what changes with time alone while the mesh runs (a chip shard's self-repair, a link repair, a
quarantine's end). But when nothing else in the mesh has a wake-up pending, that poll *is* the mesh's next
event: the coordinator jumps to it, the pass finds nothing new, the next poll is the next event, and so on
as fast as the mesh can answer. An idle stack with one job that cannot start (its chips held by a
deployment) was found advancing about 70 times a wall second, virtual time running ~700x ahead of wall
time and a core busy, for as long as it was left. Then nothing can change a pass but a known quarantine
end (an event: time may jump straight to it) or input from outside the clock (a release by another
client, a tenant's new weight), which arrives in wall time: so the pass waits for the quarantine's end or
``dispatch_interval_s`` wall seconds, whichever is first, and virtual time stays where it is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable


@dataclasses.dataclass(frozen=True)
class NextPass:
    """The next unprompted pass: at virtual time ``at_s`` (a wake-up the clock knows), after ``wall_s`` wall
    seconds, at whichever comes first; both None: only a kick passes."""

    at_s: float | None = None
    wall_s: float | None = None


def next_event_pass(*, now_s: float, queued: bool, interval_s: float, others_wake_s: float,
                    quarantine_ends_s: Iterable[float | None], wall_interval_s: float) -> NextPass:
    """``others_wake_s``: the earliest wake-up pending anywhere else in the mesh (the coordinator's horizon,
    and this process's own other sleepers; inf when none); ``quarantine_ends_s``: when quarantined devices
    come back (None: when their chip says healthy, which is the chip's own event)."""
    if not queued or interval_s <= 0:
        return NextPass()
    if math.isfinite(others_wake_s):
        return NextPass(at_s=now_s + interval_s)  # time moves anyway: poll in its own terms
    ends = [t for t in quarantine_ends_s if t is not None and t > now_s]
    return NextPass(at_s=min(ends) if ends else None, wall_s=wall_interval_s)


__all__ = ["NextPass", "next_event_pass"]
