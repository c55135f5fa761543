"""The instance allocator: gives a tenant whole devices, one tenant per device at a time.

Devices are numbered across chip shards (one shard per chip type, devices grouped into scale-up
domains of the catalog system's size). State is numpy arrays indexed by device id (owner tenant,
owning instance, chip type, domain), so every decision is a few vectorised passes even for a
million devices.

Placement constraints (:class:`PlacementConstraint`, the proto's ``topology`` field):

- ``none``: the lowest-numbered free devices of the chip type;
- ``same_domain``: all devices inside one scale-up domain (best fit: the domain with the fewest
  free devices that still has enough, to keep whole domains free for large requests); a request
  larger than a domain takes whole free domains (a multiple of the domain size), so a training
  gang's tensor-parallel groups never straddle two domains;
- ``contiguous``: one run of consecutive device ids (best fit among the free runs), which also
  keeps the instance's capability token a single range.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from gigacluster.arrays import distinct
from gigacluster.hw import catalog
from gigacluster.security import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from gigacluster.security.capability import DeviceSet, check_name

FREE = -1


class PlacementConstraint(enum.StrEnum):
    """Placement constraint of an instance's devices (the fabric's ``Topology`` is the one topology)."""

    NONE = "none"
    SAME_DOMAIN = "same_domain"
    CONTIGUOUS = "contiguous"


#: The former name, kept importable; a topology is the fabric's ``gigacluster.fabric.topology.Topology``.
Topology = PlacementConstraint


@dataclass(frozen=True)
class Shard:
    """``n_devices`` devices of ``chip_type`` in scale-up domains of ``domain_size`` (0: catalog default)."""

    chip_type: str
    n_devices: int
    domain_size: int = 0

    def __post_init__(self) -> None:
        if self.chip_type not in catalog.chip_names():
            allowed = ", ".join(catalog.chip_names())
            raise InvalidArgument("chip_type", f"unknown {self.chip_type!r}; allowed: {allowed}")
        if self.n_devices < 1:
            raise InvalidArgument("n_devices", f"must be >= 1, got {self.n_devices}")
        if self.domain_size < 0:
            raise InvalidArgument("domain_size", f"must be >= 0, got {self.domain_size}")

    def resolved_domain_size(self) -> int:
        """The domain size, defaulting to the chip's default system in the catalog."""
        if self.domain_size:
            return self.domain_size
        return catalog.get_system(catalog.default_system(self.chip_type)).chips


@dataclass(frozen=True)
class InstanceAllocation:
    """An allocated instance: its owner, chip type and devices."""

    instance: str
    tenant: str
    chip_type: str
    devices: DeviceSet
    topology: PlacementConstraint


