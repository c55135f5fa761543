"""``gigacluster estimate infer``: latency and capacity of LLM serving, from the inference models.

Without a workload it runs one replica on ``--batch`` equal requests (TTFT, TPOT, tokens/s, how
many sequences fit). With ``--qps Q --duration S`` (Poisson arrivals, optionally prefix-heavy) or
``--trace FILE`` (JSONL) it simulates ``--replicas N`` behind ``--policy`` and reports percentiles.
Exit codes: 0 ok, 2 invalid input (the message names the field) or a model that does not fit.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from gigacluster.hw.catalog import CatalogError
from gigacluster.inference.config import vllm_batch_defaults
from gigacluster.inference.engine import ReplicaConfig
from gigacluster.inference.estimate import estimate_infer
from gigacluster.inference.policies import POLICIES
from gigacluster.inference.sim import simulate
from gigacluster.inference.workload import load_trace, prefix_workload, uniform_workload
from gigacluster.model import DoesNotFitError, SpecError
from gigacluster.model.arch import preset


def register(subparsers: Any) -> None:
    """Add ``infer`` under ``gigacluster estimate``."""
    p = subparsers.add_parser("infer", help="TTFT, TPOT, throughput and KV capacity of LLM serving")
    p.add_argument("--model", default="llama3-8b", help="model preset (llama3-8b, deepseek-v3, gpt-oss-120b, ...)")
    p.add_argument("--chip", default="a100-40gb", help="chip name from the hardware catalog")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel chips per replica")
    p.add_argument("--ep", type=int, default=1,
                   help="MoE: spread the routed experts over EP chips (1 or a multiple of --tp dividing the experts)")
    p.add_argument("--precision", default="bf16", help="bf16, fp16, fp8, mxfp6, mxfp4, nvfp4, fp32 (as the chip has)")
    p.add_argument("--moe-overlap", default="none", help="MoE with --ep > 1: none (default, as vLLM without "
                   "--enable-dbo) or two_batch (DeepSeek's two micro-batches hide one's all-to-all behind the "
                   "other's compute; see gigacluster.inference.moe_work)")
    p.add_argument("--batch", type=int, default=1, help="concurrent sequences (static estimate)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--max-batch", type=int, default=None,
                   help="engine batch slots (vLLM max_num_seqs; default vLLM v1's for the chip: 1024 on 70 GB+"
                        " accelerators other than A100, else 256)")
    p.add_argument("--max-prefill-tokens", type=int, default=None,
                   help="tokens per iteration budget (vLLM max_num_batched_tokens; default vLLM v1's: 8192 or 2048)")
    p.add_argument("--max-queue", type=int, default=1024, help="queued requests per replica before shedding")
    p.add_argument("--kv-fraction", type=float, default=0.9, help="share of HBM for weights + KV (vLLM)")
    p.add_argument("--chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="chunked prefill, vLLM v1's only mode (default); --no-chunked-prefill: vLLM v0 prefill-first")
    p.add_argument("--qps", type=float, default=None, help="Poisson arrival rate (simulation)")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals (simulation)")
    p.add_argument("--trace", default=None, help="JSONL trace of {arrival_s, prompt_tokens, output_tokens, ...}")
    p.add_argument("--prefix-groups", type=int, default=0, help="with --qps: shared-prefix groups (0 = none)")
    p.add_argument("--prefix-tokens", type=int, default=0, help="with --prefix-groups: shared tokens per prompt")
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--policy", default="round_robin", help=f"routing policy: {', '.join(sorted(POLICIES))}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def _config(args: argparse.Namespace) -> ReplicaConfig:
    try:
        tokens, seqs = vllm_batch_defaults(args.chip)
    except CatalogError:
        tokens, seqs = 2048, 256  # the config below names the unknown chip
    return ReplicaConfig(
        arch=preset(args.model), chip=args.chip, tp=args.tp, ep=args.ep, precision=args.precision,
        max_batch=args.max_batch or seqs, kv_fraction=args.kv_fraction, chunked_prefill=args.chunked_prefill,
        max_prefill_tokens=args.max_prefill_tokens or tokens, max_queue=args.max_queue, moe_overlap=args.moe_overlap,
    )


def run(args: argparse.Namespace) -> int:
    """Handler of ``estimate infer``."""
    try:
        cfg = _config(args)
        if args.qps is None and args.trace is None:
            out = estimate_infer(cfg, batch=args.batch, prompt_tokens=args.prompt_tokens,
                                 output_tokens=args.output_tokens).to_dict()
        else:
            out = _simulate(cfg, args)
    except (SpecError, DoesNotFitError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(out)
    return 0


def _simulate(cfg: ReplicaConfig, args: argparse.Namespace) -> dict[str, Any]:
    if args.policy not in POLICIES:
        raise SpecError("policy", f"unknown policy {args.policy!r}; allowed: {', '.join(sorted(POLICIES))}")
    vocab = cfg.arch.vocab
    if args.trace is not None:
        reqs = load_trace(args.trace, vocab=vocab, seed=args.seed)
    elif args.prefix_groups > 0:
        if not 0 < args.prefix_tokens < args.prompt_tokens:
            raise SpecError("prefix_tokens", f"must be in (0, prompt_tokens={args.prompt_tokens}) with --prefix-groups")
        reqs = prefix_workload(qps=args.qps, duration_s=args.duration, groups=args.prefix_groups,
                               prefix_tokens=args.prefix_tokens, suffix_tokens=args.prompt_tokens - args.prefix_tokens,
                               output_tokens=args.output_tokens, vocab=vocab, seed=args.seed)
    else:
        reqs = uniform_workload(qps=args.qps, duration_s=args.duration, prompt_tokens=args.prompt_tokens,
                                output_tokens=args.output_tokens, vocab=vocab, seed=args.seed)
    res = simulate(cfg, reqs, replicas=args.replicas, policy=args.policy, seed=args.seed)
    moe = {"ep": cfg.ep, "chips": cfg.chips} if cfg.arch.is_moe else {}
    return {"model": cfg.arch.name, "chip": cfg.chip, "tp": cfg.tp, **moe, "replicas": args.replicas,
            "offered_requests": len(reqs), **res.to_dict()}


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    return str(v)


def _print(out: dict[str, Any]) -> None:
    """Human-readable report with rich."""
    t = Table(title="gigacluster estimate infer")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    for k, v in out.items():
        if isinstance(v, dict) and "p50" not in v:
            for k2, v2 in v.items():
                t.add_row(f"{k}.{k2}", _fmt(v2))
        elif isinstance(v, dict):
            t.add_row(k, "  ".join(f"{p}={v[p] * 1e3:,.1f}ms" for p in ("p50", "p90", "p99", "p99.9", "mean")))
        else:
            t.add_row(k, _fmt(v))
    Console().print(t)
