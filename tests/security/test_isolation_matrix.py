"""The adversarial matrix: tenant B (and the admin) against tenant A's devices, memory, jobs,
deployments, flows and telemetry, with missing, forged, expired, replayed (revoked) and
out-of-scope credentials. Every attempt must be denied with the right code, and nothing of A's
may reach B. Runs a dedicated small mesh whose capabilities live 3 s (to test expiry) and whose
embedded MQTT broker enforces the isolation broker's generated credentials and ACLs.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import aiomqtt
import grpc
import pytest
import pytest_asyncio

from gigacluster.broker.v1 import broker_pb2
from gigacluster.chip.v1 import chip_pb2
from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.common.v1 import common_pb2
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime.auth import call_metadata
from gigacluster.scheduler.v1 import scheduler_pb2
from gigacluster.security.capability import CapabilityIssuer, DeviceSet
from gigacluster.stack import Stack, StackConfig

pytestmark = [pytest.mark.security, pytest.mark.integration]
UNAUTH, DENIED, NF = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND
SECRET = b"tenant-a-secret-weights-0123456789"
TALLY = {"attempts": 0, "denied": 0, "leaks": 0}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    cfg = StackConfig(cluster="sec", chip="h100-sxm", chips=16, shards=1, speedup=10.0, mqtt="",
                      mqtt_port=0, ports={k: 0 for k in DEFAULT_PORTS}, state_dir=tmp_path_factory.mktemp("sec"),
                      extra_env={"GIGACLUSTER_BROKER_CAPABILITY_TTL_S": "3"}, restart=False)
    st = Stack(cfg)
    await st.start()
    try:
        keys = {t: await st.create_tenant(t) for t in ("alpha", "beta")}
        a, b = Client(st.endpoints, keys["alpha"]), Client(st.endpoints, keys["beta"])
        ia = await a.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
            chip_type="h100-sxm", count=4, topology=broker_pb2.TOPOLOGY_CONSTRAINT_SAME_DOMAIN), metadata=a.md)
        ib = await b.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
            chip_type="h100-sxm", count=4, topology=broker_pb2.TOPOLOGY_CONSTRAINT_SAME_DOMAIN), metadata=b.md)
        a_cap, b_cap = call_metadata(capability=ia.capability), call_metadata(capability=ib.capability)
        dev_a = ia.instance.devices[0].start
        alloc = await a.chip.AllocateMemory(chip_pb2.AllocateMemoryRequest(device=dev_a, size_bytes=1 << 20),
                                            metadata=a_cap)
        await a.chip.WriteMemory(chip_pb2.WriteMemoryRequest(name=alloc.name, offset=0, data=SECRET), metadata=a_cap)
        flow = await a.fabric.StartTransfer(fabric_pb2.StartTransferRequest(
            src_device=dev_a, dst_device=dev_a + 1, bytes=1e9), metadata=a_cap)
        yield {"stack": st, "a": a, "b": b, "ia": ia, "ib": ib, "a_cap": a_cap, "b_cap": b_cap, "alloc": alloc,
               "flow": flow, "dev_a": dev_a, "keys": keys}
        await a.close()
        await b.close()
    finally:
        await st.stop()
    print(f"\nisolation matrix: {TALLY}")


async def expect(code: grpc.StatusCode, call: Awaitable[Any] | Any) -> None:
    """One adversarial attempt: it must fail with ``code``; anything else counts as a leak."""
    TALLY["attempts"] += 1
    try:
        if hasattr(call, "__aiter__"):
            async for _ in call:
                break
        else:
            await call
    except grpc.aio.AioRpcError as err:
        if err.code() == code:
            TALLY["denied"] += 1
            assert SECRET.decode() not in (err.details() or "")
            return
        TALLY["leaks"] += 1
        pytest.fail(f"expected {code.name}, got {err.code().name}: {err.details()}")
    TALLY["leaks"] += 1
    pytest.fail(f"expected {code.name}, but the call succeeded")


def tamper(token: str, **changes: Any) -> str:
    """Rewrite fields of a token's payload, keeping its (now wrong) signature."""
    prefix, kid, body, sig = token.split(".")
    pad = "=" * (-len(body) % 4)
    payload = json.loads(base64.urlsafe_b64decode(body + pad))
    payload.update(changes)
    new = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
    return ".".join([prefix, kid, new.decode().rstrip("="), sig])


