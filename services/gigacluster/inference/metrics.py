"""Serving metrics: latency percentiles from HDR histograms, throughput, KV use, prefix hits.

Percentiles come from :class:`LatencyHistogram`, a wrapper of the ``hdrhistogram`` package
(values recorded in microseconds, 3 significant digits, 1 us to 1 hour), so memory stays constant
however many requests are recorded and no list is ever sorted.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
from hdrh.histogram import HdrHistogram

from gigacluster.inference.engine import ReplicaStats, RequestSummary

PERCENTILES = (50.0, 90.0, 99.0, 99.9)
_US = 1e6
_MAX_S = 3600.0


def _counts_index(h: HdrHistogram, values: np.ndarray) -> np.ndarray:
    """hdrh's ``_counts_index_for`` over an array of non-negative integer values (below 2**53)."""
    # bit_length(v | sub_bucket_mask): frexp's exponent, exact for integers a float64 holds.
    pow2ceiling = np.frexp((values | h.sub_bucket_mask).astype(np.float64))[1].astype(np.int64)
    bucket = pow2ceiling - h.unit_magnitude - (h.sub_bucket_half_count_magnitude + 1)
    sub_bucket = values >> (bucket + h.unit_magnitude)
    return ((bucket + 1) << h.sub_bucket_half_count_magnitude) + sub_bucket - h.sub_bucket_half_count


class LatencyHistogram:
    """Seconds in, percentiles (seconds) out; 1 us resolution floor, values above 1 h clamp.

    Recording is buffered: values are kept as they come (a float, or an array at a time) and entered
    into the HDR histogram together, as array work, when anything is read or :data:`FLUSH_VALUES`
    have gathered. The router records every finished request and its inter-token gaps; entered one by
    one (hdrh's ``record_value``, a few microseconds of Python each) that was a visible share of its CPU.
    """

    FLUSH_VALUES = 1 << 16

    def __init__(self, *, sig_figs: int = 3) -> None:
        self._h = HdrHistogram(1, int(_MAX_S * _US), sig_figs)
        self._sum_s = 0.0  # exact mean and max, kept beside the histogram (cheap, no iteration)
        self._max_s = 0.0
        self._scalars: list[float] = []  # values recorded one by one, not yet in the histogram
        self._arrays: list[np.ndarray] = []  # arrays recorded, not yet in the histogram
        self._buffered = 0
        self._lock = threading.Lock()

    @staticmethod
    def _to_us(value_s: float) -> int:
        return int(min(max(value_s, 1e-6), _MAX_S) * _US)

    def record(self, value_s: float, count: int = 1) -> None:
        if value_s != value_s:  # NaN
            return
        if count == 1:
            with self._lock:
                self._scalars.append(value_s)
                self._buffered += 1
                full = self._buffered >= self.FLUSH_VALUES
            if full:
                self._flush()
            return
        self._flush()
        with self._lock:
            self._h.record_value(self._to_us(value_s), count)
            self._sum_s += value_s * count
            self._max_s = max(self._max_s, value_s)

    def record_many(self, values_s: np.ndarray | Sequence[float]) -> None:
        """Record an array at once (NaN values are skipped)."""
        arr = np.asarray(values_s, dtype=np.float64)
        if arr.size == 0:
            return
        with self._lock:
            self._arrays.append(arr.ravel())
            self._buffered += arr.size
            full = self._buffered >= self.FLUSH_VALUES
        if full:
            self._flush()

    def _flush(self) -> None:
        """Enter the buffered values into the histogram: their HDR bucket indices computed as arrays (hdrh's own
        ``_counts_index_for``, vectorised), the counts added in place. Under the lock: a reader on another
        thread (a metrics scrape) may flush what the event loop records."""
        with self._lock:
            if self._buffered:
                self._enter()

    def _enter(self) -> None:
        parts = self._arrays
        if self._scalars:
            parts = [*parts, np.asarray(self._scalars, dtype=np.float64)]
        arr = np.concatenate(parts) if len(parts) > 1 else parts[0]
        self._scalars, self._arrays, self._buffered = [], [], 0
        arr = arr[~np.isnan(arr)]
        if arr.size == 0:
            return
        self._sum_s += float(arr.sum())
        self._max_s = max(self._max_s, float(arr.max()))
        us = (np.clip(arr, 1e-6, _MAX_S) * _US).astype(np.int64)
        h = self._h
        idx = _counts_index(h, us)
        np.add.at(np.ctypeslib.as_array(h.counts), idx, 1)
        h.total_count += int(us.size)
        h.min_value = min(h.min_value, int(us.min()))
        h.max_value = max(h.max_value, int(us.max()))

    @property
    def count(self) -> int:
        self._flush()
        return int(self._h.get_total_count())

    def percentile_s(self, p: float) -> float:
        return self._h.get_value_at_percentile(p) / _US if self.count else 0.0

    def mean_s(self) -> float:
        """Exact mean of the recorded values."""
        self._flush()
        return self._sum_s / self.count if self.count else 0.0

    def max_s(self) -> float:
        """Exact maximum of the recorded values."""
        self._flush()
        return self._max_s

    def percentile_values_us(self, percentiles: Sequence[float]) -> dict[float, int]:
        """The histogram's value (us) at each percentile in (0, 100], as hdrh's
        ``get_percentile_to_value_dict`` gives them, from one cumulative sum of the counts array:
        hdrh walks the array in Python (7-18 ms for a TTFT histogram, every telemetry interval, per
        histogram, on the router's loop), this takes about 0.2 ms."""
        self._flush()
        h = self._h
        cum = np.cumsum(np.ctypeslib.as_array(h.counts))
        targets = [h.get_target_count_at_percentile(p) for p in percentiles]
        index = np.searchsorted(cum, targets, side="left").tolist()
        return {p: int(h.get_highest_equivalent_value(h.get_value_from_index(i)))
                for p, i in zip(percentiles, index, strict=True)}

    def summary(self) -> dict[str, float]:
        """``{"p50": s, "p90": s, "p99": s, "p99.9": s, "mean": s, "max": s, "count": n}``."""
        n = self.count
        if n:
            pv = self.percentile_values_us(PERCENTILES)
            out = {f"p{p:g}": pv[p] / _US for p in PERCENTILES}
        else:
            out = {f"p{p:g}": 0.0 for p in PERCENTILES}
        out.update(mean=self.mean_s(), max=self.max_s(), count=float(n))
        return out


