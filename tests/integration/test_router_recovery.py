"""The router heals on a real mesh: chip-shard kill -9 under load, router kill -9, capability expiry.

One stack of its own (64 H100 in two shards, restart supervision on) whose broker issues
capabilities that live 3 s, so every test here also runs across many token lifetimes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio

from gigacluster.broker.v1 import broker_pb2
from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime import convert
from gigacluster.stack import Stack

from ..conftest import live_stack

pytestmark = pytest.mark.integration
TTL_S = 3.0
CHIPS, SHARDS = 64, 2
PREFIX = "tenants/"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(mosquitto: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Stack, Client]]:
    """The stack (3 s capabilities) and a tenant with a two-replica deployment 'heal', one replica per shard."""
    async with live_stack("healtest", mosquitto, tmp_path_factory.mktemp("healstack"), chips=CHIPS, shards=SHARDS,
                          extra_env={"GIGACLUSTER_CAPABILITY_TTL_S": str(TTL_S)}) as st:
        key = await st.create_tenant("healer")
        async with Client(st.endpoints, key) as gc:
            await gc.router.DeployModel(router_pb2.DeployModelRequest(
                deployment_id="heal", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
                replicas=1, max_batch=8, max_queue=64), metadata=gc.md)
            yield st, gc


async def _gen(gc: Client, model: str = "deployments/heal", max_tokens: int = 4, timeout: float = 30) -> Any:
    """One Generate: its last response, or the RpcError it ended with."""
    try:
        last = None
        async for r in gc.router.Generate(router_pb2.GenerateRequest(
                model=model, token_ids=router_pb2.TokenIds(ids=[11, 12, 13, 14]), max_tokens=max_tokens),
                metadata=gc.md, timeout=timeout):
            last = r
        return last
    except grpc.aio.AioRpcError as err:
        return err


async def _deployment(gc: Client, name: str = "deployments/heal") -> Any:
    return (await gc.router.GetDeployment(router_pb2.GetDeploymentRequest(name=name), metadata=gc.md)).deployment


async def _router_instances(st: Stack) -> dict[str, str]:
    """Every broker instance the router holds: name -> purpose."""
    async with Client(st.endpoints, st.admin_key) as adm:
        r = await adm.broker.ListInstances(broker_pb2.ListInstancesRequest(page_size=1000), metadata=adm.md)
    return {i.name: i.purpose for i in r.instances if i.purpose.startswith(PREFIX)}


async def _serve_after(st: Stack, gc: Client, proc: str, deadline_s: float) -> float:
    """Wait for ``proc`` to be healthy again; seconds from then to the first served request."""
    await st.wait_healthy(names=[proc])
    healthy = time.monotonic()
    while time.monotonic() - healthy < deadline_s + 5:
        r = await _gen(gc, timeout=5)
        if not isinstance(r, grpc.aio.AioRpcError):
            return time.monotonic() - healthy
        await asyncio.sleep(0.05)
    raise AssertionError(f"no request served within {deadline_s + 5} s of {proc} being healthy")


async def test_idle_deployment_serves_after_many_capability_lifetimes(env: tuple[Stack, Client]) -> None:
    """A deployment left idle for four 3 s token lifetimes still serves (its lease was refreshed in time)."""
    _, gc = env
    assert not isinstance(await _gen(gc), grpc.aio.AioRpcError)
    await asyncio.sleep(4 * TTL_S)
    r = await _gen(gc)
    assert not isinstance(r, grpc.aio.AioRpcError), r
    assert r.finish_reason == "length"
    assert (await _deployment(gc)).state == router_pb2.Deployment.STATE_READY


async def test_chip_shard_kill_under_load_heals_within_5s(env: tuple[Stack, Client]) -> None:
    """kill -9 of the shard under a loaded replica: in-flight requests end UNAVAILABLE saying retry, the
    deployment reports DEGRADED, and requests are served again within 5 s of the shard being healthy."""
    st, gc = env
    dep = await _deployment(gc)
    async with Client(st.endpoints, st.admin_key) as adm:
        inst = (await adm.broker.GetInstance(broker_pb2.GetInstanceRequest(name=dep.instances[0]),
                                             metadata=adm.md)).instance
    first = convert.ranges(inst.devices)[0][0]
    shard = first // (CHIPS // SHARDS)
    proc = "chip" if shard == 0 else f"chip-{shard}"

    load = [asyncio.ensure_future(_gen(gc, max_tokens=2000, timeout=60)) for _ in range(6)]
    await asyncio.sleep(0.5)
    p = st.procs[proc].proc
    assert p is not None
    p.kill()
    results = await asyncio.gather(*load)
    errors = [r for r in results if isinstance(r, grpc.aio.AioRpcError)]
    assert errors, "the kill should have cut the long requests short"
    assert {e.code() for e in errors} == {grpc.StatusCode.UNAVAILABLE}
    assert all("retry" in (e.details() or "") for e in errors)
    during = await _deployment(gc)  # the shard takes seconds to start again: still down here
    assert during.state == router_pb2.Deployment.STATE_DEGRADED
    assert "0 of 1 replicas serving" in during.reason and "lost its chips" in during.reason

    waited = await _serve_after(st, gc, proc, 5.0)
    assert waited < 5.0
    dep = await _deployment(gc)
    assert dep.state == router_pb2.Deployment.STATE_READY, dep.reason


async def test_router_kill_keeps_deployments_and_leaks_no_instance(env: tuple[Stack, Client]) -> None:
    """kill -9 of the router: its deployments come back (serving, same instances), an instance it
    allocated but no deployment owns is released, and a later deployment's sequence number is new."""
    st, gc = env
    before = await _deployment(gc)
    held = await _router_instances(st)
    assert set(before.instances) <= set(held)
    seqs = {int(p.rsplit("/d-", 1)[1]) for p in held.values()}
    # An instance with a router purpose that no deployment owns (as a crash mid-deploy would leave).
    async with Client(st.endpoints, st.admin_key) as adm:
        orphan = (await adm.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
            chip_type="h100-sxm", count=1, purpose="tenants/healer/deployments/ghost/d-999999",
            tenant="tenants/healer"), metadata=adm.md)).instance.name

    p = st.procs["router"].proc
    assert p is not None
    p.kill()
    await _serve_after(st, gc, "router", 5.0)

    after = await _deployment(gc)
    assert after.name == before.name and list(after.instances) == list(before.instances)
    assert after.state == router_pb2.Deployment.STATE_READY
    now_held = await _router_instances(st)
    assert orphan not in now_held
    assert set(now_held) == set(before.instances)

    await gc.router.DeployModel(router_pb2.DeployModelRequest(
        deployment_id="later", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm"),
        metadata=gc.md)
    try:
        new = {p for n, p in (await _router_instances(st)).items() if n not in now_held}
        assert len(new) == 1
        assert int(new.pop().rsplit("/d-", 1)[1]) > max(seqs)
    finally:
        with contextlib.suppress(grpc.aio.AioRpcError):
            await gc.router.DeleteDeployment(router_pb2.DeleteDeploymentRequest(name="deployments/later"),
                                             metadata=gc.md)


async def test_replica_reacquires_an_instance_the_broker_lost(env: tuple[Stack, Client]) -> None:
    """When the broker no longer knows a replica's instance (released behind the router's back), the replica
    allocates a new one and serves again; the deployment lists the new instance and the router holds only it."""
    st, gc = env
    old = list((await _deployment(gc)).instances)
    async with Client(st.endpoints, st.admin_key) as adm:
        await adm.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=old[0]), metadata=adm.md)
    deadline = time.monotonic() + 15
    while True:  # until a request is served on a new instance (the chips learn of the release within ~1 s)
        r = await _gen(gc, timeout=5)
        if not isinstance(r, grpc.aio.AioRpcError) and list((await _deployment(gc)).instances) != old:
            break
        if isinstance(r, grpc.aio.AioRpcError):
            assert r.code() == grpc.StatusCode.UNAVAILABLE and "retry" in (r.details() or ""), r
        assert time.monotonic() < deadline, "not served again after the instance was lost"
        await asyncio.sleep(0.1)
    now = await _deployment(gc)
    assert len(now.instances) == 1 and now.instances[0] != old[0]
    assert now.state == router_pb2.Deployment.STATE_READY
    assert set(await _router_instances(st)) == set(now.instances)
