"""gigacluster.arrays: the sort-based distinct values give exactly what np.unique gives."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.arrays import all_distinct, count_distinct, distinct


@pytest.mark.parametrize("n", [0, 1, 2, 3, 8, 800, 6400, 100_000])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.uint64, np.float64])
def test_distinct_equals_np_unique(n: int, dtype: type) -> None:
    rng = np.random.default_rng(n)
    for hi in (1, 2, max(n // 3, 1), 4 * n + 1):  # all equal, two values, many repeats, mostly distinct
        a = rng.integers(0, hi, n).astype(dtype)
        want = np.unique(a)
        got = distinct(a)
        assert got.dtype == want.dtype and np.array_equal(got, want)
        assert count_distinct(a) == want.size
        assert all_distinct(a) == (want.size == a.size)


def test_distinct_flattens_and_leaves_its_input_alone() -> None:
    a = np.array([[5, 1, 5], [3, 1, 9]])
    before = a.copy()
    assert distinct(a).tolist() == [1, 3, 5, 9]
    assert count_distinct(a) == 4 and not all_distinct(a)
    assert np.array_equal(a, before)
    assert all_distinct(np.array([2**62, -(2**62), 0])) and count_distinct(np.array([], dtype=np.int64)) == 0
