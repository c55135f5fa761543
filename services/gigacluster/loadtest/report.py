"""Results -> per-stream HDR percentiles, SLO attainment and goodput, a table, JSON and a PNG (matplotlib, Agg).

SLO accounting follows DistServe (Zhong et al., OSDI 2024) and vLLM's ``benchmark_serving --goodput``:
a request meets the SLO when it succeeded with TTFT <= the TTFT objective and TPOT <= the TPOT
objective, TPOT being ``(e2e - TTFT) / (output tokens - 1)`` (time per output token after the first;
0 for a one-token answer). Attainment is the met share of *offered* requests (an error, a drop or a
timeout misses); goodput is met requests per second of the arrival window (``duration_s``).
"""

from __future__ import annotations

import collections
import json
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from gigacluster.inference.metrics import LatencyHistogram
from gigacluster.loadtest.drivers import Result
from gigacluster.loadtest.scenario import Scenario, Slo

METRICS = ("ttft", "tpot", "itl", "e2e", "virtual_ttft")


def tpot_s(r: Result) -> float:
    """Time per output token after the first, of a successful request (NaN if it failed or has no timings)."""
    if not r.ok or math.isnan(r.e2e_s) or math.isnan(r.ttft_s):
        return math.nan
    return (r.e2e_s - r.ttft_s) / (r.tokens - 1) if r.tokens > 1 else 0.0


def slo_stats(results: Sequence[Result], slo: Slo, duration_s: float) -> dict[str, Any]:
    """How many of ``results`` (one stream's offered requests) met each objective and both, attainment (% of
    offered) and goodput (met both, per second of ``duration_s``)."""
    ok = [r for r in results if r.ok and not math.isnan(r.ttft_s)]
    ttft_met = [r.ttft_s <= slo.ttft_s for r in ok]
    tpot_met = [tpot_s(r) <= slo.tpot_s for r in ok]
    met = sum(a and b for a, b in zip(ttft_met, tpot_met, strict=True))
    n = len(results)
    return {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "offered": n, "met_ttft": sum(ttft_met),
            "met_tpot": sum(tpot_met), "met": met, "attainment_pct": 100.0 * met / n if n else None,
            "goodput_per_s": met / duration_s}


def _hist(values: Sequence[float]) -> dict[str, float]:
    h = LatencyHistogram()
    arr = np.asarray([v for v in values if not math.isnan(v)], dtype=np.float64)
    h.record_many(arr)
    out = h.summary()
    # HDR reports a bucket's upper edge (3 significant digits); never above the exact maximum.
    return {k: (min(v, out["max"]) if k.startswith("p") else v) for k, v in out.items()}


def summarize(scenario: Scenario, results: Sequence[Result], *, wall_s: float) -> dict[str, Any]:
    """Per stream: offered and completed counts and rates, statuses, and latency percentiles (s)."""
    streams = []
    for i, s in enumerate(scenario.streams):
        rs = [r for r in results if r.stream == i]
        ok = [r for r in rs if r.ok]
        statuses = collections.Counter(r.status for r in rs)
        streams.append({
            "name": s.name, "kind": s.kind, "arrival": s.arrival.type,
            "offered": len(rs), "ok": len(ok), "statuses": dict(sorted(statuses.items())),
            "offered_per_s": len(rs) / scenario.duration_s, "ok_per_s": len(ok) / scenario.duration_s,
            "tokens": int(sum(r.tokens for r in ok)),
            "tokens_per_s": sum(r.tokens for r in ok) / wall_s if wall_s > 0 else 0.0,
            "send_lag_p99_s": _hist([r.send_lag_s for r in rs if r.status != "DROPPED"])["p99"],
            "ttft": _hist([r.ttft_s for r in ok]),
            "tpot": _hist([tpot_s(r) for r in ok]),
            "itl": _hist([x for r in ok for x in r.itl_s]),
            "e2e": _hist([r.e2e_s for r in ok]),
            "virtual_ttft": _hist([r.virtual_ttft_s for r in ok]),
            "slo": slo_stats(rs, scenario.slo_of(s), scenario.duration_s) if s.kind != "submit_job" else None,
        })
    return {"scenario": scenario.name, "duration_s": scenario.duration_s, "wall_s": wall_s,
            "tenants": scenario.tenants, "seed": scenario.seed, "streams": streams}


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}" if x else "-"


