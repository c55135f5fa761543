"""Serving work of mixtures of experts, MLA and sliding-window attention, for ONE GPU of a replica.

Layout (vLLM ``--enable-expert-parallel`` / SGLang DP-attention, the wide-EP serving DeepSeek and
llm-d describe): a replica spans ``chips = max(tp, ep)`` GPUs (``ep`` is 1 or a multiple of
``tp``). Attention, dense layers, shared experts, the router and the embeddings are split ``tp``
ways and replicated over the ``ep / tp`` data-parallel attention groups, each serving an equal
share of the batch. Routed experts are spread whole over the ``ep`` GPUs (``experts / ep`` each);
with ``ep = 1`` every GPU holds a ``1 / tp`` slice of every expert instead (Megatron-style).

Assumptions, stated:

* Routing is uniform and independent: a batch of ``B`` tokens, each choosing ``k`` of ``E``
  experts, touches ``E (1 - (1 - k/E)^B)`` distinct experts per MoE layer on average; only those
  experts' weights are read in that iteration (decode reads ``k`` experts per layer at batch 1,
  all of them at large batch). The expert GEMMs are balanced over the EP ranks.
* With ``ep > 1`` every MoE layer dispatches each token's ``k`` copies to the experts' GPUs and
  combines them back (two all-to-alls over ``ep`` ranks, each rank sending its ``1 / chips`` share
  of the batch; dispatch in FP8 when the weights are 8-bit or narrower, as DeepEP does, combine in
  bf16), priced by :class:`gigacluster.model.comm.AlphaBetaCommModel` (the training model's
  default), not overlapped with compute unless ``moe_overlap`` says so (below).
* ``moe_overlap``: ``none`` (the default: vLLM serves DP+EP without its dual-batch overlap unless
  ``--enable-dbo`` is given, docs.vllm.ai "Dual Batch Overlap"; SGLang likewise needs
  ``--enable-two-batch-overlap``) or ``two_batch``, DeepSeek's inference system (Open Infra Index
  day 6, "DeepSeek-V3/R1 Inference System Overview", 2025-03-01): the batch is split into two
  micro-batches and one's dispatch/combine runs while the other computes (attention, experts).
  Modelled per iteration as ``max(2 C(B/2), 2 A(B/2)) + min(...) / (2 L)``: both halves' compute
  (each half re-reads the weights) against both halves' all-to-all (each pays its latency), plus
  one layer's fill of the pipeline. Assumed: the all-to-all takes no compute units while it
  overlaps (DeepEP's hook-based low-latency kernels use no SMs, per DeepSeek), and the chips are
  booked for one pass over the batch (the second weight read is time, not energy).
* MLA keeps its compressed latent and RoPE key (``kv_lora_rank + qk_rope_head_dim`` per layer) on
  every TP rank of a group (the latent is not split by heads); decode runs the weight-absorbed
  form (attention over the latent), prefill the expanded one.
* Sliding-window layers keep at most ``window`` tokens of K and V per sequence: a fixed ring per
  running sequence, reserved up front for ``max_batch`` sequences; full-attention layers take the
  paged blocks.
* Weights at 8 bits or fewer keep an FP8 KV cache and bf16 activations; the multi-token-prediction
  module is not served (no speculative decoding).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from gigacluster.model import SpecError
from gigacluster.model.arch import ModelArch
from gigacluster.model.moe import OPERAND_BYTES
from gigacluster.model.roofline import Work

Gemm = tuple[int, int, int]  # n, k, layers it runs in
OVERLAP_MODES = ("none", "two_batch")  # moe_overlap: see the module docstring


def kv_elem_bytes(precision: str) -> float:
    """Bytes per KV element: the weights' width down to FP8 (narrower formats keep an FP8 cache)."""
    return max(1.0, min(4.0, OPERAND_BYTES[precision]))


def weight_elem_bytes(precision: str) -> float:
    """Bytes per stored weight, block scales included (MX: one per 32, NVFP4: one per 16)."""
    return OPERAND_BYTES[precision]


def act_bytes(precision: str) -> float:
    return 4.0 if precision in ("fp32", "tf32") else 2.0


def touched_fraction(experts: int, k: int, tokens: float) -> float:
    """Expected share of ``experts`` that ``tokens`` tokens of top-``k`` routing touch: 1 - (1 - k/E)^B."""
    if tokens <= 0 or experts <= 0:
        return 0.0
    return 1.0 - (1.0 - k / experts) ** tokens


