"""The edge of every service holds against hostile input (issue 11, "authenticate first, bound everything").

Against the real mesh: chip and fabric answer UNAUTHENTICATED to every RPC sent without
credentials whatever its sizes; with credentials, absurd sizes (2^64-1, 2^32, a stride of 2^63,
NaN, inf, 1e308) get INVALID_ARGUMENT or RESOURCE_EXHAUSTED naming the field and the limit; an
undecodable body is INVALID_ARGUMENT on every RPC of all five services; errors quote only a short
prefix of a huge field; and a device a tenant tried to poison works for the next tenant.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest
import pytest_asyncio

from gigacluster.broker.v1 import broker_pb2
from gigacluster.chip.v1 import chip_pb2
from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.errors import error_info
from gigacluster.stack import Stack

from .test_status_codes import work

pytestmark = [pytest.mark.contract, pytest.mark.integration]
IA, RE, NF = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND
UNAUTH = grpc.StatusCode.UNAUTHENTICATED
R = common_pb2.DeviceRange
U64 = 2**64 - 1
BASE = [0]  # first device of the tenant's 8-device instance (set by the fixture)
NAN, INF = float("nan"), float("inf")
HUGE = "x" * 1_000_000


def dev(a: int, b: int) -> common_pb2.DeviceRange:
    return R(start=BASE[0] + a, end=BASE[0] + b)


def coll(**kw: Any) -> fabric_pb2.StartCollectiveRequest:
    base: dict[str, Any] = {"op": fabric_pb2.COLLECTIVE_OP_ALL_REDUCE, "ranks": [dev(0, 8)], "bytes": 1e6}
    base.update(kw)
    return fabric_pb2.StartCollectiveRequest(**base)


def window(**kw: Any) -> fabric_pb2.ReserveWindowRequest:
    base: dict[str, Any] = {"collectives": [fabric_pb2.WindowCollective(collective=coll(), expected_s=0.001)],
                            "period_s": 1.0, "repeat": 2}
    base.update(kw)
    return fabric_pb2.ReserveWindowRequest(**base)


# (service, rpc, absurd request, who calls with credentials, expected code, text the message must contain)
ABSURD: list[tuple[str, str, Callable[[], Any], str, grpc.StatusCode, str]] = [
    ("chip", "GetShard", lambda: chip_pb2.GetShardRequest(), "cap", grpc.StatusCode.OK, ""),
    ("chip", "ListDevices", lambda: chip_pb2.ListDevicesRequest(devices=[R(start=0, end=U64)]), "admin", NF,
     "devices[0]"),
    ("chip", "ListDevices", lambda: chip_pb2.ListDevicesRequest(devices=[R(start=i, end=i + 1)
                                                                         for i in range(5000)]), "admin", RE,
     "max_device_ranges"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work()],
                                                                not_before_s=1e308), "cap", IA, "not_before_s"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work()],
                                                                not_before_s=INF), "cap", IA, "not_before_s"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work()],
                                                                not_before_s=NAN), "cap", IA, "not_before_s"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work(flops=NAN)]),
     "cap", IA, "items[0].flops"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work(bytes=INF)]),
     "cap", IA, "items[0].bytes"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[R(start=0, end=U64)], items=[work()]),
     "cap", NF, "devices[0]"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 1)] * 2000, items=[work()]),
     "cap", RE, "max_device_ranges"),
    ("chip", "ExecuteWork", lambda: chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work()],
                                                                memory_in_use_bytes=U64),
     "cap", IA, "memory_in_use_bytes"),
    ("chip", "ReportWork", lambda: chip_pb2.ReportWorkRequest(
        devices=[dev(0, 8)], iterations=[chip_pb2.WorkIteration(items=[work()])] * 5000), "cap", RE,
     "max_report_iterations"),
    ("chip", "ReportWork", lambda: chip_pb2.ReportWorkRequest(
        devices=[dev(0, 8)], iterations=[chip_pb2.WorkIteration(items=[work()], not_before_s=NAN)]), "cap", IA,
     "not_before_s"),
    ("chip", "ReportWork", lambda: chip_pb2.ReportWorkRequest(
        devices=[dev(0, 8)], iterations=[chip_pb2.WorkIteration(items=[work(flops=NAN)])]), "cap", IA,
     "iterations[0].items[0].flops"),
    ("chip", "ReportWork", lambda: chip_pb2.ReportWorkRequest(
        devices=[dev(0, 8)], iterations=[chip_pb2.WorkIteration()]), "cap", IA, "iterations[0].items"),
    ("chip", "ReportWork", lambda: chip_pb2.ReportWorkRequest(
        devices=[R(start=0, end=U64)], iterations=[chip_pb2.WorkIteration(items=[work()])]), "cap", NF, "devices[0]"),
    ("chip", "ReportWork", lambda: chip_pb2.ReportWorkRequest(
        devices=[dev(0, 8)], iterations=[chip_pb2.WorkIteration(items=[work()])], memory_in_use_bytes=U64),
     "cap", IA, "memory_in_use_bytes"),
    ("chip", "SetMemoryInUse", lambda: chip_pb2.SetMemoryInUseRequest(devices=[R(start=0, end=U64)],
                                                                      bytes_per_device=1), "cap", NF, "devices[0]"),
    ("chip", "SetMemoryInUse", lambda: chip_pb2.SetMemoryInUseRequest(devices=[dev(0, 1)] * 2000,
                                                                      bytes_per_device=1), "cap", RE,
     "max_device_ranges"),
    ("chip", "SetMemoryInUse", lambda: chip_pb2.SetMemoryInUseRequest(devices=[dev(0, 8)], bytes_per_device=U64),
     "cap", IA, "bytes_per_device"),
    ("chip", "AllocateMemory", lambda: chip_pb2.AllocateMemoryRequest(device=U64, size_bytes=U64), "cap", NF,
     "device"),
    ("chip", "AllocateMemory", lambda: chip_pb2.AllocateMemoryRequest(device=BASE[0], size_bytes=U64), "cap", RE,
     "bytes"),
    ("chip", "FreeMemory", lambda: chip_pb2.FreeMemoryRequest(name="allocations/" + "9" * 5000), "cap", IA,
     "name"),
    ("chip", "WriteMemory", lambda: chip_pb2.WriteMemoryRequest(name="allocations/1", offset=U64,
                                                                data=b"x" * (5 << 20)), "cap", RE, "max_io_bytes"),
    ("chip", "ReadMemory", lambda: chip_pb2.ReadMemoryRequest(name="allocations/1", offset=U64, length=2**32),
     "cap", RE, "max_io_bytes"),
    ("chip", "ScrubInstance", lambda: chip_pb2.ScrubInstanceRequest(instance="i-x", devices=[R(start=0, end=U64)]),
     "admin", NF, "devices[0]"),
    ("chip", "InjectFault", lambda: chip_pb2.InjectFaultRequest(devices=[R(start=20, end=21)],
                                                                kind=chip_pb2.FAULT_KIND_SLOW, clock_factor=NAN),
     "admin", IA, "clock_factor"),
    ("chip", "ClearFault", lambda: chip_pb2.ClearFaultRequest(devices=[R(start=2**32, end=U64)]), "admin", NF,
     "devices[0]"),
    ("chip", "GetStats", lambda: chip_pb2.GetStatsRequest(devices=[R(start=0, end=2**32)]), "admin", NF,
     "devices[0]"),
    ("chip", "ExecuteWindow", lambda: chip_pb2.ExecuteWindowRequest(
        work=chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work()]), repeat=2**32 - 1, period_s=1.0),
     "cap", RE, "max_window_repeat"),
    ("chip", "ExecuteWindow", lambda: chip_pb2.ExecuteWindowRequest(
        work=chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work()]), repeat=2, period_s=NAN),
     "cap", IA, "period_s"),
    ("chip", "ExecuteWindow", lambda: chip_pb2.ExecuteWindowRequest(
        work=chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work()], not_before_s=INF), repeat=2,
        period_s=1.0), "cap", IA, "not_before_s"),
    ("chip", "CutWork", lambda: chip_pb2.CutWorkRequest(devices=[dev(0, 8)], at_s=NAN), "cap", IA, "at_s"),
    ("chip", "CutWork", lambda: chip_pb2.CutWorkRequest(devices=[R(start=0, end=U64)], at_s=1.0), "cap", NF,
     "devices[0]"),
    ("fabric", "GetTopology", lambda: fabric_pb2.GetTopologyRequest(), "cap", grpc.StatusCode.OK, ""),
    ("fabric", "ListLinks", lambda: fabric_pb2.ListLinksRequest(tier=HUGE, page_size=2**32 - 1), "admin", IA,
     "tier"),
    ("fabric", "StartTransfer", lambda: fabric_pb2.StartTransferRequest(src_device=U64, dst_device=2**32, bytes=1),
     "cap", IA, "src_device"),
    ("fabric", "StartTransfer", lambda: fabric_pb2.StartTransferRequest(
        src_device=BASE[0], dst_device=BASE[0] + 1, bytes=NAN), "cap", IA, "bytes"),
    ("fabric", "StartTransfer", lambda: fabric_pb2.StartTransferRequest(
        src_device=BASE[0], dst_device=BASE[0] + 1, bytes=INF), "cap", IA, "bytes"),
    ("fabric", "StartTransfer", lambda: fabric_pb2.StartTransferRequest(
        src_device=BASE[0], dst_device=BASE[0] + 1, bytes=10, not_before_s=1e308), "cap", IA, "not_before_s"),
    ("fabric", "StartCollective", lambda: coll(ranks=[R(start=0, end=U64)]), "cap", IA, "ranks[0]"),
    ("fabric", "StartCollective", lambda: coll(ranks=[R(start=0, end=2**32)]), "cap", RE, "max_collective_ranks"),
    ("fabric", "StartCollective", lambda: coll(ranks=[R(start=0, end=2**26)]), "cap", RE, "max_collective_ranks"),
    ("fabric", "StartCollective", lambda: coll(groups=2, group_stride=2**63), "cap", IA, "group_stride"),
    ("fabric", "StartCollective", lambda: coll(groups=2**32 - 1, group_stride=1), "cap", RE,
     "max_collective_groups"),
    ("fabric", "StartCollective", lambda: coll(ranks=[R(start=i, end=i + 1) for i in range(2000)]), "cap", RE,
     "max_rank_ranges"),
    ("fabric", "StartCollective", lambda: coll(bytes=NAN), "cap", IA, "bytes"),
    ("fabric", "StartCollective", lambda: coll(not_before_s=INF), "cap", IA, "not_before_s"),
    ("fabric", "StartCollective", lambda: coll(not_before_s=1e308), "cap", IA, "not_before_s"),
    ("fabric", "GetFlow", lambda: fabric_pb2.GetFlowRequest(name="flows/" + HUGE), "cap", NF, "flows/"),
    ("fabric", "WatchFlows", lambda: fabric_pb2.WatchFlowsRequest(names=["flows/f-1"] * 20_000), "cap", IA, "names"),
    ("fabric", "GetLinkStats", lambda: fabric_pb2.GetLinkStatsRequest(), "cap", grpc.StatusCode.OK, ""),
    ("fabric", "ReserveWindow", lambda: window(collectives=[fabric_pb2.WindowCollective(collective=coll())] * 300),
     "cap", RE, "max_window_collectives"),
    ("fabric", "ReserveWindow", lambda: window(repeat=2**32 - 1), "cap", RE, "max_window_steps"),
    ("fabric", "ReserveWindow", lambda: window(period_s=NAN), "cap", IA, "period_s"),
    ("fabric", "ReserveWindow", lambda: window(collectives=[fabric_pb2.WindowCollective(collective=coll(),
                                                                                           offset_s=INF)]),
     "cap", IA, "collectives[0].offset_s"),
    ("fabric", "ReserveWindow", lambda: window(collectives=[fabric_pb2.WindowCollective(
        collective=coll(ranks=[R(start=0, end=2**32)]))]), "cap", RE, "max_collective_ranks"),
    ("fabric", "CutWindow", lambda: fabric_pb2.CutWindowRequest(name="windows/" + HUGE, at_s=1.0), "cap", NF,
     "windows/"),
    ("fabric", "CutWindow", lambda: fabric_pb2.CutWindowRequest(name="windows/w-1", at_s=NAN), "cap", IA, "at_s"),
    ("fabric", "InjectLinkFault", lambda: fabric_pb2.InjectLinkFaultRequest(
        target="links/" + HUGE, kind=fabric_pb2.InjectLinkFaultRequest.KIND_DEGRADED, capacity_factor=NAN),
     "admin", NF, "target"),
    ("fabric", "ClearLinkFault", lambda: fabric_pb2.ClearLinkFaultRequest(target=HUGE), "admin", IA, "target"),
]

SERVICES = {
    "chip": ("gigacluster.chip.v1.chip_pb2", "ChipService"),
    "fabric": ("gigacluster.fabric.v1.fabric_pb2", "FabricService"),
    "broker": ("gigacluster.broker.v1.broker_pb2", "BrokerService"),
    "scheduler": ("gigacluster.scheduler.v1.scheduler_pb2", "SchedulerService"),
    "router": ("gigacluster.router.v1.router_pb2", "RouterService"),
}


def _descriptors(service: str) -> list[Any]:
    mod, name = SERVICES[service]
    return list(importlib.import_module(mod).DESCRIPTOR.services_by_name[name].methods)


def _methods(service: str) -> list[str]:
    return [f"/{m.containing_service.full_name}/{m.name}" for m in _descriptors(service)]


ALL_METHODS = [(s, f"/{m.containing_service.full_name}/{m.name}", m.server_streaming)
               for s in SERVICES for m in _descriptors(s)]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def callers(stack: Stack) -> AsyncIterator[dict[str, Any]]:
    key = await stack.create_tenant("edge")
    gc = Client(stack.endpoints, key)
    admin_md = call_metadata(api_key=stack.admin_key)
    inv = await gc.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=admin_md)
    free = {i for r in inv.free for i in range(r.start, r.end)}
    base = next(b for b in range(0, 32, 8) if set(range(b, b + 8)) <= free)
    BASE[0] = base
    r = await gc.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
        chip_type="h100-sxm", count=8, devices=[R(start=base, end=base + 8)], tenant="tenants/edge"),
        metadata=admin_md)
    yield {"client": gc, "cap": call_metadata(capability=r.capability), "admin": admin_md, "stack": stack}
    await gc.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=r.instance.name), metadata=admin_md)
    await gc.close()


async def _call(gc: Client, service: str, rpc: str, req: Any, md: Any) -> None:
    call = getattr(getattr(gc, service), rpc)(req, metadata=md, timeout=30)
    if hasattr(call, "__aiter__"):
        async for _ in call:
            break
    else:
        await call


@pytest.mark.parametrize(("service", "rpc", "make"), [(c[0], c[1], c[2]) for c in ABSURD],
                         ids=[f"{c[0]}.{c[1]}-{i}" for i, c in enumerate(ABSURD)])
async def test_no_credentials_is_unauthenticated_whatever_the_sizes(callers: dict[str, Any], service: str, rpc: str,
                                                                    make: Callable[[], Any]) -> None:
    """Chip and fabric authenticate before they validate: an absurd request without credentials is UNAUTHENTICATED."""
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _call(callers["client"], service, rpc, make(), ())
    assert exc.value.code() == UNAUTH, exc.value.details()


@pytest.mark.parametrize(("service", "rpc", "make", "who", "code", "text"), ABSURD,
                         ids=[f"{c[0]}.{c[1]}-{i}" for i, c in enumerate(ABSURD)])
async def test_absurd_sizes_get_a_precise_status(callers: dict[str, Any], service: str, rpc: str,
                                                 make: Callable[[], Any], who: str, code: grpc.StatusCode,
                                                 text: str) -> None:
    """With credentials, absurd sizes and non-finite numbers get their own status naming the field, never INTERNAL."""
    if code == grpc.StatusCode.OK:
        await _call(callers["client"], service, rpc, make(), callers[who])
        return
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await _call(callers["client"], service, rpc, make(), callers[who])
    assert exc.value.code() == code, exc.value.details()
    details = exc.value.details() or ""
    assert text in details, details
    assert len(details) <= 600, len(details)
    info = error_info(exc.value)
    assert info is not None and info.domain == "gigacluster.dev"
    assert all(len(v) <= 250 for v in info.metadata.values()), info.metadata


def test_absurd_table_covers_every_chip_and_fabric_rpc() -> None:
    """Every RPC of chip and fabric has an absurd-size case, so a new RPC cannot skip authentication-first."""
    covered = {(c[0], c[1]) for c in ABSURD}
    for service in ("chip", "fabric"):
        for method in _methods(service):
            assert (service, method.rsplit("/", 1)[1]) in covered, method


@pytest.mark.parametrize(("service", "method", "streaming"), ALL_METHODS, ids=[m for _, m, _ in ALL_METHODS])
async def test_undecodable_body_is_invalid_argument(callers: dict[str, Any], service: str, method: str,
                                                    streaming: bool) -> None:
    """Raw bytes that are no protobuf message answer INVALID_ARGUMENT naming the method, on every RPC."""
    stack: Stack = callers["stack"]
    async with open_channel(stack.endpoint_of(service), stack.tls) as ch:
        if streaming:
            call: Any = ch.unary_stream(method)(b"\xff\xff\xff\xff", metadata=callers["admin"], timeout=10)
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                async for _ in call:
                    break
        else:
            with pytest.raises(grpc.aio.AioRpcError) as exc:
                await ch.unary_unary(method)(b"\xff\xff\xff\xff", metadata=callers["admin"], timeout=10)
    assert exc.value.code() == IA, exc.value.details()
    assert method.rsplit("/", 1)[1] in (exc.value.details() or "")


async def test_long_fields_are_quoted_as_a_short_prefix(callers: dict[str, Any]) -> None:
    """A 1 MB field in a bad request comes back as a short prefix in the message and in ErrorInfo metadata."""
    gc = callers["client"]
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await gc.fabric.GetFlow(fabric_pb2.GetFlowRequest(name="flows/" + HUGE), metadata=callers["cap"], timeout=30)
    info = error_info(exc.value)
    assert exc.value.code() == NF
    assert len(exc.value.details() or "") < 300
    assert info is not None and max(len(v) for v in info.metadata.values()) <= 250
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await gc.chip.ExecuteWork(chip_pb2.ExecuteWorkRequest(devices=[dev(0, 8)], items=[work(kind=HUGE)]),
                                  metadata=callers["cap"], timeout=30)
    assert exc.value.code() == IA and "items[0].kind" in (exc.value.details() or "")
    assert len(exc.value.details() or "") < 300


async def test_released_device_is_clean_for_the_next_tenant(callers: dict[str, Any]) -> None:
    """Work booked far ahead (the poisoning attempt) is cancelled on release: the next tenant starts at once."""
    gc = callers["client"]
    admin = callers["admin"]
    stack: Stack = callers["stack"]
    base = BASE[0] + 8 if BASE[0] + 16 <= 32 else BASE[0] - 8
    devs = [R(start=base, end=base + 8)]
    for t in ("poisoner", "victim"):
        await stack.create_tenant(t)

    async def allocate(tenant: str) -> Any:
        return await gc.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
            chip_type="h100-sxm", count=8, devices=devs, tenant=f"tenants/{tenant}"), metadata=admin)

    bad = await allocate("poisoner")
    md = call_metadata(capability=bad.capability)
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await gc.chip.ExecuteWork(chip_pb2.ExecuteWorkRequest(devices=devs, items=[work()], not_before_s=1e308),
                                  metadata=md, timeout=30)
    assert exc.value.code() == IA
    # The most it can book: start at the horizon, with a day's worth of work behind it.
    shard = await gc.chip.GetShard(chip_pb2.GetShardRequest(), metadata=md, timeout=30)
    far = await gc.chip.ExecuteWork(chip_pb2.ExecuteWorkRequest(
        devices=devs, items=[work(flops=1e20, count=1000)], not_before_s=shard.now_s + 3000), metadata=md, timeout=30)
    assert far.end_s > shard.now_s + 86_400
    await gc.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=bad.instance.name), metadata=admin)
    good = await allocate("victim")
    try:
        md2 = call_metadata(capability=good.capability)
        now = (await gc.chip.GetShard(chip_pb2.GetShardRequest(), metadata=md2, timeout=30)).now_s
        res = await gc.chip.ExecuteWork(chip_pb2.ExecuteWorkRequest(devices=devs, items=[work()]), metadata=md2,
                                        timeout=30)
        assert res.start_s < now + 60, (res.start_s, now)
    finally:
        await gc.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=good.instance.name), metadata=admin)


async def test_released_instance_leaves_no_traffic_booked_on_the_fabric(callers: dict[str, Any]) -> None:
    """Flows a tenant books ahead (within the not_before horizon) end when its instance is released, so they never
    share a link with the next tenant's traffic."""
    gc = callers["client"]
    admin = callers["admin"]
    stack: Stack = callers["stack"]
    base = BASE[0] + 8 if BASE[0] + 16 <= 32 else BASE[0] - 8
    await stack.create_tenant("booker")
    inst = await gc.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
        chip_type="h100-sxm", count=8, devices=[R(start=base, end=base + 8)], tenant="tenants/booker"), metadata=admin)
    md = call_metadata(capability=inst.capability)
    now = (await gc.fabric.GetTopology(fabric_pb2.GetTopologyRequest(), metadata=md, timeout=30)).now_s
    flow = await gc.fabric.StartTransfer(fabric_pb2.StartTransferRequest(
        src_device=base, dst_device=base + 1, bytes=1e15, not_before_s=now + 3000), metadata=md, timeout=30)
    got = await gc.fabric.GetFlow(fabric_pb2.GetFlowRequest(name=flow.name), metadata=admin, timeout=30)
    assert got.flow.state == fabric_pb2.Flow.STATE_RUNNING
    await gc.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=inst.instance.name), metadata=admin)
    for _ in range(100):  # the fabric learns of the release with its next revocation pull (about a second)
        got = await gc.fabric.GetFlow(fabric_pb2.GetFlowRequest(name=flow.name), metadata=admin, timeout=30)
        if got.flow.state != fabric_pb2.Flow.STATE_RUNNING:
            break
        await asyncio.sleep(0.1)
    assert got.flow.state == fabric_pb2.Flow.STATE_FAILED
    assert inst.instance.name in got.flow.error and "released" in got.flow.error
