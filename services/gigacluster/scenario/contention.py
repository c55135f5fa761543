"""Who slowed whom: each training job's steps and the inference fleet's requests split by whether the other ran.

Pure (no I/O). The runner hands :func:`build` every job's step trace (scheduler ``GetJobTrace``: each step's
start, length and communication seconds per collective demand) and the fleet's requests (arrival, the server's
virtual TTFT and TPOT, the client's TTFT), all in virtual seconds from the start of the run. Then:

* a job's steps are *alone* when they do not overlap the fleet's window (its first arrival to its last answer)
  and *with the fleet* when they do; for each set, the mean step time and the mean expert all-to-all time
  (the ``ep_a2a`` demand, every exchange of the step, hidden or not), and the busiest step's all-to-all
  over the alone mean;
* a request is *with training* when its lifetime (arrival to last token) overlaps any job's window (first step
  start to last step end), else *alone*; for each set, TTFT and TPOT percentiles as the router measured them in
  virtual time (the emulated figures) and the client's TTFT (wall x speed-up, which a loaded machine inflates).

The with/alone ratios are the contention, measured: both sets come from the same run, stack and fabric.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

A2A = "ep_a2a"  # the expert-parallel dispatch/combine demand of a training plan (model/moe.py)


def _mean(xs: Sequence[float]) -> float | None:
    vals = [x for x in xs if math.isfinite(x)]
    return float(np.mean(vals)) if vals else None


def _pct(xs: Sequence[float], q: float) -> float | None:
    vals = [x for x in xs if math.isfinite(x)]
    return float(np.percentile(vals, q)) if vals else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _overlaps(lo: float, hi: float, windows: Sequence[tuple[float, float]]) -> bool:
    return any(lo < w_hi and hi > w_lo for w_lo, w_hi in windows)


def job_window(steps: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """(first step's start, last step's end) of a job's trace; None without steps."""
    if not steps:
        return None
    return min(s["start_s"] for s in steps), max(s["start_s"] + s["step_time_s"] for s in steps)