def attention_gemms(a: ModelArch, tp: int) -> list[tuple[int, int]]:
    """(n, k) of one layer's attention projections on one TP rank (MLA's down-projections whole)."""
    h, heads_t = a.hidden, a.heads // tp
    if a.attention == "mla":
        qk = heads_t * a.qk_head_dim
        q = [(a.q_lora_rank, h), (qk, a.q_lora_rank)] if a.q_lora_rank else [(qk, h)]
        return [*q, (a.kv_lora_rank + a.qk_rope_head_dim, h),
                (heads_t * (a.head_dim + a.v_head_dim), a.kv_lora_rank), (h, heads_t * a.v_head_dim)]
    qd = heads_t * a.head_dim
    kv = math.ceil(a.kv_heads / tp) * a.head_dim
    return [(qd + 2 * kv, h), (h, qd)]


def mlp_gemms(a: ModelArch, width: float) -> list[tuple[int, int]]:
    """(n, k) of an MLP of ``width`` hidden units (gate and up fused)."""
    w = round(width)
    return [((a.mlp_matrices - 1) * w, a.hidden), (a.hidden, w)]


def kv_layer_bytes(a: ModelArch, tp: int, precision: str) -> float:
    """KV bytes one token occupies in one layer on one GPU."""
    if a.attention == "mla":
        return (a.kv_lora_rank + a.qk_rope_head_dim) * kv_elem_bytes(precision)
    return 2.0 * math.ceil(a.kv_heads / tp) * a.head_dim * kv_elem_bytes(precision)


def window_layers(a: ModelArch) -> int:
    """Layers that attend over the sliding window only (closed form of ``arch.is_window_layer``)."""
    if not a.sliding_window:
        return 0
    g = a.global_attention_every
    return a.layers - a.layers // g if g else a.layers


