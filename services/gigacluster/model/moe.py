"""Mixture-of-experts and MLA pieces of the training step model (shapes, bytes, rank groups).

Expert parallelism follows Megatron-LM: the ``ep`` ranks of an expert-parallel group are taken
from the data-parallel ranks (consecutive DP ranks, stride ``tp x cp``), each holds
``experts / ep`` routed experts (split ``tp`` ways like the dense MLP) and a replica of everything
else. Per MoE layer and microbatch a rank dispatches its tokens to the experts chosen by the router
(an all-to-all), runs its local experts and returns the outputs (a second all-to-all, the
combine); the backward pass runs both again on the gradients. The expert gradients reduce over the
``dp / ep`` ranks that hold the same experts (the expert-data-parallel group).

Load imbalance: ``capacity_factor`` is the busiest EP rank's tokens over the mean (1.0: balanced,
as DeepSeek's auxiliary-loss-free balancing and the force-balanced NeMo benchmarks); that rank
sets the step's pace, so its expert GEMMs and its all-to-all bytes are the mean's times the factor.
``moe_overlap`` is the share of all-to-all time hidden behind compute (DualPipe-style two-stream
overlap); 0 by default, an assumption a spec states.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gigacluster.model.train_spec import TrainSpec

# Elements per byte of each GEMM format's operands (MX/NV formats: packed values plus one scale
# byte per 32 (MX) or 16 (NVFP4) elements).
OPERAND_BYTES = {"fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0,
                 "mxfp6": 0.75 + 1 / 32, "mxfp4": 0.5 + 1 / 32, "nvfp4": 0.5 + 1 / 16}

Gemm = tuple[int, int, int, int]  # m, n, k, count


def attention_gemms(spec: TrainSpec, T: int) -> list[Gemm]:
    """Projection GEMMs of MLA on one TP rank: the low-rank down-projections stay whole (they are
    small), the up-projections and the output split by heads."""
    a = spec.arch
    h, heads_t = a.hidden, a.heads // spec.tp
    qk = heads_t * a.qk_head_dim
    q = [(T, a.q_lora_rank, h, 1), (T, qk, a.q_lora_rank, 1)] if a.q_lora_rank else [(T, qk, h, 1)]
    kv = [(T, a.kv_lora_rank + a.qk_rope_head_dim, h, 1),
          (T, heads_t * (a.head_dim + a.v_head_dim), a.kv_lora_rank, 1)]
    return [*q, *kv, (T, h, heads_t * a.v_head_dim, 1)]


def quantize_bytes(gemms: list[Gemm]) -> tuple[float, float]:
    """(forward, backward) HBM bytes of casting GEMM operands to an 8-bit-or-narrower format online
    (read bf16, write the narrow copy and its scales: about 3 bytes per element): forward the
    inputs, backward the output gradients and, for the weight gradient, the inputs and output
    gradients again along the other axis (DeepSeek-V3 report section 3.3: 1x128 activation tiles,
    transposed for backward)."""
    ins = sum(float(m) * k * c for m, _, k, c in gemms)
    outs = sum(float(m) * n * c for m, n, _, c in gemms)
    return 3.0 * ins, 3.0 * (2 * outs + ins)


def routed_tokens(spec: TrainSpec, T: int, *, balanced: bool = False) -> float:
    """Token-expert assignments the critical EP rank computes per microbatch (T tokens per rank)."""
    a = spec.arch
    cf = 1.0 if balanced else spec.capacity_factor
    return T * a.experts_per_token * cf


def moe_gemms(spec: TrainSpec, T: int, *, balanced: bool = False) -> list[Gemm]:
    """Router, shared experts and the rank's ``experts / ep`` routed experts (each of the busiest
    rank's mean tokens per expert), split ``tp`` ways."""
    a = spec.arch
    h, tp = a.hidden, spec.tp
    mlp_in = 2 if a.mlp == "swiglu" else 1
    ef_t = a.expert_ffn_hidden // tp
    local = a.experts // spec.ep
    per_expert = max(1, math.ceil(routed_tokens(spec, T, balanced=balanced) / local))
    out: list[Gemm] = [(T, a.experts, h, 1)]
    if a.shared_experts:
        sf_t = a.shared_experts * ef_t
        out += [(T, mlp_in * sf_t, h, 1), (T, h, sf_t, 1)]
    out += [(per_expert, mlp_in * ef_t, h, local), (per_expert, h, ef_t, local)]
    return out


def ffn_token_width(spec: TrainSpec, T: int) -> float:
    """MLP hidden elements per microbatch on the critical rank (for activations and elementwise work)."""
    a = spec.arch
    ef_t = a.expert_ffn_hidden // spec.tp
    return routed_tokens(spec, T) * ef_t + T * a.shared_experts * ef_t


