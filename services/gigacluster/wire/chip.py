"""Chip messages <-> domain values: a ``chip.v1.WorkItem`` is a :class:`~gigacluster.model.roofline.Work`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gigacluster.chip.v1 import chip_pb2
from gigacluster.errors import InvalidArgument
from gigacluster.model.roofline import KINDS, Work
from gigacluster.runtime.convert import PRECISION_ENUMS, precision_name
from gigacluster.runtime.errors import preview

MAX_FLOPS = 1e21  # one work item of more than a zettaFLOP is a caller bug, not a workload
MAX_BYTES = 1e18
MAX_ITEMS = 10_000  # per ExecuteWork call
MAX_COUNT = 1_000_000  # repeats of one item


def works(items: Sequence[chip_pb2.WorkItem], field: str = "items") -> list[Work]:
    """Validated work items of a request, as the roofline model's values."""
    out = []
    if not items:
        raise InvalidArgument(field, "must contain at least one work item")
    if len(items) > MAX_ITEMS:
        raise InvalidArgument(field, f"at most {MAX_ITEMS} items per call, got {len(items)}")
    for i, it in enumerate(items):
        f = f"{field}[{i}]"
        kind = it.kind or "matmul"
        if kind not in KINDS:
            raise InvalidArgument(f"{f}.kind", f"allowed: {', '.join(KINDS)}; got {preview(kind, 64)!r}")
        flops, bytes_ = float(it.flops), float(it.bytes)
        for name, v, cap in (("flops", flops, MAX_FLOPS), ("bytes", bytes_, MAX_BYTES)):
            if not v >= 0:
                raise InvalidArgument(f"{f}.{name}", f"must be >= 0, got {v}")
            if v > cap:
                raise InvalidArgument(f"{f}.{name}", f"absurd value {v:g} (max {cap:g})")
        if flops == 0 and bytes_ == 0:
            raise InvalidArgument(f"{f}.flops", "a work item needs flops or bytes > 0")
        count = int(it.count) or 1
        if count > MAX_COUNT:
            raise InvalidArgument(f"{f}.count", f"must be <= {MAX_COUNT}, got {count}")
        out.append(Work(flops=flops, bytes_=bytes_, precision=precision_name(it.precision, f"{f}.precision"),
                        kind=kind, count=count, shape=tuple(int(s) for s in it.shape), graph=bool(it.graph)))
    return out


def work_msgs(ws: Iterable[Work]) -> list[chip_pb2.WorkItem]:
    """The request items for ``ws`` (the inverse of :func:`works`)."""
    return [
        chip_pb2.WorkItem(kind=w.kind, flops=w.flops, bytes=w.bytes_, precision=PRECISION_ENUMS[w.precision],  # type: ignore[arg-type]  # protobuf enums are int NewTypes
                          count=w.count, shape=list(w.shape), graph=w.graph)
        for w in ws
    ]


__all__ = ["MAX_BYTES", "MAX_FLOPS", "work_msgs", "works"]
