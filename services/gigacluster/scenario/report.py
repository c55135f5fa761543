"""What a scenario run observed -> its report (a JSON-ready dict) and markdown tables. Pure: no I/O.

The runner hands :func:`build` plain dicts (``Observed``): each job's last Job message (after the run's
end, when every job still running was cancelled, so usage stops growing), the idle-cluster estimate of
its spec, the step times it was seen running at, each tenant's ``GetTenantUsage``, the fabric's
``GetLinkStats`` samples and the load test's summary. How each figure is computed is in
docs/scenarios.md ("The report").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from gigacluster.scenario import contention

J_PER_KWH = 3.6e6


def _div(a: float, b: float) -> float | None:
    return a / b if b > 0 else None


def mean_step_s(samples: Sequence[float], job: dict[str, Any]) -> float | None:
    """The job's live mean step time: the scheduler's exact mean over every step it ran (``mean_step_time_s``,
    redone steps included); from a scheduler without it, the mean of the distinct steps the runner saw
    (``last_step_time_s`` per step number), else the Job message's mean breakdown (compute + exposed comm +
    bubble). The samples depended on which steps a sample instant caught, which on the event clock could move
    from run to run."""
    exact = float(job.get("mean_step_time_s", 0.0) or 0.0)
    if exact > 0 and math.isfinite(exact):
        return exact
    vals = [s for s in samples if s > 0 and math.isfinite(s)]
    if vals:
        return sum(vals) / len(vals)
    bd = float(job.get("compute_s", 0.0)) + float(job.get("exposed_comm_s", 0.0)) + float(job.get("bubble_s", 0.0))
    return bd if job.get("step") and bd > 0 else None


def allocated_s(job: dict[str, Any], end_s: float) -> float:
    """Virtual seconds since the job first started (its goodput's denominator); 0 if it never started."""
    if not job.get("started_s"):
        return 0.0
    return max(0.0, float(job.get("finished_s") or end_s) - float(job["started_s"]))


def job_row(j: dict[str, Any], end_s: float) -> dict[str, Any]:
    """One job of the report: the Job message's figures and the slowdown against the idle estimate."""
    job = j["job"]
    mean = mean_step_s(j.get("step_samples", ()), job)
    est = j.get("estimate_step_s")
    alloc = allocated_s(job, end_s)
    usage = job.get("usage", {})
    return {
        "key": j["key"], "tenant": j["tenant"], "name": j["name"], "job": job.get("name", ""),
        "chips": j["chips"], "submit_at_s": j["at_s"], "state_at_end": j.get("state_at_end", job.get("state", "")),
        "error": j.get("error", ""),
        "steps": int(job.get("step", 0)), "steps_total": int(job.get("steps_total", 0)),
        "mean_step_s": mean, "estimate_step_s": est,
        "slowdown": (mean / est - 1.0) if mean and est else None,
        "mfu": float(job.get("mfu", 0.0)), "estimate_mfu": j.get("estimate_mfu"),
        "goodput": float(job.get("goodput", 0.0)), "allocated_s": alloc,
        # Virtual time spent in steps (kept or lost) over the allocated time: below the goodput's complement
        # of restarts, pauses and lost work, the rest is the emulator falling behind its clock between steps.
        "stepping_share": _div(int(job.get("step", 0)) * (mean or 0.0) + float(job.get("lost_s", 0.0)), alloc),
        "useful_s": float(job.get("goodput", 0.0)) * alloc,
        "lost_s": float(job.get("lost_s", 0.0)), "restart_s": float(job.get("restart_s", 0.0)),
        "checkpoint_pause_s": float(job.get("checkpoint_pause_s", 0.0)),
        "restarts": int(job.get("restarts", 0)), "failures": int(job.get("failures", 0)),
        "preemptions": int(job.get("preemptions", 0)),
        "chip_hours": float(usage.get("chip_hours", 0.0)),
        "energy_it_kwh": float(usage.get("energy_it_j", 0.0)) / J_PER_KWH,
        "energy_facility_kwh": float(usage.get("energy_facility_j", 0.0)) / J_PER_KWH,
        "cost_usd": float(usage.get("cost_usd", 0.0)),
    }


def tenant_row(t: dict[str, Any], jobs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One tenant: usage from GetTenantUsage, goodput as useful over allocated chip-seconds of its jobs."""
    mine = [j for j in jobs if j["tenant"] == t["name"]]
    alloc = sum(j["allocated_s"] * j["chips"] for j in mine)
    useful = sum(j["useful_s"] * j["chips"] for j in mine)
    u = t.get("usage", {})
    return {
        "name": t["name"], "tenant": t["id"], "weight": t["weight"], "jobs": len(mine),
        "failed_to_submit": sum(1 for j in mine if j["error"]),
        "chip_hours": float(u.get("chip_hours", 0.0)),
        "chip_hours_of_jobs": sum(j["chip_hours"] for j in mine),
        "goodput": _div(useful, alloc),
        "lost_chip_hours": sum(j["lost_s"] * j["chips"] for j in mine) / 3600.0,
        "restart_chip_hours": sum(j["restart_s"] * j["chips"] for j in mine) / 3600.0,
        "checkpoint_chip_hours": sum(j["checkpoint_pause_s"] * j["chips"] for j in mine) / 3600.0,
        "energy_it_kwh": float(u.get("energy_it_j", 0.0)) / J_PER_KWH,
        "energy_facility_kwh": float(u.get("energy_facility_j", 0.0)) / J_PER_KWH,
        "cost_usd": float(u.get("cost_usd", 0.0)),
        "chip_hours_share": float(t.get("chip_hours_share", 0.0)),
    }


def tier_rows(samples: Sequence[dict[str, Any]],
              totals: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Per fabric tier: the time-average link utilisation over the run, from the fabric's cumulative link-seconds
    of utilisation read at the run's start and end (``totals``: flows and steady-state windows alike), and the
    bytes carried meanwhile; the highest link utilisation seen at a sample (flows at that instant, and the peak of
    each open window's step); the most links seen down or degraded at once; and, for comparison, the mean of the
    samples' instantaneous tier means (which never see a window's bytes). Without totals (a fabric that does not
    report them) ``mean_utilization`` is that sampled mean."""
    tiers: dict[str, dict[str, Any]] = {}
    for s in samples:
        for t in s["tiers"]:
            row = tiers.setdefault(t["tier"], {"tier": t["tier"], "links": t["links"], "samples": 0, "sum": 0.0,
                                                 "peak_utilization": 0.0, "max_links_faulty": 0})
            row["samples"] += 1
            row["sum"] += t["mean_utilization"]
            row["peak_utilization"] = max(row["peak_utilization"], t["max_utilization"])
            row["max_links_faulty"] = max(row["max_links_faulty"], t["links_down"] + t["links_degraded"])
    start, end = (totals or {}).get("start"), (totals or {}).get("end")
    elapsed = float(end["t_s"]) - float(start["t_s"]) if start and end else 0.0
    for name, t in (end or {}).get("tiers", {}).items() if elapsed > 0 else ():
        tiers.setdefault(name, {"tier": name, "links": t["links"], "samples": 0, "sum": 0.0,
                                "peak_utilization": 0.0, "max_links_faulty": 0})
    out = []
    for r in tiers.values():
        sampled = r["sum"] / r["samples"] if r["samples"] else 0.0
        row = {"tier": r["tier"], "links": r["links"], "samples": r["samples"], "mean_utilization": sampled,
               "sampled_mean_utilization": sampled, "busy_link_s": None, "bytes_carried": None,
               "elapsed_s": elapsed or None, "peak_utilization": r["peak_utilization"],
               "max_links_faulty": r["max_links_faulty"]}
        a, b = (start or {}).get("tiers", {}).get(r["tier"]), (end or {}).get("tiers", {}).get(r["tier"])
        if elapsed > 0 and a and b and r["links"]:
            busy = float(b["busy_link_s"]) - float(a["busy_link_s"])
            row.update(busy_link_s=busy, bytes_carried=float(b["bytes_carried"]) - float(a["bytes_carried"]),
                       mean_utilization=busy / (r["links"] * elapsed))
        out.append(row)
    return out


def inference_rows(summary: dict[str, Any] | None, speedup: float, duration_s: float) -> list[dict[str, Any]]:
    """Per trace stream, from the load test's summary (wall seconds): TTFT and TPOT percentiles converted to
    virtual seconds (x speedup), the server's own virtual TTFT, and SLO goodput per virtual second."""
    if not summary:
        return []
    out = []
    for s in summary["streams"]:
        slo = s.get("slo") or {}
        out.append({
            "stream": s["name"], "offered": s["offered"], "ok": s["ok"], "statuses": s["statuses"],
            "ttft_p50_s": s["ttft"]["p50"] * speedup, "ttft_p99_s": s["ttft"]["p99"] * speedup,
            "tpot_p50_s": s["tpot"]["p50"] * speedup, "tpot_p99_s": s["tpot"]["p99"] * speedup,
            "server_ttft_p50_s": s["virtual_ttft"]["p50"], "server_ttft_p99_s": s["virtual_ttft"]["p99"],
            "slo_ttft_s": slo.get("ttft_s", 0.0) * speedup, "slo_tpot_s": slo.get("tpot_s", 0.0) * speedup,
            "slo_met": slo.get("met", 0), "slo_attainment_pct": slo.get("attainment_pct"),
            "slo_goodput_per_s": _div(slo.get("met", 0), duration_s),
            "tokens": s["tokens"], "send_lag_p99_s": s["send_lag_p99_s"],
        })
    return out


def build(obs: dict[str, Any]) -> dict[str, Any]:
    """The report of one run (see the module docstring for ``obs``)."""
    end_s = float(obs["end_s"])
    jobs = [job_row(j, end_s) for j in obs["jobs"]]
    tenants = [tenant_row(t, jobs) for t in obs["tenants"]]
    inf = obs.get("inference") or {}
    total_ch = sum(t["chip_hours"] for t in tenants)
    return {
        "scenario": obs["scenario"], "site": obs["site"], "speedup_expected": obs.get("speedup_expected") or None,
        "speedup_stack": obs["speedup_stack"], "clock": obs.get("clock", "wall"), "wall_s": obs["wall_s"],
        "virtual_s": obs["virtual_s"],
        "speedup_reached": _div(obs["virtual_s"], obs["wall_s"]),
        "totals": {
            "jobs": len(jobs), "jobs_submitted": sum(1 for j in jobs if j["job"]),
            "chip_hours": total_ch, "chip_hours_of_jobs": sum(j["chip_hours"] for j in jobs),
            "energy_it_kwh": sum(t["energy_it_kwh"] for t in tenants),
            "energy_facility_kwh": sum(t["energy_facility_kwh"] for t in tenants),
            "cost_usd": sum(t["cost_usd"] for t in tenants),
            "goodput": _div(sum(j["useful_s"] * j["chips"] for j in jobs),
                            sum(j["allocated_s"] * j["chips"] for j in jobs)),
            "stepping_share": _div(sum((j["stepping_share"] or 0.0) * j["allocated_s"] * j["chips"] for j in jobs),
                                   sum(j["allocated_s"] * j["chips"] for j in jobs)),
        },
        "tenants": tenants, "jobs": jobs, "tiers": tier_rows(obs.get("link_samples", ()), obs.get("link_totals")),
        "inference": {"deployment": inf.get("deployment", ""), "duration_s": inf.get("duration_s", 0.0),
                      "wall_qps_offered": inf.get("wall_qps", 0.0), "rate_scales": inf.get("rate_scales", {}),
                      "error": inf.get("error", ""),
                      "streams": inference_rows(inf.get("summary"), obs["speedup_stack"], inf.get("duration_s", 0.0))},
        "faults": list(obs.get("faults", ())),
        "contention": contention.build(obs["jobs"], inf.get("requests", ()), obs["speedup_stack"],
                                       v0_s=obs.get("end_s", 0.0) - obs.get("virtual_s", 0.0),
                                       end_s=obs.get("end_s", math.inf)),
    }


def _f(v: Any, fmt: str = ".3g") -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return "-"
    return format(v, fmt) if isinstance(v, int | float) else str(v)


def _pct(v: Any) -> str:
    return "-" if v is None else f"{v * 100:+.1f}%"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def markdown(rep: dict[str, Any]) -> str:
    """The report as markdown tables (also what ``scenario run`` prints)."""
    t = rep["totals"]
    lines = [f"# Scenario {rep['scenario']} on {rep['site']['chips']:,} x {rep['site']['chip']}", "",
             f"{rep['virtual_s']:.0f} virtual s in {rep['wall_s']:.1f} wall s: speed-up reached "
             f"{_f(rep['speedup_reached'], '.1f')}x ("
             + ("event clock" if rep.get("clock") == "event" else f"stack clock {rep['speedup_stack']:.1f}x")
             + "; jobs in steps "
             f"{_f(t['stepping_share'], '.0%')} of their allocated time); "
             f"{t['jobs_submitted']}/{t['jobs']} jobs submitted, {t['chip_hours']:.1f} chip-hours, goodput "
             f"{_f(t['goodput'], '.3f')}, {t['energy_it_kwh']:.1f} kWh IT / "
             f"{t['energy_facility_kwh']:.1f} kWh facility, "
             f"${t['cost_usd']:,.2f}", "", "## Tenants", ""]
    lines += _table(("tenant", "weight", "jobs", "chip-h", "goodput", "lost chip-h", "restart chip-h",
                     "ckpt chip-h", "IT kWh", "facility kWh", "cost $"),
                    [(r["name"], _f(r["weight"]), str(r["jobs"]), f"{r['chip_hours']:.2f}", _f(r["goodput"], ".3f"),
                      f"{r['lost_chip_hours']:.2f}", f"{r['restart_chip_hours']:.2f}",
                      f"{r['checkpoint_chip_hours']:.2f}", f"{r['energy_it_kwh']:.2f}",
                      f"{r['energy_facility_kwh']:.2f}", f"{r['cost_usd']:,.2f}") for r in rep["tenants"]])
    lines += ["", "## Jobs", ""]
    lines += _table(("job", "chips", "state", "steps", "mean step s", "idle est s", "slowdown", "MFU", "goodput",
                     "stepping", "restarts", "failures", "chip-h"),
                    [(r["key"], f"{r['chips']:,}", r["state_at_end"] or r["error"][:40],
                      f"{r['steps']}/{r['steps_total']}", _f(r["mean_step_s"], ".4g"), _f(r["estimate_step_s"], ".4g"),
                      _pct(r["slowdown"]), f"{r['mfu'] * 100:.1f}%", f"{r['goodput']:.3f}",
                      _f(r["stepping_share"], ".0%"), str(r["restarts"]),
                      str(r["failures"]), f"{r['chip_hours']:.2f}") for r in rep["jobs"]])
    lines += ["", "## Fabric tiers", ""]
    lines += _table(("tier", "links", "mean utilisation", "TB carried", "peak link", "samples",
                     "sampled mean", "most links faulty"),
                    [(r["tier"], f"{r['links']:,}", f"{r['mean_utilization'] * 100:.3f}%",
                      _f(None if r.get("bytes_carried") is None else r["bytes_carried"] / 1e12, ".4g"),
                      f"{r['peak_utilization'] * 100:.1f}%", str(r["samples"]),
                      f"{r.get('sampled_mean_utilization', 0.0) * 100:.3f}%", str(r["max_links_faulty"]))
                     for r in rep["tiers"]])
    inf = rep["inference"]
    if inf["streams"] or inf["error"]:
        per = "virtual" if rep.get("clock") == "event" else "wall"
        lines += ["", f"## Inference ({inf['deployment']}, {inf['wall_qps_offered']:.2f} req/s offered per {per} s)"
                  + (f": {inf['error']}" if inf["error"] else ""), ""]
        lines += _table(("stream", "offered", "ok", "TTFT p50 s", "TTFT p99 s", "TPOT p50 s", "TPOT p99 s",
                         "server TTFT p50 s", "SLO met %", "SLO goodput req/s"),
                        [(r["stream"], str(r["offered"]), str(r["ok"]), _f(r["ttft_p50_s"]), _f(r["ttft_p99_s"]),
                          _f(r["tpot_p50_s"]), _f(r["tpot_p99_s"]), _f(r["server_ttft_p50_s"]),
                          _f(r["slo_attainment_pct"], ".1f"), _f(r["slo_goodput_per_s"])) for r in inf["streams"]])
    lines += contention.markdown(rep.get("contention") or {})
    if rep["faults"]:
        lines += ["", "## Faults", ""]
        lines += _table(("at s", "kind", "target", "injected at s", "cleared at s", "affected", "error"),
                        [(f"{f['at_s']:g}", f["kind"], f["target"], _f(f.get("injected_s"), ".0f"),
                          _f(f.get("cleared_s"), ".0f"), str(f.get("affected", 0)), f.get("error", "") or "-")
                         for f in rep["faults"]])
    return "\n".join(lines)