async def test_b_cannot_run_work_on_or_read_a_s_devices(mesh: dict[str, Any]) -> None:
    """B's own token, no token, a tampered token, a token signed by another key and a bare API key are all
    refused on A's devices (PERMISSION_DENIED out of scope, UNAUTHENTICATED otherwise)."""
    b, dev = mesh["b"], mesh["dev_a"]
    work = chip_pb2.ExecuteWorkRequest(devices=[common_pb2.DeviceRange(start=dev, end=dev + 4)],
                                       items=[chip_pb2.WorkItem(kind="matmul", flops=1e12, bytes=1e9, count=1)])
    await expect(DENIED, b.chip.ExecuteWork(work, metadata=mesh["b_cap"]))
    await expect(UNAUTH, b.chip.ExecuteWork(work, metadata=()))
    await expect(UNAUTH, b.chip.ExecuteWork(work, metadata=call_metadata(api_key=mesh["keys"]["beta"])))
    b_token = dict(mesh["b_cap"])["x-gigacluster-capability"]
    widened = tamper(b_token, dev=DeviceSet.from_range(0, 16).to_wire())
    await expect(UNAUTH, b.chip.ExecuteWork(work, metadata=call_metadata(capability=widened)))
    rogue = CapabilityIssuer.generate(cluster="sec", key_id="k1").issue(
        "beta", mesh["ib"].instance.name.removeprefix("instances/"), DeviceSet.from_range(0, 16),
        ["compute.run", "memory.read"], 60, __import__("time").time())
    await expect(UNAUTH, b.chip.ExecuteWork(work, metadata=call_metadata(capability=rogue)))
    await expect(DENIED, b.chip.GetStats(chip_pb2.GetStatsRequest(devices=work.devices), metadata=mesh["b_cap"]))
    await expect(DENIED, b.chip.ListDevices(chip_pb2.ListDevicesRequest(devices=work.devices),
                                            metadata=mesh["b_cap"]))


async def test_b_and_the_admin_cannot_read_a_s_memory(mesh: dict[str, Any]) -> None:
    """B cannot read, write or free A's allocation; the admin has no capability path to it either."""
    b, st, name = mesh["b"], mesh["stack"], mesh["alloc"].name
    await expect(DENIED, b.chip.ReadMemory(chip_pb2.ReadMemoryRequest(name=name, length=len(SECRET)),
                                           metadata=mesh["b_cap"]))
    await expect(DENIED, b.chip.WriteMemory(chip_pb2.WriteMemoryRequest(name=name, data=b"x"),
                                            metadata=mesh["b_cap"]))
    await expect(DENIED, b.chip.FreeMemory(chip_pb2.FreeMemoryRequest(name=name), metadata=mesh["b_cap"]))
    admin = call_metadata(api_key=st.admin_key)
    await expect(UNAUTH, b.chip.ReadMemory(chip_pb2.ReadMemoryRequest(name=name, length=8), metadata=admin))
    await expect(DENIED, b.broker.RefreshCapability(
        broker_pb2.RefreshCapabilityRequest(instance=mesh["ia"].instance.name), metadata=admin))
    await expect(NF, b.broker.RefreshCapability(
        broker_pb2.RefreshCapabilityRequest(instance=mesh["ia"].instance.name), metadata=b.md))
    await expect(NF, b.broker.ReleaseInstance(
        broker_pb2.ReleaseInstanceRequest(name=mesh["ia"].instance.name), metadata=b.md))
    await expect(grpc.StatusCode.RESOURCE_EXHAUSTED, b.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
        chip_type="h100-sxm", count=4, devices=[common_pb2.DeviceRange(start=mesh["dev_a"], end=mesh["dev_a"] + 4)],
        tenant="tenants/beta"), metadata=admin))
    a_read = await mesh["a"].chip.ReadMemory(chip_pb2.ReadMemoryRequest(name=name, length=len(SECRET)),
                                             metadata=mesh["a_cap"])
    assert a_read.data == SECRET


