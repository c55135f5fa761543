"""Roofline timing of one unit of work on one chip, with a shape-aware efficiency model.

A :class:`Work` item is what the chip service executes and what the training and inference
models emit: FLOPs, bytes moved to and from HBM, a precision, and a kind and shape that the
efficiency model uses to decide what fraction of peak the operation reaches.

Time of one repetition = max(FLOPs / (peak x efficiency x clock), bytes / (HBM x hbm fraction))
+ launch overhead. The efficiency is a product of physical terms (catalog section
``efficiency``), not one constant:

* matmul, shape ``(m, n, k)`` or ``(m, n, k, batch)`` (one batched kernel): kind ceiling
  (isolated-benchmark rate) x sustained fraction (the same op inside a training step) x tile
  quantisation on m and n x wave quantisation of the output tiles over the chip's compute units,
  or stream-K's balanced split of the K loop when that is better x depth factor ``k / (k + k_overhead)``;
* attention (``attention_triton``: the same fused algorithm in the 2022-2023 Triton kernel, at its own ceiling
  ``flash_triton_fraction``), shape ``(seq_q, seq_kv, head_dim)`` forward, ``(seq_q, seq_kv, head_dim,
  BACKWARD_FLOPS_PER_SCORE)`` backward: kind ceiling x sustained fraction x tile
  quantisation on seq_q x
  ``seq_kv / (seq_kv + tile_n)`` (diagonal blocks and softmax rescaling amortised over the KV
  loop) x the head-dimension factor of :func:`head_dim_factor` (the softmax's exponentials, one per score, run
  on the special-function units beside the matrix units' 4 x head_dim FLOPs per score forward and 10 x head_dim
  backward: thin heads leave the exponentials a larger share of the kernel; the kind ceiling is the rate at head
  dim 128);
* elementwise and memory work: bandwidth bound, HBM fraction only.

Attention whose queries fill less than one tile (``seq_q`` below ``tile_m``: a decode kernel, whose rows are
the query heads sharing a KV head) is a paged KV scan: it takes at least ``paged_decode_call_s`` plus its
bytes at ``paged_decode_hbm_fraction`` of HBM, the affine time measured for FlashAttention-2's paged decode
kernel (vLLM's decode attention) where it is published; elsewhere both default to the plain roofline. Where only
small calls are published, all taking the same time whatever their bytes (the A100), the call takes at least
``paged_decode_floor_s`` instead.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from gigacluster.hw.catalog import PRECISIONS, Chip, _raw
from gigacluster.model import SpecError

KINDS = ("matmul", "attention", "attention_triton", "elementwise", "memory")

# Non-matrix work (norms, activations, optimizer) runs on vector units: a small fraction of the
# matrix peak; it is almost always bandwidth bound anyway.
_VECTOR_FRACTION = {"elementwise": 0.05, "memory": 0.01}


@dataclasses.dataclass(frozen=True)
class Work:
    """One operation, repeated ``count`` times. ``shape`` is optional (GEMM m, n, k; attention
    seq_q, seq_kv, head_dim)."""

    flops: float
    bytes_: float
    precision: str = "bf16"
    kind: str = "matmul"
    count: int = 1
    shape: tuple[int, ...] = ()
    graph: bool = False  # launched from a captured CUDA/Neuron graph (decode batches): lower launch cost

    def __post_init__(self) -> None:
        if not self.flops >= 0:
            raise SpecError("flops", f"must be >= 0, got {self.flops!r}")
        if not self.bytes_ >= 0:
            raise SpecError("bytes", f"must be >= 0, got {self.bytes_!r}")
        if self.count < 1:
            raise SpecError("count", f"must be >= 1, got {self.count!r}")
        if self.kind not in KINDS:
            raise SpecError("kind", f"allowed: {', '.join(KINDS)}; got {self.kind!r}")
        if self.precision not in PRECISIONS:
            raise SpecError("precision", f"allowed: {', '.join(PRECISIONS)}; got {self.precision!r}")
        if any(int(d) != d or d < 1 for d in self.shape):
            raise SpecError("shape", f"dimensions must be positive integers, got {self.shape!r}")
        # Hashed once: the price memos below look an item up several times an iteration.
        object.__setattr__(self, "_hash", hash((self.flops, self.bytes_, self.precision, self.kind, self.count,
                                                self.shape, self.graph)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined, no-any-return]  # set in __post_init__

    def __reduce__(self) -> tuple[type[Work], tuple[object, ...]]:
        # Rebuilt through __init__, so the hash is that of the process that loads it (str hashes are salted).
        return (Work, (self.flops, self.bytes_, self.precision, self.kind, self.count, self.shape, self.graph))

    @property
    def total_flops(self) -> float:
        """FLOPs of all ``count`` repetitions."""
        return self.flops * self.count

    @property
    def total_bytes(self) -> float:
        """HBM bytes of all ``count`` repetitions."""
        return self.bytes_ * self.count


@dataclasses.dataclass(frozen=True)
class EfficiencyParams:
    """Per-chip parameters of the efficiency model (catalog ``efficiency``; see module docstring)."""

    matmul_peak_fraction: float
    attention_peak_fraction: float
    flash_triton_fraction: float  # isolated fwd+bwd rate of the Triton FlashAttention of 2022-2023 (attention_triton)
    sustained_fraction: float
    hbm_peak_fraction: float
    tile_m: int
    tile_n: int
    k_overhead: float
    compute_units: int
    launch_overhead_s: float
    graph_launch_overhead_s: float
    skinny_hbm_fraction: float
    power_compute_share: float
    power_memory_share: float
    power_clock_exponent: float
    overlap_compute_share: float  # of compute units a communication kernel overlapping compute occupies
    tile_k: int  # K depth of one main-loop step (the stream-K work unit)
    stream_k_fraction: float  # rate of a K-split, balanced GEMM relative to a full-wave tiled one
    fp8_matmul_factor: float  # share of its 16-bit efficiency an FP8 GEMM reaches (of the FP8 peak)
    fp4_matmul_factor: float  # share of its 16-bit efficiency a 4-bit (NVFP4, MXFP4) GEMM reaches (of the FP4 peak)
    paged_decode_call_s: float  # fixed time of one paged decode-attention call (0: the roofline alone)
    paged_decode_hbm_fraction: float  # share of HBM bandwidth its KV scan reaches beyond that
    paged_decode_floor_s: float  # least time of one paged decode-attention call however few its bytes (0: none)
    fp8_skinny_call_s: float  # fixed time of one FP8 library GEMM call with m below one tile (0: the roofline alone)
    fp8_skinny_hbm_fraction: float  # share of HBM bandwidth its weight stream reaches beyond that
    ranks_per_chip: int  # framework ranks one chip runs (Neuron on Trn1: one per NeuronCore-v2)
    tensor_flops_per_exp: float  # dense 16-bit matrix FLOPs the chip issues in the time it issues one exponential

    def __post_init__(self) -> None:
        for f in ("matmul_peak_fraction", "attention_peak_fraction", "flash_triton_fraction", "sustained_fraction",
                  "hbm_peak_fraction", "skinny_hbm_fraction", "stream_k_fraction", "fp8_matmul_factor",
                  "fp4_matmul_factor", "paged_decode_hbm_fraction", "fp8_skinny_hbm_fraction"):
            v = getattr(self, f)
            if not 0 < v <= 1:
                raise SpecError(f"efficiency.{f}", f"must be in (0, 1], got {v!r}")
        if self.tile_m < 1 or self.tile_n < 1 or self.tile_k < 1 or self.compute_units < 1:
            raise SpecError("efficiency.tile_m", "tiles and compute_units must be >= 1")
        if self.tensor_flops_per_exp <= 0:
            raise SpecError("efficiency.tensor_flops_per_exp", f"must be > 0, got {self.tensor_flops_per_exp!r}")
        if self.ranks_per_chip < 1:
            raise SpecError("efficiency.ranks_per_chip", f"must be >= 1, got {self.ranks_per_chip!r}")
        if not 0 <= self.overlap_compute_share < 1:
            raise SpecError("efficiency.overlap_compute_share",
                            f"must be in [0, 1), got {self.overlap_compute_share!r}")
        if not 0 <= self.paged_decode_call_s < 1e-3:
            raise SpecError("efficiency.paged_decode_call_s", f"must be in [0, 1 ms), got {self.paged_decode_call_s!r}")
        if not 0 <= self.paged_decode_floor_s < 1e-3:
            raise SpecError("efficiency.paged_decode_floor_s",
                            f"must be in [0, 1 ms), got {self.paged_decode_floor_s!r}")
        if not 0 <= self.fp8_skinny_call_s < 1e-3:
            raise SpecError("efficiency.fp8_skinny_call_s", f"must be in [0, 1 ms), got {self.fp8_skinny_call_s!r}")
        if self.k_overhead < 0 or self.launch_overhead_s < 0:
            raise SpecError("efficiency.k_overhead", "must be >= 0")

    @classmethod
    def for_chip(cls, chip: Chip | str) -> EfficiencyParams:
        """The catalog's defaults overridden by the chip's own entry."""
        return _efficiency_params(chip if isinstance(chip, str) else chip.name)


@functools.cache
def _efficiency_params(name: str) -> EfficiencyParams:
    section: dict[str, Any] = _raw().get("efficiency", {})
    merged = dict(section.get("default", {}))
    merged.update(section.get("chips", {}).get(name, {}) or {})
    fields = {f.name for f in dataclasses.fields(EfficiencyParams)}
    missing = fields - set(merged)
    if missing:
        raise SpecError("efficiency", f"catalog misses {sorted(missing)} for chip {name!r}")
    vals = {k: float(merged[k]) for k in fields}
    for k in ("tile_m", "tile_n", "tile_k", "compute_units", "ranks_per_chip"):
        vals[k] = int(vals[k])
    return EfficiencyParams(**vals)  # type: ignore[arg-type]


def _tile_q(dim: int, tile: int) -> float:
    """Useful fraction of padded tiles along one dimension."""
    return dim / (math.ceil(dim / tile) * tile)


def _wave_q(tiles: int, units: int) -> float:
    """Useful fraction of the last wave when ``tiles`` output tiles run on ``units`` units."""
    return tiles / (math.ceil(tiles / units) * units)


def _waves(tiles: int, k: int, p: EfficiencyParams) -> float:
    """Useful share of the compute units over the kernel: the better of a tiled grid (a partial last
    wave idles units) and stream-K, which spreads every tile's K iterations evenly over the units at
    ``stream_k_fraction`` of the rate (partial-tile fix-ups), as cuBLAS/CUTLASS choose per shape."""
    tiled = _wave_q(tiles, p.compute_units)
    if tiled >= p.stream_k_fraction:
        return tiled
    return max(tiled, p.stream_k_fraction * _wave_q(tiles * math.ceil(k / p.tile_k), p.compute_units))


def compute_efficiency(chip: Chip, work: Work) -> float:
    """Fraction of dense peak an operation of this kind and shape reaches, in (0, 1]."""
    p = EfficiencyParams.for_chip(chip)
    if work.kind in _VECTOR_FRACTION:
        return _VECTOR_FRACTION[work.kind]
    if work.kind == "matmul":
        eff = _matmul_ceiling(p, work) * p.sustained_fraction
        if len(work.shape) >= 3:
            m, n, k = work.shape[:3]
            if _skinny(work, p):
                # GEMV-like (decode, m < one tile): kernels split K instead of padding m to a tile and
                # are bound by streaming the weights; the FLOPs are small either way.
                return max(eff, 1e-3)
            batch = work.shape[3] if len(work.shape) >= 4 else 1  # a batched GEMM fills the units with all its tiles
            tiles = math.ceil(m / p.tile_m) * math.ceil(n / p.tile_n) * batch
            eff *= _tile_q(m, p.tile_m) * _tile_q(n, p.tile_n) * _waves(tiles, k, p)
            eff *= k / (k + p.k_overhead)
        elif work.shape:
            eff *= _tile_q(min(work.shape), p.tile_m)
        return max(eff, 1e-3)
    # attention
    ceiling = p.flash_triton_fraction if work.kind == "attention_triton" else p.attention_peak_fraction
    eff = ceiling * p.sustained_fraction
    if len(work.shape) >= 3:
        seq_q, seq_kv, head_dim = work.shape[:3]
        per_score = work.shape[3] if len(work.shape) >= 4 else FORWARD_FLOPS_PER_SCORE
        eff *= _tile_q(seq_q, p.tile_m) * seq_kv / (seq_kv + p.tile_n) * head_dim_factor(p, head_dim, per_score)
    return min(1.0, max(eff, 1e-3))


#: Head dimension at which the attention ceilings (``attention_peak_fraction``, ``flash_triton_fraction``) are stated.
REFERENCE_HEAD_DIM = 128
#: Matrix FLOPs per score per unit of head dimension of a fused attention, each pass with one exponential a score:
#: forward 4 (Q K^T and P V), backward 10 (its five matmuls; P is recomputed, so its exponential too). A backward work
#: item says so as the fourth element of its shape; without it an item is a forward pass.
FORWARD_FLOPS_PER_SCORE = 4
BACKWARD_FLOPS_PER_SCORE = 10


def head_dim_factor(p: EfficiencyParams, head_dim: int, flops_per_score: int = FORWARD_FLOPS_PER_SCORE) -> float:
    """Rate of a fused attention pass at ``head_dim`` relative to its rate at :data:`REFERENCE_HEAD_DIM`.

    Each score costs ``flops_per_score x head_dim`` matrix FLOPs (4 forward, 10 backward) but one exponential whatever
    the head dimension, on the special-function units, which issue one exponential in the time the matrix units issue
    ``tensor_flops_per_exp`` FLOPs (FlashAttention-3, arXiv 2407.08608, section 3: the H100's 989 TFLOPS of matmul
    against 3.9 TFLOPS of exponentials, "exponential can take 50% of the cycle time compared to matmul" at head dim
    128). With the two not overlapped (FlashAttention-2's kernels; a warp-specialised kernel hides some of it, so this
    is the upper bound of the effect), a pass's time per FLOP is proportional to
    ``1 + tensor_flops_per_exp / (flops_per_score x head_dim)``. Forward at head dim 64: 0.83 of head dim 128's rate on
    an A100, 0.75 on an H100, 0.67 on a GB200; forward and backward together 0.89, 0.82 and 0.74. Head dims above 128
    run faster than 128.
    """
    r = p.tensor_flops_per_exp / flops_per_score
    return (1.0 + r / REFERENCE_HEAD_DIM) / (1.0 + r / max(1, head_dim))


#: Formats one MMA kind runs on Blackwell (PTX ``tcgen05.mma``): FP8 and MXFP6 at the 8-bit rate (``kind::f8f6f4``),
#: the block-scaled 4-bit formats at twice it (``kind::mxf4nvf4``); each kind one factor.
FP8_RATE_PRECISIONS = frozenset({"fp8", "mxfp6"})
FP4_PRECISIONS = frozenset({"nvfp4", "mxfp4"})


def _matmul_ceiling(p: EfficiencyParams, work: Work) -> float:
    """Isolated-benchmark share of the precision's peak a large GEMM reaches: FP8 and 4-bit GEMMs reach less
    of their peak than 16-bit GEMMs of theirs (the same tiles, pipeline and 16-bit epilogue at two and four
    times the MAC rate)."""
    if work.precision in FP8_RATE_PRECISIONS:
        return p.matmul_peak_fraction * p.fp8_matmul_factor
    if work.precision in FP4_PRECISIONS:
        return p.matmul_peak_fraction * p.fp4_matmul_factor
    return p.matmul_peak_fraction


def _skinny(work: Work, p: EfficiencyParams) -> bool:
    """A matmul whose m is below one tile: a GEMV-like weight stream (LLM decode)."""
    return work.kind == "matmul" and len(work.shape) >= 3 and work.shape[0] < p.tile_m


def memory_efficiency(chip: Chip, work: Work) -> float:
    """Fraction of HBM bandwidth the access pattern reaches (weight-streaming GEMVs reach less than
    STREAM-like kernels)."""
    p = EfficiencyParams.for_chip(chip)
    return p.skinny_hbm_fraction if _skinny(work, p) else p.hbm_peak_fraction


#: Priced items, by (chip object, item, clock factor): a live service prices the same items again and again
#: (an inference engine's GEMMs depend only on the batch's token count; a training step repeats its plan),
#: and the catalog is read once per process, so an item's price never changes. Emptied when full.
_MEMO_MAX = 1 << 16
_time_memo: dict[tuple[int, Work, float], tuple[Chip, float]] = {}


def memo(table: dict[tuple[int, Work, float], tuple[Chip, float]], chip: Chip, work: Work, clock_factor: float,
         price: Callable[[Chip, Work, float], float]) -> float:
    """``price(chip, work, clock_factor)``, remembered in ``table``. The key holds the chip's id and the entry
    the chip itself, so an id is never reused while its entry lives (chips are unhashable dataclasses)."""
    key = (id(chip), work, clock_factor)
    hit = table.get(key)
    if hit is not None and hit[0] is chip:
        return hit[1]
    v = price(chip, work, clock_factor)
    if len(table) >= _MEMO_MAX:
        table.clear()
    table[key] = (chip, v)
    return v


def _one_time_s(chip: Chip, work: Work, clock_factor: float) -> float:
    return memo(_time_memo, chip, work, clock_factor, _price_one_s)


def _price_one_s(chip: Chip, work: Work, clock_factor: float) -> float:
    peak = chip.peak_flops(work.precision) * compute_efficiency(chip, work) * clock_factor
    bw = chip.hbm_Bps * memory_efficiency(chip, work)
    t = max(work.flops / peak if work.flops else 0.0, work.bytes_ / bw if work.bytes_ else 0.0)
    p = EfficiencyParams.for_chip(chip)
    t += p.graph_launch_overhead_s if work.graph else p.launch_overhead_s
    if p.paged_decode_call_s and _paged_decode(work, p):
        t = max(t, p.paged_decode_call_s + work.bytes_ / (chip.hbm_Bps * p.paged_decode_hbm_fraction))
    if p.paged_decode_floor_s and _paged_decode(work, p):
        # Where only small calls are measured (all at one time whatever their bytes), a floor, not a line.
        t = max(t, p.paged_decode_floor_s)
    if p.fp8_skinny_call_s and work.precision == "fp8" and _skinny(work, p):
        # FP8 decode GEMMs that go to the GEMM library's tile kernels (hipBLASLt on MI300X: vLLM's own skinny
        # kernels took only 16-bit inputs) pay its measured fixed time per call beyond streaming the weights:
        # the line of its benchmark table, as for paged decode.
        t = max(t, p.fp8_skinny_call_s + work.bytes_ / (chip.hbm_Bps * p.fp8_skinny_hbm_fraction))
    return t


def _paged_decode(work: Work, p: EfficiencyParams) -> bool:
    """Attention whose queries fill less than one tile: a decode kernel scanning a paged KV cache."""
    return work.kind == "attention" and len(work.shape) >= 3 and work.shape[0] < p.tile_m


def work_time_s(chip: Chip, work: Work, *, clock_factor: float = 1.0) -> float:
    """Seconds to run ``work`` (all ``count`` repetitions) at ``clock_factor`` of nominal clock."""
    if not 0 < clock_factor <= 1.5:
        raise SpecError("clock_factor", f"must be in (0, 1.5], got {clock_factor!r}")
    return _one_time_s(chip, work, clock_factor) * work.count


def works_time_s(chip: Chip, works: Sequence[Work], *, clock_factor: float = 1.0) -> float:
    """Seconds to run a sequence of work items back to back."""
    return sum(work_time_s(chip, w, clock_factor=clock_factor) for w in works)


def compute_bound_fraction(chip: Chip, work: Work, *, clock_factor: float = 1.0) -> tuple[float, float]:
    """(matrix-unit utilisation relative to the kind ceiling, HBM utilisation) while ``work`` runs.

    Used by the power model: a large GEMM keeps the matrix units as busy as they get (1.0) even
    though it reaches only ``matmul_peak_fraction`` of the datasheet peak.
    """
    p = EfficiencyParams.for_chip(chip)
    t = _one_time_s(chip, work, clock_factor)
    if t <= 0:
        return 0.0, 0.0
    if work.kind in ("matmul", "attention", "attention_triton"):
        ceiling = (_matmul_ceiling(p, work) if work.kind == "matmul" else p.flash_triton_fraction
                   if work.kind == "attention_triton" else p.attention_peak_fraction)
        u_c = work.flops / (t * chip.peak_flops(work.precision) * clock_factor * ceiling * p.sustained_fraction)
    else:
        u_c = 0.0
    u_m = work.bytes_ / (t * chip.hbm_Bps)
    return min(u_c, 1.0), min(u_m, 1.0)
