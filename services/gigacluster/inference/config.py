"""The configuration of one replica: model, chip, tensor parallelism, batch and KV-cache bounds.

:class:`ReplicaConfig` validates itself and derives what the engine needs from it (the per-shard
shape, the KV blocks that fit next to the weights, the chip).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gigacluster.hw.catalog import Chip, UnknownHardwareError, get_chip
from gigacluster.inference.moe_work import OVERLAP_MODES
from gigacluster.inference.work import ACT_BYTES, BYTES_PER_PARAM, ShardShape
from gigacluster.model import DoesNotFitError, SpecError
from gigacluster.model.arch import ModelArch, divisors

# Token ids below this are the tokenizer's raw bytes; synthetic output stays above them so it
# decodes to words (see tokenizer.py).
FIRST_WORD_TOKEN = 256
# vLLM keeps 1% of KV blocks free when admitting a prompt, so running decodes can grow.
WATERMARK_FRAC = 0.01
ROLES = ("both", "prefill", "decode")


def vllm_batch_defaults(chip: str) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) vLLM v1's OpenAI server picks for ``chip``
    (``EngineArgs.get_batch_defaults``): 8,192 and 1,024 on accelerators of 70 GB or more other
    than the A100 (H100, H200, B200, MI300X ...), else 2,048 and 256."""
    c = get_chip(chip)
    big = c.hbm_bytes >= 70 * 2**30 and not c.name.startswith("a100")
    return (8192, 1024) if big else (2048, 256)


