"""DeepSeek-V3 served in FP8 on H200: what expert parallelism buys, from one HGX node (TP 8) to wide EP
over four nodes (DP attention), at a fixed 64 sequences per GPU and a 2,048-token context; then the
InferenceMAX-style frontier of three chips for gpt-oss-120b 1k/1k. See docs/inference.md ("Mixtures of
experts"). Run: python examples/serve_moe_wide_ep.py  (a few seconds)."""

from __future__ import annotations

from gigacluster.inference.config import ReplicaConfig
from gigacluster.inference.cost import moe_a2a_s
from gigacluster.inference.frontier import decode_step_s, frontier
from gigacluster.model.arch import preset

ds = preset("deepseek-v3")
print("tp  ep  chips  experts/GPU  KV tokens/GPU  TPOT ms  a2a ms  tok/s/user  tok/s/GPU")
for tp, ep in ((8, 1), (8, 8), (4, 16), (1, 32)):
    chips = max(tp, ep)
    cfg = ReplicaConfig(ds, "h200", tp=tp, ep=ep, precision="fp8", max_batch=64 * chips)
    t = decode_step_s(cfg, 64 * chips, 2048)
    a2a = moe_a2a_s(cfg.chip_spec, cfg.shard, 64 * chips)
    experts = ds.experts // ep if ep > 1 else ds.experts
    print(f"{tp:>2} {ep:>3} {chips:>6} {experts:>12} {cfg.kv_capacity_tokens // chips:>14,} {t * 1e3:>8.1f} "
          f"{a2a * 1e3:>7.1f} {1 / t:>11.1f} {64 / t:>10,.0f}")

print("\ngpt-oss-120b 1k/1k fp8: frontier (users, tok/s/user, output tok/s/GPU, $/M output)")
for chip, pts in frontier(preset("gpt-oss-120b"), ["h200", "b200", "mi355x"], isl=1024, osl=1024,
                          precision="fp8").items():
    print(chip, "  ".join(f"{p.concurrency}:{p.interactivity_tok_s_user:.0f}/{p.output_tok_s_per_gpu:,.0f}/"
                          f"${p.cost_usd_per_million_output:.2f}" for p in pts))
