"""Bad input on InjectFault / InjectLinkFault (and their clears) on a live mesh: refused with INVALID_ARGUMENT
or NOT_FOUND naming the field, and nothing is faulted by a refused call (issue 14: bad input is refused with
the field named)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest
import pytest_asyncio

from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.common.v1 import common_pb2
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.runtime.auth import call_metadata
from gigacluster.stack import Stack
from tests.conftest import live_stack

pytestmark = [pytest.mark.integration, pytest.mark.contract]
IA, NF = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
R = common_pb2.DeviceRange
FK = fabric_pb2.InjectLinkFaultRequest


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def mesh(mosquitto: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """16 H100 in one shard, with a fabric (NIC links ``links/chip0-leaf0`` ...)."""
    async with live_stack("badfault", mosquitto, tmp_path_factory.mktemp("badfault"), chips=16, shards=1) as st:
        yield st


def md(st: Stack) -> tuple[tuple[str, str], ...]:
    return call_metadata(api_key=st.admin_key)


async def refused(call: Awaitable[Any], code: grpc.StatusCode, field: str) -> None:
    """The call fails with ``code`` and its message names ``field``."""
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await call
    assert ei.value.code() == code and field in (ei.value.details() or ""), ei.value.details()


CHIP_CASES: list[tuple[str, Callable[[], Any], grpc.StatusCode, str]] = [
    ("no devices", lambda: chip_pb2.InjectFaultRequest(kind=chip_pb2.FAULT_KIND_FAILED), IA, "devices"),
    ("no kind", lambda: chip_pb2.InjectFaultRequest(devices=[R(start=1, end=2)]), IA, "kind"),
    ("unknown kind", lambda: chip_pb2.InjectFaultRequest(devices=[R(start=1, end=2)], kind=9), IA, "kind"),
    ("negative repair", lambda: chip_pb2.InjectFaultRequest(devices=[R(start=1, end=2)],
                                                            kind=chip_pb2.FAULT_KIND_FAILED, repair_after_s=-1), IA,
     "repair_after_s"),
    ("NaN repair", lambda: chip_pb2.InjectFaultRequest(devices=[R(start=1, end=2)], kind=chip_pb2.FAULT_KIND_HBM,
                                                       repair_after_s=math.nan), IA, "repair_after_s"),
    ("infinite repair", lambda: chip_pb2.InjectFaultRequest(devices=[R(start=1, end=2)],
                                                            kind=chip_pb2.FAULT_KIND_HBM, repair_after_s=math.inf),
     IA, "repair_after_s"),
    ("negative clock factor", lambda: chip_pb2.InjectFaultRequest(devices=[R(start=1, end=2)],
                                                                  kind=chip_pb2.FAULT_KIND_FAILED, clock_factor=-0.5),
     IA, "clock_factor"),
    ("slow clock factor 1", lambda: chip_pb2.InjectFaultRequest(devices=[R(start=1, end=2)],
                                                                kind=chip_pb2.FAULT_KIND_SLOW, clock_factor=1.0), IA,
     "clock_factor"),
    ("device off the shard", lambda: chip_pb2.InjectFaultRequest(devices=[R(start=16, end=17)],
                                                                 kind=chip_pb2.FAULT_KIND_FAILED), NF, "devices[0]"),
]


@pytest.mark.parametrize(("what", "make", "code", "field"), CHIP_CASES, ids=[c[0] for c in CHIP_CASES])
async def test_a_bad_inject_fault_is_refused_naming_the_field_and_faults_nothing(
        mesh: Stack, what: str, make: Callable[[], Any], code: grpc.StatusCode, field: str) -> None:
    """Missing devices or kind, an unknown kind, a negative or non-finite repair time or clock factor: the field
    is named; devices off the shard are NOT_FOUND; the devices it named stay healthy."""
    async with grpc.aio.insecure_channel(mesh.endpoint_of("chip")) as ch:
        stub = chip_pb2_grpc.ChipServiceStub(ch)
        await refused(stub.InjectFault(make(), metadata=md(mesh)), code, field)
        r = await stub.ListDevices(chip_pb2.ListDevicesRequest(devices=[R(start=0, end=16)]), metadata=md(mesh))
        assert all(d.state == chip_pb2.Device.STATE_HEALTHY and not d.fault for d in r.devices)

LINK_CASES: list[tuple[str, Callable[[], Any], grpc.StatusCode, str]] = [
    ("no target", lambda: FK(kind=FK.KIND_DOWN), IA, "target"),
    ("no kind", lambda: FK(target="links/chip0-leaf0"), IA, "kind"),
    ("unknown kind", lambda: FK(target="links/chip0-leaf0", kind=7), IA, "kind"),
    ("negative capacity", lambda: FK(target="links/chip0-leaf0", kind=FK.KIND_DEGRADED, capacity_factor=-0.5), IA,
     "capacity_factor"),
    ("NaN capacity", lambda: FK(target="links/chip0-leaf0", kind=FK.KIND_DEGRADED, capacity_factor=math.nan), IA,
     "capacity_factor"),
    ("degraded switch", lambda: FK(target="switches/leaf0", kind=FK.KIND_DEGRADED, capacity_factor=0.5), IA, "kind"),
    ("unknown link", lambda: FK(target="links/chip99-leaf0", kind=FK.KIND_DOWN), NF, "target"),
]


@pytest.mark.parametrize(("what", "make", "code", "field"), LINK_CASES, ids=[c[0] for c in LINK_CASES])
async def test_a_bad_inject_link_fault_is_refused_naming_the_field_and_breaks_no_link(
        mesh: Stack, what: str, make: Callable[[], Any], code: grpc.StatusCode, field: str) -> None:
    """A missing target or kind, an unknown kind, a capacity factor outside (0, 1), a switch 'degraded', an unknown
    link: refused naming the field, and no link is down or degraded afterwards (no chip cut off)."""
    async with grpc.aio.insecure_channel(mesh.endpoint_of("fabric")) as ch:
        stub = fabric_pb2_grpc.FabricServiceStub(ch)
        await refused(stub.InjectLinkFault(make(), metadata=md(mesh)), code, field)
        st = await stub.GetLinkStats(fabric_pb2.GetLinkStatsRequest(), metadata=md(mesh))
        assert not any(t.links_down or t.links_degraded for t in st.tiers) and not st.cut_off_chips
