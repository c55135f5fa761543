"""Transformer architectures and the presets shared by training and inference models.

A :class:`ModelArch` is a decoder-only transformer: dense (every layer one MLP) or a mixture of
experts (``experts > 0``: ``first_dense_layers`` dense layers, then MoE layers of ``experts``
routed experts of which ``experts_per_token`` run per token, plus ``shared_experts`` that every
token runs; each expert an MLP of ``expert_ffn_hidden``). Attention is ``gqa`` (grouped-query;
multi-head when ``kv_heads == heads``), optionally with a ``sliding_window`` on all layers or on
all but every ``global_attention_every``-th, or ``mla`` (DeepSeek's multi-head latent attention
with its low-rank ``q_lora_rank`` / ``kv_lora_rank``, ``qk_rope_head_dim`` and ``v_head_dim``;
``head_dim`` is then the no-RoPE query/key width). ``mtp_layers`` are DeepSeek-V3's
multi-token-prediction modules (each one more transformer layer and one more output head pass
in training). Presets live below, each with its source.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gigacluster.model import SpecError

ATTENTION_KINDS = ("gqa", "mla")
MLP_KINDS = ("swiglu", "gelu")


@dataclasses.dataclass(frozen=True)
class ModelArch:
    """A decoder-only transformer. ``mlp`` is ``swiglu`` (3 matrices) or ``gelu`` (2)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int  # dense layers' MLP width
    vocab: int
    seq_len: int
    mlp: str = "swiglu"
    attn_head_dim: int = 0  # 0: hidden / heads
    attention: str = "gqa"
    sliding_window: int = 0  # tokens; 0: full causal attention
    global_attention_every: int = 0  # with a window: every k-th layer attends fully (gpt-oss: 2); 0: none
    q_lora_rank: int = 0  # MLA; 0: no query compression
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    experts: int = 0  # routed experts per MoE layer; 0: dense model
    experts_per_token: int = 0
    shared_experts: int = 0
    expert_ffn_hidden: int = 0
    first_dense_layers: int = 0
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise SpecError(f"model.{f}", f"must be a positive integer, got {v!r}")
        for f in ("attn_head_dim", "sliding_window", "global_attention_every", "q_lora_rank", "kv_lora_rank",
                  "qk_rope_head_dim", "v_head_dim", "experts", "experts_per_token", "shared_experts",
                  "expert_ffn_hidden", "first_dense_layers", "mtp_layers"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise SpecError(f"model.{_yaml_name(f)}", f"must be a non-negative integer, got {v!r}")
        if not self.attn_head_dim and self.hidden % self.heads:
            raise SpecError("model.heads", f"hidden ({self.hidden}) must be divisible by heads ({self.heads})"
                            " unless model.head_dim is given")
        if self.heads % self.kv_heads:
            raise SpecError("model.kv_heads", f"heads ({self.heads}) must be divisible by kv_heads ({self.kv_heads})")
        if self.mlp not in MLP_KINDS:
            raise SpecError("model.mlp", f"allowed: {', '.join(MLP_KINDS)}; got {self.mlp!r}")
        if self.attention not in ATTENTION_KINDS:
            raise SpecError("model.attention", f"allowed: {', '.join(ATTENTION_KINDS)}; got {self.attention!r}")
        if self.attention == "mla":
            for f in ("kv_lora_rank", "qk_rope_head_dim", "v_head_dim"):
                if not getattr(self, f):
                    raise SpecError(f"model.{f}", "required (> 0) with attention: mla")
            if self.sliding_window:
                raise SpecError("model.sliding_window", "not supported with attention: mla")
        self._check_moe()

    def _check_moe(self) -> None:
        moe_fields = ("experts_per_token", "shared_experts", "expert_ffn_hidden", "first_dense_layers")
        if not self.experts:
            extra = [f for f in moe_fields if getattr(self, f)]
            if extra:
                raise SpecError(f"model.{extra[0]}", "needs model.experts > 0 (a mixture of experts)")
            return
        if not 1 <= self.experts_per_token <= self.experts:
            raise SpecError("model.experts_per_token",
                            f"must be in [1, experts={self.experts}], got {self.experts_per_token}")
        if not self.expert_ffn_hidden:
            raise SpecError("model.expert_ffn_hidden", "required (> 0) for a mixture of experts")
        if self.first_dense_layers >= self.layers:
            raise SpecError("model.first_dense_layers",
                            f"must be below layers ({self.layers}), got {self.first_dense_layers}")

    # --- shapes ----------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        """Query/key width per head (MLA: the no-RoPE part)."""
        return self.attn_head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of the attention's query (and, for GQA, output) projection."""
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def qk_head_dim(self) -> int:
        """Width of one head's query-key dot product (MLA adds the decoupled RoPE part)."""
        return self.head_dim + (self.qk_rope_head_dim if self.attention == "mla" else 0)

    @property
    def v_dim_per_head(self) -> int:
        return self.v_head_dim if self.attention == "mla" else self.head_dim

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "swiglu" else 2

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return self.layers - self.first_dense_layers if self.is_moe else 0

    def is_moe_layer(self, i: int) -> bool:
        return self.is_moe and i >= self.first_dense_layers

    def is_window_layer(self, i: int) -> bool:
        """Layer ``i`` attends over the sliding window only (gpt-oss: even layers)."""
        if not self.sliding_window:
            return False
        return not (self.global_attention_every and i % self.global_attention_every == self.global_attention_every - 1)

    # --- parameters ------------------------------------------------------------------------
    @property
    def attn_params(self) -> int:
        """Attention weights of one layer (Q, K, V, output; MLA's down/up projections)."""
        h = self.hidden
        if self.attention == "mla":
            qk = self.heads * self.qk_head_dim
            q = h * self.q_lora_rank + self.q_lora_rank * qk if self.q_lora_rank else h * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * self.heads * (
                self.head_dim + self.v_head_dim)
            return q + kv + self.heads * self.v_head_dim * h
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h

    @property
    def expert_params(self) -> int:
        """Weights of one expert (an MLP of ``expert_ffn_hidden``)."""
        return self.mlp_matrices * self.hidden * self.expert_ffn_hidden

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts

    @property
    def params_per_layer(self) -> int:
        """Weights of one dense layer (attention + MLP of ``ffn_hidden``)."""
        return self.attn_params + self.mlp_matrices * self.hidden * self.ffn_hidden

    @property
    def moe_layer_params(self) -> int:
        """Weights of one MoE layer: attention, router, every routed and shared expert."""
        return self.attn_params + self.router_params + (self.experts + self.shared_experts) * self.expert_params

    @property
    def moe_layer_active_params(self) -> int:
        """Weights one token runs through in an MoE layer."""
        routed = self.experts_per_token + self.shared_experts
        return self.attn_params + self.router_params + routed * self.expert_params

    @property
    def mtp_params(self) -> int:
        """One multi-token-prediction module: a projection of 2h to h and one (MoE) layer; it shares
        the embedding and output head."""
        layer = self.moe_layer_params if self.is_moe else self.params_per_layer
        return 2 * self.hidden * self.hidden + layer

    @property
    def embedding_params(self) -> int:
        """Input embedding plus an untied output projection."""
        return 2 * self.vocab * self.hidden

    @property
    def params(self) -> int:
        """All weights (every expert counted)."""
        if not self.is_moe and not self.mtp_layers:
            return self.layers * self.params_per_layer + self.embedding_params
        dense = self.layers - self.moe_layers
        return (dense * self.params_per_layer + self.moe_layers * self.moe_layer_params
                + self.mtp_layers * self.mtp_params + self.embedding_params)

    @property
    def active_params(self) -> int:
        """Weights one token runs through in the main model (routed experts: only its top-k), with
        the output head and without the embedding lookup, as model cards count "activated" params."""
        if not self.is_moe:
            return self.layers * self.params_per_layer + self.vocab * self.hidden
        dense = self.layers - self.moe_layers
        return (dense * self.params_per_layer + self.moe_layers * self.moe_layer_active_params
                + self.vocab * self.hidden)

    def kv_bytes_per_token(self, bytes_per_elem: float = 2.0) -> float:
        """KV-cache bytes one token occupies across all layers (K and V; MLA: the compressed latent
        and the shared RoPE key)."""
        if self.attention == "mla":
            return float(self.layers * (self.kv_lora_rank + self.qk_rope_head_dim)) * bytes_per_elem
        return 2.0 * self.layers * self.kv_dim * bytes_per_elem


# YAML / proto names that differ from the dataclass field names.
_YAML_NAMES = {"attn_head_dim": "head_dim"}


def _yaml_name(field: str) -> str:
    return _YAML_NAMES.get(field, field)


# The integer architecture fields a spec or a deployment may give instead of (or on top of) a preset,
# by their YAML / proto names.
ARCH_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len")
MOE_ARCH_FIELDS = (
    "head_dim", "sliding_window", "global_attention_every", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
    "v_head_dim", "experts", "experts_per_token", "shared_experts", "expert_ffn_hidden", "first_dense_layers",
    "mtp_layers",
)
ARCH_TEXT_FIELDS = ("mlp", "attention")
ALL_ARCH_KEYS = ("preset", "name", *ARCH_FIELDS, *MOE_ARCH_FIELDS, *ARCH_TEXT_FIELDS)


# Model presets, each from its paper, model card or released config.json (named beside it).
#
# Dense: Llama 3 paper (2024), Table 3; GPT-3 paper (Brown et al. 2020), Table 2.1.
#
# Mixtures of experts (every one unties its embedding and output head, as the configs say):
#
# * ``gpt-oss-120b`` / ``gpt-oss-20b``: openai/gpt-oss-{120b,20b} config.json and the gpt-oss model
#   card (Aug 2025): hidden 2880, 64 query heads of 64, 8 KV heads, 128 / 32 experts of 2880, top-4,
#   vocab 201,088; layers alternate a 128-token sliding window and full attention; 116.8B / 20.9B
#   total, 5.1B / 3.6B active.
# * ``deepseek-v3``: deepseek-ai/DeepSeek-V3 config.json and the DeepSeek-V3 technical report
#   (arXiv 2412.19437), section 2 and 4.2: 61 layers, hidden 7168, MLA with 128 heads (q rank 1536,
#   kv rank 512, no-RoPE 128 + RoPE 64 per head, v 128), first 3 layers dense (FFN 18,432), then 256
#   routed experts (top-8) + 1 shared expert of 2048, one MTP module, vocab 129,280; 671B total,
#   37B active. Pre-training sequence length 4K.
# * ``mixtral-8x7b``: mistralai/Mixtral-8x7B-v0.1 config.json and the Mixtral paper (arXiv
#   2401.04088), Table 1: 32 layers, hidden 4096, 32 heads, 8 KV heads, 8 experts of 14,336, top-2,
#   vocab 32,000, 32K context; 46.7B total, 12.9B active.
# * ``qwen3-235b-a22b`` / ``qwen3-30b-a3b``: Qwen/Qwen3-235B-A22B and Qwen/Qwen3-30B-A3B config.json
#   and the Qwen3 technical report (arXiv 2505.09388), Table 2: 94 / 48 layers, hidden 4096 / 2048,
#   64 / 32 query heads of 128, 4 KV heads, 128 experts of 1536 / 768, top-8, no shared experts,
#   vocab 151,936; 235B / 30.5B total, 22B / 3.3B active. Pre-training sequence length 4K.

_GPT_OSS = dict(hidden=2880, heads=64, kv_heads=8, ffn_hidden=2880, vocab=201088, seq_len=4096,
                attn_head_dim=64, sliding_window=128, global_attention_every=2, experts_per_token=4,
                expert_ffn_hidden=2880)
_QWEN3 = dict(kv_heads=4, vocab=151936, seq_len=4096, attn_head_dim=128, experts=128, experts_per_token=8)

PRESETS: dict[str, ModelArch] = {
    # Llama 2 (Touvron et al. 2023, arXiv 2307.09288, and the released configs): 4,096 context, 32,000 vocab;
    # grouped-query attention in the 70B only.
    "llama2-7b": ModelArch("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    "llama2-13b": ModelArch("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    "llama2-70b": ModelArch("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
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


def preset(name: str) -> ModelArch:
    if name not in PRESETS:
        raise SpecError("model.preset", f"unknown preset {name!r}; allowed: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def _fields(d: dict[str, Any]) -> dict[str, Any]:
    """YAML keys as dataclass field names."""
    back = {v: k for k, v in _YAML_NAMES.items()}
    return {back.get(k, k): v for k, v in d.items() if k not in ("preset", "name")}


def arch_from_dict(d: dict[str, Any], *, field: str = "model") -> ModelArch:
    """A preset (with optional overrides, e.g. ``seq_len``) or an explicit architecture.

    An explicit architecture must give ``ffn_hidden`` and ``mlp`` (no silent 4 x hidden, no silent
    SwiGLU: GPT-style ``gelu`` has 2 matrices, Llama-style ``swiglu`` 3; issue 15); ``attention``
    defaults to ``gqa``, as docs/validation.md states.
    """
    if not isinstance(d, dict):
        raise SpecError(field, "must be a mapping with `preset` or `layers`, `hidden`, `heads`, ...")
    extra = set(d) - set(ALL_ARCH_KEYS)
    if extra:
        raise SpecError(f"{field}.{sorted(map(str, extra))[0][:40]}",
                        f"unknown field; allowed: {', '.join(ALL_ARCH_KEYS)}")
    if "preset" in d:
        base = preset(str(d["preset"]))
        over = _fields(d)
        return dataclasses.replace(base, **over) if over else base
    hints = {"ffn_hidden": " (the dense MLP width; GPT-style models use 4 x hidden with mlp: gelu)",
             "mlp": f" ({' or '.join(MLP_KINDS)}: gelu has 2 matrices (GPT), swiglu 3 (Llama))"}
    for req in ("layers", "hidden", "heads", "ffn_hidden", "mlp", "vocab", "seq_len"):
        if req not in d:
            raise SpecError(f"{field}.{req}", f"required when no preset is given{hints.get(req, '')}")
    kw = _fields(d)
    kw.setdefault("kv_heads", d["heads"])
    return ModelArch(name=str(d.get("name", "custom")), **kw)


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in increasing order (the valid expert-parallel degrees of ``n`` experts)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})

