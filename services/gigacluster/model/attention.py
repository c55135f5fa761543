"""Attention and GEMM work of one training layer: the flash-attention core, the materialised
(2021-2022 Megatron-LM) attention with its s x s tensors in HBM, and GEMM work items.

Used by :mod:`gigacluster.model.step`; ``attention_impl`` of the spec picks the attention path.
"""

from __future__ import annotations

from gigacluster.model import moe
from gigacluster.model.roofline import Work
from gigacluster.model.step_memory import _dims
from gigacluster.model.train_spec import TrainSpec


def gemm_work(m: int, n: int, k: int, precision: str, count: int = 1) -> Work:
    """One (m, n, k) GEMM ``count`` times: FLOPs, operand and output bytes (operands in the GEMM format)."""
    e = moe.OPERAND_BYTES[precision]
    return Work(2.0 * m * n * k, float(e * (m * k + k * n) + 2 * m * n), precision, "matmul", count, (m, n, k))


def bgemm_work(m: int, n: int, k: int, precision: str, batch: int) -> Work:
    """One batched-GEMM kernel of ``batch`` (m, n, k) products (shape ``(m, n, k, batch)``)."""
    w = gemm_work(m, n, k, precision)
    return Work(w.flops * batch, w.bytes_ * batch, precision, "matmul", 1, (m, n, k, batch))


def flash_core(spec: TrainSpec, window: bool) -> tuple[float, float, tuple[int, int, int]]:
    """(FLOPs, bytes, shape) of causal attention forward on one rank, load balanced over CP ranks:
    each query sees seq_len / 2 keys on average (a window of w keys: w (1 - w / 2s))."""
    a = spec.arch
    T, q_t, kv_t, _, hd = _dims(spec)
    s_eff = max(1, a.seq_len // 2)
    if window and a.sliding_window < a.seq_len:
        w = a.sliding_window
        s_eff = max(1, round(w * (1 - w / (2 * a.seq_len))))
    if a.attention == "mla":
        heads_t = a.heads // spec.tp
        qk, v = a.qk_head_dim, a.v_head_dim
        flops = 2.0 * T * s_eff * heads_t * (qk + v)
        bytes_ = 2.0 * (T * heads_t * (qk + v) + T * heads_t * v + a.seq_len * heads_t * (qk + v))
        # The shape's head dimension is the mean of the score's and the value's: 4 x it FLOPs per score, one
        # exponential (roofline.head_dim_factor).
        return flops, bytes_, (T, s_eff, (qk + v) // 2)
    return 4.0 * T * s_eff * q_t, 2.0 * (2 * T * q_t + 2 * a.seq_len * kv_t), (T, s_eff, hd)


def materialized_works(spec: TrainSpec, window: bool) -> tuple[list[Work], list[Work]]:
    """(forward, backward) works of attention that writes the s x s tensors to HBM (Megatron-LM
    2021-2022, ``attention_impl: materialized``): per sequence and head a score GEMM Q K^T and a
    context GEMM P V over all s x s positions (the causal mask is applied, not skipped), a fused
    scale-mask-softmax (reads the scores, writes the probabilities) and dropout (writes the output
    and a 1-byte mask); backward 4 GEMMs, dropout backward and softmax backward. The GEMMs' own
    operand and output bytes are in their works, so the s x s round trips price themselves."""
    a = spec.arch
    _, q_t, _, _, hd = _dims(spec)
    sq, skv = a.seq_len // spec.cp, a.seq_len
    if window and a.sliding_window < a.seq_len:
        skv = a.sliding_window
    n = spec.microbatch_size * max(1, q_t // hd)
    p = spec.precision if spec.precision in ("fp16", "bf16") else "bf16"
    e = float(sq * skv * n)
    fwd = [bgemm_work(sq, skv, hd, p, n), bgemm_work(sq, hd, skv, p, n),
           Work(8.0 * e, 9.0 * e, p, "elementwise")]  # softmax 2+2 bytes, dropout 2+2+1
    bwd = [bgemm_work(sq, skv, hd, p, n), bgemm_work(skv, hd, sq, p, n), bgemm_work(sq, hd, skv, p, n),
           bgemm_work(skv, hd, sq, p, n), Work(8.0 * e, 11.0 * e, p, "elementwise")]  # dropout bwd 2+1+2, softmax 2+2+2
    return fwd, bwd
