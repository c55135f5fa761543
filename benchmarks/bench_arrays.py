"""Benchmark: distinct values of integer arrays, NumPy's bare ``np.unique`` against ``gigacluster.arrays``.

NumPy 2.3 made ``np.unique(a)`` with no ``return_*`` a hash-table pass; ``gigacluster.arrays.distinct``
sorts and compares neighbours. The arrays are the project's own kinds: the ranks of one DP group (800
distinct chip ids, checked on every StartCollective), domain ids of a 6,400-rank job (many repeats), and
link ids of 100k and 1M flow entries (the max-min solver's and the simulator's). Reported: median of N
CPU times of each (``time.process_time``) and their ratio, in one process.

    python benchmarks/bench_arrays.py --markdown
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _table import print_rows

from gigacluster.arrays import all_distinct, distinct


def _median_s(fn: Callable[[], object], repeat: int) -> float:
    runs = []
    for _ in range(repeat):
        t = time.process_time()
        fn()
        runs.append(time.process_time() - t)
    return statistics.median(runs)


def _unique_all_distinct(a: np.ndarray) -> bool:
    return bool(np.unique(a).size == a.size)


def cases() -> list[tuple[str, np.ndarray, bool]]:
    """(label, array, check only): the project's kinds of integer arrays."""
    rng = np.random.default_rng(7)
    return [
        ("800 ranks of one DP group (distinct?)", np.arange(800, dtype=np.int64) * 128, True),
        ("6,400 domain ids, 100 distinct", np.repeat(np.arange(100, dtype=np.int64) * 64, 64), False),
        ("100,000 link ids of flow entries", rng.integers(0, 794_624, 100_000), False),
        ("1,000,000 link ids of flow entries", rng.integers(0, 794_624, 1_000_000), False),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for label, a, check in cases():
        repeat = 200 if a.size < 10_000 else 20 if a.size < 500_000 else 5
        if check:
            old = _median_s(functools.partial(_unique_all_distinct, a), repeat)
            new = _median_s(functools.partial(all_distinct, a), repeat)
        else:
            assert np.array_equal(np.unique(a), distinct(a))
            old = _median_s(functools.partial(np.unique, a), repeat)
            new = _median_s(functools.partial(distinct, a), repeat)
        rows.append({"case": label, "np_unique_ms": old * 1e3, "sorted_ms": new * 1e3, "ratio": old / new})
    print_rows(rows, [("array", lambda r: r["case"]), ("np.unique (ms)", lambda r: f"{r['np_unique_ms']:.3f}"),
                      ("sort + neighbours (ms)", lambda r: f"{r['sorted_ms']:.3f}"),
                      ("np.unique / sorted", lambda r: f"{r['ratio']:.1f}x")], markdown=args.markdown)
    print(f"numpy {np.__version__}")


if __name__ == "__main__":
    main()