async def test_b_cannot_see_a_s_flows_or_send_on_a_s_ranks(mesh: dict[str, Any]) -> None:
    """A's flow is NOT_FOUND for B, and B cannot start a collective over A's ranks."""
    b, dev = mesh["b"], mesh["dev_a"]
    await expect(NF, b.fabric.GetFlow(fabric_pb2.GetFlowRequest(name=mesh["flow"].name), metadata=mesh["b_cap"]))
    await expect(NF, b.fabric.WatchFlows(fabric_pb2.WatchFlowsRequest(names=[mesh["flow"].name]),
                                         metadata=mesh["b_cap"]))
    await expect(DENIED, b.fabric.StartCollective(fabric_pb2.StartCollectiveRequest(
        op=fabric_pb2.COLLECTIVE_OP_ALL_REDUCE, ranks=[common_pb2.DeviceRange(start=dev, end=dev + 4)], bytes=1e6),
        metadata=mesh["b_cap"]))
    await expect(DENIED, b.fabric.StartTransfer(fabric_pb2.StartTransferRequest(
        src_device=dev, dst_device=mesh["ib"].instance.devices[0].start, bytes=1e6), metadata=mesh["b_cap"]))


async def test_b_cannot_see_or_touch_a_s_jobs_and_deployments(mesh: dict[str, Any]) -> None:
    """A's job and deployment are NOT_FOUND to B (indistinguishable from missing); B's lists hold none of A's;
    unauthenticated and bogus keys are UNAUTHENTICATED."""
    a, b = mesh["a"], mesh["b"]
    spec = {"model": {"preset": "llama3-8b", "seq_len": 2048}, "batch": {"global_batch": 8},
            "parallelism": {"tp": 4}, "hardware": {"chip": "h100-sxm", "count": 4}, "precision": "bf16", "steps": 2}
    job = await a.submit_job(spec)
    dep = await a.router.DeployModel(router_pb2.DeployModelRequest(
        deployment_id="secret-model", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
        replicas=1), metadata=a.md)
    await expect(NF, b.scheduler.GetJob(scheduler_pb2.GetJobRequest(name=job.name), metadata=b.md))
    await expect(NF, b.scheduler.CancelJob(scheduler_pb2.CancelJobRequest(name=job.name), metadata=b.md))
    await expect(NF, b.scheduler.WatchJob(scheduler_pb2.WatchJobRequest(name=job.name), metadata=b.md))
    await expect(DENIED, b.scheduler.ListJobs(scheduler_pb2.ListJobsRequest(tenant="tenants/alpha"), metadata=b.md))
    await expect(NF, b.router.GetDeployment(router_pb2.GetDeploymentRequest(name=dep.deployment.name),
                                            metadata=b.md))
    await expect(NF, b.router.Generate(router_pb2.GenerateRequest(model=dep.deployment.name, text="leak?",
                                                                  max_tokens=2), metadata=b.md))
    await expect(NF, b.router.DeleteDeployment(router_pb2.DeleteDeploymentRequest(name=dep.deployment.name),
                                               metadata=b.md))
    await expect(UNAUTH, b.scheduler.ListJobs(scheduler_pb2.ListJobsRequest(), metadata=()))
    await expect(UNAUTH, b.router.ListDeployments(router_pb2.ListDeploymentsRequest(),
                                                  metadata=call_metadata(api_key="gck_0000000000000000_forged")))
    assert [j.name for j in (await b.scheduler.ListJobs(scheduler_pb2.ListJobsRequest(), metadata=b.md)).jobs] == []
    assert not (await b.router.ListDeployments(router_pb2.ListDeploymentsRequest(), metadata=b.md)).deployments


