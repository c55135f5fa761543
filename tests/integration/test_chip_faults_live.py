"""Faults through the real path on a live mesh: an injected chip fault survives kill -9 of its shard (and a repair
that fell due meanwhile applies), and chips behind a down NIC link are kept out of placement until it is repaired
(issue 14 item 3 and its rule that kill -9 of any process loses nothing acknowledged)."""

from __future__ import annotations

import pathlib
import re

import grpc
import pytest

from gigacluster.broker.v1 import broker_pb2
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.scheduler.v1 import scheduler_pb2
from tests.broker.test_broker_restart_live import kill_9
from tests.conftest import TEST_SPEEDUP, live_stack
from tests.integration.test_scheduler_live import devices_of, small, wait_state

pytestmark = pytest.mark.integration
J = scheduler_pb2.Job
_NIC = re.compile(r"^links/(?:chip(\d+)-leaf\d+|leaf\d+-chip(\d+))$")  # a chip's NIC link, either way


def rng(a: int, b: int) -> list[common_pb2.DeviceRange]:
    return [common_pb2.DeviceRange(start=a, end=b)]


async def test_an_injected_fault_survives_kill_9_of_its_shard_and_still_fails_a_step(mosquitto: str,
                                                                                    tmp_path: pathlib.Path) -> None:
    """InjectFault (acknowledged), kill -9 of the shard, supervisor restart: the device still reports FAILED with
    its fault, a fault whose repair fell due while the shard was down is repaired, and a job placed on the
    faulted device fails its step there. Likewise an InjectLinkFault survives kill -9 of the fabric."""
    async with live_stack("cfkill", mosquitto, tmp_path, chips=16, shards=2) as st:
        async with Client(st.endpoints, st.admin_key) as admin:
            inv = await admin.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=admin.md)
            ep = next(s.endpoint for s in inv.shards if s.devices.start == 8)
            async with grpc.aio.insecure_channel(ep) as ch:
                chip = chip_pb2_grpc.ChipServiceStub(ch)
                await chip.InjectFault(chip_pb2.InjectFaultRequest(
                    devices=rng(8, 10), kind=chip_pb2.FAULT_KIND_FAILED, repair_after_s=1e6), metadata=admin.md)
                # repaired 0.3 wall seconds from now: before the shard is back (the restart alone waits 0.5 s)
                await chip.InjectFault(chip_pb2.InjectFaultRequest(
                    devices=rng(10, 11), kind=chip_pb2.FAULT_KIND_HBM, repair_after_s=0.3 * TEST_SPEEDUP),
                    metadata=admin.md)
                await chip.InjectFault(chip_pb2.InjectFaultRequest(devices=rng(11, 12), kind=chip_pb2.FAULT_KIND_SLOW,
                                                                   clock_factor=0.25), metadata=admin.md)
            await kill_9(st, "chip-1")
            async with grpc.aio.insecure_channel(ep) as ch:
                r = await chip_pb2_grpc.ChipServiceStub(ch).ListDevices(
                    chip_pb2.ListDevicesRequest(devices=rng(8, 13)), metadata=admin.md)
            got = {d.id: (chip_pb2.Device.State.Name(d.state), d.fault, round(d.clock_factor, 3)) for d in r.devices}
            assert got[8][:2] == got[9][:2] == ("STATE_FAILED", "FAULT_KIND_FAILED")
            assert got[10][:2] == ("STATE_HEALTHY", "")  # its repair fell due while the shard was down
            assert got[11] == ("STATE_THROTTLED", "FAULT_KIND_SLOW", 0.25) and got[12][0] == "STATE_HEALTHY"
        key = await st.create_tenant("cfkill")
        async with Client(st.endpoints, key) as gc:
            job = await gc.submit_job(small(16), max_restarts=0)  # all 16 chips: devices 8 and 9 included
            j = await wait_state(gc, job.name, J.STATE_FAILED, timeout_s=60)
        assert j.failures == 1 and "device 8 has failed" in j.reason, j.reason
        # the fabric too: a NIC link taken down (acknowledged), kill -9 of the fabric, the link is still down
        async with Client(st.endpoints, st.admin_key) as admin:
            async with grpc.aio.insecure_channel(inv.fabric_endpoint) as ch:
                fabric = fabric_pb2_grpc.FabricServiceStub(ch)
                links = await fabric.ListLinks(fabric_pb2.ListLinksRequest(tier="nic", page_size=1000),
                                               metadata=admin.md)
                up = next(lk.name for lk in links.links if (m := _NIC.match(lk.name)) and m.group(1) == "2")
                await fabric.InjectLinkFault(fabric_pb2.InjectLinkFaultRequest(
                    target=up, kind=fabric_pb2.InjectLinkFaultRequest.KIND_DOWN), metadata=admin.md)
            await kill_9(st, "fabric")
            async with grpc.aio.insecure_channel(inv.fabric_endpoint) as ch:
                stats = await fabric_pb2_grpc.FabricServiceStub(ch).GetLinkStats(fabric_pb2.GetLinkStatsRequest(),
                                                                                 metadata=admin.md)
        assert [(r.start, r.end) for r in stats.cut_off_chips] == [(2, 3)]
        assert {t.tier: t.links_down for t in stats.tiers}["nic"] == 1