def table(summary: dict[str, Any]) -> str:
    """A plain-text table (markdown-compatible): one row per stream and latency metric."""
    head = "| stream | kind | offered | ok | other statuses | metric | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for s in summary["streams"]:
        other = ", ".join(f"{k} {v}" for k, v in s["statuses"].items() if k != "OK") or "-"
        metrics = ["e2e"] if s["kind"] == "submit_job" else ["ttft", "tpot", "itl", "e2e"]
        for j, m in enumerate(metrics):
            h = s[m]
            first = j == 0
            lines.append(
                f"| {s['name'] if first else ''} | {s['kind'] if first else ''} | {s['offered'] if first else ''} "
                f"| {s['ok'] if first else ''} | {other if first else ''} | {m} | {_ms(h['p50'])} | {_ms(h['p90'])} "
                f"| {_ms(h['p99'])} | {_ms(h['p99.9'])} | {_ms(h['max'])} |")
    slo_rows = [s for s in summary["streams"] if s.get("slo")]
    if slo_rows:
        head = ("| stream | SLO TTFT ms | SLO TPOT ms | offered | met TTFT | met TPOT | met both | attainment % "
                "| goodput req/s | ok req/s |")
        lines += ["", head, "|---" * (head.count("|") - 1) + "|"]
        for s in slo_rows:
            g = s["slo"]
            att = "-" if g["attainment_pct"] is None else f"{g['attainment_pct']:.1f}"
            lines.append(f"| {s['name']} | {g['ttft_s'] * 1e3:g} | {g['tpot_s'] * 1e3:g} | {g['offered']} "
                         f"| {g['met_ttft']} | {g['met_tpot']} | {g['met']} | {att} | {g['goodput_per_s']:.2f} "
                         f"| {s['ok_per_s']:.2f} |")
    return "\n".join(lines)


def plot(summary: dict[str, Any], results: Sequence[Result], path: pathlib.Path, names: Sequence[str]) -> None:
    """Latency CDFs (TTFT and end-to-end per stream), completions over time, and each request's TTFT against
    its TPOT with the SLO box (attainment and goodput in the legend), as a PNG."""
    from matplotlib.figure import Figure  # deferred: importing matplotlib adds ~0.4 s to every CLI start

    fig = Figure(figsize=(18, 4.5))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    for i, name in enumerate(names):
        ok = [r for r in results if r.stream == i and r.ok]
        for metric, style in (("ttft_s", "-"), ("e2e_s", "--")):
            v = np.sort([getattr(r, metric) for r in ok if not math.isnan(getattr(r, metric))])
            if v.size:
                ax1.plot(v * 1e3, np.arange(1, v.size + 1) / v.size, style, label=f"{name} {metric[:-2]}")
        t = np.sort([r.intended_s + r.e2e_s for r in ok if not math.isnan(r.e2e_s)])
        if t.size:
            bins = np.arange(0, math.ceil(t[-1]) + 1, 1.0)
            counts, edges = np.histogram(t, bins=bins)
            ax2.step(edges[:-1], counts, where="post", label=name)
    ax1.set_xscale("log")
    ax1.set_xlabel("latency from intended send (ms, log)")
    ax1.set_ylabel("fraction of requests")
    ax1.set_title("latency CDF (TTFT solid, end-to-end dashed)")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=7)
    for i, (name, st) in enumerate(zip(names, summary["streams"], strict=True)):
        g = st.get("slo")
        if not g:
            continue
        ok = [r for r in results if r.stream == i and r.ok and not math.isnan(r.ttft_s)]
        att = "-" if g["attainment_pct"] is None else f"{g['attainment_pct']:.0f}%"
        points = ax3.scatter([r.ttft_s * 1e3 for r in ok], [tpot_s(r) * 1e3 for r in ok], s=6, alpha=0.5,
                             label=f"{name}: {att} met, goodput {g['goodput_per_s']:.2f}/s")
        ax3.axvline(g["ttft_s"] * 1e3, color=points.get_facecolor()[0], ls="--", lw=1)
        ax3.axhline(g["tpot_s"] * 1e3, color=points.get_facecolor()[0], ls="--", lw=1)
    ax3.set_xscale("log")
    ax3.set_yscale("log")
    ax3.set_xlabel("TTFT (ms, log)")
    ax3.set_ylabel("TPOT (ms per output token, log)")
    ax3.set_title("per request vs SLO (dashed: objectives)")
    ax3.grid(True, which="both", alpha=0.3)
    if ax3.has_data():
        ax3.legend(fontsize=7)
    ax2.set_xlabel("wall time since start (s)")
    ax2.set_ylabel("completions per second")
    ax2.set_title(f"{summary['scenario']}: throughput")
    ax2.grid(True, alpha=0.3)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def write(out_dir: pathlib.Path, scenario: Scenario, summary: dict[str, Any], results: Sequence[Result]) -> list[
        pathlib.Path]:
    """summary.json, summary.md (the table), results.jsonl (one line per arrival) and latency.png."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "summary.json", out_dir / "summary.md", out_dir / "results.jsonl", out_dir / "latency.png"]
    paths[0].write_text(json.dumps(summary, indent=2) + "\n")
    paths[1].write_text(table(summary) + "\n")
    with paths[2].open("w") as f:
        for r in results:
            f.write(json.dumps({"stream": scenario.streams[r.stream].name, "intended_s": r.intended_s,
                                "status": r.status, "send_lag_s": r.send_lag_s, "ttft_s": _num(r.ttft_s),
                                "e2e_s": _num(r.e2e_s), "tpot_s": _num(tpot_s(r)), "tokens": r.tokens,
                                "virtual_ttft_s": _num(r.virtual_ttft_s), "detail": r.detail}) + "\n")
    plot(summary, results, paths[3], [s.name for s in scenario.streams])
    return paths


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x
