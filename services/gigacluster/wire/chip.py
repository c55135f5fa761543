"""Chip messages <-> domain values: a ``chip.v1.WorkItem`` is a :class:`~gigacluster.model.roofline.Work`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from gigacluster.chip.v1 import chip_pb2
from gigacluster.errors import InvalidArgument
from gigacluster.model.roofline import KINDS, Work
from gigacluster.runtime.convert import PRECISION_ENUMS, precision_name, range_msgs
from gigacluster.runtime.errors import preview

if TYPE_CHECKING:  # annotations only: the chip service imports this module (no package cycle)
    from gigacluster.chip.shard import ChipShard

MAX_FLOPS = 1e21  # one work item of more than a zettaFLOP is a caller bug, not a workload
MAX_BYTES = 1e18
MAX_ITEMS = 10_000  # per ExecuteWork call
MAX_COUNT = 1_000_000  # repeats of one item
MAX_DIM = 1 << 40  # one operand dimension (a GEMM's m, n or k; an attention's sequence length)
MAX_RANK = 8  # operand dimensions of one item


# Valid items seen, by their wire bytes, and the messages of items sent. A replica reports the same few
# items (its GEMMs at a batch size) in every iteration, many a second: reading and checking an item field by
# field and building its Work cost the chip shard about 12 us an item, the bytes and a look-up 1. Work is
# frozen, so one value serves every request that sends the same bytes; each dict is cleared when it fills.
CACHE_MAX = 65_536
_WORKS: dict[bytes, Work] = {}
_MSGS: dict[Work, chip_pb2.WorkItem] = {}


def works(items: Sequence[chip_pb2.WorkItem], field: str = "items") -> list[Work]:
    """Validated work items of a request, as the roofline model's values."""
    out = []
    if not items:
        raise InvalidArgument(field, "must contain at least one work item")
    if len(items) > MAX_ITEMS:
        raise InvalidArgument(field, f"at most {MAX_ITEMS} items per call, got {len(items)}")
    for i, it in enumerate(items):
        key = it.SerializeToString()
        w = _WORKS.get(key)
        if w is None:
            w = _work(it, f"{field}[{i}]")  # raises for an invalid item, which is never kept
            if len(_WORKS) >= CACHE_MAX:
                _WORKS.clear()
            _WORKS[key] = w
        out.append(w)
    return out


def _work(it: chip_pb2.WorkItem, f: str) -> Work:
    """One item, checked field by field (``f`` names it in the error)."""
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
    if len(it.shape) > MAX_RANK or any(d > MAX_DIM for d in it.shape):
        raise InvalidArgument(f"{f}.shape", f"at most {MAX_RANK} dimensions of at most {MAX_DIM} each, "
                                            f"got {preview(str(list(it.shape)), 80)}")
    return Work(flops=flops, bytes_=bytes_, precision=precision_name(it.precision, f"{f}.precision"),
                kind=kind, count=count, shape=tuple(int(s) for s in it.shape), graph=bool(it.graph))


def work_msgs(ws: Iterable[Work]) -> list[chip_pb2.WorkItem]:
    """The request items for ``ws`` (the inverse of :func:`works`). The messages are shared: a request built
    with them copies them (``items=...``, ``extend``); never change one in place."""
    out = []
    for w in ws:
        m = _MSGS.get(w)
        if m is None:
            m = chip_pb2.WorkItem(kind=w.kind, flops=w.flops, bytes=w.bytes_, precision=PRECISION_ENUMS[w.precision],  # type: ignore[arg-type]  # protobuf enums are int NewTypes
                                  count=w.count, shape=list(w.shape), graph=w.graph)
            if len(_MSGS) >= CACHE_MAX:
                _MSGS.clear()
            _MSGS[w] = m
        out.append(m)
    return out


def fault_name(kind: int) -> str:
    """The FaultKind enum's name ("" for none)."""
    return chip_pb2.FaultKind.Name(kind) if kind else ""  # type: ignore[arg-type]


def shard_msg(s: ChipShard, *, name: str, now_s: float) -> chip_pb2.GetShardResponse:
    return chip_pb2.GetShardResponse(
        name=name, chip_type=s.chip.name, devices=range_msgs([(s.offset, s.end)])[0], system=s.system.name,
        chips_per_domain=s.system.chips, hbm_bytes_per_device=s.chip.hbm_bytes, now_s=now_s,
    )


def device_msgs(s: ChipShard, idx: np.ndarray, *, now_s: float, memory_used: np.ndarray) -> list[chip_pb2.Device]:
    """One Device message per local index in ``idx`` (ids on the wire are global: offset added)."""
    energy = s.energy_j(now_s)
    states = s.state()
    return [chip_pb2.Device(
        id=int(i) + s.offset, state=int(states[i]), utilization=float(s.utilization[i]),  # type: ignore[arg-type]  # protobuf enums are int NewTypes
        power_w=float(s.power_w[i]), temperature_c=float(s.temp_c[i]), clock_factor=float(s.clock[i]),
        memory_used_bytes=int(memory_used[i]), energy_j=float(energy[i]),
        busy_s=float(s.busy_s[i]), fault=fault_name(int(s.fault[i])),
    ) for i in np.asarray(idx, dtype=np.int64)]


def stats_msg(s: ChipShard, sel: np.ndarray, *, now_s: float, memory_used: np.ndarray) -> chip_pb2.GetStatsResponse:
    """Aggregates over the local indices ``sel``."""
    st = s.state()[sel]
    return chip_pb2.GetStatsResponse(
        devices=int(sel.size), healthy=int(np.count_nonzero(st == 1)), failed=int(np.count_nonzero(st == 3)),
        throttled=int(np.count_nonzero(st == 2)), mean_utilization=float(s.utilization[sel].mean()),
        power_w=float(s.power_w[sel].sum()), energy_j=float(s.energy_j(now_s)[sel].sum()),
        busy_s=float(s.busy_s[sel].sum()), memory_used_bytes=int(memory_used[sel].sum()),
        max_temperature_c=float(s.temp_c[sel].max()), now_s=now_s,
    )


__all__ = ["MAX_BYTES", "MAX_FLOPS", "device_msgs", "fault_name", "shard_msg", "stats_msg", "work_msgs", "works"]
