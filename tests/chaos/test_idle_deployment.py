"""A deployment left idle past several capability lifetimes still serves (tokens refreshed before expiry)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from gigacluster.client import Client
from gigacluster.router.v1 import router_pb2
from gigacluster.stack import Stack

from .conftest import CAPABILITY_TTL_S, deploy, report, serves_within, stack_config

pytestmark = [pytest.mark.chaos, pytest.mark.integration]
IDLE_S = 4 * CAPABILITY_TTL_S  # four token lifetimes of silence
SERVE_S = 5.0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def idle_mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """A 16-chip mesh whose capability tokens live CAPABILITY_TTL_S (3 s)."""
    st = Stack(stack_config(tmp_path_factory.mktemp("chaos-idle"), "idle", chips=16))
    await st.start()
    try:
        yield st
    finally:
        await st.stop()


async def test_idle_deployment_serves_after_several_token_lifetimes(idle_mesh: Stack) -> None:
    """Serve once, stay silent for 4 capability lifetimes, then the next request is served within 5 s and the
    deployment still reports READY."""
    key = await idle_mesh.create_tenant("idler")
    async with Client(idle_mesh.endpoints, key) as gc:
        dep = await deploy(gc, "idle")
        await serves_within(gc, dep.name, 30.0)
        await asyncio.sleep(IDLE_S)
        state = (await gc.router.GetDeployment(router_pb2.GetDeploymentRequest(name=dep.name), metadata=gc.md,
                                               timeout=10)).deployment.state
        try:
            took = await serves_within(gc, dep.name, SERVE_S)
        finally:
            report("idle", {"idle_s": IDLE_S, "ttl_s": CAPABILITY_TTL_S,
                            "state": router_pb2.Deployment.State.Name(state)})
        report("idle", {"idle_s": IDLE_S, "ttl_s": CAPABILITY_TTL_S, "served_after_s": round(took, 2),
                        "state": router_pb2.Deployment.State.Name(state)})
        assert state == router_pb2.Deployment.STATE_READY
