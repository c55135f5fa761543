"""Single-replica static estimate (``gigacluster estimate infer`` without a workload).

It runs the same :class:`ReplicaEngine` on ``batch`` identical requests that arrive together,
so TTFT and TPOT come from exactly the iterations the live mesh would run.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from gigacluster.inference.engine import ReplicaConfig, ReplicaEngine, Request
from gigacluster.inference.moe_work import touched_fraction, weight_elem_bytes
from gigacluster.model import SpecError


@dataclasses.dataclass(frozen=True)
class InferEstimate:
    """Latency and capacity of one replica serving ``batch`` equal requests."""

    model: str
    chip: str
    tp: int
    precision: str
    batch: int
    prompt_tokens: int
    output_tokens: int
    ttft_s: float
    tpot_s: float
    decode_tokens_per_s: float
    prefill_tokens_per_s: float
    max_batch_fit: int
    kv_cache_bytes: float
    weight_bytes: float
    decode_roofline_tokens_per_s: float
    decode_roofline_frac: float
    moe: dict[str, Any] | None = None  # MoE replicas only: ep, chips, expert bytes per GPU, ...

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if d["moe"] is None:  # dense output unchanged
            del d["moe"]
        return d


def moe_facts(cfg: ReplicaConfig, batch: int) -> dict[str, Any] | None:
    """What an MoE replica adds to the estimate: layout, per-GPU expert weights, KV per token, the
    share of experts a decode step of ``batch`` tokens reads, and the all-to-all bytes."""
    a = cfg.arch
    if not a.is_moe:
        return None
    s = cfg.shard.moe
    dispatch, combine = s.a2a_bytes(batch)
    return {
        "ep": cfg.ep, "chips": cfg.chips, "dp_attention": s.dp_attn, "experts_per_gpu": s.local_experts
        if cfg.ep > 1 else a.experts, "expert_bytes_per_gpu": s.expert_params() * weight_elem_bytes(cfg.precision),
        "active_params": a.active_params, "total_params": a.params,
        "kv_bytes_per_token_per_gpu": s.kv_bytes_per_token, "kv_window_bytes_per_seq_per_gpu": s.window_bytes_per_seq,
        "decode_experts_touched_frac": touched_fraction(a.experts, a.experts_per_token, batch),
        "decode_weight_read_bytes_per_gpu": s.weight_read_bytes_for(batch),
        "a2a_dispatch_bytes_per_gpu_layer": dispatch, "a2a_combine_bytes_per_gpu_layer": combine,
        "assumption": "uniform routing: a batch of B tokens touches E(1-(1-k/E)^B) experts per layer",
    }


def estimate_infer(cfg: ReplicaConfig, *, batch: int, prompt_tokens: int, output_tokens: int) -> InferEstimate:
    """Run ``batch`` requests of ``prompt_tokens`` + ``output_tokens`` through one replica."""
    for f, v in (("batch", batch), ("prompt_tokens", prompt_tokens), ("output_tokens", output_tokens)):
        if not isinstance(v, int) or v < 1:
            raise SpecError(f, f"must be an integer >= 1, got {v!r}")
    fit = cfg.max_batch_fit(prompt_tokens + output_tokens)
    if batch > fit:
        raise SpecError("batch", f"at most {fit} sequences of {prompt_tokens + output_tokens} tokens fit in the "
                                 f"KV cache of {cfg.kv_cache_bytes / 1e9:.1f} GB")
    if batch > cfg.max_batch:
        raise SpecError("batch", f"must be <= max_batch ({cfg.max_batch})")
    eng = ReplicaEngine(cfg)
    rng = np.random.default_rng(0)
    for i in range(batch):
        toks = rng.integers(256, cfg.arch.vocab, size=prompt_tokens, dtype=np.int32)
        eng.admit(Request(f"e{i}", toks, output_tokens), 0.0)
    t = 0.0
    ttft, tpot = [], []
    while (it := eng.next_iteration(t)) is not None:
        t += it.predicted_s
        for s in eng.complete_batch(it, t).summaries:
            ttft.append(s.ttft_s)
            tpot.append(s.tpot_s)
    ttft_s = float(np.mean(ttft))
    tpot_s = float(np.mean(tpot)) if output_tokens > 1 else 0.0
    mid_ctx = prompt_tokens + output_tokens // 2
    roof = cfg.decode_roofline_tokens_per_s(mid_ctx)
    return InferEstimate(
        model=cfg.arch.name, chip=cfg.chip, tp=cfg.tp, precision=cfg.precision, batch=batch,
        prompt_tokens=prompt_tokens, output_tokens=output_tokens, ttft_s=ttft_s, tpot_s=tpot_s,
        decode_tokens_per_s=1.0 / tpot_s if tpot_s else 0.0,
        prefill_tokens_per_s=batch * prompt_tokens / max(ttft), max_batch_fit=fit,
        kv_cache_bytes=cfg.kv_cache_bytes, weight_bytes=cfg.weight_bytes,
        decode_roofline_tokens_per_s=roof, decode_roofline_frac=(1.0 / tpot_s) / roof if tpot_s else 0.0,
        moe=moe_facts(cfg, batch),
    )
