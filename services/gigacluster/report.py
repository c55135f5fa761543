"""A run's recording (telemetry messages and client-side request records, one JSON object per
line) turned into plots and one HTML page: power over time, step time per job, TTFT CDF.

Record with ``gigacluster record`` (an MQTT subscriber) or ``gigacluster demo --record DIR``;
render with ``gigacluster report RUN.jsonl``. Pure: no network, matplotlib's Agg backend.
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import pathlib
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import numpy as np


@dataclasses.dataclass
class RunSeries:
    """What the plots need, extracted from a recording."""

    power_t_s: list[float] = dataclasses.field(default_factory=list)
    power_w: list[float] = dataclasses.field(default_factory=list)
    steps: dict[str, list[tuple[float, int, float, float]]] = dataclasses.field(default_factory=dict)
    ttft_s: list[float] = dataclasses.field(default_factory=list)
    ttft_percentiles: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.power_w or self.steps or self.ttft_s or self.ttft_percentiles)


def load(lines: Iterable[str]) -> RunSeries:
    """Parse a recording: ``{"topic", "payload"}`` telemetry lines and ``{"request": {...}}`` lines."""
    shard_power: dict[str, dict[float, float]] = defaultdict(dict)
    out = RunSeries()
    for raw in lines:
        raw = raw.strip()
        if not raw:
            continue
        rec = json.loads(raw)
        if "request" in rec:
            ttft = rec["request"].get("ttft_s")
            if ttft is not None:
                out.ttft_s.append(float(ttft))
            continue
        topic, p = rec.get("topic", ""), rec.get("payload", {})
        if "/chip/shards/" in topic and topic.endswith("/stats"):
            shard_power[topic][round(float(p["t_s"]), 1)] = float(p["power_w"])
        elif "/jobs/" in topic and topic.endswith("/progress"):
            out.steps.setdefault(p["job"], []).append(
                (float(p["t_s"]), int(p["step"]), float(p["step_time_s"]), float(p.get("predicted_step_time_s", 0))))
        elif "/deployments/" in topic and topic.endswith("/stats"):
            out.ttft_percentiles = {k: float(v) for k, v in p.get("ttft_s", {}).items() if k.startswith("p")}
    if shard_power:
        # Sum the shards on a common time grid (each shard reports on its own ticks).
        grid = sorted({t for series in shard_power.values() for t in series})
        total = np.zeros(len(grid))
        for series in shard_power.values():
            ts = np.array(sorted(series))
            ws = np.array([series[t] for t in ts])
            total += np.interp(grid, ts, ws)
        out.power_t_s, out.power_w = list(grid), total.tolist()
    return out


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def render(series: RunSeries, out_dir: pathlib.Path, *, title: str = "gigacluster run") -> pathlib.Path:
    """Write power.png, step_time.png, ttft_cdf.png and report.html into ``out_dir``; returns the page."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    images: dict[str, bytes] = {}

    fig, ax = plt.subplots(figsize=(7, 3.2))
    if series.power_w:
        ax.plot(series.power_t_s, np.asarray(series.power_w) / 1e3, color="tab:red")
    ax.set(xlabel="virtual time (s)", ylabel="chip power (kW)", title="Power of all chips")
    ax.grid(alpha=0.3)
    images["power.png"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    for job, pts in sorted(series.steps.items()):
        pts = sorted(pts, key=lambda p: p[1])
        ax.plot([p[1] for p in pts], [p[2] for p in pts], marker=".", label=f"{job} live")
        if pts and pts[0][3]:
            ax.axhline(pts[0][3], linestyle="--", linewidth=1, color="gray")
    ax.set(xlabel="step", ylabel="step time (s)", title="Step time (dashed: model prediction)")
    if series.steps:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    images["step_time.png"] = _png(fig)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 3.2))
    if series.ttft_s:
        xs = np.sort(np.asarray(series.ttft_s)) * 1e3
        ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label=f"{xs.size} requests")
    elif series.ttft_percentiles:
        ps = sorted((float(k[1:]) / 100, v * 1e3) for k, v in series.ttft_percentiles.items())
        ax.step([v for _, v in ps], [q for q, _ in ps], where="post", marker="o", label="router percentiles")
    ax.set(xlabel="TTFT (ms)", ylabel="fraction of requests", title="Time to first token, CDF", ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    if series.ttft_s or series.ttft_percentiles:
        ax.legend(fontsize=7)
    images["ttft_cdf.png"] = _png(fig)
    plt.close(fig)

    for name, data in images.items():
        (out_dir / name).write_bytes(data)
    rows = [
        ("peak chip power", f"{max(series.power_w) / 1e3:.1f} kW" if series.power_w else "n/a"),
        ("jobs", ", ".join(f"{j}: {len(p)} steps" for j, p in sorted(series.steps.items())) or "n/a"),
        ("requests with TTFT", str(len(series.ttft_s)) if series.ttft_s else "n/a"),
    ]
    if series.ttft_s:
        arr = np.asarray(series.ttft_s) * 1e3
        rows.append(("TTFT p50 / p99", f"{np.percentile(arr, 50):.1f} / {np.percentile(arr, 99):.1f} ms"))
    table = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    imgs = "".join(
        f'<figure><img alt="{n}" src="data:image/png;base64,{base64.b64encode(d).decode()}"></figure>'
        for n, d in images.items())
    page = out_dir / "report.html"
    page.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}th{text-align:left;padding-right:2em}"
        "img{max-width:100%}</style></head>"
        f"<body><h1>{html.escape(title)}</h1><table>{table}</table>{imgs}</body></html>")
    return page
