"""Model presets, each from its paper, model card or released config.json (named beside it).

Dense: Llama 3 paper (2024), Table 3; GPT-3 paper (Brown et al. 2020), Table 2.1.

Mixtures of experts (every one unties its embedding and output head, as the configs say):

* ``gpt-oss-120b`` / ``gpt-oss-20b``: openai/gpt-oss-{120b,20b} config.json and the gpt-oss model
  card (Aug 2025): hidden 2880, 64 query heads of 64, 8 KV heads, 128 / 32 experts of 2880, top-4,
  vocab 201,088; layers alternate a 128-token sliding window and full attention; 116.8B / 20.9B
  total, 5.1B / 3.6B active.
* ``deepseek-v3``: deepseek-ai/DeepSeek-V3 config.json and the DeepSeek-V3 technical report
  (arXiv 2412.19437), section 2 and 4.2: 61 layers, hidden 7168, MLA with 128 heads (q rank 1536,
  kv rank 512, no-RoPE 128 + RoPE 64 per head, v 128), first 3 layers dense (FFN 18,432), then 256
  routed experts (top-8) + 1 shared expert of 2048, one MTP module, vocab 129,280; 671B total,
  37B active. Pre-training sequence length 4K.
* ``mixtral-8x7b``: mistralai/Mixtral-8x7B-v0.1 config.json and the Mixtral paper (arXiv
  2401.04088), Table 1: 32 layers, hidden 4096, 32 heads, 8 KV heads, 8 experts of 14,336, top-2,
  vocab 32,000, 32K context; 46.7B total, 12.9B active.
* ``qwen3-235b-a22b`` / ``qwen3-30b-a3b``: Qwen/Qwen3-235B-A22B and Qwen/Qwen3-30B-A3B config.json
  and the Qwen3 technical report (arXiv 2505.09388), Table 2: 94 / 48 layers, hidden 4096 / 2048,
  64 / 32 query heads of 128, 4 KV heads, 128 experts of 1536 / 768, top-8, no shared experts,
  vocab 151,936; 235B / 30.5B total, 22B / 3.3B active. Pre-training sequence length 4K.
"""

from __future__ import annotations

from gigacluster.model.arch import ModelArch

_GPT_OSS = dict(hidden=2880, heads=64, kv_heads=8, ffn_hidden=2880, vocab=201088, seq_len=4096,
                attn_head_dim=64, sliding_window=128, global_attention_every=2, experts_per_token=4,
                expert_ffn_hidden=2880)
_QWEN3 = dict(kv_heads=4, vocab=151936, seq_len=4096, attn_head_dim=128, experts=128, experts_per_token=8)

PRESETS: dict[str, ModelArch] = {
    "llama3-8b": ModelArch("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
    "llama3-70b": ModelArch("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
    "llama3-405b": ModelArch("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192),
    "gpt3-175b": ModelArch("gpt3-175b", 96, 12288, 96, 96, 49152, 50257, 2048, mlp="gelu"),
    "gpt-oss-120b": ModelArch(name="gpt-oss-120b", layers=36, experts=128, **_GPT_OSS),  # type: ignore[arg-type]
    "gpt-oss-20b": ModelArch(name="gpt-oss-20b", layers=24, experts=32, **_GPT_OSS),  # type: ignore[arg-type]
    "deepseek-v3": ModelArch(
        name="deepseek-v3", layers=61, hidden=7168, heads=128, kv_heads=128, ffn_hidden=18432, vocab=129280,
        seq_len=4096, attention="mla", attn_head_dim=128, q_lora_rank=1536, kv_lora_rank=512, qk_rope_head_dim=64,
        v_head_dim=128, experts=256, experts_per_token=8, shared_experts=1, expert_ffn_hidden=2048,
        first_dense_layers=3, mtp_layers=1,
    ),
    "mixtral-8x7b": ModelArch(
        name="mixtral-8x7b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=32000,
        seq_len=32768, experts=8, experts_per_token=2, expert_ffn_hidden=14336,
    ),
    "qwen3-235b-a22b": ModelArch(name="qwen3-235b-a22b", layers=94, hidden=4096, heads=64, ffn_hidden=12288,
                                 expert_ffn_hidden=1536, **_QWEN3),  # type: ignore[arg-type]
    "qwen3-30b-a3b": ModelArch(name="qwen3-30b-a3b", layers=48, hidden=2048, heads=32, ffn_hidden=6144,
                               expert_ffn_hidden=768, **_QWEN3),  # type: ignore[arg-type]
}