def a2a_calls(spec: TrainSpec) -> tuple[int, float]:
    """(all-to-all calls per MoE layer per microbatch, mean bytes per token element of a call):
    dispatch and combine forward, both again backward, and again under full recompute. The forward
    dispatch moves the GEMM format (DeepSeek-V3 dispatches in FP8), the rest bf16."""
    first = min(2.0, OPERAND_BYTES[spec.precision])
    sizes = [first, 2.0, 2.0, 2.0] + ([first, 2.0] if spec.recompute == "full" else [])
    return len(sizes), sum(sizes) / len(sizes)


def a2a_bytes(spec: TrainSpec, T: int) -> float:
    """Per-rank bytes of one all-to-all (nccl-tests convention: the send buffer): the busiest
    rank's token-expert copies of its sequence-parallel shard of the microbatch."""
    _, per_elem = a2a_calls(spec)
    return routed_tokens(spec, T) / spec.tp * spec.arch.hidden * per_elem


def stage_param_split(spec: TrainSpec, layers: range, first: bool, last: bool) -> tuple[float, float]:
    """(replicated-over-EP params, routed-expert params) one rank holds for a pipeline stage."""
    a = spec.arch
    dense_l = sum(1 for i in layers if not a.is_moe_layer(i))
    moe_l = len(layers) - dense_l
    shared = (dense_l * a.params_per_layer
              + moe_l * (a.attn_params + a.router_params + a.shared_experts * a.expert_params))
    experts = moe_l * a.experts * a.expert_params
    if first:
        shared += a.vocab * a.hidden
    if last:
        shared += a.vocab * a.hidden
        if a.mtp_layers:
            shared += a.mtp_layers * (2 * a.hidden * a.hidden + a.attn_params + a.router_params
                                      + a.shared_experts * a.expert_params)
            experts += a.mtp_layers * a.experts * a.expert_params
    return shared / spec.tp, experts / (spec.tp * spec.ep)


def moe_act_bytes_per_token(spec: TrainSpec, T: int) -> float:
    """Activation bytes per token of an MoE layer's MLP part on the critical rank: the permuted
    token copies fed to the experts (in the GEMM format when it is 8-bit or narrower, as DeepSeek-V3
    caches FP8 activations for the backward of its linear layers, report section 3.3.3) and the
    experts' up-projection outputs; the activation output too unless recompute is selective."""
    a = spec.arch
    mlp_in = 2 if a.mlp == "swiglu" else 1
    if spec.recompute == "full":
        return 0.0
    ffn = ffn_token_width(spec, T) / T
    c = cached_bytes(spec)
    keep = c * (mlp_in * ffn + routed_tokens(spec, 1) * a.hidden) + 2.0 * a.experts
    if spec.recompute == "none":
        keep += c * ffn
    return keep


def cached_bytes(spec: TrainSpec) -> float:
    """Bytes per cached activation element of a linear layer's input: 1 when the GEMMs run in 8
    bits or fewer (DeepSeek-V3 caches them in FP8, report section 3.3.3), else bf16."""
    return min(2.0, max(1.0, OPERAND_BYTES[spec.precision]))


def mla_act_bytes_per_token(spec: TrainSpec) -> float:
    """Activation bytes per token of an MLA attention block on one TP rank: under selective
    recompute only the norm input, the compressed query/KV latents and the attention output stay
    (DeepSeek-V3 recomputes RMSNorm and the MLA up-projections in backward, report section 3.2.3);
    without recompute the up-projected q, k, v stay too."""
    a = spec.arch
    heads_t = a.heads // spec.tp
    h_sp = a.hidden / spec.tp
    if spec.recompute == "full":
        return 2.0 * h_sp
    latents = a.q_lora_rank + a.kv_lora_rank + a.qk_rope_head_dim + heads_t * a.v_head_dim
    keep = 2.0 * 2 * h_sp + cached_bytes(spec) * latents
    if spec.recompute == "none":
        keep += 2.0 * (2 * h_sp + heads_t * (2 * a.qk_head_dim + a.v_head_dim))
    return keep


def moe_rank_groups(spec: TrainSpec, name: str) -> tuple[int, int, int, list[int]]:
    """(group size, rank stride, copies, copy offsets) of the MoE demands, in the layout of
    :func:`gigacluster.scheduler.core.rank_groups` (Megatron order tp, cp, dp, pp)."""
    tp, cp, dp, pp, ep = spec.tp, spec.cp, spec.dp, spec.pp, spec.ep
    stage = tp * cp * dp
    if name == "ep_a2a":
        offs = [s * stage + b * ep * tp * cp + r for s in range(pp) for b in range(dp // ep) for r in range(tp * cp)]
        return ep, tp * cp, len(offs), offs
    if name in ("ep_grad", "ep_param"):
        offs = [s * stage + e * tp * cp + r for s in range(pp) for e in range(ep) for r in range(tp * cp)]
        return dp // ep, tp * cp * ep, len(offs), offs
    raise ValueError(f"unknown MoE collective demand {name!r}")