class ServingMetrics:
    """Aggregates finished requests and replica samples into a snapshot dict."""

    def __init__(self) -> None:
        self.ttft = LatencyHistogram()
        self.tpot = LatencyHistogram()
        self.itl = LatencyHistogram()
        self.e2e = LatencyHistogram()
        self.queue = LatencyHistogram()
        self._kv_sum = 0.0
        self._kv_n = 0
        self._kv_max = 0.0
        self.requests = 0
        self.rejected = 0
        self.shed = 0
        self.preempted = 0
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self._t0 = math.inf
        self._t1 = -math.inf
        self._prefix_hit = 0
        self._prefix_lookup = 0

    def record_request(self, s: RequestSummary, itl_s: np.ndarray | Sequence[float] | None = None) -> None:
        """A finished request; ``itl_s`` its inter-token gaps if the caller has them."""
        self.requests += 1
        self.ttft.record(s.ttft_s)
        if s.output_tokens > 1:
            self.tpot.record(s.tpot_s)
        self.e2e.record(s.e2e_s)
        self.queue.record(s.queue_s)
        if itl_s is not None:
            self.itl.record_many(itl_s)
        self.output_tokens += s.output_tokens
        self.prompt_tokens += s.prompt_tokens
        self.cached_tokens += s.cached_tokens
        self.preempted += s.preemptions > 0
        self._t0 = min(self._t0, s.arrival_s)
        self._t1 = max(self._t1, s.finish_s)

    def record_itl(self, itl_s: np.ndarray | Sequence[float]) -> None:
        self.itl.record_many(itl_s)

    def record_rejected(self, n: int = 1, *, shed: bool = False) -> None:
        if shed:
            self.shed += n
        else:
            self.rejected += n

    def record_kv(self, used_frac: float) -> None:
        self._kv_sum += used_frac
        self._kv_n += 1
        self._kv_max = max(self._kv_max, used_frac)

    def set_prefix_counts(self, hit_tokens: int, lookup_tokens: int) -> None:
        """Prefix-cache totals (the replicas count them; summed by the caller)."""
        self._prefix_hit, self._prefix_lookup = hit_tokens, lookup_tokens

    def observe(self, stats: Sequence[ReplicaStats]) -> None:
        """Sample every replica's KV use and take the prefix counters' current totals."""
        for st in stats:
            self.record_kv(st.kv_used_frac)
        self.set_prefix_counts(sum(s.prefix_hit_tokens for s in stats), sum(s.prefix_lookup_tokens for s in stats))

    def snapshot(self, duration_s: float | None = None) -> dict[str, Any]:
        """Everything as plain numbers; rates over ``duration_s`` or first arrival to last finish."""
        span = duration_s if duration_s is not None else max(self._t1 - self._t0, 0.0)
        rate = (lambda n: n / span) if span > 0 else (lambda n: 0.0)
        return {
            "requests": self.requests,
            "rejected": self.rejected,
            "shed": self.shed,
            "preempted_requests": self.preempted,
            "ttft_s": self.ttft.summary(),
            "tpot_s": self.tpot.summary(),
            "itl_s": self.itl.summary(),
            "e2e_s": self.e2e.summary(),
            "queue_s": self.queue.summary(),
            "output_tokens_per_s": rate(self.output_tokens),
            "prompt_tokens_per_s": rate(self.prompt_tokens),
            "requests_per_s": rate(self.requests),
            "prefix_hit_rate": self._prefix_hit / self._prefix_lookup if self._prefix_lookup else 0.0,
            "cached_prompt_frac": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
            "kv_used_mean": self._kv_sum / self._kv_n if self._kv_n else 0.0,
            "kv_used_max": self._kv_max,
            "span_s": span,
        }