class MoeShard:
    """Per-GPU sizes and iteration work of a replica (see the module docstring)."""

    def __init__(self, arch: ModelArch, tp: int, ep: int, precision: str, overlap: str = "none") -> None:
        if overlap not in OVERLAP_MODES:
            raise SpecError("moe_overlap", f"allowed: {', '.join(OVERLAP_MODES)}; got {str(overlap)[:20]!r}")
        self.arch, self.tp, self.ep, self.precision, self.overlap = arch, tp, ep, precision, overlap
        self.chips = max(tp, ep)
        self.dp_attn = self.chips // tp
        self.expert_split = tp if ep == 1 else 1  # each expert's width is split this many ways
        self.local_experts = arch.experts // ep if arch.is_moe else 0
        self.window_layers = window_layers(arch)
        self.full_layers = arch.layers - self.window_layers

    # --- parameters and bytes ----------------------------------------------------------------
    def dense_params(self) -> float:
        """Non-expert weights on one GPU: attention, dense MLPs, router, shared experts, embeddings."""
        a, tp = self.arch, self.tp
        attn = sum(n * k for n, k in attention_gemms(a, tp))
        dense_l = a.layers - a.moe_layers
        mlp = sum(n * k for n, k in mlp_gemms(a, a.ffn_hidden / tp))
        shared = sum(n * k for n, k in mlp_gemms(a, a.shared_experts * a.expert_ffn_hidden / tp)) \
            if a.shared_experts else 0
        per_moe = a.router_params + shared
        return float(a.layers * attn + dense_l * mlp + a.moe_layers * per_moe + 2 * a.vocab * a.hidden / tp)

    def expert_params(self) -> float:
        """Routed-expert weights on one GPU (``experts / ep`` whole, or a ``1 / tp`` slice of each)."""
        a = self.arch
        return float(a.moe_layers * a.experts * a.expert_params) / self.chips

    @property
    def weight_bytes(self) -> float:
        return (self.dense_params() + self.expert_params()) * weight_elem_bytes(self.precision)

    def weight_read_bytes_for(self, tokens: float) -> float:
        """Weights one iteration of ``tokens`` tokens (replica-wide) reads on one GPU."""
        a, wb = self.arch, weight_elem_bytes(self.precision)
        dense = self.dense_params() - a.vocab * a.hidden / self.tp  # the embedding is a row lookup
        f = touched_fraction(a.experts, a.experts_per_token, tokens)
        return (dense + f * self.expert_params()) * wb

    @property
    def kv_layer_bytes(self) -> float:
        return kv_layer_bytes(self.arch, self.tp, self.precision)

    @property
    def kv_bytes_per_token(self) -> float:
        """Paged KV bytes per token on one GPU: the full-attention layers (windows are a fixed ring)."""
        return self.full_layers * self.kv_layer_bytes

    @property
    def window_bytes_per_seq(self) -> float:
        """The sliding-window layers' KV ring of one sequence on one GPU."""
        return self.window_layers * self.arch.sliding_window * self.kv_layer_bytes

    def kv_bytes_for(self, tokens: int) -> float:
        """KV bytes of one ``tokens``-token sequence on one GPU (windows capped)."""
        w = min(tokens, self.arch.sliding_window) if self.window_layers else 0
        return tokens * self.kv_bytes_per_token + w * self.window_layers * self.kv_layer_bytes

    # --- work ---------------------------------------------------------------------------------
    def _gemm(self, m: float, n: int, k: int, count: int, graph: bool, *, weights: float = 1.0,
              flops_m: float | None = None) -> Work:
        """A GEMM of ``m`` rows; ``weights`` copies of the (n, k) matrix read (touched experts)."""
        fm = m if flops_m is None else flops_m
        wb, ab = weight_elem_bytes(self.precision), act_bytes(self.precision)
        return Work(flops=2.0 * fm * n * k, bytes_=weights * n * k * wb + fm * (n + k) * ab,
                    precision=self.precision, graph=graph, kind="matmul", count=count,
                    shape=(max(1, round(m)), n, k))

    def batch_work(self, *, tokens: int, pre_c: np.ndarray, pre_n: np.ndarray, dec_c: np.ndarray,
                   logits: int) -> tuple[Work, ...]:
        """Work items of one iteration on one GPU: ``pre_c``/``pre_n`` the prefill sequences' computed
        and new tokens, ``dec_c`` the decode sequences' contexts, ``tokens`` the replica's total."""
        if tokens <= 0:
            return ()
        a, g = self.arch, self.dp_attn
        graph = pre_n.size == 0
        tg = tokens / g  # tokens of one attention group
        items = [self._gemm(tg, n, k, a.layers, graph) for n, k in attention_gemms(a, self.tp)]
        dense_l = a.layers - a.moe_layers
        if dense_l:
            items += [self._gemm(tg, n, k, dense_l, graph) for n, k in mlp_gemms(a, a.ffn_hidden / self.tp)]
        ffn_width = (a.ffn_hidden / self.tp) * dense_l / a.layers
        if a.is_moe:
            items += self._moe_items(tokens, tg, graph)
            ffn_width += (a.experts_per_token * a.expert_ffn_hidden / self.chips * g
                          + a.shared_experts * a.expert_ffn_hidden / self.tp) * a.moe_layers / a.layers
        items += self._attention_items(pre_c, pre_n, dec_c, graph)
        act = act_bytes(self.precision)
        items.append(Work(flops=tg * (10.0 * a.hidden + 4.0 * ffn_width),
                          bytes_=tg * ((8.0 * a.hidden + 3.0 * ffn_width) * act + self.kv_layer_bytes),
                          precision=self.precision, graph=graph, kind="elementwise", count=a.layers))
        if logits:
            lg = logits / g
            vocab_s = a.vocab / self.tp
            head = a.hidden * vocab_s
            items.append(Work(flops=2.0 * lg * head,
                              bytes_=head * weight_elem_bytes(self.precision) + lg * (a.hidden * act + vocab_s * 4.0),
                              precision=self.precision, graph=graph, kind="matmul", count=1,
                              shape=(max(1, round(lg)), int(vocab_s), a.hidden)))
        return tuple(items)

    def _moe_items(self, tokens: int, tg: float, graph: bool) -> list[Work]:
        """Router, shared experts and the GPU's routed experts over the batch's token copies."""
        a = self.arch
        L = a.moe_layers
        out = [self._gemm(tg, a.experts, a.hidden, L, graph)]
        if a.shared_experts:
            out += [self._gemm(tg, n, k, L, graph)
                    for n, k in mlp_gemms(a, a.shared_experts * a.expert_ffn_hidden / self.tp)]
        pairs = tokens * a.experts_per_token / (self.ep if self.ep > 1 else 1)  # token copies on this GPU
        touched = max(1e-9, self.local_experts * touched_fraction(a.experts, a.experts_per_token, tokens))
        for n, k in mlp_gemms(a, a.expert_ffn_hidden / self.expert_split):
            out.append(self._gemm(pairs / touched, n, k, L, graph, weights=touched, flops_m=pairs))
        return out

    def _attention_items(self, pre_c: np.ndarray, pre_n: np.ndarray, dec_c: np.ndarray, graph: bool) -> list[Work]:
        """Attention over the KV cache for the full and the sliding-window layers (one group's share)."""
        a, g = self.arch, self.dp_attn
        heads_t = a.heads // self.tp
        w = a.sliding_window
        out: list[Work] = []
        for layers, window in ((self.full_layers, 0), (self.window_layers, w)):
            if not layers:
                continue
            pairs, kv_read, q = 0.0, 0.0, 0
            if pre_n.size:
                pairs += _causal_pairs(pre_c, pre_n, window) / g
                kv_read += float(np.minimum(pre_c + pre_n, window or np.iinfo(np.int64).max).sum()) / g
                q += int(pre_n.sum())
            dec_kv = np.minimum(dec_c + 1, window) if window else dec_c + 1
            if dec_c.size:
                pairs += float(dec_kv.sum()) / g
                kv_read += float(dec_kv.sum()) / g
                q += int(dec_c.size)
            if a.attention == "mla":  # absorbed decode: q.latent and p.latent per head
                per_pair = 2.0 * heads_t * (2 * a.kv_lora_rank + a.qk_rope_head_dim) if not pre_n.size else \
                    2.0 * heads_t * (a.qk_head_dim + a.v_head_dim)
            else:
                per_pair = 4.0 * a.head_dim * heads_t
            seqs = max(1, int(pre_n.size + dec_c.size))
            q_bytes = q / g * 2 * heads_t * a.head_dim * act_bytes(self.precision)
            out.append(Work(flops=per_pair * pairs, bytes_=kv_read * self.kv_layer_bytes + q_bytes,
                            precision=self.precision, graph=graph, kind="attention", count=layers,
                            shape=(max(1, round(q / g)), max(1, round(kv_read * g / seqs)), a.head_dim)))
        return out

    # --- communication ------------------------------------------------------------------------
    def allreduce_bytes(self, tokens: int) -> float:
        """Bytes each GPU all-reduces per iteration inside its TP group: two per layer."""
        if self.tp == 1:
            return 0.0
        return 2.0 * self.arch.layers * tokens / self.dp_attn * self.arch.hidden * act_bytes(self.precision)

    def a2a_bytes(self, tokens: int) -> tuple[float, float]:
        """(dispatch, combine) bytes one GPU sends per MoE layer (nccl-tests send-buffer convention)."""
        if self.ep <= 1 or not self.arch.is_moe:
            return 0.0, 0.0
        copies = tokens / self.chips * self.arch.experts_per_token * self.arch.hidden
        return copies * min(2.0, max(1.0, OPERAND_BYTES[self.precision])), copies * 2.0


