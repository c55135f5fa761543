"""Conversions between proto messages and the pure modules' values, shared by all servicers."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from gigacluster.common.v1 import common_pb2
from gigacluster.errors import InvalidArgument
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.model.comm import OPS
from gigacluster.model.roofline import KINDS, Work
from gigacluster.runtime.errors import preview

PRECISION_NAMES: dict[int, str] = {
    common_pb2.PRECISION_FP32: "fp32",
    common_pb2.PRECISION_TF32: "tf32",
    common_pb2.PRECISION_BF16: "bf16",
    common_pb2.PRECISION_FP8: "fp8",
}
PRECISION_ENUMS = {v: k for k, v in PRECISION_NAMES.items()}
OP_ENUMS: dict[str, fabric_pb2.CollectiveOp] = {
    op: fabric_pb2.CollectiveOp.Value("COLLECTIVE_OP_" + op.upper()) for op in OPS
}
"""Collective op name (model.comm.OPS, the one table) -> fabric proto enum value."""
OP_NAMES: dict[fabric_pb2.CollectiveOp, str] = {v: k for k, v in OP_ENUMS.items()}
MAX_FLOPS = 1e21  # one work item of more than a zettaFLOP is a caller bug, not a workload
MAX_BYTES = 1e18


def precision_name(value: int, field: str = "precision", *, default: str | None = "bf16") -> str:
    if value == common_pb2.PRECISION_UNSPECIFIED and default is not None:
        return default
    if value not in PRECISION_NAMES:
        raise InvalidArgument(field, f"allowed: {', '.join(common_pb2.Precision.keys()[1:])}; got {value}")
    return PRECISION_NAMES[value]


def ranges(msgs: Iterable[common_pb2.DeviceRange]) -> list[tuple[int, int]]:
    return [(int(r.start), int(r.end)) for r in msgs]


def range_msgs(pairs: Iterable[tuple[int, int]]) -> list[common_pb2.DeviceRange]:
    return [common_pb2.DeviceRange(start=int(a), end=int(b)) for a, b in pairs]


def works(items: Sequence[object], field: str = "items") -> list[Work]:
    out = []
    if not items:
        raise InvalidArgument(field, "must contain at least one work item")
    if len(items) > 10_000:
        raise InvalidArgument(field, f"at most 10000 items per call, got {len(items)}")
    for i, it in enumerate(items):
        f = f"{field}[{i}]"
        kind = it.kind or "matmul"  # type: ignore[attr-defined]
        if kind not in KINDS:
            raise InvalidArgument(f"{f}.kind", f"allowed: {', '.join(KINDS)}; got {preview(kind, 64)!r}")
        flops, bytes_ = float(it.flops), float(it.bytes)  # type: ignore[attr-defined]
        for name, v, cap in (("flops", flops, MAX_FLOPS), ("bytes", bytes_, MAX_BYTES)):
            if not v >= 0:
                raise InvalidArgument(f"{f}.{name}", f"must be >= 0, got {v}")
            if v > cap:
                raise InvalidArgument(f"{f}.{name}", f"absurd value {v:g} (max {cap:g})")
        if flops == 0 and bytes_ == 0:
            raise InvalidArgument(f"{f}.flops", "a work item needs flops or bytes > 0")
        count = int(it.count) or 1  # type: ignore[attr-defined]
        if count > 1_000_000:
            raise InvalidArgument(f"{f}.count", f"must be <= 1000000, got {count}")
        out.append(Work(flops=flops, bytes_=bytes_,
                        precision=precision_name(it.precision, f"{f}.precision"),  # type: ignore[attr-defined]
                        kind=kind, count=count, shape=tuple(int(s) for s in it.shape),  # type: ignore[attr-defined]
                        graph=bool(it.graph)))  # type: ignore[attr-defined]
    return out


def work_msgs(ws: Iterable[Work]) -> list[Any]:
    from gigacluster.chip.v1 import chip_pb2

    return [
        chip_pb2.WorkItem(kind=w.kind, flops=w.flops, bytes=w.bytes_, precision=PRECISION_ENUMS[w.precision],  # type: ignore[arg-type]  # protobuf enums are int NewTypes
                          count=w.count, shape=list(w.shape), graph=w.graph)
        for w in ws
    ]


def page(items: Sequence[Any] | np.ndarray, page_size: int, page_token: str, *, default: int = 100,
         maximum: int = 1000) -> tuple[Sequence[Any], str]:
    """Slice a list for a List call; tokens are opaque offsets."""
    if page_size < 0:
        raise InvalidArgument("page_size", f"must be >= 0, got {page_size}")
    size = min(page_size or default, maximum)
    try:
        start = int(page_token) if page_token else 0
    except ValueError as exc:
        raise InvalidArgument("page_token", "not a token returned by this call") from exc
    if start < 0 or start > len(items):
        raise InvalidArgument("page_token", "not a token returned by this call")
    end = start + size
    return list(items[start:end]), (str(end) if end < len(items) else "")
