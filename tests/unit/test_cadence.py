"""Window cadences (model/cadence.py): a period with checkpoint pauses, counted exactly at boundaries."""

from __future__ import annotations

import pytest

from gigacluster.errors import InvalidArgument, ResourceExhausted
from gigacluster.model.cadence import Cadence, cadence


def test_starts_shift_by_each_pause_before_them() -> None:
    """Period 0.7 s from 10 s with 0.25 s pauses after steps 1 and 3: starts and ends as a per-step loop adds them."""
    c = Cadence(10.0, 0.7, 6, (1, 3), 0.25)
    t, want = 10.0, []
    for j in range(6):
        want.append(t)
        t += 0.7 + (0.25 if j in (1, 3) else 0.0)
    assert [c.start(j) for j in range(6)] == pytest.approx(want)
    assert c.start(6) == pytest.approx(10.0 + 6 * 0.7 + 0.5)
    assert c.end(6, 0.7) == pytest.approx(want[5] + 0.7) and c.end(0, 0.7) == 10.0


def test_counts_are_exact_at_boundaries_and_in_pauses() -> None:
    """A time on a boundary (with float noise either way) counts as the step starting there; a time in a pause counts
    the steps before it."""
    c = Cadence(0.0, 0.1, 30, (9,), 0.05)
    for noise in (1 - 1e-15, 1.0, 1 + 1e-15):
        assert c.started_before(0.7 * noise) == 7
        assert c.ended_by(0.7 * noise, 0.1) == 7
        assert c.started_by(0.7 * noise) == 8
    assert c.ended_by(1.02, 0.1) == 10 and c.started_before(1.02) == 10  # in the pause after step 9
    assert c.started_by(1.05) == 11 and c.started_before(100.0) == 30 and c.started_before(-1.0) == 0


def test_bad_pause_lists_are_refused_with_the_field_named() -> None:
    """Unsorted, out of range, too many, or a pause without a length: INVALID_ARGUMENT / RESOURCE_EXHAUSTED."""
    with pytest.raises(InvalidArgument, match="pause_after: must be strictly increasing"):
        cadence(0.0, 1.0, 10, (3, 3), 0.5, max_pauses=10)
    with pytest.raises(InvalidArgument, match=r"pause_after: indices must be in \[0, repeat - 1\)"):
        cadence(0.0, 1.0, 10, (9,), 0.5, max_pauses=10)
    with pytest.raises(InvalidArgument, match="pause_s"):
        cadence(0.0, 1.0, 10, (2,), 0.0, max_pauses=10)
    with pytest.raises(InvalidArgument, match="pause_s"):
        cadence(0.0, 1.0, 10, (), -1.0, max_pauses=10)
    with pytest.raises(ResourceExhausted, match="pause_after"):
        cadence(0.0, 1.0, 10, (1, 2, 3), 0.5, max_pauses=2)
    assert cadence(0.0, 1.0, 10, (1, 2), 0.5, max_pauses=10).start(3) == pytest.approx(4.0)
