"""Roofline timing of one unit of work on one chip.

A :class:`Work` item is what the chip service executes and what the training and inference
models emit: FLOPs, bytes moved to and from HBM, a precision, and a kind and shape that the
efficiency model uses to decide what fraction of peak the operation reaches.
"""

from __future__ import annotations

import dataclasses

from gigacluster.hw.catalog import Chip
from gigacluster.model import SpecError

KINDS = ("matmul", "attention", "elementwise", "memory")


@dataclasses.dataclass(frozen=True)
class Work:
    """One operation, repeated ``count`` times. ``shape`` is optional (e.g. GEMM m, n, k)."""

    flops: float
    bytes_: float
    precision: str = "bf16"
    kind: str = "matmul"
    count: int = 1
    shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.flops >= 0:
            raise SpecError("flops", f"must be >= 0, got {self.flops!r}")
        if not self.bytes_ >= 0:
            raise SpecError("bytes", f"must be >= 0, got {self.bytes_!r}")
        if self.count < 1:
            raise SpecError("count", f"must be >= 1, got {self.count!r}")
        if self.kind not in KINDS:
            raise SpecError("kind", f"allowed: {', '.join(KINDS)}; got {self.kind!r}")


def compute_efficiency(chip: Chip, work: Work) -> float:
    """Fraction of dense peak an operation of this kind and shape reaches (0, 1]."""
    base = {"matmul": 0.75, "attention": 0.55, "elementwise": 0.05, "memory": 0.01}[work.kind]
    if work.shape:
        smallest = min(work.shape)
        # Tiles of 128 on each side keep systolic arrays and tensor cores full; smaller dims waste lanes.
        base *= min(1.0, smallest / 128.0) ** 0.5
    return max(base, 1e-3)


def memory_efficiency(chip: Chip, work: Work) -> float:
    """Fraction of HBM bandwidth a streaming access pattern reaches."""
    return 0.8


def work_time_s(chip: Chip, work: Work, *, clock_factor: float = 1.0) -> float:
    """Seconds to run ``work`` (all ``count`` repetitions) at ``clock_factor`` of nominal clock."""
    peak = chip.peak_flops(work.precision) * compute_efficiency(chip, work) * clock_factor
    bw = chip.hbm_Bps * memory_efficiency(chip, work)
    one = max(work.flops / peak if work.flops else 0.0, work.bytes_ / bw if work.bytes_ else 0.0)
    return one * work.count


def works_time_s(chip: Chip, works: list[Work] | tuple[Work, ...], *, clock_factor: float = 1.0) -> float:
    """Seconds to run a sequence of work items back to back."""
    return sum(work_time_s(chip, w, clock_factor=clock_factor) for w in works)
