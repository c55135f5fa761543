"""The load generator's pure parts: scenario validation, the precomputed open-loop timeline, the HTTP
SSE driver against a stub server, and the report (HDR percentiles, table, JSON, PNG)."""

from __future__ import annotations

import asyncio
import json
import math
import pathlib

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from gigacluster.errors import InvalidArgument
from gigacluster.loadtest import drivers, report, scenario, schedule
from gigacluster.loadtest.drivers import Result

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _sc(**kw: object) -> scenario.Scenario:
    data = {"name": "t", "duration_s": 100.0, "seed": 1, "deploy": {"deployment_id": "m"},
            "streams": [{"name": "a", "kind": "generate", "arrival": {"type": "poisson", "rate_per_s": 5}}]}
    data.update(kw)
    return scenario.parse(data, base_dir=ROOT)


def test_every_shipped_scenario_parses_and_builds_a_timeline() -> None:
    """Each loadtest/*.yaml is a valid scenario whose timeline is non-empty, sorted and within its duration."""
    files = sorted((ROOT / "loadtest").glob("*.yaml"))
    assert len(files) >= 3
    for f in files:
        sc = scenario.load(f)
        tl = schedule.build(sc)
        assert len(tl) > 0 and np.all(np.diff(tl.t_s) >= 0) and tl.t_s[-1] < sc.duration_s


@pytest.mark.parametrize(("data", "field"), [
    ({"streams": []}, "streams"),
    ({"duration_s": 0}, "duration_s"),
    ({"streams": [{"name": "a", "kind": "ftp", "arrival": {}}]}, "streams.a.kind"),
    ({"streams": [{"name": "a", "kind": "generate", "arrival": {"type": "poisson", "rate_per_s": 0}}]},
     "arrival.rate_per_s"),
    ({"streams": [{"name": "a", "kind": "generate", "arrival": {"type": "trace"}}]}, "arrival.path"),
    ({"streams": [{"name": "j", "kind": "submit_job", "arrival": {}}]}, "streams.j.job"),
    ({"deploy": None}, "deploy.deployment_id"),
    ({"rate": 3}, "rate"),
])
def test_bad_scenarios_fail_naming_the_field(data: dict[str, object], field: str) -> None:
    """A bad scenario raises InvalidArgument that names the offending field."""
    with pytest.raises(InvalidArgument) as ei:
        _sc(**data)
    assert ei.value.metadata.get("field", str(ei.value)).startswith(field) or field in str(ei.value.metadata)


def test_poisson_timeline_has_the_offered_rate_and_exponential_gaps() -> None:
    """A 5/s Poisson stream over 100 s (seed 1) offers 500 +- 3 sigma arrivals, with gap mean ~0.2 s and
    coefficient of variation ~1 (exponential), and the same seed gives the same timeline."""
    sc = _sc()
    tl = schedule.build(sc)
    assert abs(len(tl) - 500) < 3 * math.sqrt(500)
    gaps = np.diff(tl.t_s)
    assert gaps.mean() == pytest.approx(0.2, rel=0.1)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.15)
    assert np.array_equal(schedule.build(sc).t_s, tl.t_s)


def test_streams_merge_in_time_order_and_uniform_is_evenly_spaced() -> None:
    """Two streams merge into one sorted timeline, tagged by stream; a uniform 2/s stream is every 0.5 s."""
    sc = _sc(duration_s=10.0, streams=[
        {"name": "p", "kind": "generate", "arrival": {"type": "poisson", "rate_per_s": 3}},
        {"name": "u", "kind": "generate", "arrival": {"type": "uniform", "rate_per_s": 2}, "max_tokens": 7}])
    tl = schedule.build(sc)
    assert np.all(np.diff(tl.t_s) >= 0)
    u = tl.t_s[tl.stream == 1]
    assert np.allclose(u, np.arange(0, 10, 0.5))
    assert set(tl.max_tokens[tl.stream == 1]) == {7}


def test_trace_replay_keeps_times_and_token_counts_scaled(tmp_path: pathlib.Path) -> None:
    """Trace replay sends at arrival_s x time_scale with each row's prompt/output tokens, dropping rows past
    the duration, in time order even if the file is not."""
    trace = tmp_path / "t.jsonl"
    rows = [{"arrival_s": 3.0, "prompt_tokens": 30, "output_tokens": 3}, {"arrival_s": 1.0, "prompt_tokens": 10},
            {"arrival_s": 50.0, "prompt_tokens": 1}]
    trace.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    sc = _sc(duration_s=10.0, streams=[{"name": "t", "kind": "generate", "max_tokens": 9,
                                        "arrival": {"type": "trace", "path": str(trace), "time_scale": 2.0}}])
    tl = schedule.build(sc)
    assert tl.t_s.tolist() == [2.0, 6.0]
    assert tl.prompt_tokens.tolist() == [10, 30]
    assert tl.max_tokens.tolist() == [9, 3]