@dataclasses.dataclass(frozen=True)
class ReplicaConfig:
    """One model replica: a model, a chip type, a tensor-parallel degree and engine limits.

    ``kv_fraction`` is vLLM's ``gpu_memory_utilization``: the share of each chip's HBM the engine
    may use. Weights and an activation workspace come out of it first; the rest is KV cache.
    ``max_prefill_tokens`` is vLLM's ``max_num_batched_tokens``: new tokens per iteration (the
    chunk budget with chunked prefill; a cap on batched prompts without it). ``ep`` spreads a
    mixture of experts' routed experts over ``max(tp, ep)`` chips (1, or a multiple of ``tp`` that
    divides the experts; attention runs data-parallel over the ``ep / tp`` groups: see
    :mod:`gigacluster.inference.moe_work`).

    Raises ``SpecError`` for a bad field and ``DoesNotFitError`` when the weights plus the KV cache
    of one full-length sequence (``arch.seq_len`` tokens, vLLM's start-up check) do not fit.
    """

    arch: ModelArch
    chip: str
    tp: int = 1
    precision: str = "bf16"
    max_batch: int = 256
    kv_fraction: float = 0.9
    block_size: int = 16
    chunked_prefill: bool = False
    max_prefill_tokens: int = 8192
    max_queue: int = 1024
    role: str = "both"
    ep: int = 1
    moe_overlap: str = "none"  # "two_batch": DeepSeek's two micro-batch overlap of the all-to-all (moe_work)
    num_scheduler_steps: int = 1  # vLLM v0's multi-step scheduling (inference.multistep); 1 = off, vLLM's default
    async_output: bool = False  # vLLM v0.6's async output processor: outputs seen one iteration late (multistep)

    def __post_init__(self) -> None:
        if not isinstance(self.arch, ModelArch):
            raise SpecError("model", f"must be a ModelArch, got {type(self.arch).__name__}")
        try:
            chip = get_chip(self.chip)
        except UnknownHardwareError as exc:
            raise SpecError("chip", str(exc)) from exc
        for f, lo in (("tp", 1), ("ep", 1), ("max_batch", 1), ("block_size", 1), ("max_prefill_tokens", 1),
                      ("max_queue", 0), ("num_scheduler_steps", 1)):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise SpecError(f, f"must be an integer >= {lo}, got {v!r}")
        if not isinstance(self.async_output, bool):
            raise SpecError("async_output", f"must be true or false, got {self.async_output!r}")
        if self.role not in ROLES:
            raise SpecError("role", f"allowed: {', '.join(ROLES)}; got {self.role!r}")
        if self.arch.heads % self.tp:
            raise SpecError("tp", f"must divide the model's {self.arch.heads} attention heads, got {self.tp}")
        self._check_ep()
        if self.precision not in BYTES_PER_PARAM or self.precision not in chip.peak_tflops:
            allowed = [p for p in chip.precisions() if p in BYTES_PER_PARAM]
            raise SpecError("precision", f"allowed on {self.chip}: {', '.join(allowed)}; got {self.precision!r}")
        if not (isinstance(self.kv_fraction, float | int) and 0.0 < self.kv_fraction <= 1.0):
            raise SpecError("kv_fraction", f"must be in (0, 1], got {self.kv_fraction!r}")
        if self.block_size & (self.block_size - 1) or self.block_size > 1024:
            raise SpecError("block_size", f"must be a power of two <= 1024, got {self.block_size}")
        if self.num_scheduler_steps > 1 and self.chunked_prefill:
            raise SpecError("num_scheduler_steps", "multi-step scheduling is vLLM v0's: set chunked_prefill false")
        if self.moe_overlap not in OVERLAP_MODES:
            raise SpecError("moe_overlap", f"allowed: {', '.join(OVERLAP_MODES)}; got {str(self.moe_overlap)[:20]!r}")
        shape = ShardShape(self.arch, self.tp, self.precision, self.ep, self.moe_overlap)
        usable = chip.hbm_bytes * float(self.kv_fraction)
        kv_bytes = usable - shape.weight_bytes - self.workspace_bytes - self._window_reserve(shape)
        block_bytes = self.block_size * shape.kv_bytes_per_token
        blocks = int(kv_bytes // block_bytes) if kv_bytes > 0 else 0
        min_blocks = math.ceil(self.arch.seq_len / self.block_size)
        if blocks < min_blocks:
            need = shape.weight_bytes + self.workspace_bytes + min_blocks * block_bytes
            par = f"tp={self.tp}" + (f" ep={self.ep}" if self.ep > 1 else "")
            raise DoesNotFitError(
                f"{self.arch.name} at {self.precision} with {par} needs {need / 1e9:.2f} GB per "
                f"{self.chip} (weights {shape.weight_bytes / 1e9:.2f} GB, workspace "
                f"{self.workspace_bytes / 1e9:.2f} GB, KV for one {self.arch.seq_len}-token sequence "
                f"{min_blocks * block_bytes / 1e9:.2f} GB) but kv_fraction={self.kv_fraction} of HBM is "
                f"{usable / 1e9:.2f} GB; raise {'ep' if self.arch.is_moe else 'tp'} or lower seq_len",
                need_bytes=need,
                have_bytes=usable,
            )
        blocks *= shape.dp_attn  # each data-parallel attention group holds its own sequences' KV
        object.__setattr__(self, "_chip", chip)
        object.__setattr__(self, "_window", self._window_reserve(shape))
        object.__setattr__(self, "_shape", shape)
        object.__setattr__(self, "_blocks", blocks)

    def _check_ep(self) -> None:
        """``ep`` spreads routed experts: only for a mixture of experts, dividing its experts, a multiple of tp."""
        if self.ep == 1:
            return
        e = self.arch.experts
        if not e:
            raise SpecError("ep", f"{self.arch.name} is dense (no experts to spread); use ep 1, got {self.ep}")
        if e % self.ep:
            divs = divisors(e)
            raise SpecError("ep", f"must divide {self.arch.name}'s {e} routed experts (e.g. "
                                  f"{', '.join(map(str, divs[-6:]))}), got {self.ep} ({e} / {self.ep} = "
                                  f"{e / self.ep:.2f} experts per GPU)")
        if self.ep % self.tp:
            raise SpecError("ep", f"must be 1 or a multiple of tp={self.tp} (attention runs data-parallel over "
                                  f"ep / tp groups), got {self.ep}")

    def _window_reserve(self, shape: ShardShape) -> float:
        """Sliding-window KV rings reserved per GPU: one per sequence its attention group may run."""
        return shape.window_bytes_per_seq * math.ceil(self.max_batch / shape.dp_attn)

    @property
    def chips(self) -> int:
        """Chips of one replica: ``tp``, or ``ep`` when the experts spread over more."""
        return self.shard.chips

    @property
    def chip_spec(self) -> Chip:
        return self._chip  # type: ignore[attr-defined,no-any-return]

    @property
    def shard(self) -> ShardShape:
        return self._shape  # type: ignore[attr-defined,no-any-return]

    @property
    def workspace_bytes(self) -> float:
        """Activation workspace per shard: one max-size batch of activations plus fp32 logits."""
        act = ACT_BYTES[self.precision]
        a = self.arch
        return self.max_prefill_tokens * (4 * a.hidden + 2 * a.ffn_hidden / self.tp) * act + (
            self.max_batch * a.vocab / self.tp * 4.0
        )

    @property
    def kv_blocks(self) -> int:
        """KV blocks per replica (each block holds ``block_size`` tokens on every shard)."""
        return self._blocks  # type: ignore[attr-defined,no-any-return]

    @property
    def kv_capacity_tokens(self) -> int:
        return self.kv_blocks * self.block_size

    @property
    def kv_cache_bytes(self) -> float:
        """KV-cache bytes of the whole replica (all shards)."""
        paged = self.kv_capacity_tokens * self.shard.kv_bytes_per_token * self.tp
        window: float = self._window  # type: ignore[attr-defined]
        return paged + window * self.chips if window else paged

    @property
    def weight_bytes(self) -> float:
        """Weight bytes of the whole replica (all shards; KV heads replicated when tp > kv_heads)."""
        return self.shard.weight_bytes * self.chips

    def max_batch_fit(self, tokens_per_seq: int) -> int:
        """Sequences of ``tokens_per_seq`` tokens whose KV fits at once (not capped by max_batch)."""
        return self.kv_blocks // max(1, math.ceil(tokens_per_seq / self.block_size))

    def decode_roofline_tokens_per_s(self, context_tokens: int) -> float:
        """HBM bound of batch-1 decode: bandwidth over bytes read per token (weights + KV)."""
        s = self.shard
        return self.chip_spec.hbm_Bps / (s.weight_read_bytes + context_tokens * s.kv_bytes_per_token)

    def describe(self) -> dict[str, Any]:
        """Static facts of a replica of this config, for logs and the estimate command."""
        return {
            "kv_blocks": self.kv_blocks, "kv_capacity_tokens": self.kv_capacity_tokens,
            "kv_cache_bytes": self.kv_cache_bytes, "weight_bytes": self.weight_bytes,
            **({"ep": self.ep, "chips": self.chips} if self.arch.is_moe else {}),
        }
