"""Device memory tracked per allocation, with owner checks and scrub-on-release.

Each device has an HBM capacity and a list of allocations (owner tenant and instance, offset,
size). A tenant reads and writes bytes of its own allocations only. Contents are kept as sparse
written extents, never as HBM-sized buffers: bytes never written read as zeros. Releasing an
allocation scrubs it: its extents are dropped (so the next owner of those bytes reads zeros)
and the scrub is charged as virtual time, ``bytes / scrub_Bps`` per device, devices in parallel,
where ``scrub_Bps`` comes from the catalog's ``chip.hbm_Bps`` times the write efficiency of a
memset kernel (:class:`~gigacluster.security.overhead.VirtualizationOverhead`).

Metadata (:class:`Allocation`) is visible to the admin; contents are reachable only through
:meth:`DeviceMemory.read` with the owning tenant.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from gigacluster.hw.catalog import Chip
from gigacluster.security import InvalidArgument, NotFound, PermissionDenied, ResourceExhausted
from gigacluster.security.overhead import VirtualizationOverhead

#: Largest single read or write (bytes): bounds the buffer a request can make the emulator build.
MAX_IO_BYTES = 64 * 1024 * 1024
#: Default bound on bytes actually stored across all extents (emulator RAM, not modelled HBM).
DEFAULT_MAX_STORED_BYTES = 1 << 30


@dataclass(frozen=True)
class Allocation:
    """Metadata of one allocation (no contents)."""

    alloc_id: int
    device: int
    tenant: str
    instance: str
    offset_bytes: int
    size_bytes: int


@dataclass
class _Extents:
    """Sparse written bytes of one allocation: sorted, disjoint, non-adjacent (start, data)."""

    starts: list[int] = field(default_factory=list)
    datas: list[bytearray] = field(default_factory=list)

    def stored_bytes(self) -> int:
        return sum(len(d) for d in self.datas)

    def write(self, offset: int, data: bytes) -> int:
        """Store ``data`` at ``offset``; returns the change in stored bytes."""
        end = offset + len(data)
        # Extents that overlap or touch [offset, end) are merged into one.
        lo = bisect.bisect_left(self.starts, offset)
        if lo > 0 and self.starts[lo - 1] + len(self.datas[lo - 1]) >= offset:
            lo -= 1
        hi = bisect.bisect_right(self.starts, end)
        before = sum(len(d) for d in self.datas[lo:hi])
        if lo == hi:
            merged, m_start = bytearray(data), offset
        else:
            m_start = min(offset, self.starts[lo])
            m_end = max(end, self.starts[hi - 1] + len(self.datas[hi - 1]))
            merged = bytearray(m_end - m_start)
            for s, d in zip(self.starts[lo:hi], self.datas[lo:hi], strict=True):
                merged[s - m_start : s - m_start + len(d)] = d
            merged[offset - m_start : end - m_start] = data
        self.starts[lo:hi] = [m_start]
        self.datas[lo:hi] = [merged]
        return len(merged) - before

    def read(self, offset: int, n: int) -> bytes:
        out = bytearray(n)  # never-written bytes are zeros
        end = offset + n
        i = max(0, bisect.bisect_right(self.starts, offset) - 1)
        while i < len(self.starts) and self.starts[i] < end:
            s, d = self.starts[i], self.datas[i]
            a, b = max(s, offset), min(s + len(d), end)
            if a < b:
                out[a - offset : b - offset] = d[a - s : b - s]
            i += 1
        return bytes(out)


@dataclass
class _Record:
    meta: Allocation
    extents: _Extents = field(default_factory=_Extents)


class DeviceMemory:
    """HBM of ``n_devices`` devices: allocations per device, owner-checked I/O, scrub on release."""

    def __init__(
        self,
        n_devices: int,
        hbm_bytes: int,
        *,
        scrub_Bps: float,
        max_stored_bytes: int = DEFAULT_MAX_STORED_BYTES,
    ) -> None:
        if n_devices < 1:
            raise InvalidArgument("n_devices", f"must be >= 1, got {n_devices}")
        if hbm_bytes < 1:
            raise InvalidArgument("hbm_bytes", f"must be >= 1, got {hbm_bytes}")
        if not scrub_Bps > 0:
            raise InvalidArgument("scrub_Bps", f"must be > 0, got {scrub_Bps}")
        self.n_devices = n_devices
        self.capacity_bytes = np.full(n_devices, hbm_bytes, dtype=np.int64)
        self.used_bytes = np.zeros(n_devices, dtype=np.int64)
        self.scrub_Bps = float(scrub_Bps)
        self.max_stored_bytes = max_stored_bytes
        self._stored_bytes = 0
        self._next_id = 1
        self._records: dict[int, _Record] = {}
        # Per device: allocation ids sorted by offset, and their offsets (for first-fit placement).
        self._dev_offsets: dict[int, list[int]] = {}
        self._dev_ids: dict[int, list[int]] = {}
        self._by_instance: dict[str, set[int]] = {}

    @classmethod
    def for_chip(
        cls, chip: Chip, n_devices: int, *, overhead: VirtualizationOverhead | None = None
    ) -> DeviceMemory:
        """Memory of ``n_devices`` chips of the catalog type ``chip`` (capacity and scrub bandwidth)."""
        ov = overhead or VirtualizationOverhead()
        return cls(n_devices, chip.hbm_bytes, scrub_Bps=chip.hbm_Bps * ov.scrub_bandwidth_fraction)

    @property
    def stored_bytes(self) -> int:
        """Bytes actually held for written extents (emulator RAM use)."""
        return self._stored_bytes

    def scrub_time_s(self, bytes_: float) -> float:
        """Virtual seconds to overwrite ``bytes_`` of one device's HBM with zeros."""
        return float(bytes_) / self.scrub_Bps

    def allocate(self, device: int, tenant: str, instance: str, size_bytes: int) -> int:
        """Place ``size_bytes`` on ``device`` (first fit) for ``tenant``/``instance``; returns the id."""
        if not 0 <= device < self.n_devices:
            raise InvalidArgument("device", f"must be in [0, {self.n_devices}), got {device}")
        if size_bytes < 1:
            raise InvalidArgument("size_bytes", f"must be >= 1, got {size_bytes}")
        cap = int(self.capacity_bytes[device])
        offsets = self._dev_offsets.setdefault(device, [])
        ids = self._dev_ids.setdefault(device, [])
        cursor, pos = 0, len(ids)
        for i, aid in enumerate(ids):  # first fit: the first gap between allocations that is big enough
            if offsets[i] - cursor >= size_bytes:
                pos = i
                break
            cursor = offsets[i] + self._records[aid].meta.size_bytes
        else:
            if cap - cursor < size_bytes:
                free = cap - int(self.used_bytes[device])
                raise ResourceExhausted(
                    f"device {device}: {size_bytes} bytes requested, {free} of {cap} free"
                    + (" but fragmented" if free >= size_bytes else ""),
                    requested=size_bytes, available=free, reason="DEVICE_MEMORY_EXHAUSTED",
                )
        aid = self._next_id
        self._next_id += 1
        meta = Allocation(aid, device, tenant, instance, cursor, size_bytes)
        self._records[aid] = _Record(meta)
        offsets.insert(pos, cursor)
        ids.insert(pos, aid)
        self.used_bytes[device] += size_bytes
        self._by_instance.setdefault(instance, set()).add(aid)
        return aid

    def _owned(self, alloc_id: int, tenant: str, instance: str | None) -> _Record:
        rec = self._records.get(alloc_id)
        if rec is None:
            raise NotFound(f"no allocation {alloc_id}", reason="ALLOCATION_NOT_FOUND")
        if rec.meta.tenant != tenant or (instance is not None and rec.meta.instance != instance):
            raise PermissionDenied(f"allocation {alloc_id} is not yours", reason="ALLOCATION_NOT_OWNED")
        return rec

    @staticmethod
    def _check_range(rec: _Record, offset: int, n: int) -> None:
        if n > MAX_IO_BYTES:
            raise InvalidArgument("size", f"at most {MAX_IO_BYTES} bytes per call, got {n}")
        if offset < 0 or n < 0 or offset + n > rec.meta.size_bytes:
            raise InvalidArgument(
                "offset", f"[{offset}, {offset + n}) is outside allocation of {rec.meta.size_bytes} bytes"
            )

    def write(self, alloc_id: int, tenant: str, offset: int, data: bytes, *, instance: str | None = None) -> None:
        """Write ``data`` at ``offset`` of the tenant's allocation."""
        rec = self._owned(alloc_id, tenant, instance)
        self._check_range(rec, offset, len(data))
        if not data:
            return
        headroom = self.max_stored_bytes - self._stored_bytes
        if len(data) > headroom:  # conservative: an overwrite may need no new room
            raise ResourceExhausted(
                f"emulator stores at most {self.max_stored_bytes} written bytes in all",
                requested=len(data), available=max(headroom, 0), reason="EMULATOR_STORE_FULL",
            )
        self._stored_bytes += rec.extents.write(offset, bytes(data))

    def read(self, alloc_id: int, tenant: str, offset: int, n: int, *, instance: str | None = None) -> bytes:
        """``n`` bytes at ``offset`` of the tenant's allocation (zeros where never written)."""
        rec = self._owned(alloc_id, tenant, instance)
        self._check_range(rec, offset, n)
        return rec.extents.read(offset, n)

    def _drop(self, aid: int) -> Allocation:
        rec = self._records.pop(aid)
        m = rec.meta
        self._stored_bytes -= rec.extents.stored_bytes()
        rec.extents.starts.clear()  # the scrub: the contents are gone, not just unreachable
        rec.extents.datas.clear()
        ids = self._dev_ids[m.device]
        i = ids.index(aid)
        del ids[i]
        del self._dev_offsets[m.device][i]
        self.used_bytes[m.device] -= m.size_bytes
        inst = self._by_instance.get(m.instance)
        if inst is not None:
            inst.discard(aid)
            if not inst:
                del self._by_instance[m.instance]
        return m

    def _scrub_time(self, metas: list[Allocation]) -> float:
        if not metas:
            return 0.0
        per_device = np.bincount(
            np.array([m.device for m in metas]), weights=np.array([m.size_bytes for m in metas], dtype=float)
        )
        return float(per_device.max()) / self.scrub_Bps

    def free(self, alloc_id: int, tenant: str, *, instance: str | None = None) -> float:
        """Release one of the tenant's allocations; returns the scrub time in seconds."""
        self._owned(alloc_id, tenant, instance)
        return self._scrub_time([self._drop(alloc_id)])

    def release_instance(self, instance: str) -> float:
        """Release and scrub every allocation of ``instance``; returns the scrub time in seconds.

        Devices scrub in parallel, so the time is that of the device with the most bytes.
        """
        aids = sorted(self._by_instance.get(instance, ()))
        return self._scrub_time([self._drop(a) for a in aids])

    def allocations(self, *, device: int | None = None, instance: str | None = None) -> Iterator[Allocation]:
        """Metadata of live allocations, optionally of one device or instance (never contents)."""
        if instance is not None:
            aids: list[int] = sorted(self._by_instance.get(instance, ()))
        elif device is not None:
            aids = list(self._dev_ids.get(device, ()))
        else:
            aids = sorted(self._records)
        for a in aids:
            m = self._records[a].meta
            if device is None or m.device == device:
                yield m
