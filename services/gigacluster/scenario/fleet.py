"""The scenario's inference fleet as a load-test run (:mod:`gigacluster.loadtest`), and its results back on the
scenario's virtual clock. Pure: the runner does the I/O."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from gigacluster.loadtest import azure
from gigacluster.loadtest import runner as lt_runner
from gigacluster.loadtest import scenario as lt_scenario
from gigacluster.scenario.spec import Inference, Scenario, Stream


def rate_scales(sc: Scenario, inf: Inference, speedup: float) -> tuple[dict[str, float], float]:
    """Each stream's rate scale, reduced evenly so the offered total stays at or under ``max_wall_qps``, and that
    total (requests per wall second)."""
    wall_s = inf.duration_s / speedup
    natural = {}
    for s in inf.streams:
        if s.steady:
            natural[s.name] = s.rate_per_s * speedup
            continue
        trace = azure.read(sc.resolve(s.path))
        t0, t1 = s.trace_start_s, s.trace_start_s + inf.duration_s * inf.trace_speed
        rows = int(np.count_nonzero((trace.t_s >= t0) & (trace.t_s < t1)))
        natural[s.name] = rows * s.rate_scale / wall_s
    total = sum(natural.values())
    cut = min(1.0, inf.max_wall_qps / total) if total > 0 else 1.0
    return {s.name: s.rate_scale * cut for s in inf.streams}, total * cut


def _lt_stream(sc: Scenario, inf: Inference, s: Stream, scale: float, speedup: float) -> lt_scenario.Stream:
    """A scenario stream as a load-test stream in wall seconds (a steady one evenly spaced at its rate)."""
    if s.steady:
        return lt_scenario.Stream(name=s.name, kind="generate", context_tokens=s.context_tokens,
                                  prompt_tokens=s.prompt_tokens, max_tokens=s.output_tokens,
                                  arrival=lt_scenario.Arrival(type="uniform", rate_per_s=s.rate_per_s * speedup
                                                              * scale))
    return lt_scenario.Stream(
        name=s.name, kind="generate", context_tokens=s.context_tokens,
        arrival=lt_scenario.Arrival(type="azure_csv", path=str(sc.resolve(s.path)),
                                    speed=inf.trace_speed * speedup, start_s=s.trace_start_s, rate_scale=scale))


def loadtest_scenario(sc: Scenario, inf: Inference, scales: dict[str, float], speedup: float) -> lt_scenario.Scenario:
    """The fleet as a load-test scenario in wall seconds: the trace at ``trace_speed x speed-up`` trace seconds
    per wall second, the SLO divided by the speed-up (the router answers in virtual time)."""
    streams = tuple(_lt_stream(sc, inf, s, scales[s.name], speedup) for s in inf.streams)
    return lt_scenario.Scenario(
        name=f"{sc.name}-inference", streams=streams, duration_s=inf.duration_s / speedup, seed=sc.seed,
        tenants=1, max_in_flight=inf.max_in_flight, drain_s=inf.drain_s, deploy=dict(inf.deploy),
        slo=lt_scenario.Slo(inf.slo.ttft_s / speedup, inf.slo.tpot_s / speedup), base_dir=sc.base_dir)


def request_rows(res: lt_runner.Run, w0: float, speedup: float) -> list[dict[str, Any]]:
    """Each request of the fleet on the run's virtual clock (``w0`` the loop time at virtual 0): arrival, the
    router's TTFT and TPOT (virtual), the client's TTFT (wall) and end to end (virtual, the request's lifetime)."""
    rows = []
    for r in res.results:
        tpot = (r.virtual_e2e_s - r.virtual_ttft_s) / (r.tokens - 1) if r.tokens > 1 else math.nan
        rows.append({"arrival_s": (res.start_s + r.intended_s - w0) * speedup, "ok": r.ok,
                     "server_ttft_s": r.virtual_ttft_s, "server_tpot_s": tpot, "client_ttft_s": r.ttft_s,
                     "e2e_s": r.virtual_e2e_s if math.isfinite(r.virtual_e2e_s) else r.e2e_s * speedup})
    return rows
