"""The common.v1 conversions every servicer shares: precision, device ranges, paging.

Each service's own messages convert in :mod:`gigacluster.wire` (one module per service)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from gigacluster.common.v1 import common_pb2
from gigacluster.errors import InvalidArgument

PRECISION_NAMES: dict[int, str] = {
    common_pb2.PRECISION_FP32: "fp32",
    common_pb2.PRECISION_TF32: "tf32",
    common_pb2.PRECISION_BF16: "bf16",
    common_pb2.PRECISION_FP8: "fp8",
    common_pb2.PRECISION_FP16: "fp16",
    common_pb2.PRECISION_MXFP6: "mxfp6",
    common_pb2.PRECISION_MXFP4: "mxfp4",
    common_pb2.PRECISION_NVFP4: "nvfp4",
}
PRECISION_ENUMS = {v: k for k, v in PRECISION_NAMES.items()}


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
