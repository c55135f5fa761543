"""The run report: a recording becomes the power, step-time and TTFT series and one HTML page."""

from __future__ import annotations

import json
import pathlib

import pytest

from gigacluster.report import load, render


def recording() -> list[str]:
    lines = []
    for t in range(10):
        for off, w in ((0, 1000.0), (32, 2000.0)):
            lines.append(json.dumps({"topic": f"gigacluster/x/chip/shards/h100-sxm-{off}/stats",
                                     "payload": {"t_s": float(t), "power_w": w + t}}))
        lines.append(json.dumps({"topic": "gigacluster/x/scheduler/tenants/a/jobs/j-1/progress",
                                 "payload": {"job": "jobs/j-1", "t_s": float(t), "step": t + 1, "step_time_s": 0.5,
                                             "predicted_step_time_s": 0.5}}))
    lines += [json.dumps({"request": {"ttft_s": v}}) for v in (0.01, 0.02, 0.03, 0.04)]
    return lines


def test_recording_becomes_series_summed_over_shards() -> None:
    """Shard power is summed on a common grid; job steps and client TTFTs are kept."""
    s = load(recording())
    assert s.power_w[0] == pytest.approx(3000.0) and s.power_w[-1] == pytest.approx(3018.0)
    assert [p[1] for p in s.steps["jobs/j-1"]] == list(range(1, 11))
    assert sorted(s.ttft_s) == [0.01, 0.02, 0.03, 0.04]


def test_render_writes_three_plots_and_a_self_contained_page(tmp_path: pathlib.Path) -> None:
    """render() writes three PNGs and an HTML page embedding them, with the TTFT percentiles."""
    page = render(load(recording()), tmp_path)
    for name in ("power.png", "step_time.png", "ttft_cdf.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 3 and "TTFT p50 / p99" in text and "25.0 /" in text


def router_recording(ttfts_s: list[float]) -> list[str]:
    """A live stack's recording: no client records, TTFT only in the router's deployment stats, built
    from the router's own ServingMetrics so the payload keys are the ones it publishes."""
    from gigacluster.inference.engine import RequestSummary
    from gigacluster.inference.metrics import ServingMetrics

    m = ServingMetrics()
    lines = [json.dumps({"topic": "gigacluster/x/router/tenants/default/deployments/llama3-8b/stats",
                         "payload": {"deployment": "deployments/llama3-8b", "t_s": 0.0, "requests": 0,
                                     "ttft_s": m.snapshot()["ttft_s"]}})]
    for i, t in enumerate(ttfts_s):
        m.record_request(RequestSummary(f"r{i}", "t", 0, 1.0, 1.0, 1.0 + t, 2.0 + t, 10, 5, 0, 0, "length"))
        s = m.snapshot()
        lines.append(json.dumps({"topic": "gigacluster/x/router/tenants/default/deployments/llama3-8b/stats",
                                 "payload": {"deployment": "deployments/llama3-8b", "t_s": float(i + 1),
                                             "requests": s["requests"], "ttft_s": s["ttft_s"]}}))
    return lines


def test_live_recording_summary_counts_the_requests_its_ttft_plot_draws(tmp_path: pathlib.Path) -> None:
    """A live stack's recording (router stats only) reports the router's request count and percentiles,
    the same source as its TTFT CDF, instead of "n/a" beside a drawn CDF."""
    s = load(router_recording([0.010, 0.020, 0.030, 0.040, 0.050]))
    assert s.ttft_source == "router"
    r = s.router_ttft["deployments/llama3-8b"]
    assert r.requests == 5 and r.percentiles_s["p50"] == pytest.approx(0.030, rel=0.01)
    text = render(s, tmp_path).read_text()
    assert "n/a" not in text.split("requests with TTFT")[1][:80]
    assert "5 (router stats, 1 deployment(s))" in text
    assert "TTFT p50 / p99, deployments/llama3-8b" in text and "30.0 /" in text


def test_recording_without_ttft_says_why_and_draws_no_cdf(tmp_path: pathlib.Path) -> None:
    """With no request records and no router stats (or only an idle deployment's), the summary says n/a
    and names what is missing, and the TTFT source is empty so no CDF is drawn."""
    s = load(router_recording([]) + recording()[:20])
    assert s.ttft_source == "" and not s.router_ttft
    text = render(s, tmp_path).read_text()
    assert "n/a (no request records and no router deployment stats" in text
