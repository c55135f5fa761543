"""Synthetic and trace workloads for the offline simulator: lists of :class:`Request`.

Prompts are int32 numpy arrays of token ids (cheap to hash, shared prefixes share memory-free
copies of one group array). Everything is drawn from a seeded ``numpy`` generator, so a workload
is reproducible from its arguments.

Trace format (JSONL, one request per line)::

    {"arrival_s": 0.12, "prompt_tokens": 900, "output_tokens": 128, "prefix_group": "support",
     "prefix_tokens": 700, "priority": 0, "tenant": ""}

``prefix_group`` and the rest are optional. Requests of one ``prefix_group`` draw their prompt from
the group's fixed token stream: the first ``prefix_tokens`` tokens (default: the whole prompt,
like turns of one conversation, which share ``min`` of their lengths) are the group's, the rest
unique to the request.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gigacluster.inference.engine import FIRST_WORD_TOKEN, Request
from gigacluster.inference.hashing import stable_u64
from gigacluster.model import SpecError


def poisson_arrivals(qps: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a Poisson process of rate ``qps`` over ``[0, duration_s)``."""
    if not qps > 0:
        raise SpecError("qps", f"must be > 0, got {qps!r}")
    if not duration_s > 0:
        raise SpecError("duration", f"must be > 0, got {duration_s!r}")
    n = int(rng.poisson(qps * duration_s))
    return np.sort(rng.uniform(0.0, duration_s, size=n))


def _tokens(rng: np.random.Generator, n: int, vocab: int) -> np.ndarray:
    return rng.integers(FIRST_WORD_TOKEN, vocab, size=n, dtype=np.int32)


def _lengths(rng: np.random.Generator, mean: int, n: int, spread: float, field: str) -> np.ndarray:
    if not isinstance(mean, int | np.integer) or mean < 1:
        raise SpecError(field, f"must be an integer >= 1, got {mean!r}")
    if spread <= 0:
        return np.full(n, mean, dtype=np.int64)
    lo, hi = max(1, int(mean * (1 - spread))), max(1, int(mean * (1 + spread)))
    return rng.integers(lo, hi + 1, size=n)


def uniform_workload(
    *, qps: float, duration_s: float, prompt_tokens: int, output_tokens: int, vocab: int = 128256,
    spread: float = 0.0, seed: int = 0,
) -> list[Request]:
    """Poisson arrivals of unrelated prompts (no shared prefix); lengths uniform +-``spread``."""
    rng = np.random.default_rng(seed)
    t = poisson_arrivals(qps, duration_s, rng)
    p = _lengths(rng, prompt_tokens, t.size, spread, "prompt_tokens")
    o = _lengths(rng, output_tokens, t.size, spread, "output_tokens")
    return [
        Request(f"u{i}", _tokens(rng, int(p[i]), vocab), int(o[i]), arrival_s=float(t[i]))
        for i in range(t.size)
    ]


def prefix_workload(
    *, qps: float, duration_s: float, groups: int, prefix_tokens: int, suffix_tokens: int, output_tokens: int,
    vocab: int = 128256, zipf: float = 0.0, seed: int = 0,
) -> list[Request]:
    """Poisson arrivals where each prompt is one of ``groups`` shared prefixes (system prompts,
    few-shot examples, documents) followed by a unique suffix. ``zipf`` > 0 skews group popularity."""
    if not isinstance(groups, int) or groups < 1:
        raise SpecError("groups", f"must be an integer >= 1, got {groups!r}")
    rng = np.random.default_rng(seed)
    t = poisson_arrivals(qps, duration_s, rng)
    heads = [_tokens(rng, prefix_tokens, vocab) for _ in range(groups)]
    w = 1.0 / np.arange(1, groups + 1) ** zipf
    g = rng.choice(groups, size=t.size, p=w / w.sum())
    return [
        Request(f"p{i}", np.concatenate((heads[g[i]], _tokens(rng, suffix_tokens, vocab))), output_tokens,
                arrival_s=float(t[i]))
        for i in range(t.size)
    ]


def load_trace(path: str | Path, *, vocab: int = 128256, seed: int = 0) -> list[Request]:
    """Requests from a JSONL trace (see the module docstring); ``SpecError`` names the bad line."""
    rng = np.random.default_rng(seed)
    streams: dict[str, np.random.Generator] = {}
    group_tokens: dict[str, np.ndarray] = {}
    out: list[Request] = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise SpecError("trace", f"cannot read {path}: {exc}") from exc
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"trace:{no}", f"not JSON: {exc.msg}") from exc
        if not isinstance(rec, dict):
            raise SpecError(f"trace:{no}", "each line must be a JSON object")
        for f in ("arrival_s", "prompt_tokens", "output_tokens"):
            if f not in rec:
                raise SpecError(f"trace:{no}.{f}", "required")
        arrival, p, o = rec["arrival_s"], rec["prompt_tokens"], rec["output_tokens"]
        if not isinstance(arrival, int | float) or arrival < 0:
            raise SpecError(f"trace:{no}.arrival_s", f"must be a number >= 0, got {arrival!r}")
        for f, v in (("prompt_tokens", p), ("output_tokens", o)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise SpecError(f"trace:{no}.{f}", f"must be an integer >= 1, got {v!r}")
        group = rec.get("prefix_group")
        if group is None:
            toks = _tokens(rng, p, vocab)
        else:
            g = str(group)
            shared = rec.get("prefix_tokens", p)
            if not isinstance(shared, int) or not 0 <= shared <= p:
                raise SpecError(f"trace:{no}.prefix_tokens", f"must be in [0, prompt_tokens={p}], got {shared}")
            have = group_tokens.get(g, np.empty(0, dtype=np.int32))
            if have.size < shared:
                gen = streams.setdefault(g, np.random.default_rng(stable_u64(g)))
                have = np.concatenate((have, _tokens(gen, shared - have.size, vocab)))
                group_tokens[g] = have
            toks = np.concatenate((have[:shared], _tokens(rng, p - shared, vocab)))
        prio = rec.get("priority", 0)
        if not isinstance(prio, int):
            raise SpecError(f"trace:{no}.priority", f"must be an integer, got {prio!r}")
        out.append(Request(str(rec.get("id", f"t{no}")), toks, o, priority=prio,
                           arrival_s=float(arrival), tenant=str(rec.get("tenant", ""))))
    out.sort(key=lambda r: r.arrival_s)
    return out
