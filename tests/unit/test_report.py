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
