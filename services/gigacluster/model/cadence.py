"""When the repetitions of a steady-state window start: a period, and pauses after some repetitions.

A training job's steady state is not a plain period: every checkpoint interval the job pauses for the
device-to-host copy of its checkpoint (``scheduler/checkpoint.py``). A window that spans checkpoints
books its steps with those pauses in between, so a window is not cut at every checkpoint (the Llama 3
405B run checkpoints every few steps: ending windows there made windows a few steps long).

Repetition ``j`` (0-based) starts at ``start_s + j * period_s + pause_s * (pauses after repetitions
before j)``. The chip shard (``ExecuteWindow``), the fabric (``ReserveWindow``) and the scheduler use
this one definition, so they agree on every boundary to the bit.
"""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import math
from collections.abc import Sequence

from gigacluster.errors import InvalidArgument, ResourceExhausted

EPS = 1e-9  # a float-noise margin (in periods) that keeps a time on a boundary exactly on it


@dataclasses.dataclass(frozen=True)
class Cadence:
    """Start times of ``repeat`` repetitions (see the module doc)."""

    start_s: float
    period_s: float
    repeat: int
    pause_after: tuple[int, ...] = ()  # sorted, distinct repetition indices followed by a pause
    pause_s: float = 0.0

    def start(self, j: int) -> float:
        """Start of repetition ``j`` (``j == repeat``: where a following repetition would start)."""
        return self.start_s + j * self.period_s + self.pause_s * bisect.bisect_left(self.pause_after, j)

    def end(self, n: int, dur_s: float) -> float:
        """End of the first ``n`` repetitions lasting ``dur_s`` each (the start when ``n`` is 0)."""
        return self.start(n - 1) + dur_s if n > 0 else self.start_s

    def _count(self, pred_true_from: float, offset: float) -> int:
        """How many j in [0, repeat) have ``start(j) + offset < pred_true_from`` (start is increasing)."""
        lo, hi = 0, self.repeat
        while lo < hi:  # first j whose start + offset reaches the time
            mid = (lo + hi) // 2
            if self.start(mid) + offset >= pred_true_from - EPS * self.period_s:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def started_before(self, at_s: float) -> int:
        """Repetitions that start before ``at_s`` (one starting at ``at_s`` to within float noise does not)."""
        return self._count(at_s, 0.0)

    def started_by(self, t: float) -> int:
        """Repetitions that start at or before ``t`` (to within float noise)."""
        return self._count(t + 2 * EPS * self.period_s, 0.0)

    def ended_by(self, t: float, dur_s: float) -> int:
        """Repetitions of ``dur_s`` that ended by ``t`` (one ending at ``t`` to within float noise did)."""
        return self._count(t + 2 * EPS * self.period_s, dur_s)


def cadence(start_s: float, period_s: float, repeat: int, pause_after: Sequence[int] = (), pause_s: float = 0.0,
            *, max_pauses: int) -> Cadence:
    """A checked :class:`Cadence` from a request's fields (bad input named, as the RPCs answer it)."""
    if not (math.isfinite(pause_s) and pause_s >= 0):
        raise InvalidArgument("pause_s", f"must be a finite number >= 0, got {pause_s}")
    if len(pause_after) > max_pauses:
        raise ResourceExhausted(f"pause_after: at most {max_pauses} pauses per window, got {len(pause_after)}",
                                field="pause_after")
    pa = tuple(int(j) for j in pause_after)
    if any(b <= a for a, b in itertools.pairwise(pa)):
        raise InvalidArgument("pause_after", "must be strictly increasing repetition indices")
    if pa and (pa[0] < 0 or pa[-1] >= repeat - 1):
        raise InvalidArgument("pause_after", f"indices must be in [0, repeat - 1) = [0, {repeat - 1}), "
                                             f"got {pa[0] if pa[0] < 0 else pa[-1]}")
    if pa and pause_s == 0:
        raise InvalidArgument("pause_s", "must be > 0 when pause_after is given")
    return Cadence(start_s, period_s, repeat, pa, pause_s)


__all__ = ["Cadence", "cadence"]
