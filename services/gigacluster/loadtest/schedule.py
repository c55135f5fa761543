"""The arrival timeline, computed whole before the first send.

Open loop: each arrival has a fixed intended time; the runner sends at that time whatever the
state of earlier requests, and latency counts from the intended time, so a stalled server shows
up as latency instead of silently lowering the offered load (coordinated omission).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

import numpy as np

from gigacluster.errors import InvalidArgument
from gigacluster.loadtest import azure
from gigacluster.loadtest.scenario import Arrival, Scenario, Stream


@dataclasses.dataclass(frozen=True)
class Timeline:
    """Arrivals of all streams merged and sorted: time (s from start), stream index, and per-arrival
    prompt and output token counts (from the stream, or from the trace row)."""

    t_s: np.ndarray
    stream: np.ndarray
    prompt_tokens: np.ndarray
    max_tokens: np.ndarray

    def __len__(self) -> int:
        return int(self.t_s.size)


def poisson_times(rate_per_s: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Poisson process of ``rate_per_s`` in [0, duration_s): exponential gaps."""
    n_guess = int(rate_per_s * duration_s + 10 * np.sqrt(rate_per_s * duration_s) + 10)
    t = np.cumsum(rng.exponential(1.0 / rate_per_s, n_guess))
    while t[-1] < duration_s:  # extremely unlikely; extend rather than truncate the process
        t = np.concatenate([t, t[-1] + np.cumsum(rng.exponential(1.0 / rate_per_s, n_guess))])
    return t[t < duration_s]


def uniform_times(rate_per_s: float, duration_s: float) -> np.ndarray:
    """Evenly spaced arrivals at ``rate_per_s`` in [0, duration_s)."""
    return np.arange(0.0, duration_s, 1.0 / rate_per_s)


def trace_rows(path: pathlib.Path, time_scale: float, duration_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(times, prompt tokens, output tokens) of a JSON-lines trace's rows that fall within the duration;
    token counts are 0 where the row has none (the stream's defaults apply)."""
    t, p, o = [], [], []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        if "arrival_s" not in row:
            raise InvalidArgument("arrival.path", f"{path} line {i + 1} has no arrival_s")
        ts = float(row["arrival_s"]) * time_scale
        if ts < duration_s:
            t.append(ts)
            p.append(int(row.get("prompt_tokens", 0)))
            o.append(int(row.get("output_tokens", 0)))
    order = np.argsort(np.asarray(t), kind="stable")
    return np.asarray(t, float)[order], np.asarray(p, np.int64)[order], np.asarray(o, np.int64)[order]


def bound_tokens(stream: Stream, prompt: np.ndarray, output: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-arrival (prompt, max_tokens) of trace rows: a row's counts, the stream's defaults where a row has 0,
    cut to what the router accepts (output at most context - 1, prompt at most max_prompt_tokens and
    context - output). Only trace rows are cut: a stream's own explicit sizes go to the router as written."""
    out = np.minimum(np.where(output > 0, output, stream.max_tokens), stream.context_tokens - 1)
    p = np.where(prompt > 0, prompt, stream.prompt_tokens)
    p = np.clip(p, 1, np.minimum(stream.max_prompt_tokens, stream.context_tokens - out))
    return p.astype(np.int64), out.astype(np.int64)


def build(scenario: Scenario) -> Timeline:
    """The merged timeline of every stream of ``scenario`` (deterministic for a given seed)."""
    rng = np.random.default_rng(scenario.seed)
    ts, ss, ps, ms = [], [], [], []
    for i, s in enumerate(scenario.streams):
        a: Arrival = s.arrival
        if a.type == "poisson":
            t = poisson_times(a.rate_per_s, scenario.duration_s, rng)
            p, o = np.full(t.size, s.prompt_tokens, np.int64), np.full(t.size, s.max_tokens, np.int64)
        elif a.type == "uniform":
            t = uniform_times(a.rate_per_s, scenario.duration_s)
            p, o = np.full(t.size, s.prompt_tokens, np.int64), np.full(t.size, s.max_tokens, np.int64)
        elif a.type == "azure_csv":
            t, p, o = azure.replay(azure.read(scenario.resolve(a.path)), speed=a.speed, start_s=a.start_s,
                                   window_s=a.window_s, duration_s=scenario.duration_s, rate_scale=a.rate_scale,
                                   target_qps=a.target_qps)
        else:
            t, p, o = trace_rows(scenario.resolve(a.path), a.time_scale, scenario.duration_s)
        if a.type in ("trace", "azure_csv"):
            p, o = bound_tokens(s, p, o)
        ts.append(t)
        ss.append(np.full(t.size, i, np.int64))
        ps.append(p)
        ms.append(o)
    t_all = np.concatenate(ts)
    order = np.argsort(t_all, kind="stable")
    return Timeline(t_all[order], np.concatenate(ss)[order], np.concatenate(ps)[order], np.concatenate(ms)[order])
