"""The isolation broker's durability on real processes: kill -9 of the broker under a running mesh,
a whole Stack restarted on its state directory, and ``gigacluster up`` killed with SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import aiomqtt
import grpc
import pytest
import pytest_asyncio

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.cli.up import bring_up
from gigacluster.client import DEFAULT_PORTS
from gigacluster.common.v1 import common_pb2
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.channels import open_channel
from gigacluster.security.audit import Anchor, load_anchors, load_public_key, verify_audit
from gigacluster.stack import Stack, StackConfig, free_port
from tests.conftest import TEST_SPEEDUP, live_stack, wait_for

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def broker_stack(mosquitto: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """A mesh of its own (32 H100, two shards) whose broker the tests kill."""
    async with live_stack("bkr", mosquitto, tmp_path_factory.mktemp("bkr"), chips=32,
                          extra_env={"GIGACLUSTER_BROKER_AUDIT_ANCHOR_INTERVAL_S": "0.5"}) as st:
        yield st


def md(key: str) -> tuple[tuple[str, str], ...]:
    return call_metadata(api_key=key)


async def kill_9(st: Stack, name: str) -> None:
    """SIGKILL one service and wait until the supervisor has it healthy again."""
    proc = st.procs[name].proc
    assert proc is not None
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()
    await asyncio.sleep(0.7)  # the supervisor's first restart delay is 0.5 s
    await st.wait_healthy(names=[name])


def ids(ranges: object) -> set[int]:
    return {i for r in ranges for i in range(r.start, r.end)}  # type: ignore[attr-defined]


async def test_kill_9_of_the_broker_loses_no_tenant_key_instance_or_allocation(broker_stack: Stack) -> None:
    """After SIGKILL of the broker: tenants, their keys, instances and allocations are back; a
    capability issued before still opens the chip; the next instance gets a fresh id and only free
    devices; the released instance's id is never reused; denied calls are audited and the audit log
    verifies against its signed anchors."""
    st = broker_stack
    key_a = await st.create_tenant("alpha")
    key_b = await st.create_tenant("bravo")
    async with open_channel(st.endpoint_of("broker")) as ch:
        broker = broker_pb2_grpc.BrokerServiceStub(ch)
        a1 = await broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(chip_type="h100-sxm", count=8),
                                           metadata=md(key_a), timeout=10)
        b1 = await broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(chip_type="h100-sxm", count=8),
                                           metadata=md(key_b), timeout=10)
        b2 = await broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(chip_type="h100-sxm", count=4),
                                           metadata=md(key_b), timeout=10)
        await broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=b2.instance.name), metadata=md(key_b),
                                     timeout=30)
        before = await broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=md(st.admin_key), timeout=10)
        assert before.free_devices == 16

    await kill_9(st, "broker")

    async with open_channel(st.endpoint_of("broker")) as ch:
        broker = broker_pb2_grpc.BrokerServiceStub(ch)
        t = await broker.GetTenant(broker_pb2.GetTenantRequest(name="tenants/alpha"), metadata=md(key_a), timeout=10)
        assert t.tenant.devices_held == 8
        listed = await broker.ListTenants(broker_pb2.ListTenantsRequest(), metadata=md(st.admin_key), timeout=10)
        assert {"tenants/alpha", "tenants/bravo"} <= {x.name for x in listed.tenants}
        got = await broker.GetInstance(broker_pb2.GetInstanceRequest(name=a1.instance.name), metadata=md(key_a),
                                       timeout=10)
        assert ids(got.instance.devices) == ids(a1.instance.devices)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await broker.GetInstance(broker_pb2.GetInstanceRequest(name=b2.instance.name), metadata=md(key_b),
                                     timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        inv = await broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=md(st.admin_key), timeout=10)
        assert inv.free_devices == 16
        assert not ids(inv.free) & (ids(a1.instance.devices) | ids(b1.instance.devices))
        a2 = await broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(chip_type="h100-sxm", count=16),
                                           metadata=md(key_a), timeout=10)
        assert a2.instance.name not in {a1.instance.name, b1.instance.name, b2.instance.name}
        assert not ids(a2.instance.devices) & (ids(a1.instance.devices) | ids(b1.instance.devices))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(chip_type="h100-sxm", count=1),
                                          metadata=md(key_a), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # Unauthenticated first, whatever the request: a range to 2^64-1 without a key.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                chip_type="h100-sxm", count=1, devices=[common_pb2.DeviceRange(start=0, end=2**64 - 1)]),
                timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                chip_type="h100-sxm", count=1, devices=[common_pb2.DeviceRange(start=0, end=2**64 - 1)],
                tenant="tenants/alpha"), metadata=md(st.admin_key), timeout=10)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await broker.ListTenants(broker_pb2.ListTenantsRequest(), metadata=md(key_a), timeout=10)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED

    # The capability issued before the kill still opens the chip (the signing key survived).
    dev = min(ids(a1.instance.devices))
    shard = 0 if dev < 16 else 1
    async with open_channel(st.endpoint_of("chip" if shard == 0 else "chip-1")) as ch:
        r = await chip_pb2_grpc.ChipServiceStub(ch).AllocateMemory(
            chip_pb2.AllocateMemoryRequest(device=dev, size_bytes=1 << 20),
            metadata=call_metadata(capability=a1.capability), timeout=10)
        assert r.name.startswith("allocations/")

    state = st.cfg.state_dir
    assert state is not None
    recs = [json.loads(x) for x in (state / "audit.jsonl").read_text().splitlines()]
    denied = {(r["actor"], r["action"], r.get("reason")) for r in recs if r["outcome"] == "denied"}
    assert ("anonymous:none", "broker.allocate_instance", "NO_API_KEY") in denied
    assert ("tenant:alpha", "broker.list_tenants", "ADMIN_ONLY") in denied

    async def anchored() -> bool:
        a = load_anchors(state / "audit.jsonl.anchors")
        return bool(a) and a[-1].seq == len((state / "audit.jsonl").read_text().splitlines())

    await wait_for(anchored, 10)
    report = verify_audit(state / "audit.jsonl", public_key=(state / "audit.pub").read_bytes(),
                          anchors=load_anchors(state / "audit.jsonl.anchors"))
    assert report.records == report.anchored == len(recs)
    # The same anchors go out on MQTT, retained, for a subscriber off the machine to keep.
    host, _, port = st.mqtt.rpartition(":")
    async with aiomqtt.Client(host, int(port)) as client:
        await client.subscribe("gigacluster/bkr/broker/audit/anchor")
        async with asyncio.timeout(10):
            msg = await anext(aiter(client.messages))
    published = Anchor.from_json(json.loads(bytes(msg.payload)))  # type: ignore[arg-type]
    published.verify(load_public_key((state / "audit.pub").read_bytes()))
    assert published.seq >= 1


async def test_a_stack_restarted_on_its_state_dir_keeps_admin_and_tenant_keys(
        mosquitto: str, tmp_path: pathlib.Path) -> None:
    """Stop a whole stack and start another on the same state directory: same admin key, the default
    tenant's key from credentials.json still works and is not rotated, other tenants survive."""
    def cfg() -> StackConfig:
        return StackConfig(cluster="again", chips=8, shards=1, speedup=TEST_SPEEDUP, mqtt=mosquitto,
                           ports={k: 0 for k in DEFAULT_PORTS}, state_dir=tmp_path, restart=False)

    st1 = Stack(cfg())
    try:
        key1 = await bring_up(st1, deploy=False)
        other = await st1.create_tenant("other")
    finally:
        await st1.stop()
    creds1 = json.loads((tmp_path / "credentials.json").read_text())
    st2 = Stack(cfg())
    try:
        key2 = await bring_up(st2, deploy=False)
        assert st2.admin_key == st1.admin_key and st2.service_key == st1.service_key
        assert key2 == key1
        creds2 = json.loads((tmp_path / "credentials.json").read_text())
        assert (creds2["api_key"], creds2["admin_key"], creds2["mqtt_password"]) == (
            creds1["api_key"], creds1["admin_key"], creds1["mqtt_password"])
        assert (tmp_path / "credentials.json").stat().st_mode & 0o777 == 0o600
        async with open_channel(st2.endpoint_of("broker")) as ch:
            broker = broker_pb2_grpc.BrokerServiceStub(ch)
            t = await broker.GetTenant(broker_pb2.GetTenantRequest(name="tenants/other"), metadata=md(other),
                                       timeout=10)
            assert t.tenant.name == "tenants/other"
    finally:
        await st2.stop()