def _causal_pairs(c: np.ndarray, n: np.ndarray, window: int) -> float:
    """(query, key) pairs of prefilling positions c+1..c+n causally, each key span capped at ``window``."""
    lo, hi = c + 1, c + n
    if not window:
        return float((n * c).sum() + (n * (n + 1)).sum() / 2.0)
    top = np.minimum(hi, window)
    below = np.where(top >= lo, (lo + top) * (top - lo + 1) / 2.0, 0.0)
    above = (hi - np.maximum(lo - 1, top)) * float(window)
    return float(below.sum() + above.sum())


def half_batch(work: tuple[Work, ...], precision: str) -> tuple[Work, ...]:
    """The work of one of two micro-batches of an iteration: half the FLOPs and activations; a GEMM reads its
    whole weights again (its bytes beyond the activations'), attention and elementwise work halve."""
    ab = act_bytes(precision)
    out = []
    for w in work:
        if w.kind == "matmul" and len(w.shape) == 3:
            m, n, k = w.shape
            act = w.flops / (2.0 * n * k) * (n + k) * ab
            out.append(dataclasses.replace(w, flops=w.flops / 2, bytes_=max(0.0, w.bytes_ - act / 2),
                                           shape=(max(1, round(m / 2)), n, k)))
        else:
            out.append(dataclasses.replace(w, flops=w.flops / 2, bytes_=w.bytes_ / 2))
    return tuple(out)


def two_batch_s(compute_half_s: float, a2a_half_s: float, layers: int) -> float:
    """Iteration time of two overlapped micro-batches: both halves' compute against both halves' all-to-all, the
    longer one sets the pace, plus one MoE layer's share of the shorter to fill the two-stage pipeline."""
    c2, a2 = 2.0 * compute_half_s, 2.0 * a2a_half_s
    return max(c2, a2) + min(c2, a2) / (2.0 * max(1, layers))
