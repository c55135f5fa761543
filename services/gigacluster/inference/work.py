"""The roofline work of one engine iteration, for ONE tensor-parallel shard.

An iteration runs a batch of sequences through the model; each scheduled sequence contributes
``n`` new tokens starting at context position ``c`` (a decode step is ``n = 1``; a prefill or a
prefill chunk is ``n > 1``). Per layer this is one weight pass of GEMMs (compute-bound in prefill,
bound by reading the weights in decode), attention over the KV cache (causal pairs for prefill,
a KV read per decode sequence), and the small elementwise ops; the output projection (LM head)
runs only for sequences that emit a token this iteration. Timing is NOT computed here: the items
go through :func:`gigacluster.model.roofline.works_time_s`, the same function the chip service uses.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from gigacluster.inference.moe_work import MoeShard
from gigacluster.model.arch import ModelArch
from gigacluster.model.moe import OPERAND_BYTES
from gigacluster.model.roofline import Work

# The formats the dense path was built for; any other (fp16, MX, NVFP4), a mixture of experts, MLA,
# sliding windows or ep > 1 take the general per-GPU model of moe_work.py.
CLASSIC_PRECISIONS = ("fp32", "tf32", "bf16", "fp8")
# Bytes per stored weight at each precision (block scales included). tf32 is a math mode on fp32
# storage. The dense path also stores its KV cache at this width.
BYTES_PER_PARAM: dict[str, float] = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp8": 1.0,
                                     **{p: OPERAND_BYTES[p] for p in ("fp16", "mxfp6", "mxfp4", "nvfp4")}}
# Activations stay in 16-bit except in fp32 runs (fp8 and narrower inference keeps bf16 activations).
ACT_BYTES: dict[str, float] = {p: (4.0 if p in ("fp32", "tf32") else 2.0) for p in BYTES_PER_PARAM}


# A batch's GEMMs, elementwise item and logits GEMM (None without logits): batch_work's items that do not
# depend on the context.
FixedItems = tuple[tuple[Work, ...], Work, "Work | None"]


@dataclasses.dataclass(frozen=True)
class ShardShape:
    """Per-shard sizes of a model split ``tp`` ways (Megatron-style: heads and FFN columns split).

    ``ep`` spreads a mixture of experts' routed experts over ``max(tp, ep)`` GPUs; anything but a
    dense GQA model without windows at a classic precision is sized by :class:`MoeShard` (per GPU).
    """

    arch: ModelArch
    tp: int
    precision: str
    ep: int = 1
    moe_overlap: str = "none"  # MoE all-to-all overlap in serving (inference.moe_work.OVERLAP_MODES)

    @property
    def classic(self) -> bool:
        """The dense path (kept bit-identical): dense GQA, no window, ep 1, a classic precision."""
        a = self.arch
        return (not a.is_moe and a.attention == "gqa" and not a.sliding_window and self.ep == 1
                and self.precision in CLASSIC_PRECISIONS)

    @functools.cached_property
    def moe(self) -> MoeShard:
        return MoeShard(self.arch, self.tp, self.ep, self.precision, self.moe_overlap)

    @functools.cached_property
    def fixed_items(self) -> dict[tuple[int, bool, int], FixedItems]:
        """:func:`batch_work`'s items that do not depend on the context (GEMMs, elementwise, logits) by
        (tokens, graph, logits): a replica forms the same few batches again and again."""
        return {}

    @property
    def chips(self) -> int:
        """GPUs of one replica: ``tp``, or ``ep`` when the experts spread wider (DP attention)."""
        return max(self.tp, self.ep)

    @property
    def dp_attn(self) -> int:
        """Data-parallel attention groups of one replica (``chips / tp``)."""
        return self.chips // self.tp

    @property
    def q_dim(self) -> int:
        return self.arch.hidden // self.tp

    @property
    def kv_heads(self) -> int:
        """KV heads held by one shard; when tp > kv_heads each shard keeps a replica of one."""
        return math.ceil(self.arch.kv_heads / self.tp)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.arch.head_dim

    @property
    def ffn(self) -> float:
        return self.arch.ffn_hidden / self.tp

    @property
    def gemms(self) -> tuple[tuple[int, int], ...]:
        """(n, k) of the layer's GEMMs on one shard: QKV, attention output, gate+up (fused), down."""
        h, q, kv, ffn = self.arch.hidden, self.q_dim, self.kv_dim, round(self.ffn)
        up = (self.arch.mlp_matrices - 1) * ffn
        return ((q + 2 * kv, h), (h, q), (up, h), (h, ffn))

    @property
    def layer_params(self) -> float:
        """Weights of one layer on one shard (QKV, output projection, MLP)."""
        h = self.arch.hidden
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + self.arch.mlp_matrices * h * self.ffn

    @property
    def head_params(self) -> float:
        """The shard's slice of the (untied) output projection."""
        return self.arch.hidden * self.arch.vocab / self.tp

    @property
    def weight_bytes(self) -> float:
        """Weights resident on one shard: layers, LM head slice, and the embedding slice."""
        if not self.classic:
            return self.moe.weight_bytes
        bpp = BYTES_PER_PARAM[self.precision]
        return (self.arch.layers * self.layer_params + 2 * self.head_params) * bpp

    @property
    def weight_read_bytes(self) -> float:
        """Weights read by one full forward step of one token (the input embedding is a row lookup,
        not read; a mixture of experts reads its top-k experts)."""
        if not self.classic:
            return self.moe.weight_read_bytes_for(1)
        return (self.arch.layers * self.layer_params + self.head_params) * BYTES_PER_PARAM[self.precision]

    @property
    def kv_bytes_per_token_layer(self) -> float:
        if not self.classic:
            return self.moe.kv_layer_bytes
        return 2.0 * self.kv_dim * BYTES_PER_PARAM[self.precision]

    @property
    def window_bytes_per_seq(self) -> float:
        """Sliding-window layers' KV ring per running sequence on one shard (0 without windows)."""
        return 0.0 if self.classic else self.moe.window_bytes_per_seq

    def kv_bytes_for(self, tokens: int) -> float:
        """KV bytes of one ``tokens``-token sequence on one shard (what a P/D transfer moves)."""
        return tokens * self.kv_bytes_per_token if self.classic else self.moe.kv_bytes_for(tokens)

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token occupies on one shard, all (full-attention) layers."""
        if not self.classic:
            return self.moe.kv_bytes_per_token
        return self.arch.layers * self.kv_bytes_per_token_layer


def _attention(shape: ShardShape, graph: bool, *, pairs: float, kv_tokens: float, q_tokens: int, seqs: int,
               rows: int) -> Work:
    """Attention of ``q_tokens`` queries over ``pairs`` (query, key) pairs, reading ``kv_tokens`` of K and V
    (``seqs`` sequences; the kernel's tile is ``rows`` by the mean context)."""
    arch, prec = shape.arch, shape.precision
    return Work(
        flops=4.0 * arch.head_dim * (arch.heads // shape.tp) * pairs,
        bytes_=kv_tokens * shape.kv_bytes_per_token_layer + q_tokens * 2 * shape.q_dim * ACT_BYTES[prec],
        precision=prec,
        graph=graph,
        kind="attention",
        count=arch.layers,
        shape=(rows, max(1, round(kv_tokens / max(1, seqs))), arch.head_dim),
    )


def batch_work(
    shape: ShardShape,
    *,
    prefill_tokens: int = 0,
    prefill_pairs: float = 0.0,
    prefill_kv_tokens: float = 0.0,
    prefill_seqs: int = 1,
    decode_seqs: int = 0,
    decode_kv_tokens: float = 0.0,
    logits: int = 0,
) -> tuple[Work, ...]:
    """Work items of one iteration on one shard.

    ``prefill_pairs`` is the number of (query, key) pairs of the prefill tokens (causal), and the
    ``*_kv_tokens`` the context tokens whose K and V are read; ``logits`` counts the sequences that
    sample a token. Returns an empty tuple for an empty batch.
    """
    arch = shape.arch
    tokens = prefill_tokens + decode_seqs
    if tokens <= 0:
        return ()
    # vLLM replays decode-only batches from captured CUDA graphs (prefill runs eagerly).
    graph = prefill_tokens == 0
    cache = shape.fixed_items
    fixed = cache.get((tokens, graph, logits))
    if fixed is None:
        if len(cache) >= FIXED_ITEMS_MAX:
            cache.clear()
        fixed = cache[(tokens, graph, logits)] = _fixed_items(shape, tokens, graph, logits)
    gemms, elementwise, head = fixed
    items = list(gemms)
    if prefill_tokens:
        items.append(_attention(shape, graph, pairs=prefill_pairs, kv_tokens=prefill_kv_tokens,
                                q_tokens=prefill_tokens, seqs=prefill_seqs, rows=prefill_tokens))
    if decode_seqs:
        # Decode kernels (FlashDecoding) pack the query heads sharing a KV head into one tile.
        items.append(_attention(shape, graph, pairs=decode_kv_tokens, kv_tokens=decode_kv_tokens,
                                q_tokens=decode_seqs, seqs=decode_seqs, rows=arch.heads // arch.kv_heads))
    items.append(elementwise)
    if head is not None:
        items.append(head)
    return tuple(items)


FIXED_ITEMS_MAX = 4096  # (tokens, graph, logits) kept per shape


def _fixed_items(shape: ShardShape, tokens: int, graph: bool, logits: int) -> FixedItems:
    """The GEMMs, the elementwise item and the logits GEMM (None without logits) of a batch of ``tokens``."""
    arch, prec = shape.arch, shape.precision
    bpp, act = BYTES_PER_PARAM[prec], ACT_BYTES[prec]
    h, ffn, layers = arch.hidden, shape.ffn, arch.layers
    # The layer's four GEMMs with their true (m, n, k): QKV, attention output, gate+up, down.
    m = tokens
    gemms = tuple(
        Work(flops=2.0 * m * n_out * k_in, bytes_=n_out * k_in * bpp + m * (n_out + k_in) * act, precision=prec,
             graph=graph, kind="matmul", count=layers, shape=(m, n_out, k_in))
        for n_out, k_in in shape.gemms
    )
    # Norms, rotary embedding, residual adds, activation function, and writing the new K and V.
    elementwise = Work(flops=tokens * (10.0 * h + 4.0 * ffn),
                       bytes_=tokens * ((8.0 * h + 3.0 * ffn) * act + shape.kv_bytes_per_token_layer),
                       precision=prec, graph=graph, kind="elementwise", count=layers)
    head = None
    if logits:
        vocab_s = arch.vocab / shape.tp
        head = Work(flops=2.0 * logits * shape.head_params,
                    bytes_=shape.head_params * bpp + logits * (h * act + vocab_s * 4.0),
                    precision=prec, graph=graph, kind="matmul", count=1, shape=(logits, int(vocab_s), h))
    # One object per distinct item across every replica and shape of the process: the price memos then find
    # their keys by identity rather than comparing items field by field.
    if len(_INTERNED) >= INTERNED_MAX:  # a router up for weeks meets many batch sizes: identity is an optimisation
        _INTERNED.clear()
    return (tuple(_INTERNED.setdefault(w, w) for w in gemms), _INTERNED.setdefault(elementwise, elementwise),
            None if head is None else _INTERNED.setdefault(head, head))


INTERNED_MAX = 1 << 16
_INTERNED: dict[Work, Work] = {}


def allreduce_bytes(shape: ShardShape, tokens: int) -> float:
    """Bytes each shard all-reduces per iteration: two per layer (after attention and after MLP)."""
    if not shape.classic:
        return shape.moe.allreduce_bytes(tokens)
    if shape.tp == 1:
        return 0.0
    return 2.0 * shape.arch.layers * tokens * shape.arch.hidden * ACT_BYTES[shape.precision]