async def test_http_driver_times_sse_tokens_from_the_intended_send_time() -> None:
    """Against a stub OpenAI /v1/completions that streams 4 SSE events 20 ms apart after a 50 ms wait, the
    driver sends the bearer key and stream:true, and measures TTFT >= 50 ms plus the intended-send lag,
    3 inter-token gaps of ~20 ms, the usage token count, and maps a 429 to HTTP_429."""
    seen: dict[str, object] = {}

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.update(body=body, auth=request.headers.get("Authorization"))
        if body["model"] == "busy":
            return web.json_response({"error": {"message": "saturated", "code": 429}}, status=429)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await asyncio.sleep(0.05)
        for i in range(4):
            event = {"choices": [{"index": 0, "text": f" t{i}", "finish_reason": "length" if i == 3 else None}]}
            await resp.write(f"data: {json.dumps(event)}\n\n".encode())
            await asyncio.sleep(0.02)
        await resp.write(b'data: {"choices": [], "usage": {"completion_tokens": 4}}\n\ndata: [DONE]\n\n')
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            loop = asyncio.get_running_loop()
            intended = loop.time() - 0.01  # a send 10 ms late: latency still counts from the intended time
            r = await drivers.http_completion(session, f"http://127.0.0.1:{port}", "k-1", Result(0, 0.0), intended,
                                              model="m", prompt=[1, 2, 3], max_tokens=4)
            busy = await drivers.http_completion(session, f"http://127.0.0.1:{port}", "k-1", Result(0, 0.0),
                                                 loop.time(), model="busy", prompt=[1], max_tokens=4)
    finally:
        await runner.cleanup()
    assert seen["auth"] == "Bearer k-1"
    assert seen["body"]["stream"] is True and seen["body"]["prompt"] == [1]  # type: ignore[index]
    assert r.ok and r.tokens == 4 and len(r.itl_s) == 3 and min(r.itl_s) >= 0.015
    assert r.ttft_s >= 0.06 and r.e2e_s >= r.ttft_s + 0.06 and r.send_lag_s >= 0.01
    assert busy.status == "HTTP_429"


def test_report_percentiles_table_json_and_png(tmp_path: pathlib.Path) -> None:
    """1,000 results with TTFT 1..1000 ms give HDR p50 ~500 ms and p99 ~990 ms (3 significant digits); errors
    and drops are counted per status; the table, JSON, JSON lines and a non-empty PNG are written."""
    sc = _sc(duration_s=10.0)
    results = [Result(0, i * 0.01, ttft_s=(i + 1) / 1000, e2e_s=(i + 1) / 500, tokens=8, itl_s=[0.01] * 7)
               for i in range(1000)]
    results += [Result(0, 5.0, status="RESOURCE_EXHAUSTED"), Result(0, 6.0, status="DROPPED")]
    summary = report.summarize(sc, results, wall_s=12.0)
    s = summary["streams"][0]
    assert s["offered"] == 1002 and s["ok"] == 1000
    assert s["statuses"] == {"DROPPED": 1, "OK": 1000, "RESOURCE_EXHAUSTED": 1}
    assert s["ttft"]["p50"] == pytest.approx(0.500, rel=0.005)
    assert s["ttft"]["p99"] == pytest.approx(0.990, rel=0.005)
    assert s["itl"]["p99.9"] == pytest.approx(0.01, rel=0.005)
    assert s["tokens_per_s"] == pytest.approx(8000 / 12.0)
    text = report.table(summary)
    row = next(line for line in text.splitlines() if "| ttft |" in line)
    assert row.startswith("| a | generate | 1002 | 1000 | DROPPED 1, RESOURCE_EXHAUSTED 1 | ttft |")
    assert float(row.split("|")[7]) == pytest.approx(500, rel=0.005)
    paths = report.write(tmp_path, sc, summary, results)
    assert json.loads(paths[0].read_text())["streams"][0]["ok"] == 1000
    assert len(paths[2].read_text().splitlines()) == 1002
    png = paths[3].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
