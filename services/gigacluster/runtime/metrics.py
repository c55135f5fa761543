"""Prometheus metrics for every service, read from the services' own arrays at scrape time.

Each service registers collectors on its own registry; ``serve`` exposes them on
``--metrics-port`` (``GIGACLUSTER_METRICS_PORT``; -1 = off). Chip metrics carry dcgm-exporter's
names (``DCGM_FI_DEV_POWER_USAGE``, ...) and router metrics vLLM's, so existing Grafana
dashboards work unchanged. Per-device series are capped (``per_device_max``): a 65,536-chip
shard exports its aggregates, not 65,536 series per metric.

Anything that only grows (energy, tokens, requests, events) is a counter, whose exposed name
ends in ``_total`` (``rate()`` and ``promtool check metrics`` depend on it); levels are gauges.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import numpy as np
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector


class FunctionCollector(Collector):
    """A collector whose metrics come from a function called at every scrape."""

    def __init__(self, fn: Callable[[], Iterable[Metric]]) -> None:
        self.fn = fn

    def collect(self) -> Iterable[Metric]:
        return self.fn()


def gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    """A level that can go up and down (power, queue depth, memory in use)."""
    return GaugeMetricFamily(name, doc, labels=labels or [])


def counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    """A monotonically increasing total (energy, tokens, requests); reset only by a restart.

    ``name`` must end in ``_total``: the exposed series is exactly the name asked for, not a
    silently suffixed one.
    """
    if not name.endswith("_total"):
        raise ValueError(f"counter {name!r} must end in _total")
    return CounterMetricFamily(name, doc, labels=labels or [])


class BucketHistogram:
    """Cumulative Prometheus buckets kept in numpy. Observations are buffered as they come and counted
    into the buckets together, as array work, when the histogram is read (a scrape) or
    :data:`FOLD_VALUES` have gathered: the router observes four per finished request."""

    FOLD_VALUES = 1 << 14

    def __init__(self, bounds: Iterable[float]) -> None:
        self.bounds = np.asarray(sorted(bounds), dtype=float)
        self._counts = np.zeros(self.bounds.size + 1, dtype=np.int64)  # last bucket: +Inf
        self._sum = 0.0
        self._pending: list[float] = []
        self._lock = threading.Lock()  # a scrape (its own thread) folds what the event loop observes

    def observe(self, values: float | Iterable[float]) -> None:
        if not isinstance(values, float | int | list):
            values = np.asarray(values, dtype=float).ravel().tolist()
        with self._lock:
            if isinstance(values, list):
                self._pending.extend(values)
            else:
                self._pending.append(values)
            full = len(self._pending) >= self.FOLD_VALUES
        if full:
            self._fold()

    def _fold(self) -> None:
        with self._lock:
            if not self._pending:
                return
            v = np.asarray(self._pending, dtype=float)
            self._pending = []
            self._counts += np.bincount(np.searchsorted(self.bounds, v, side="left"), minlength=self._counts.size)
            self._sum += float(v.sum())

    @property
    def counts(self) -> np.ndarray:
        """Observations per bucket (the last one +Inf), everything observed so far included."""
        self._fold()
        return self._counts

    @property
    def sum(self) -> float:
        self._fold()
        return self._sum

    def family(self, name: str, doc: str, labels: list[str], label_values: list[str],
               into: HistogramMetricFamily | None = None) -> HistogramMetricFamily:
        fam = into or HistogramMetricFamily(name, doc, labels=labels)
        cum = np.cumsum(self.counts)
        buckets = [(f"{b:g}", float(c)) for b, c in zip(self.bounds, cum[:-1], strict=True)]
        buckets.append(("+Inf", float(cum[-1])))
        fam.add_metric(label_values, buckets, self.sum)
        return fam


#: The classic text format: what every Prometheus since 2.0 reads, with names exactly as registered.
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_app(registry: CollectorRegistry) -> Callable[..., Iterable[bytes]]:
    """WSGI app serving ``registry`` on ``/metrics`` in the classic text format, whatever the scraper
    asks for. prometheus_client's OpenMetrics encoder (chosen when Prometheus offers OpenMetrics, as it
    does by default) rewrites ``vllm:x`` samples to ``vllm_x`` while keeping ``vllm:x`` in TYPE/HELP, so
    a real Prometheus would store vLLM's series under names no vLLM dashboard queries."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics\n"]
        body = generate_latest(registry)
        start_response("200 OK", [("Content-Type", TEXT_CONTENT_TYPE), ("Content-Length", str(len(body)))])
        return [] if environ.get("REQUEST_METHOD") == "HEAD" else [body]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (one line per scrape per service would drown the logs)."""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> int:
    """Start the /metrics HTTP endpoint (a daemon thread); returns the bound port."""
    server = make_server(host, port, metrics_app(registry), _ThreadingServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return int(server.server_port)
