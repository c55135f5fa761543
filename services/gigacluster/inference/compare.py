"""Routing comparison behind docs/inference.md: every policy on the same workloads.

``python -m gigacluster.inference.compare [--quick]`` prints the markdown tables of the doc:
8 replicas of llama3-8b on a100-40gb (the GKE Inference Gateway study's setup, calibration.md
section 6), a prefix-heavy workload (shared system prompts) and a uniform one, over a QPS sweep.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from gigacluster.inference.engine import ReplicaConfig, Request
from gigacluster.inference.policies import POLICIES
from gigacluster.inference.sim import simulate
from gigacluster.inference.workload import prefix_workload, uniform_workload
from gigacluster.model.arch import preset

# Prefix-heavy: 128 system prompts of 3,000 tokens, 393 MB of KV each on llama3-8b (50 GB in all):
# more than one A100-40GB's 19 GB of KV cache holds, less than eight replicas' 152 GB.
PREFIX_HEAVY = {"groups": 128, "prefix_tokens": 3000, "suffix_tokens": 200, "output_tokens": 128}
UNIFORM = {"prompt_tokens": 1024, "output_tokens": 128, "spread": 0.5}


def prefix_heavy(qps: float, duration_s: float, seed: int = 1) -> list[Request]:
    return prefix_workload(qps=qps, duration_s=duration_s, seed=seed, **PREFIX_HEAVY)  # type: ignore[arg-type]


def uniform(qps: float, duration_s: float, seed: int = 1) -> list[Request]:
    return uniform_workload(qps=qps, duration_s=duration_s, seed=seed, **UNIFORM)  # type: ignore[arg-type]


def compare(
    cfg: ReplicaConfig,
    make: Callable[[float, float], list[Request]],
    *,
    qps: Sequence[float],
    duration_s: float,
    replicas: int = 8,
    policies: Sequence[str] = tuple(POLICIES),
) -> list[dict[str, Any]]:
    """One row per (qps, policy): TTFT/ITL percentiles, throughput, prefix hit rate."""
    rows = []
    for q in qps:
        for pol in policies:
            res = simulate(cfg, make(q, duration_s), replicas=replicas, policy=pol).to_dict()
            rows.append({
                "qps": q, "policy": pol,
                "ttft_mean_ms": res["ttft_s"]["mean"] * 1e3, "ttft_p99_ms": res["ttft_s"]["p99"] * 1e3,
                "itl_mean_ms": res["itl_s"]["mean"] * 1e3, "itl_p99_ms": res["itl_s"]["p99"] * 1e3,
                "output_tokens_per_s": res["output_tokens_per_s"], "prefix_hit_rate": res["prefix_hit_rate"],
                "rejected": res["rejected"], "preemptions": res["preemptions"],
            })
    return rows


def to_markdown(rows: list[dict[str, Any]]) -> str:
    head = ("| QPS | policy | TTFT mean ms | TTFT p99 ms | ITL mean ms | ITL p99 ms | output tok/s | "
            "prefix hit rate |\n|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['qps']:g} | {r['policy']} | {r['ttft_mean_ms']:,.0f} | {r['ttft_p99_ms']:,.0f} | "
        f"{r['itl_mean_ms']:.1f} | {r['itl_p99_ms']:.1f} | {r['output_tokens_per_s']:,.0f} | "
        f"{r['prefix_hit_rate']:.2f} |\n"
        for r in rows
    )
    return head + body


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--qps", type=float, nargs="+", default=[20.0, 30.0, 40.0])
    ap.add_argument("--uniform-qps", type=float, nargs="+", default=[20.0, 35.0])
    args = ap.parse_args(argv)
    cfg = ReplicaConfig(preset("llama3-8b"), "a100-40gb")
    print("## prefix-heavy\n")
    print(to_markdown(compare(cfg, prefix_heavy, qps=args.qps, duration_s=args.duration)))
    print("## uniform\n")
    print(to_markdown(compare(cfg, uniform, qps=args.uniform_qps, duration_s=args.duration)))


if __name__ == "__main__":
    main()
