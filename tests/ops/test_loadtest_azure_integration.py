"""A few seconds of the shipped azure-conv scenario (the Azure LLM inference trace 2023) against the real
five-process mesh: every arrival completes with the trace's token counts, and the report's TTFT, TPOT and
SLO goodput figures are present and agree with each other and with the files written."""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np
import pytest

from gigacluster.client import Client
from gigacluster.loadtest import report, runner, scenario, schedule
from gigacluster.stack import Stack

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]


async def test_azure_conv_replay_reports_consistent_slo_goodput(stack: Stack, tenant: Client,
                                                                 tmp_path: pathlib.Path) -> None:
    """azure-conv cut to 4 s (40 s of trace at speed 10, thinned to 2 req/s: 8 arrivals) on one replica: all
    complete, the tokens streamed are the trace rows' generated tokens, TTFT and TPOT are positive with
    TTFT < end-to-end, met <= ok <= offered, attainment = 100 met / offered, goodput = met / 4 s, and
    summary.json, summary.md and latency.png carry the same figures."""
    sc = scenario.load(ROOT / "loadtest" / "azure-conv.yaml").with_duration(4.0)
    sc = dataclasses.replace(sc, deploy={**(sc.deploy or {}), "replicas": 1}, drain_s=60)
    tl = schedule.build(sc)
    assert len(tl) == 8
    run = await runner.run(sc, runner.Target(stack.endpoints, tenant.api_key))
    assert all(r.ok for r in run.results), [(r.status, r.detail) for r in run.results if not r.ok]
    assert len(run.results) == 8
    assert sorted(r.tokens for r in run.results) == sorted(tl.max_tokens.tolist())
    assert all(0 < r.ttft_s < r.e2e_s and report.tpot_s(r) > 0 for r in run.results)

    summary = report.summarize(sc, run.results, wall_s=run.wall_s)
    s = summary["streams"][0]
    slo = s["slo"]
    assert s["offered"] == slo["offered"] == 8 and s["ok"] == 8
    assert (slo["ttft_s"], slo["tpot_s"]) == (0.25, 0.1)
    assert slo["met"] <= min(slo["met_ttft"], slo["met_tpot"]) <= s["ok"]
    assert slo["attainment_pct"] == pytest.approx(100.0 * slo["met"] / 8)
    assert slo["goodput_per_s"] == pytest.approx(slo["met"] / 4.0)
    tpots = np.array([report.tpot_s(r) for r in run.results])
    assert s["tpot"]["count"] == 8 and s["tpot"]["max"] == pytest.approx(tpots.max(), rel=1e-6)
    assert 0 < s["ttft"]["p50"] <= s["ttft"]["max"] < s["e2e"]["max"]
    met = sum(r.ttft_s <= 0.25 and report.tpot_s(r) <= 0.1 for r in run.results)
    assert slo["met"] == met

    paths = report.write(tmp_path, sc, summary, run.results)
    assert json.loads(paths[0].read_text())["streams"][0]["slo"] == slo
    assert f"| conv | 250 | 100 | 8 | {slo['met_ttft']} | {slo['met_tpot']} | {met} |" in paths[1].read_text()
    assert paths[3].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
