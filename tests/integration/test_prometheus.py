"""A real Prometheus (Debian's ``prometheus``) scraping a live stack with the repository's own scrape
configuration, queried through its HTTP API as Grafana would; the Grafana dashboard's queries are
run against what the stack really exports."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.stack import Stack

from ..conftest import TEST_SPEEDUP
from ..ops.prometheus import ROOT, PrometheusServer, local_config

pytestmark = pytest.mark.integration
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "gigacluster.json"
PROM_BUDGET_S = 60.0  # the whole Prometheus session of this module is bounded by this


def _exprs(dashboard: dict[str, Any]) -> list[str]:
    def walk(panels: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [q for p in panels for q in [*p.get("targets", []), *walk(p.get("panels", []))]]

    return [str(t["expr"]) for t in walk(dashboard["panels"]) if t.get("expr")]


_FUNCS = {"sum", "avg", "max", "min", "count", "rate", "irate", "increase", "histogram_quantile", "by",
          "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool"}


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (label matchers, ranges, strings and grouping removed)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[m.end():].lstrip()
        if m.group() not in _FUNCS and not rest.startswith("("):
            names.add(m.group())
    return names


def test_metric_names_are_read_from_promql() -> None:
    """The dashboard check's PromQL reader finds metric names and skips functions, labels and ranges."""
    assert metric_names('histogram_quantile(0.5, sum by (le, model_name) (rate(vllm:x_bucket[1m])))') == {
        "vllm:x_bucket"}
    assert metric_names('max by (Hostname) (DCGM_FI_DEV_GPU_TEMP{model_name=~"$chip"})') == {"DCGM_FI_DEV_GPU_TEMP"}


class LivePrometheus(PrometheusServer):
    """The server plus the client of the tenant that owns the ``prom`` deployment."""

    client: Client


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def prom(stack: Stack) -> AsyncIterator[LivePrometheus]:
    """Prometheus on loopback with a temp TSDB, scraping every service of the stack each second, with a
    served deployment under traffic (so vLLM's series exist); stopped and removed afterwards."""
    if shutil.which("prometheus") is None:
        pytest.fail("prometheus is required: apt-get install -y prometheus (see .ci/run)")
    gc = Client(stack.endpoints, await stack.create_tenant("prometheus"))
    dep = (await gc.router.DeployModel(router_pb2.DeployModelRequest(
        deployment_id="prom", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
        replicas=1), metadata=gc.md)).deployment
    server = LivePrometheus(local_config(stack.metrics_ports, scrape_interval="1s"))
    server.client = gc
    try:
        await asyncio.to_thread(server.start)
        for _ in range(3):  # traffic across several scrapes: counters and histograms move
            _ = [c async for c in gc.generate("deployments/prom", "tell me about prometheus", max_tokens=16)]
            await asyncio.sleep(1.2)
        yield server
    finally:
        await asyncio.to_thread(server.stop)
        await gc.router.DeleteDeployment(router_pb2.DeleteDeploymentRequest(name=dep.name), metadata=gc.md)
        await gc.close()


async def query_until(prom: PrometheusServer, expr: str, ok: Any, budget_s: float = 20.0) -> list[dict[str, Any]]:
    """Run ``expr`` until ``ok(result)`` (bounded): scrapes land each second."""
    deadline = time.monotonic() + budget_s
    while True:
        res = await asyncio.to_thread(prom.query, expr)
        if ok(res) or time.monotonic() > deadline:
            return res
        await asyncio.sleep(0.5)


def _vals(res: list[dict[str, Any]]) -> list[float]:
    return [float(r["value"][1]) for r in res]