async def test_chips_behind_a_down_nic_link_are_not_placed_until_it_is_repaired(mosquitto: str,
                                                                               tmp_path: pathlib.Path) -> None:
    """A 16-chip job (two HGX domains, DP over the NICs) on 24 chips: the NIC links of one of its chips go down, its
    step fails and it restarts on the two domains that do not hold that chip, and keeps running there (one
    failure, not one per relaunch); once the links are repaired a 24-chip job gets every chip, that one included."""
    async with live_stack("cfnic", mosquitto, tmp_path, chips=24, shards=1) as st:
        key = await st.create_tenant("cfnic")
        async with Client(st.endpoints, st.admin_key) as admin, Client(st.endpoints, key) as gc:
            inv = await admin.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=admin.md)
            async with grpc.aio.insecure_channel(inv.fabric_endpoint) as ch:
                fabric = fabric_pb2_grpc.FabricServiceStub(ch)
                job = await gc.submit_job(small(16), max_restarts=5, checkpoint_interval_steps=5)
                j = await wait_state(gc, job.name, J.STATE_RUNNING, timeout_s=60, cond=lambda j: j.step >= 3)
                bad = (await devices_of(admin, j.instance))[3]
                links = await fabric.ListLinks(fabric_pb2.ListLinksRequest(tier="nic", page_size=1000),
                                               metadata=admin.md)
                nic = [lk.name for lk in links.links if (m := _NIC.match(lk.name)) and str(bad) in m.groups()]
                assert len(nic) == 2, [lk.name for lk in links.links][:6]
                for name in nic:
                    await fabric.InjectLinkFault(fabric_pb2.InjectLinkFaultRequest(
                        target=name, kind=fabric_pb2.InjectLinkFaultRequest.KIND_DOWN), metadata=admin.md)
                stats = await fabric.GetLinkStats(fabric_pb2.GetLinkStatsRequest(), metadata=admin.md)
                assert [(r.start, r.end) for r in stats.cut_off_chips] == [(bad, bad + 1)]
                j2 = await wait_state(gc, job.name, J.STATE_RUNNING, timeout_s=60,
                                      cond=lambda x: x.restarts >= 1 and x.instance not in ("", j.instance))
                new = await devices_of(admin, j2.instance)
                domain = range(bad // 8 * 8, bad // 8 * 8 + 8)  # the 8-chip HGX domain holding the cut-off chip
                assert sorted(new) == [d for d in range(24) if d not in domain], new
                later = await wait_state(gc, job.name, J.STATE_RUNNING, timeout_s=60,
                                         cond=lambda x: x.step >= j2.step + 20)
                assert later.failures == 1 and later.restarts == 1
                await gc.cancel_job(job.name)
                for name in nic:
                    await fabric.ClearLinkFault(fabric_pb2.ClearLinkFaultRequest(target=name), metadata=admin.md)
                stats = await fabric.GetLinkStats(fabric_pb2.GetLinkStatsRequest(), metadata=admin.md)
                assert not stats.cut_off_chips
            whole = await gc.submit_job(small(24), max_restarts=0)
            w = await wait_state(gc, whole.name, J.STATE_RUNNING, timeout_s=60, cond=lambda x: x.step >= 2)
            assert sorted(await devices_of(admin, w.instance)) == list(range(24))
            await gc.cancel_job(whole.name)