class DeviceAllocator:
    """Allocates and releases instances over all devices of the cluster."""

    def __init__(self, shards: Sequence[Shard]) -> None:
        if not shards:
            raise InvalidArgument("shards", "need at least one shard")
        self.chip_types: tuple[str, ...] = tuple(dict.fromkeys(s.chip_type for s in shards))
        n = sum(s.n_devices for s in shards)
        self.n_devices = n
        self.chip_of = np.empty(n, dtype=np.int16)
        self.domain_of = np.empty(n, dtype=np.int64)
        start, next_domain = 0, 0
        for s in shards:
            size = s.resolved_domain_size()
            stop = start + s.n_devices
            self.chip_of[start:stop] = self.chip_types.index(s.chip_type)
            self.domain_of[start:stop] = next_domain + np.arange(s.n_devices) // size
            next_domain += -(-s.n_devices // size)
            start = stop
        self.domain_size_of = np.bincount(self.domain_of)
        self._chip_mask = [self.chip_of == c for c in range(len(self.chip_types))]
        self._max_domain = [int(self.domain_size_of[distinct(self.domain_of[m])].max()) for m in self._chip_mask]
        self.owner = np.full(n, FREE, dtype=np.int32)  # tenant index per device
        self.instance_of = np.full(n, FREE, dtype=np.int32)  # instance index per device
        self._tenants: list[str] = []
        self._tenant_idx: dict[str, int] = {}
        self._instances: dict[str, InstanceAllocation] = {}
        self._instance_idx: dict[str, int] = {}
        self._next_instance = 0

    def _chip_code(self, chip_type: str) -> int:
        if chip_type not in self.chip_types:
            raise InvalidArgument("chip_type", f"no devices of {chip_type!r}; allowed: {', '.join(self.chip_types)}")
        return self.chip_types.index(chip_type)

    def free_mask(self, chip_type: str) -> np.ndarray:
        """Boolean array over devices: free and of ``chip_type``."""
        return (self.owner == FREE) & self._chip_mask[self._chip_code(chip_type)]

    def free_count(self, chip_type: str) -> int:
        """Free devices of ``chip_type``."""
        return int(np.count_nonzero(self.free_mask(chip_type)))

    def allocate(
        self, tenant: str, instance: str, chip_type: str, count: int,
        topology: PlacementConstraint | str = PlacementConstraint.NONE,
    ) -> InstanceAllocation:
        """Give ``tenant`` ``count`` free devices of ``chip_type`` under ``topology`` as ``instance``.

        Raises ResourceExhausted (with the numbers) when the devices are not there, InvalidArgument
        for a bad field, FailedPrecondition if the instance name is already in use.
        """
        check_name("tenant", tenant)
        check_name("instance", instance)
        try:
            topo = PlacementConstraint(topology)
        except ValueError as exc:
            raise InvalidArgument("topology", f"allowed: {', '.join(t.value for t in PlacementConstraint)}") from exc
        if not isinstance(count, int | np.integer) or count < 1:
            raise InvalidArgument("count", f"must be an integer >= 1, got {count!r}")
        if instance in self._instances:
            raise FailedPrecondition(f"instance {instance!r} already exists", reason="INSTANCE_EXISTS")
        mask = self.free_mask(chip_type)
        free = int(np.count_nonzero(mask))
        if free < count:
            raise ResourceExhausted(
                f"need {count} {chip_type} devices, {free} free", requested=count, available=free,
                reason="NOT_ENOUGH_DEVICES",
            )
        if topo is PlacementConstraint.NONE:
            ids = np.flatnonzero(mask)[:count]
            devices = DeviceSet.from_ids(ids)
        elif topo is PlacementConstraint.SAME_DOMAIN:
            devices = self._same_domain(mask, chip_type, count, free)
        else:
            devices = self._contiguous(mask, chip_type, count, free)
        t_idx = self._tenant_idx.setdefault(tenant, len(self._tenants))
        if t_idx == len(self._tenants):
            self._tenants.append(tenant)
        i_idx = self._next_instance
        self._next_instance += 1
        for a, b in zip(devices.starts.tolist(), devices.stops.tolist(), strict=True):
            self.owner[a:b] = t_idx
            self.instance_of[a:b] = i_idx
        alloc = InstanceAllocation(instance, tenant, chip_type, devices, topo)
        self._instances[instance] = alloc
        self._instance_idx[instance] = i_idx
        return alloc

    def _same_domain(self, mask: np.ndarray, chip_type: str, count: int, free: int) -> DeviceSet:
        biggest = self._max_domain[self._chip_code(chip_type)]
        if count > biggest:
            return self._whole_domains(mask, chip_type, count, free, biggest)
        per_domain = np.bincount(self.domain_of[mask], minlength=self.domain_size_of.size)
        fits = per_domain >= count
        if not fits.any():
            raise ResourceExhausted(
                f"need {count} {chip_type} devices in one scale-up domain; {free} free in total,"
                f" at most {int(per_domain.max())} free in any domain",
                requested=count, available=int(per_domain.max()), reason="NO_DOMAIN_WITH_ENOUGH_DEVICES",
            )
        best = int(np.argmin(np.where(fits, per_domain, np.iinfo(np.int64).max)))
        # Domains are runs of consecutive ids: search only the chosen one.
        lo, hi = np.searchsorted(self.domain_of, [best, best + 1])
        ids = lo + np.flatnonzero(mask[lo:hi])[:count]
        return DeviceSet.from_ids(ids)

    def _whole_domains(self, mask: np.ndarray, chip_type: str, count: int, free: int, size: int) -> DeviceSet:
        """``count / size`` entirely free domains (lowest ids first), so groups of up to ``size``
        consecutive ranks each sit inside one scale-up domain."""
        if count % size:
            raise InvalidArgument(
                "count", f"{chip_type} scale-up domains hold {size} devices; a larger same-domain instance "
                f"takes whole domains, so count must be a multiple of {size}, got {count}")
        free_per_domain = np.bincount(self.domain_of[mask], minlength=self.domain_size_of.size)
        whole = np.flatnonzero((free_per_domain == self.domain_size_of) & (self.domain_size_of == size))
        need = count // size
        if whole.size < need:
            raise ResourceExhausted(
                f"need {need} entirely free {chip_type} domains of {size}; {whole.size} are free"
                f" ({free} devices free in total)",
                requested=count, available=int(whole.size) * size, reason="NOT_ENOUGH_FREE_DOMAINS",
            )
        return DeviceSet.from_mask(np.isin(self.domain_of, whole[:need]) & mask)

    def _contiguous(self, mask: np.ndarray, chip_type: str, count: int, free: int) -> DeviceSet:
        runs = DeviceSet.from_mask(mask)
        lengths = runs.stops - runs.starts
        fits = lengths >= count
        if not fits.any():
            longest = int(lengths.max()) if lengths.size else 0
            raise ResourceExhausted(
                f"need {count} contiguous {chip_type} devices; {free} free in total, longest free run {longest}",
                requested=count, available=longest, reason="NO_CONTIGUOUS_RUN",
            )
        best = int(np.argmin(np.where(fits, lengths, np.iinfo(np.int64).max)))
        start = int(runs.starts[best])
        return DeviceSet.from_range(start, start + count)

    def allocate_exact(self, tenant: str, instance: str, chip_type: str, devices: DeviceSet) -> InstanceAllocation:
        """Give ``tenant`` exactly ``devices`` (all free and of ``chip_type``) as ``instance``.

        For a scheduler that places gangs itself (topology-aware placement); ResourceExhausted
        names the first device that is taken.
        """
        check_name("tenant", tenant)
        check_name("instance", instance)
        if instance in self._instances:
            raise FailedPrecondition(f"instance {instance!r} already exists", reason="INSTANCE_EXISTS")
        ids = devices.ids()
        if ids.size == 0:
            raise InvalidArgument("devices", "must name at least one device")
        if int(ids.max()) >= self.n_devices:
            raise NotFound(f"device {int(ids.max())} does not exist (the cluster has {self.n_devices})",
                           reason="DEVICE_NOT_FOUND")
        code = self._chip_code(chip_type)
        wrong = ids[self.chip_of[ids] != code]
        if wrong.size:
            raise InvalidArgument("devices", f"device {int(wrong[0])} is not a {chip_type}")
        taken = ids[self.owner[ids] != FREE]
        if taken.size:
            raise ResourceExhausted(f"device {int(taken[0])} is not free ({taken.size} of {ids.size} taken)",
                                    requested=int(ids.size), available=int(ids.size - taken.size),
                                    reason="DEVICES_TAKEN")
        t_idx = self._tenant_idx.setdefault(tenant, len(self._tenants))
        if t_idx == len(self._tenants):
            self._tenants.append(tenant)
        i_idx = self._next_instance
        self._next_instance += 1
        self.owner[ids] = t_idx
        self.instance_of[ids] = i_idx
        alloc = InstanceAllocation(instance, tenant, chip_type, devices, PlacementConstraint.CONTIGUOUS
                                   if devices.n_ranges == 1 else PlacementConstraint.NONE)
        self._instances[instance] = alloc
        self._instance_idx[instance] = i_idx
        return alloc

    def release(self, instance: str) -> InstanceAllocation:
        """Free the instance's devices; returns what was released (its devices must be scrubbed)."""
        alloc = self._instances.pop(instance, None)
        if alloc is None:
            raise NotFound(f"no instance {instance!r}", reason="INSTANCE_NOT_FOUND")
        del self._instance_idx[instance]
        for a, b in zip(alloc.devices.starts.tolist(), alloc.devices.stops.tolist(), strict=True):
            self.owner[a:b] = FREE
            self.instance_of[a:b] = FREE
        return alloc

    def get(self, instance: str) -> InstanceAllocation:
        """The live instance called ``instance``."""
        alloc = self._instances.get(instance)
        if alloc is None:
            raise NotFound(f"no instance {instance!r}", reason="INSTANCE_NOT_FOUND")
        return alloc

    def instances(self, tenant: str | None = None) -> Iterator[InstanceAllocation]:
        """Live instances, optionally of one tenant (metadata only: what the admin may list)."""
        for alloc in self._instances.values():
            if tenant is None or alloc.tenant == tenant:
                yield alloc

    def tenant_of(self, devices: np.ndarray | Sequence[int]) -> list[str | None]:
        """The owning tenant of each device id (None for free devices)."""
        idx = self.owner[np.asarray(devices, dtype=np.int64)]
        return [self._tenants[i] if i != FREE else None for i in idx.tolist()]

    def owned_by(self, tenant: str, devices: np.ndarray | Sequence[int]) -> bool:
        """True if every device in ``devices`` belongs to ``tenant``."""
        t = self._tenant_idx.get(tenant)
        if t is None:
            return False
        return bool(np.all(self.owner[np.asarray(devices, dtype=np.int64)] == t))