async def test_every_target_is_scraped_up(stack: Stack, prom: PrometheusServer) -> None:
    """Every service of the stack is a target of the repository's scrape config, labelled with its
    service, and Prometheus scrapes each one without error."""
    res = await query_until(prom, "up", lambda r: len(r) == len(stack.metrics_ports) and set(_vals(r)) == {1.0})
    assert sorted(r["metric"]["service"] for r in res) == ["broker", "chip", "chip", "fabric", "router",
                                                            "scheduler"]
    assert set(_vals(res)) == {1.0}
    targets = (await asyncio.to_thread(prom.api, "targets"))["activeTargets"]
    assert {t["health"] for t in targets} == {"up"}, [t.get("lastError") for t in targets]


async def test_promql_returns_dcgm_vllm_and_link_series(prom: PrometheusServer) -> None:
    """PromQL through the HTTP API returns DCGM power for all 64 chips, the deployment's vLLM token
    counter and link utilisation per switch tier."""
    power = await query_until(prom, "DCGM_FI_DEV_POWER_USAGE", lambda r: len(r) == 64)
    assert sorted(int(r["metric"]["gpu"]) for r in power) == list(range(64))
    assert all(v >= 90.0 * 0.999 for v in _vals(power))  # H100 idle power in the catalog
    tokens = await query_until(prom, 'vllm:generation_tokens_total{model_name="prom"}',
                               lambda r: r and _vals(r)[0] >= 48)
    assert _vals(tokens) == [48.0]  # three requests of 16 tokens
    links = await query_until(prom, "gigacluster_link_utilization", lambda r: len(r) >= 2)
    assert {"scaleup", "nic"} <= {r["metric"]["tier"] for r in links}


async def test_rate_over_energy_counter_matches_power(stack: Stack, prom: LivePrometheus) -> None:
    """``rate()`` over the chips' energy counter (mJ) is the power they draw: summed over the cluster it
    matches the summed power gauge times the clock's speed-up (energy is booked in virtual time); and
    ``rate()`` over vLLM's generation-token counter rises while tokens are generated."""
    # rate() extrapolates a window it has too few samples for: wait until every chip has 5 in it
    covered = "count(count_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total[5s]) >= 5)"
    assert _vals(await query_until(prom, covered, lambda r: bool(r) and _vals(r) == [64.0])) == [64.0]
    expr = "sum(rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION_total[5s])) / 1000"
    res = await query_until(prom, expr, lambda r: bool(r) and _vals(r)[0] > 0)
    watts = _vals(res)[0] / TEST_SPEEDUP
    power = _vals(await asyncio.to_thread(prom.query, "sum(DCGM_FI_DEV_POWER_USAGE)"))[0]
    assert 0.8 * power < watts < 1.25 * power
    # tokens generated between scrapes: rate() over vLLM's token counter moves
    for _ in range(2):
        _ = [c async for c in prom.client.generate("deployments/prom", "more tokens please", max_tokens=16)]
        await asyncio.sleep(1.2)
    tok = await query_until(prom, 'rate(vllm:generation_tokens_total{model_name="prom"}[30s])',
                            lambda r: bool(r) and _vals(r)[0] > 0)
    assert _vals(tok)[0] > 0


async def test_grafana_dashboard_queries_what_the_stack_exports(prom: PrometheusServer) -> None:
    """Every metric name a dashboard panel queries is exported by the stack, every panel's query returns
    series for the stack's chip, and the chip variable's label exists on the DCGM series."""
    dash = json.loads(DASHBOARD.read_text())
    exprs = _exprs(dash)
    assert len(exprs) >= 10
    names = set(await asyncio.to_thread(prom.api, "label/__name__/values"))
    wanted = set().union(*(metric_names(e) for e in exprs))
    assert wanted and wanted <= names, sorted(wanted - names)
    for expr in exprs:
        q = expr.replace("$chip", "h100-sxm")
        res = await query_until(prom, q, bool)
        assert res, f"dashboard query returned nothing: {q}"
    var = dash["templating"]["list"][0]["query"]["query"]
    metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var).groups()  # type: ignore[union-attr]
    values = await asyncio.to_thread(prom.api, f"label/{label}/values", **{"match[]": metric})
    assert values == ["h100-sxm"]
