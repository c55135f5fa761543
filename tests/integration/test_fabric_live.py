"""The live fabric service: faults fail or reroute flows with a clear status, contention is visible."""

from __future__ import annotations

import pytest

from gigacluster.broker.v1 import broker_pb2
from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.runtime.auth import call_metadata
from gigacluster.stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture
async def endpoints(stack: Stack) -> tuple[Client, int, int, tuple[tuple[str, str], ...]]:
    """A fresh tenant holding one chip on each of two free HGX nodes: (client, src, dst, capability md)."""
    tid = f"fab-{next(_ids)}"
    gc = Client(stack.endpoints, await stack.create_tenant(tid))
    admin = call_metadata(api_key=stack.admin_key)
    inv = await gc.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=admin)
    free = {i for r in inv.free for i in range(r.start, r.end)}
    whole = [b for b in range(0, 64, 8) if set(range(b, b + 8)) <= free]
    assert len(whole) >= 2, "the test needs two free HGX nodes"
    src, dst = whole[-2], whole[-1]
    r = await gc.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
        chip_type="h100-sxm", count=2, tenant=f"tenants/{tid}",
        devices=[common_pb2.DeviceRange(start=src, end=src + 1), common_pb2.DeviceRange(start=dst, end=dst + 1)]),
        metadata=admin)
    yield gc, src, dst, call_metadata(capability=r.capability)
    await gc.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=r.instance.name), metadata=gc.md)
    await gc.close()


_ids = iter(range(1, 1000))


async def test_nic_down_fails_the_flow_with_a_clear_status_and_clear_restores(
        stack: Stack, endpoints: tuple[Client, int, int, tuple[tuple[str, str], ...]]) -> None:
    """A transfer between two nodes runs over the source's NIC; taking that NIC link down leaves no path,
    so the flow FAILS with an error naming the problem; after clearing the fault a new transfer completes."""
    tenant, src, dst, md = endpoints
    admin = call_metadata(api_key=stack.admin_key)
    t = await tenant.fabric.StartTransfer(fabric_pb2.StartTransferRequest(
        src_device=src, dst_device=dst, bytes=50e9), metadata=md)
    assert t.predicted_end_s - t.start_s == pytest.approx(50e9 / (400e9 / 8 * 0.92), rel=0.1)  # NIC goodput
    nic = await tenant.fabric.ListLinks(fabric_pb2.ListLinksRequest(tier="nic", page_size=1000), metadata=admin)
    link = next(ln.name for ln in nic.links if ln.name.startswith(f"links/chip{src}-"))
    r = await tenant.fabric.InjectLinkFault(fabric_pb2.InjectLinkFaultRequest(
        target=link, kind=fabric_pb2.InjectLinkFaultRequest.KIND_DOWN), metadata=admin)
    assert r.links_affected == 1 and r.flows_failed == 1
    f = (await tenant.fabric.GetFlow(fabric_pb2.GetFlowRequest(name=t.name), metadata=md)).flow
    assert f.state == fabric_pb2.Flow.STATE_FAILED and f.error
    stats = await tenant.fabric.GetLinkStats(fabric_pb2.GetLinkStatsRequest(), metadata=admin)
    assert {s.tier: s.links_down for s in stats.tiers}["nic"] == 1
    await tenant.fabric.ClearLinkFault(fabric_pb2.ClearLinkFaultRequest(target=link), metadata=admin)
    t2 = await tenant.fabric.StartTransfer(fabric_pb2.StartTransferRequest(
        src_device=src, dst_device=dst, bytes=1e6), metadata=md)
    async for upd in tenant.fabric.WatchFlows(fabric_pb2.WatchFlowsRequest(names=[t2.name]), metadata=md):
        if upd.flow.state != fabric_pb2.Flow.STATE_RUNNING:
            assert upd.flow.state == fabric_pb2.Flow.STATE_DONE
            break


async def test_two_transfers_share_a_nic_max_min_fairly(
        stack: Stack, endpoints: tuple[Client, int, int, tuple[tuple[str, str], ...]]) -> None:
    """Two equal transfers from the same chip share its NIC max-min fairly: each takes twice as long as one
    alone (checked on the actual completions reported by WatchFlows)."""
    tenant, src, dst, md = endpoints
    one = await tenant.fabric.StartTransfer(fabric_pb2.StartTransferRequest(
        src_device=src, dst_device=dst, bytes=10e9), metadata=md)
    solo = one.predicted_end_s - one.start_s
    two = await tenant.fabric.StartTransfer(fabric_pb2.StartTransferRequest(
        src_device=src, dst_device=dst, bytes=10e9, not_before_s=one.start_s), metadata=md)
    done = {}
    async for upd in tenant.fabric.WatchFlows(fabric_pb2.WatchFlowsRequest(names=[one.name, two.name]), metadata=md):
        if upd.flow.state == fabric_pb2.Flow.STATE_DONE:
            done[upd.flow.name] = upd.flow.end_s - upd.flow.start_s
        if len(done) == 2:
            break
    assert done[one.name] == pytest.approx(2 * solo, rel=0.02)
    assert done[two.name] == pytest.approx(2 * solo, rel=0.02)
