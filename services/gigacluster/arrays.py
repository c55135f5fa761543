"""Distinct values of integer arrays, by sorting.

NumPy 2.3 made a bare ``np.unique(a)`` (no ``return_index``, ``return_inverse`` or ``return_counts``) a
hash-table pass followed by a sort of the distinct values. On this project's arrays (chip, link and domain
ids, a few hundred to a million of them) that is 3-40x slower than sorting and comparing neighbours
(``python benchmarks/bench_arrays.py``; ``docs/performance.md``, "Distinct values"): 0.27 ms instead of
0.02 ms to check the 800 ranks of one data-parallel group distinct, 0.8 s instead of 20 ms for a million
random link ids. Call these instead of a bare ``np.unique`` on integer arrays; the forms of ``np.unique``
that return indices or counts still sort, and are left as they are.
"""

from __future__ import annotations

import numpy as np


def distinct(a: np.ndarray) -> np.ndarray:
    """The sorted distinct values of integer array ``a`` (flattened): what ``np.unique(a)`` returns."""
    s = np.sort(np.asarray(a).ravel())
    if s.size < 2:
        return s
    keep = np.empty(s.size, dtype=bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def count_distinct(a: np.ndarray) -> int:
    """How many distinct values integer array ``a`` holds (``np.unique(a).size``)."""
    s = np.sort(np.asarray(a).ravel())
    return int(s.size and 1 + np.count_nonzero(s[1:] != s[:-1]))


def all_distinct(a: np.ndarray) -> bool:
    """Whether no value of integer array ``a`` repeats (``np.unique(a).size == a.size``)."""
    s = np.sort(np.asarray(a).ravel())
    return bool(s.size < 2 or (s[1:] != s[:-1]).all())


__all__ = ["all_distinct", "count_distinct", "distinct"]
