"""DeviceSet: a set of device ids as sorted half-open ranges, and its compact text form.

The scope of a capability (:mod:`gigacluster.security.capability`) and of an allocation; a token
carries it as :meth:`DeviceSet.to_wire` (base64url of varints).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from gigacluster.arrays import distinct
from gigacluster.security import InvalidArgument

#: Largest device id a DeviceSet accepts (2**40): far above any cluster, small enough for int64 sums.
MAX_DEVICE_ID = 1 << 40


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Strict base64url decode (no padding in the input); raises ValueError on any bad character."""
    if not re.fullmatch(r"[A-Za-z0-9_-]*", text) or len(text) % 4 == 1:
        raise ValueError("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _uvarints(values: Iterable[int]) -> bytes:
    out = bytearray()
    for v in values:
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
    return bytes(out)


def _read_uvarints(data: bytes) -> list[int]:
    values: list[int] = []
    v = shift = 0
    for b in data:
        v |= (b & 0x7F) << shift
        if b & 0x80:
            shift += 7
            if shift > 63:
                raise ValueError("varint too long")
        else:
            values.append(v)
            v = shift = 0
    if shift:
        raise ValueError("truncated varint")
    return values


@dataclass(frozen=True, eq=False)
class DeviceSet:
    """A set of device ids as sorted, disjoint, non-adjacent half-open ranges ``[start, stop)``.

    Compact whatever the count: 100k contiguous devices are one range. Membership tests are
    vectorised (``searchsorted``), so checking a call that names thousands of devices is cheap.
    """

    starts: np.ndarray
    stops: np.ndarray
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        starts = np.ascontiguousarray(self.starts, dtype=np.int64).reshape(-1)
        stops = np.ascontiguousarray(self.stops, dtype=np.int64).reshape(-1)
        if starts.shape != stops.shape:
            raise InvalidArgument("devices", "starts and stops must have the same length")
        if starts.size:
            if starts[0] < 0 or stops[-1] > MAX_DEVICE_ID:
                raise InvalidArgument("devices", f"device ids must be in [0, {MAX_DEVICE_ID})")
            if np.any(stops <= starts):
                raise InvalidArgument("devices", "every range must be non-empty (stop > start)")
            if np.any(starts[1:] <= stops[:-1]):
                raise InvalidArgument("devices", "ranges must be sorted, disjoint and non-adjacent")
        starts.setflags(write=False)
        stops.setflags(write=False)
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "stops", stops)
        object.__setattr__(self, "_hash", hash((starts.tobytes(), stops.tobytes())))

    @classmethod
    def empty(cls) -> DeviceSet:
        """The set with no devices."""
        return cls(np.empty(0, np.int64), np.empty(0, np.int64))

    @classmethod
    def from_range(cls, start: int, stop: int) -> DeviceSet:
        """Devices ``start .. stop-1``."""
        if stop == start:
            return cls.empty()
        return cls(np.array([start], np.int64), np.array([stop], np.int64))

    @classmethod
    def from_ids(cls, ids: np.ndarray | Iterable[int]) -> DeviceSet:
        """The set of the given ids (any order, duplicates allowed), merged into ranges."""
        arr = distinct(np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64))
        if arr.size == 0:
            return cls.empty()
        breaks = np.flatnonzero(np.diff(arr) != 1) + 1
        starts = arr[np.concatenate(([0], breaks))]
        stops = arr[np.concatenate((breaks - 1, [arr.size - 1]))] + 1
        return cls(starts, stops)

    @classmethod
    def from_mask(cls, mask: np.ndarray) -> DeviceSet:
        """The set of indices where the boolean array ``mask`` is true (fast for 1M devices)."""
        m = np.asarray(mask, dtype=np.int8)
        edges = np.diff(np.concatenate(([0], m, [0])))
        return cls(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1))

    @property
    def n_ranges(self) -> int:
        return int(self.starts.size)

    def __len__(self) -> int:
        return int((self.stops - self.starts).sum())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DeviceSet):
            return NotImplemented
        return np.array_equal(self.starts, other.starts) and np.array_equal(self.stops, other.stops)

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"DeviceSet({self})"

    def __str__(self) -> str:
        parts = [
            f"{a}" if b == a + 1 else f"{a}-{b - 1}"
            for a, b in zip(self.starts.tolist()[:8], self.stops.tolist()[:8], strict=True)
        ]
        more = f",...(+{self.n_ranges - 8} ranges)" if self.n_ranges > 8 else ""
        return ",".join(parts) + more

    def ids(self) -> np.ndarray:
        """All member ids as an int64 array (materialises the set)."""
        if not self.starts.size:
            return np.empty(0, np.int64)
        lengths = self.stops - self.starts
        offsets = np.repeat(self.starts - np.concatenate(([0], np.cumsum(lengths)[:-1])), lengths)
        return np.arange(int(lengths.sum()), dtype=np.int64) + offsets

    def contains(self, ids: np.ndarray | Iterable[int]) -> np.ndarray:
        """Boolean array: which of ``ids`` are members."""
        arr = np.asarray(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64)
        if not self.starts.size:
            return np.zeros(arr.shape, bool)
        idx = np.searchsorted(self.starts, arr, side="right") - 1
        return (idx >= 0) & (arr < self.stops[np.maximum(idx, 0)])

    def contains_all(self, ids: np.ndarray | Iterable[int]) -> bool:
        """True if every id in ``ids`` is a member (an empty ``ids`` is contained)."""
        return bool(np.all(self.contains(ids)))

    def issubset(self, other: DeviceSet) -> bool:
        """True if every range of this set lies inside one range of ``other``."""
        if not self.starts.size:
            return True
        if not other.starts.size:
            return False
        idx = np.searchsorted(other.starts, self.starts, side="right") - 1
        ok = idx >= 0
        idx = np.maximum(idx, 0)
        return bool(np.all(ok & (self.stops <= other.stops[idx])))

    def to_wire(self) -> str:
        """Compact text form: base64url of varints (range count, then gap and length per range)."""
        starts = self.starts.tolist()
        stops = self.stops.tolist()
        values = [len(starts)]
        prev = 0
        for a, b in zip(starts, stops, strict=True):
            values += [a - prev, b - a]
            prev = b
        return b64url_encode(_uvarints(values))

    @classmethod
    def from_wire(cls, text: str) -> DeviceSet:
        """Parse :meth:`to_wire` output; raises InvalidArgument(devices) when malformed."""
        try:
            values = _read_uvarints(b64url_decode(text))
        except (ValueError, binascii.Error) as exc:
            raise InvalidArgument("devices", f"malformed device set: {exc}") from exc
        if not values or len(values) != 1 + 2 * values[0]:
            raise InvalidArgument("devices", "malformed device set: wrong number of values")
        pairs = np.array(values[1:], dtype=object).reshape(-1, 2)
        if pairs.size and (pairs.max() >= MAX_DEVICE_ID or (pairs[1:, 0] == 0).any()):
            raise InvalidArgument("devices", "malformed device set: out of range or non-canonical")
        gaps = pairs[:, 0].astype(np.int64)
        lengths = pairs[:, 1].astype(np.int64)
        stops = np.cumsum(gaps + lengths)
        return cls(stops - lengths, stops)


__all__ = ["MAX_DEVICE_ID", "DeviceSet", "b64url_decode", "b64url_encode"]