async def test_telemetry_of_a_never_reaches_b(mesh: dict[str, Any]) -> None:
    """On the enforcing MQTT broker, B subscribed to everything receives none of A's job topics while A
    receives its own; B cannot connect as A, and anonymous clients are refused."""
    st, a = mesh["stack"], mesh["a"]
    host, _, port = st.mqtt.rpartition(":")
    got: dict[str, list[str]] = {"alpha": [], "beta": []}
    ready = asyncio.Event()
    subs = 0

    async def listen(tenant: str, topic: str) -> None:
        nonlocal subs
        user, password = st.tenant_mqtt[tenant]
        async with aiomqtt.Client(host, int(port), username=user, password=password) as c:
            await c.subscribe(topic)
            subs += 1
            if subs == 2:
                ready.set()
            async for m in c.messages:
                got[tenant].append(str(m.topic))

    tasks = [asyncio.create_task(listen("alpha", "gigacluster/sec/scheduler/tenants/alpha/#")),
             asyncio.create_task(listen("beta", "gigacluster/sec/#"))]
    await asyncio.wait_for(ready.wait(), 10)
    spec = {"model": {"preset": "llama3-8b", "seq_len": 2048}, "batch": {"global_batch": 8},
            "parallelism": {"tp": 4}, "hardware": {"chip": "h100-sxm", "count": 4}, "precision": "bf16", "steps": 3}
    job = await a.submit_job(spec)
    async for _ in a.watch_job(job.name):
        pass
    await asyncio.sleep(1.5)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert any("/tenants/alpha/jobs/" in t for t in got["alpha"]), "A must receive its own job telemetry"
    leaked = [t for t in got["beta"] if "/tenants/alpha/" in t]
    TALLY["attempts"] += 3
    TALLY["leaks"] += len(leaked)
    assert leaked == []
    TALLY["denied"] += 1
    user_a, _ = st.tenant_mqtt["alpha"]
    _, pw_b = st.tenant_mqtt["beta"]
    for creds in ({"username": user_a, "password": pw_b}, {}):
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client(host, int(port), **creds):
                pass
        TALLY["denied"] += 1


async def test_expired_and_revoked_tokens_are_refused(mesh: dict[str, Any]) -> None:
    """A token past its expiry (3 s TTL + 1 s leeway) is UNAUTHENTICATED; after A releases its instance its
    token is revoked at once; B then gets those devices and reads zeros, never A's bytes (scrubbed)."""
    a, b, st = mesh["a"], mesh["b"], mesh["stack"]
    fresh = await a.broker.RefreshCapability(broker_pb2.RefreshCapabilityRequest(instance=mesh["ia"].instance.name),
                                             metadata=a.md)
    await asyncio.sleep(4.5)
    read = chip_pb2.ReadMemoryRequest(name=mesh["alloc"].name, length=len(SECRET))
    await expect(UNAUTH, a.chip.ReadMemory(read, metadata=call_metadata(capability=fresh.capability)))
    live = await a.broker.RefreshCapability(broker_pb2.RefreshCapabilityRequest(instance=mesh["ia"].instance.name),
                                            metadata=a.md)
    rel = await a.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=mesh["ia"].instance.name),
                                         metadata=a.md)
    assert rel.scrub_s > 0
    await expect(UNAUTH, a.chip.ReadMemory(read, metadata=call_metadata(capability=live.capability)))
    dev = mesh["dev_a"]
    admin = call_metadata(api_key=st.admin_key)
    nb = await b.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
        chip_type="h100-sxm", count=4, devices=[common_pb2.DeviceRange(start=dev, end=dev + 4)],
        tenant="tenants/beta"), metadata=admin)
    cap = call_metadata(capability=nb.capability)
    mine = await b.chip.AllocateMemory(chip_pb2.AllocateMemoryRequest(device=dev, size_bytes=1 << 20), metadata=cap)
    data = (await b.chip.ReadMemory(chip_pb2.ReadMemoryRequest(name=mine.name, length=len(SECRET)),
                                    metadata=cap)).data
    TALLY["attempts"] += 1
    if data != bytes(len(SECRET)):
        TALLY["leaks"] += 1
    else:
        TALLY["denied"] += 1
    assert data == bytes(len(SECRET))
    await expect(NF, b.chip.ReadMemory(chip_pb2.ReadMemoryRequest(name=mesh["alloc"].name, length=8), metadata=cap))


def test_matrix_tally_has_no_leaks() -> None:
    """Every adversarial attempt above was denied with its expected code and nothing leaked."""
    assert TALLY["attempts"] > 30 and TALLY["leaks"] == 0 and TALLY["denied"] == TALLY["attempts"], TALLY
