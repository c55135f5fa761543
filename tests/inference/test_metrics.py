"""Metrics: HDR histogram percentiles and the serving snapshot."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.inference.engine import RequestSummary
from gigacluster.inference.metrics import PERCENTILES, LatencyHistogram, ServingMetrics


def test_histogram_percentiles_within_hdr_precision() -> None:
    """Values 1..10,000 ms give p50 = 5 s and p99 = 9.9 s within the 3-significant-digit precision."""
    h = LatencyHistogram()
    vals = np.arange(1, 10_001) / 1000.0
    h.record_many(vals)
    assert h.count == 10_000
    assert h.percentile_s(50) == pytest.approx(5.0, rel=2e-3)
    assert h.percentile_s(99) == pytest.approx(9.9, rel=2e-3)
    assert h.mean_s() == pytest.approx(vals.mean())
    assert h.max_s() == pytest.approx(10.0)


def test_record_many_matches_record() -> None:
    """Batch recording (with NaN skipped) gives the same percentiles as one-by-one recording."""
    rng = np.random.default_rng(1)
    vals = rng.exponential(0.05, size=5000)
    a, b = LatencyHistogram(), LatencyHistogram()
    for v in vals:
        a.record(float(v))
    b.record_many(np.concatenate((vals, [np.nan])))
    assert a.summary() == pytest.approx(b.summary())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_buffered_recording_fills_the_same_buckets_as_hdrh(seed: int) -> None:
    """The buffered, vectorised recording puts every value in the bucket hdrh's own ``record_value`` does: the
    counts array, total, min and max are identical, over 1 us to past the 1 h clamp, powers of two and their
    neighbours included, across more than one automatic flush."""
    from hdrh.histogram import HdrHistogram

    rng = np.random.default_rng(seed)
    edges = np.array([2.0**k for k in range(0, 32)])
    us = np.concatenate([edges, edges - 1, edges + 1, rng.integers(1, 4_000_000_000, 20_000).astype(float),
                         np.exp(rng.uniform(0, np.log(3.6e9), 20_000))])
    vals = us / 1e6
    mine = LatencyHistogram()
    mine.FLUSH_VALUES = 7_000  # several flushes, some mid-array
    ref = HdrHistogram(1, int(3600 * 1e6), 3)
    for k, v in enumerate(vals):
        if k % 3:
            mine.record(float(v))
        else:
            mine.record_many(vals[k:k + 1])
        ref.record_value(int(min(max(float(v), 1e-6), 3600.0) * 1e6))
    mine.record(float("nan"))
    mine.record_many(np.array([np.nan]))
    assert mine.count == ref.get_total_count() == vals.size
    h = mine._h
    assert list(np.ctypeslib.as_array(h.counts)) == list(np.ctypeslib.as_array(ref.counts))
    assert (h.min_value, h.max_value) == (ref.min_value, ref.max_value)
    assert mine.max_s() == pytest.approx(min(vals.max(), 1e12))
    assert mine.mean_s() == pytest.approx(vals.mean(), rel=1e-12)


def test_histogram_memory_is_constant() -> None:
    """The histogram's storage does not grow with the number of recorded values."""
    import ctypes

    h = LatencyHistogram()
    size0 = ctypes.sizeof(h._h.counts)
    h.record_many(np.random.default_rng(2).uniform(0, 100, size=200_000))
    assert ctypes.sizeof(h._h.counts) == size0 and h.count == 200_000


def test_snapshot_fields() -> None:
    """The snapshot derives TTFT, TPOT, queue and throughput from request summaries."""
    m = ServingMetrics()
    m.record_request(RequestSummary("a", "", 0, 0.0, 0.1, 0.3, 1.3, 100, 11, 32, 0, "length"), itl_s=[0.1] * 10)
    m.record_rejected()
    m.set_prefix_counts(32, 100)
    s = m.snapshot()
    assert s["ttft_s"]["p50"] == pytest.approx(0.3, rel=1e-3)
    assert s["tpot_s"]["p50"] == pytest.approx(0.1, rel=1e-3)
    assert s["queue_s"]["p50"] == pytest.approx(0.1, rel=1e-3)
    assert s["itl_s"]["count"] == 10
    assert s["output_tokens_per_s"] == pytest.approx(11 / 1.3)
    assert s["prefix_hit_rate"] == pytest.approx(0.32) and s["rejected"] == 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_summary_percentiles_equal_hdrh_own_walk(seed: int) -> None:
    """The numpy percentiles of summary() are exactly hdrh's get_percentile_to_value_dict on the same counts."""
    rng = np.random.default_rng(seed)
    h = LatencyHistogram()
    h.record_many(rng.lognormal(-4.0, 1.5, 3000))  # seconds: a TTFT-like spread, 1 ms to seconds
    h.record(7.5, count=3)
    want = h._h.get_percentile_to_value_dict(list(PERCENTILES))
    assert h.percentile_values_us(PERCENTILES) == want
    assert h.summary()["p99"] == want[99.0] / 1e6