def _ports_closed(ports: list[int]) -> bool:
    for p in ports:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", p)) == 0:
                return False
    return True


def _base_port() -> int:
    """Five consecutive free ports (retrying a few random bases)."""
    for _ in range(50):
        base = free_port()
        if base + 5 < 65536 and all(_ports_closed([base + i]) for i in range(5)):
            return base
    raise RuntimeError("no five consecutive free ports")


async def _start_up(home: pathlib.Path, base: int, mqtt_port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "GIGACLUSTER_HOME": str(home)}
    t0 = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gigacluster.cli.main", "up", "--no-model", "--chips", "8", "--speedup",
         str(TEST_SPEEDUP), "--base-port", str(base), "--http-port", "-1", "--mqtt-port", str(mqtt_port),
         "--metrics-port", "0"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    creds = home / "local" / "credentials.json"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if creds.exists() and creds.stat().st_mtime >= t0:
            return proc
        if proc.poll() is not None:
            raise RuntimeError(f"gigacluster up exited with {proc.returncode}")
        await asyncio.sleep(0.2)
    proc.kill()
    raise TimeoutError("gigacluster up did not write credentials in time")


@pytest.mark.slow
async def test_up_killed_with_sigkill_comes_back_with_the_same_state(tmp_path: pathlib.Path) -> None:
    """``gigacluster up`` killed with kill -9 (its services die with it) and started again on the same
    home: same admin and default-tenant keys, and a tenant created before is still there."""
    base, mqtt_port = _base_port(), free_port()
    up1 = await _start_up(tmp_path, base, mqtt_port)
    try:
        creds1 = json.loads((tmp_path / "local" / "credentials.json").read_text())
        async with open_channel(f"127.0.0.1:{base + 2}") as ch:
            r = await broker_pb2_grpc.BrokerServiceStub(ch).CreateTenant(
                broker_pb2.CreateTenantRequest(tenant_id="kept"), metadata=md(creds1["admin_key"]), timeout=10)
        kept_key = r.api_key
    finally:
        up1.send_signal(signal.SIGKILL)
        up1.wait()
    ports = [base + i for i in range(5)] + [mqtt_port]
    deadline = time.monotonic() + 30
    while not _ports_closed(ports) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert _ports_closed(ports), "the services of a SIGKILLed up must die with it (PR_SET_PDEATHSIG)"
    up2 = await _start_up(tmp_path, base, mqtt_port)
    try:
        creds2 = json.loads((tmp_path / "local" / "credentials.json").read_text())
        assert (creds2["admin_key"], creds2["api_key"]) == (creds1["admin_key"], creds1["api_key"])
        async with open_channel(f"127.0.0.1:{base + 2}") as ch:
            broker = broker_pb2_grpc.BrokerServiceStub(ch)
            t = await broker.GetTenant(broker_pb2.GetTenantRequest(name="tenants/kept"), metadata=md(kept_key),
                                       timeout=10)
            assert t.tenant.name == "tenants/kept"
            await broker.GetTenant(broker_pb2.GetTenantRequest(name="tenants/default"),
                                   metadata=md(creds1["api_key"]), timeout=10)
    finally:
        up2.send_signal(signal.SIGTERM)
        try:
            up2.wait(30)
        except subprocess.TimeoutExpired:
            up2.kill()
            up2.wait()
