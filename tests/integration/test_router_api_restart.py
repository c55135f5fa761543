"""The OpenAI endpoint across a router restart (issue 17): a model's ``created`` is the deployment's creation
time, kept in the router's store, and ``/health`` answers 200 again once the router serves.

A small stack of its own (8 H100, restart supervision on, the HTTP endpoint on a free port that the
restarted router binds again).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
import pytest_asyncio

from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2

from ..conftest import live_stack

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(mosquitto: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    """The stack and a tenant with one deployment 'm'."""
    async with live_stack("apirestart", mosquitto, tmp_path_factory.mktemp("apirestart"), chips=8, shards=1,
                          http_port=0) as st:
        key = await st.create_tenant("api")
        async with Client(st.endpoints, key) as gc:
            await gc.router.DeployModel(router_pb2.DeployModelRequest(
                deployment_id="m", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
                replicas=1, max_batch=4), metadata=gc.md)
            yield {"stack": st, "key": key, "base": st.openai_base_url}


async def _health(root: str) -> int:
    try:
        async with aiohttp.ClientSession() as s, s.get(root + "/health",
                                                       timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status
    except (TimeoutError, aiohttp.ClientError):
        return -1  # not listening (the router is down)


async def test_created_survives_a_router_restart_and_health_comes_back(env: dict[str, Any]) -> None:
    """kill -9 of the router: /health is 200 again once it serves, and models.retrieve reports the same created."""
    st, root = env["stack"], env["base"].removesuffix("/v1")
    client = openai.AsyncOpenAI(base_url=env["base"], api_key=env["key"], max_retries=0)
    try:
        before = await client.models.retrieve("m")
        assert 0 < time.time() - before.created < 600
        assert await _health(root) == 200
        # A restored deployment that took the restore time as created would now differ by at least a second.
        await asyncio.sleep(max(0.0, before.created + 1.1 - time.time()))
        proc = st.procs["router"].proc
        assert proc is not None
        proc.kill()
        await asyncio.sleep(0.2)
        await st.wait_healthy(names=["router"])  # gRPC health says SERVING only after the deployments are back
        assert await _health(root) == 200
        for _ in range(100):  # the deployment's replicas come back with the reconcile
            try:
                after = await client.models.retrieve("m")
                break
            except openai.NotFoundError:
                await asyncio.sleep(0.05)
        assert after.created == before.created
        assert [m.created async for m in client.models.list()] == [before.created]
    finally:
        await client.close()
