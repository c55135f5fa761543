"""The instance allocator: ownership, topology constraints and exhaustion, up to 1M devices."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.security import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from gigacluster.security.allocator import DeviceAllocator, Shard, Topology


@pytest.fixture
def alloc() -> DeviceAllocator:
    # trn2 scale-up domain is 16 chips (AWS Neuron docs, trn2: 4x4 torus); HGX is 8 GPUs.
    return DeviceAllocator([Shard("trainium2", 64), Shard("h100-sxm", 32)])


def test_domains_come_from_the_catalog(alloc: DeviceAllocator) -> None:
    """Trainium2 devices form domains of 16 (trn2) and H100 of 8 (HGX) when no size is given."""
    assert alloc.domain_size_of.tolist() == [16] * 4 + [8] * 4
    assert alloc.chip_of[:64].tolist() == [0] * 64 and alloc.chip_of[64:].tolist() == [1] * 32


def test_a_device_belongs_to_one_tenant_at_a_time(alloc: DeviceAllocator) -> None:
    """Two instances never share a device, and release hands devices back."""
    a = alloc.allocate("acme", "i-1", "trainium2", 40)
    b = alloc.allocate("beta", "i-2", "trainium2", 24)
    assert len(np.intersect1d(a.devices.ids(), b.devices.ids())) == 0
    assert alloc.free_count("trainium2") == 0
    assert alloc.owned_by("acme", a.devices.ids()) and not alloc.owned_by("acme", b.devices.ids())
    assert alloc.tenant_of([0, 63, 64]) == ["acme", "beta", None]
    alloc.release("i-1")
    assert alloc.free_count("trainium2") == 40
    assert alloc.tenant_of([0]) == [None]


def test_same_domain_best_fit(alloc: DeviceAllocator) -> None:
    """same_domain keeps an instance inside one scale-up domain and prefers the fullest domain that fits."""
    alloc.allocate("acme", "i-1", "trainium2", 10, "same_domain")  # domain 0 -> 6 free left
    b = alloc.allocate("beta", "i-2", "trainium2", 5, Topology.SAME_DOMAIN)
    assert set(alloc.domain_of[b.devices.ids()].tolist()) == {0}
    c = alloc.allocate("beta", "i-3", "trainium2", 16, "same_domain")
    assert len(set(alloc.domain_of[c.devices.ids()].tolist())) == 1


def test_same_domain_exhaustion_reports_numbers(alloc: DeviceAllocator) -> None:
    """With 48 free devices but at most 12 per domain, asking 16 in one domain is RESOURCE_EXHAUSTED."""
    for i in range(16):
        alloc.allocate("acme", f"i-{i}", "trainium2", 4, "none")  # ids 4i .. 4i+3
    for i in range(16):
        if i % 4:
            alloc.release(f"i-{i}")  # each 16-device domain keeps 4 busy, 12 free
    with pytest.raises(ResourceExhausted) as exc:
        alloc.allocate("beta", "big", "trainium2", 16, "same_domain")
    assert exc.value.requested == 16
    assert exc.value.available == 12
    assert "48 free in total" in str(exc.value)
    with pytest.raises(InvalidArgument) as exc2:
        alloc.allocate("beta", "huge", "trainium2", 17, "same_domain")
    assert exc2.value.field == "count"


def test_contiguous_best_fit_and_exhaustion(alloc: DeviceAllocator) -> None:
    """contiguous returns one run of ids (one token range) and reports the longest free run when none fits."""
    alloc.allocate("acme", "a", "h100-sxm", 8, "contiguous")
    alloc.allocate("acme", "b", "h100-sxm", 4, "contiguous")
    alloc.allocate("acme", "c", "h100-sxm", 20, "contiguous")
    alloc.release("b")
    d = alloc.allocate("beta", "d", "h100-sxm", 3, "contiguous")
    assert d.devices.n_ranges == 1 and int(d.devices.starts[0]) == 64 + 8  # the 4-gap, best fit
    alloc.release("a")
    with pytest.raises(ResourceExhausted) as exc:
        alloc.allocate("beta", "e", "h100-sxm", 9, "contiguous")
    assert (exc.value.requested, exc.value.available) == (9, 8)


def test_not_enough_devices_and_bad_requests(alloc: DeviceAllocator) -> None:
    """Too many devices, unknown chip or topology, bad count, duplicate instance: the right errors."""
    with pytest.raises(ResourceExhausted) as exc:
        alloc.allocate("acme", "i-1", "h100-sxm", 33)
    assert (exc.value.requested, exc.value.available) == (33, 32)
    bad = [(("acme", "i-1", "b200", 1), "chip_type"), (("acme", "i-1", "h100-sxm", 0), "count"),
           (("acme", "i-1", "h100-sxm", 1, "ring"), "topology"), (("Acme", "i-1", "h100-sxm", 1), "tenant")]
    for args, field in bad:
        with pytest.raises(InvalidArgument) as e:
            alloc.allocate(*args)
        assert e.value.field == field
    alloc.allocate("acme", "i-1", "h100-sxm", 1)
    with pytest.raises(FailedPrecondition):
        alloc.allocate("beta", "i-1", "h100-sxm", 1)
    with pytest.raises(NotFound):
        alloc.release("nope")


def test_million_devices_all_topologies() -> None:
    """On 1M devices the three topologies allocate correct, disjoint sets and release restores the count."""
    al = DeviceAllocator([Shard("trainium3", 500_000, domain_size=64), Shard("trainium2", 500_000)])
    a = al.allocate("acme", "a", "trainium2", 100_000, "contiguous")
    b = al.allocate("beta", "b", "trainium2", 64_000, "none")
    c = al.allocate("gamma", "c", "trainium3", 64, "same_domain")
    assert a.devices.n_ranges == 1 and len(a.devices) == 100_000
    assert len(b.devices) == 64_000 and len(np.intersect1d(a.devices.ids(), b.devices.ids())) == 0
    assert len(set(al.domain_of[c.devices.ids()].tolist())) == 1
    assert al.free_count("trainium2") == 500_000 - 164_000
    al.release("a")
    assert al.free_count("trainium2") == 500_000 - 64_000
