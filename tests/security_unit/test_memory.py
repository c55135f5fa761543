"""Per-allocation device memory: owner checks, sparse contents, bounds, scrub on release."""

from __future__ import annotations

import pytest

from gigacluster.hw.catalog import get_chip
from gigacluster.security import InvalidArgument, NotFound, PermissionDenied, ResourceExhausted
from gigacluster.security.memory import MAX_IO_BYTES, DeviceMemory
from gigacluster.security.overhead import VirtualizationOverhead

GIB = 1 << 30


@pytest.fixture
def mem() -> DeviceMemory:
    return DeviceMemory(n_devices=4, hbm_bytes=4 * GIB, scrub_Bps=1e12)


def test_unwritten_bytes_read_as_zeros_and_writes_merge(mem: DeviceMemory) -> None:
    """Sparse extents: overlapping and adjacent writes merge, gaps read as zeros, nothing HBM-sized is held."""
    a = mem.allocate(0, "acme", "i-1", 2 * GIB)
    mem.write(a, "acme", 10, b"hello")
    mem.write(a, "acme", 13, b"LOWORLD")
    mem.write(a, "acme", 20, b"!")
    mem.write(a, "acme", GIB, b"far")
    assert mem.read(a, "acme", 8, 14) == b"\0\0helLOWORLD!\0"
    assert mem.read(a, "acme", GIB - 1, 5) == b"\0far\0"
    assert mem.stored_bytes == 11 + 3


def test_other_tenant_cannot_read_or_write(mem: DeviceMemory) -> None:
    """Another tenant's read, write or free of an allocation is PERMISSION_DENIED; no bytes leak."""
    a = mem.allocate(0, "acme", "i-1", 1024)
    mem.write(a, "acme", 0, b"secret")
    for op in (lambda: mem.read(a, "beta", 0, 6), lambda: mem.write(a, "beta", 0, b"x"),
               lambda: mem.free(a, "beta"), lambda: mem.read(a, "acme", 0, 6, instance="i-2")):
        with pytest.raises(PermissionDenied) as exc:
            op()
        assert exc.value.reason == "ALLOCATION_NOT_OWNED"
    assert mem.read(a, "acme", 0, 6) == b"secret"


def test_out_of_bounds_and_oversize_io_are_errors(mem: DeviceMemory) -> None:
    """Reads and writes past the allocation, at negative offsets or above the I/O cap are refused."""
    a = mem.allocate(0, "acme", "i-1", 100)
    for op in (lambda: mem.read(a, "acme", 90, 11), lambda: mem.read(a, "acme", -1, 1),
               lambda: mem.write(a, "acme", 99, b"ab"), lambda: mem.read(a, "acme", 0, -5)):
        with pytest.raises(InvalidArgument):
            op()
    big = mem.allocate(1, "acme", "i-1", 2 * MAX_IO_BYTES)
    with pytest.raises(InvalidArgument) as exc:
        mem.read(big, "acme", 0, MAX_IO_BYTES + 1)
    assert exc.value.field == "size"


def test_release_then_reallocation_reads_zeros(mem: DeviceMemory) -> None:
    """After release, the next tenant's allocation at the same offset reads zeros, never old contents."""
    a = mem.allocate(2, "acme", "i-1", GIB)
    mem.write(a, "acme", 0, b"acme-weights" * 100)
    mem.release_instance("i-1")
    with pytest.raises(NotFound):
        mem.read(a, "acme", 0, 12)
    b = mem.allocate(2, "beta", "i-2", GIB)
    meta = next(mem.allocations(instance="i-2"))
    assert meta.offset_bytes == 0 and meta.device == 2
    assert mem.read(b, "beta", 0, 1200) == bytes(1200)
    assert mem.stored_bytes == 0


def test_scrub_time_from_catalog_hbm_bandwidth() -> None:
    """Scrub time is bytes / (chip.hbm_Bps x scrub fraction), the busiest device when in parallel.

    Trainium2 HBM 2.9 TB/s (AWS Neuron docs, Trainium2 architecture page), via the catalog.
    """
    chip = get_chip("trainium2")
    ov = VirtualizationOverhead(scrub_bandwidth_fraction=0.9)
    mem = DeviceMemory.for_chip(chip, 8, overhead=ov)
    assert mem.capacity_bytes[0] == chip.hbm_bytes
    mem.allocate(0, "acme", "i-1", 10 * GIB)
    mem.allocate(0, "acme", "i-1", 6 * GIB)
    mem.allocate(1, "acme", "i-1", 12 * GIB)
    mem.allocate(3, "beta", "i-9", 50 * GIB)
    scrub_s = mem.release_instance("i-1")
    assert scrub_s == pytest.approx(16 * GIB / (2.9e12 * 0.9))  # device 0 holds the most bytes
    assert int(mem.used_bytes.sum()) == 50 * GIB


def test_first_fit_reuses_gaps_and_capacity_is_enforced(mem: DeviceMemory) -> None:
    """A freed gap is reused; asking for more than is free is RESOURCE_EXHAUSTED with the numbers."""
    a = mem.allocate(0, "acme", "i-1", GIB)
    mem.allocate(0, "acme", "i-1", GIB)
    mem.free(a, "acme")
    c = mem.allocate(0, "beta", "i-2", GIB // 2)
    assert next(m for m in mem.allocations(device=0) if m.alloc_id == c).offset_bytes == 0
    with pytest.raises(ResourceExhausted) as exc:
        mem.allocate(0, "beta", "i-2", 3 * GIB)
    assert exc.value.requested == 3 * GIB
    assert exc.value.available == 4 * GIB - GIB - GIB // 2


def test_emulator_store_is_bounded() -> None:
    """Written bytes beyond max_stored_bytes are refused, so a tenant cannot exhaust emulator RAM."""
    mem = DeviceMemory(1, GIB, scrub_Bps=1e12, max_stored_bytes=1000)
    a = mem.allocate(0, "acme", "i-1", GIB)
    mem.write(a, "acme", 0, bytes(1000))
    with pytest.raises(ResourceExhausted) as exc:
        mem.write(a, "acme", 5000, b"x")
    assert exc.value.reason == "EMULATOR_STORE_FULL"


def test_allocation_metadata_holds_no_contents(mem: DeviceMemory) -> None:
    """What the admin can list is offsets and sizes; the contents are not a field of it."""
    a = mem.allocate(1, "acme", "i-1", 64)
    mem.write(a, "acme", 0, b"prompt: the secret plan")
    meta = list(mem.allocations())
    assert [(m.tenant, m.instance, m.device, m.size_bytes) for m in meta] == [("acme", "i-1", 1, 64)]
    assert "secret" not in repr(meta)