def fleet_window(requests: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """(first arrival, last answer) of the fleet's answered requests; None without any."""
    ok = [r for r in requests if r["ok"]]
    if not ok:
        return None
    return min(r["arrival_s"] for r in ok), max(r["arrival_s"] + r["e2e_s"] for r in ok)


def _steps_summary(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    a2a = [float(s["comm_s"].get(A2A, math.nan)) for s in steps]
    return {"steps": len(steps), "mean_step_s": _mean([s["step_time_s"] for s in steps]),
            "mean_a2a_s": _mean(a2a), "max_a2a_s": max((x for x in a2a if math.isfinite(x)), default=None),
            "mean_exposed_comm_s": _mean([s.get("exposed_comm_s", math.nan) for s in steps])}


def job_contention(key: str, steps: Sequence[dict[str, Any]], fleet: tuple[float, float] | None) -> dict[str, Any]:
    """One job's steps alone and with the fleet, and the slowdowns between them."""
    windows = [fleet] if fleet else []
    with_ = [s for s in steps if _overlaps(s["start_s"], s["start_s"] + s["step_time_s"], windows)]
    alone = [s for s in steps if s not in with_]
    a, w = _steps_summary(alone), _steps_summary(with_)
    step_ratio, a2a_ratio = _ratio(w["mean_step_s"], a["mean_step_s"]), _ratio(w["mean_a2a_s"], a["mean_a2a_s"])
    return {"key": key, "alone": a, "with_fleet": w,
            "step_slowdown": None if step_ratio is None else step_ratio - 1.0,
            "a2a_slowdown": None if a2a_ratio is None else a2a_ratio - 1.0,
            "a2a_peak_ratio": _ratio(w["max_a2a_s"], a["mean_a2a_s"])}


def _requests_summary(reqs: Sequence[dict[str, Any]], speedup: float) -> dict[str, Any]:
    ok = [r for r in reqs if r["ok"]]
    ttft = [r["server_ttft_s"] for r in ok]
    tpot = [r["server_tpot_s"] for r in ok]
    return {"requests": len(reqs), "ok": len(ok),
            "server_ttft_p50_s": _pct(ttft, 50), "server_ttft_p99_s": _pct(ttft, 99),
            "server_ttft_mean_s": _mean(ttft),
            "server_tpot_p50_s": _pct(tpot, 50), "server_tpot_p99_s": _pct(tpot, 99),
            "server_tpot_mean_s": _mean(tpot),
            "client_ttft_p50_s": _pct([r["client_ttft_s"] * speedup for r in ok], 50)}


def fleet_contention(requests: Sequence[dict[str, Any]], jobs: Sequence[tuple[float, float]],
                     speedup: float) -> dict[str, Any]:
    """The fleet's requests alone and with training running, and the slowdowns between them."""
    with_ = [r for r in requests if _overlaps(r["arrival_s"], r["arrival_s"] + (r["e2e_s"] if r["ok"] else 0.0),
                                             jobs)]
    alone = [r for r in requests if r not in with_]
    a, w = _requests_summary(alone, speedup), _requests_summary(with_, speedup)
    out: dict[str, Any] = {"alone": a, "with_training": w}
    for metric in ("ttft_mean", "tpot_mean", "ttft_p50", "tpot_p50"):
        r = _ratio(w[f"server_{metric}_s"], a[f"server_{metric}_s"])
        out[f"{metric}_slowdown"] = None if r is None else r - 1.0
    return out


def run_window(job: dict[str, Any], v0_s: float, end_s: float) -> tuple[float, float] | None:
    """(start, end) of a job's run from its record (``started_s`` to ``finished_s``, or the run's ``end_s``; stack
    times, relative to ``v0_s``), else of its trace: a trace holds a job's latest steps only (GetJobTrace), so in a
    long run it may begin after the fleet's window though the job ran all along."""
    rec = job.get("job") or {}
    if rec.get("started_s"):
        return rec["started_s"] - v0_s, (rec.get("finished_s") or end_s) - v0_s
    return job_window(job.get("trace", ()))


def build(jobs: Sequence[dict[str, Any]], requests: Sequence[dict[str, Any]], speedup: float, *,
          v0_s: float = 0.0, end_s: float = math.inf) -> dict[str, Any]:
    """The contention section of a report: per job with a step trace, and the fleet (empty without a fleet or
    without jobs that stepped). Requests are classed by the jobs' runs (:func:`run_window`)."""
    fleet = fleet_window(requests)
    windows = [w for w in (run_window(j, v0_s, end_s) for j in jobs if j.get("trace")) if w]
    if fleet is None or not windows:
        return {}
    return {"fleet_window_s": list(fleet), "job_windows_s": [list(w) for w in windows],
            "jobs": [job_contention(j["key"], j["trace"], fleet) for j in jobs if j.get("trace")],
            "fleet": fleet_contention(requests, windows, speedup)}


def check(c: dict[str, Any], offered: int) -> list[str]:
    """What is inconsistent in a contention section: the two phases must hold every offered request once, and
    every slowdown must follow from its phase means (empty when all holds, or without a section)."""
    if not c:
        return []
    f = c["fleet"]
    bad = []
    if f["alone"]["requests"] + f["with_training"]["requests"] != offered:
        bad.append(f"contention: {f['alone']['requests']} + {f['with_training']['requests']} requests in the "
                   f"phases, {offered} offered")
    for j in c["jobs"]:
        ratio = _ratio(j["with_fleet"]["mean_a2a_s"], j["alone"]["mean_a2a_s"])
        if ratio is not None and not math.isclose(j["a2a_slowdown"], ratio - 1.0, rel_tol=1e-9, abs_tol=1e-12):
            bad.append(f"contention: {j['key']} all-to-all slowdown {j['a2a_slowdown']} != {ratio - 1.0}")
    return bad


def _f(v: Any, fmt: str = ".4g") -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, fmt)


def _pct_s(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def markdown(c: dict[str, Any]) -> list[str]:
    """The contention tables (empty when there is no contention section)."""
    if not c:
        return []
    lines = ["", "## Contention: training alone vs with the inference fleet", "",
             "| job | steps alone / with | mean step s alone | with | slowdown | all-to-all s alone | with | "
             "slowdown | busiest step's all-to-all / alone |", "|---" * 9 + "|"]
    for j in c["jobs"]:
        a, w = j["alone"], j["with_fleet"]
        lines.append(f"| {j['key']} | {a['steps']} / {w['steps']} | {_f(a['mean_step_s'])} | {_f(w['mean_step_s'])} "
                     f"| {_pct_s(j['step_slowdown'])} | {_f(a['mean_a2a_s'])} | {_f(w['mean_a2a_s'])} | "
                     f"{_pct_s(j['a2a_slowdown'])} | {_f(j['a2a_peak_ratio'], '.3f')} |")
    f = c["fleet"]
    a, w = f["alone"], f["with_training"]
    lines += ["", "## Contention: the inference fleet alone vs with training (virtual s, as the router measured)", "",
              "| requests | answered | TTFT p50 | TTFT p99 | TTFT mean | TPOT p50 | TPOT p99 | TPOT mean | "
              "client TTFT p50 |", "|---" * 9 + "|"]
    for name, s in (("alone", a), ("with training", w)):
        lines.append(f"| {name}: {s['requests']} | {s['ok']} | {_f(s['server_ttft_p50_s'])} | "
                     f"{_f(s['server_ttft_p99_s'])} | {_f(s['server_ttft_mean_s'])} | {_f(s['server_tpot_p50_s'])} | "
                     f"{_f(s['server_tpot_p99_s'])} | {_f(s['server_tpot_mean_s'])} | {_f(s['client_ttft_p50_s'])} |")
    lines.append(f"| slowdown | | {_pct_s(f['ttft_p50_slowdown'])} | | {_pct_s(f['ttft_mean_slowdown'])} | "
                 f"{_pct_s(f['tpot_p50_slowdown'])} | | {_pct_s(f['tpot_mean_slowdown'])} | |")
    return lines
