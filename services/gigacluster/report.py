"""A run's recording (telemetry messages and client-side request records, one JSON object per
line) turned into plots and one HTML page: power over time, step time per job, TTFT CDF.

TTFT comes from one of two sources, and the summary names the one the plot draws: client-side
request records (``{"request": {"ttft_s": ...}}``, written by ``demo --record``), or, for a
recording of a live stack (``gigacluster record``), the router's per-deployment stats on MQTT
(``.../deployments/<id>/stats``: ``requests`` finished and ``ttft_s`` percentiles ``p50`` ...).

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

from gigacluster.model.power import host_overhead_w


@dataclasses.dataclass(frozen=True)
class RouterTTFT:
    """A deployment's TTFT as the router last published it: finished requests and percentiles."""

    requests: int
    percentiles_s: dict[str, float]  # "p50" -> seconds

    def points(self) -> list[tuple[float, float]]:
        """(quantile, seconds) pairs in quantile order, for a CDF through the published percentiles."""
        return sorted((float(k[1:]) / 100, v) for k, v in self.percentiles_s.items())


@dataclasses.dataclass
class RunSeries:
    """What the plots need, extracted from a recording."""

    power_t_s: list[float] = dataclasses.field(default_factory=list)
    power_w: list[float] = dataclasses.field(default_factory=list)
    steps: dict[str, list[tuple[float, int, float, float]]] = dataclasses.field(default_factory=dict)
    ttft_s: list[float] = dataclasses.field(default_factory=list)
    router_ttft: dict[str, RouterTTFT] = dataclasses.field(default_factory=dict)  # by deployment

    @property
    def empty(self) -> bool:
        return not (self.power_w or self.steps or self.ttft_s or self.router_ttft)

    @property
    def ttft_source(self) -> str:
        """Where the TTFT plot and summary come from: "client", "router" or "" (none)."""
        return "client" if self.ttft_s else "router" if self.router_ttft else ""


@dataclasses.dataclass(frozen=True)
class ChipTotals:
    """Every chip shard's GetStats at one instant, summed: metered chip energy since start, power."""

    energy_j: float
    devices: int
    power_w: float
    now_s: float


def cluster_it_energy_j(chip_energy_j: float, devices: int, window_s: float,
                        host_w_per_chip: float | None = None) -> float:
    """The whole cluster's IT energy over a window, on the boundary of a job's ``energy_it_j``.

    A job's IT energy counts its chips (idle floor plus work) and each chip's host share (CPU, DRAM,
    NIC, fans; scheduler/runner.py ``step_energy_it_j``); the chip shards meter the chips alone.
    Adding the host share of every device, idle ones included, over the same window makes the two
    comparable, and the cluster's figure then bounds any job's run inside that window from above.
    """
    host_w = host_overhead_w() if host_w_per_chip is None else host_w_per_chip
    return chip_energy_j + devices * host_w * max(window_s, 0.0)


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
            # Cumulative since the deployment started: the last message of each deployment wins.
            requests = int(p.get("requests", 0))
            pct = {k: float(v) for k, v in p.get("ttft_s", {}).items() if k.startswith("p")}
            if requests > 0 and pct:
                out.router_ttft[str(p.get("deployment") or topic)] = RouterTTFT(requests, pct)
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


def ttft_rows(series: RunSeries) -> list[tuple[str, str]]:
    """The summary's TTFT rows, from the same source the TTFT plot draws."""
    if series.ttft_s:
        arr = np.asarray(series.ttft_s) * 1e3
        return [("requests with TTFT", f"{arr.size} (client-side records)"),
                ("TTFT p50 / p99", f"{np.percentile(arr, 50):.1f} / {np.percentile(arr, 99):.1f} ms")]
    if series.router_ttft:
        total = sum(r.requests for r in series.router_ttft.values())
        rows = [("requests with TTFT", f"{total} (router stats, {len(series.router_ttft)} deployment(s))")]
        for dep, r in sorted(series.router_ttft.items()):
            p50, p99 = r.percentiles_s.get("p50"), r.percentiles_s.get("p99")
            if p50 is not None and p99 is not None:
                rows.append((f"TTFT p50 / p99, {dep}", f"{p50 * 1e3:.1f} / {p99 * 1e3:.1f} ms"))
        return rows
    return [("requests with TTFT", "n/a (no request records and no router deployment stats in the recording)")]


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return buf.getvalue()


def render(series: RunSeries, out_dir: pathlib.Path, *, title: str = "gigacluster run") -> pathlib.Path:
    """Write power.png, step_time.png, ttft_cdf.png and report.html into ``out_dir``; returns the page."""
    from matplotlib.figure import Figure  # deferred: importing matplotlib adds ~0.4 s to every CLI start

    out_dir.mkdir(parents=True, exist_ok=True)
    images: dict[str, bytes] = {}

    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    if series.power_w:
        ax.plot(series.power_t_s, np.asarray(series.power_w) / 1e3, color="tab:red")
    ax.set(xlabel="virtual time (s)", ylabel="chip power (kW)", title="Power of all chips")
    ax.grid(alpha=0.3)
    images["power.png"] = _png(fig)

    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
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

    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    if series.ttft_s:
        xs = np.sort(np.asarray(series.ttft_s)) * 1e3
        ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label=f"{xs.size} requests")
    else:
        for dep, r in sorted(series.router_ttft.items()):
            ps = r.points()
            ax.step([v * 1e3 for _, v in ps], [q for q, _ in ps], where="post", marker="o",
                    label=f"{dep}: {r.requests} requests (router percentiles)")
    ax.set(xlabel="TTFT (ms)", ylabel="fraction of requests", title="Time to first token, CDF", ylim=(0, 1.02))
    ax.grid(alpha=0.3)
    if series.ttft_source:
        ax.legend(fontsize=7)
    images["ttft_cdf.png"] = _png(fig)

    for name, data in images.items():
        (out_dir / name).write_bytes(data)
    rows = [
        ("peak chip power", f"{max(series.power_w) / 1e3:.1f} kW" if series.power_w else "n/a"),
        ("jobs", ", ".join(f"{j}: {len(p)} steps" for j, p in sorted(series.steps.items())) or "n/a"),
        *ttft_rows(series),
    ]
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
