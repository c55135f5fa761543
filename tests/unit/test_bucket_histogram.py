"""The Prometheus bucket histogram the router keeps per deployment: buffered observations fold into exactly the
buckets and sum that counting each observation at once gives (``le`` buckets: a value on a bound counts there)."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.runtime.metrics import BucketHistogram


def test_buffered_observations_fold_into_the_same_buckets() -> None:
    bounds = [0.01, 0.05, 0.1, 0.5, 1.0]
    h = BucketHistogram(bounds)
    h.FOLD_VALUES = 50  # several folds on the way, some in the middle of an observed list
    rng = np.random.default_rng(3)
    vals: list[float] = []
    for k in range(400):
        if k % 4 == 0:
            xs = rng.exponential(0.2, size=7).tolist()
            h.observe(xs)
            vals += xs
        else:
            x = float(rng.exponential(0.2))
            h.observe(x)
            vals.append(x)
    h.observe(np.array(bounds))  # values on the bounds: each in its own ``le`` bucket
    vals += bounds
    h.observe(2)  # an int
    vals.append(2.0)
    expect = np.bincount(np.searchsorted(bounds, vals, side="left"), minlength=len(bounds) + 1)
    assert h.counts.tolist() == expect.tolist()
    assert h.sum == pytest.approx(sum(vals), rel=1e-12)
    fam = h.family("x", "doc", [], [])
    samples = {s.labels.get("le"): s.value for s in fam.samples if s.name == "x_bucket"}
    assert samples["+Inf"] == len(vals)
    assert samples["0.1"] == int(expect[:3].sum())
