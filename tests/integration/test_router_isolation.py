"""No neighbour effects through the router, and hostile HTTP bodies, on a real mesh.

One small stack of its own (16 H100, the OpenAI endpoint on a free port, a router RPC rate limit
of 40 calls/s per tenant so the HTTP 429 path is reachable). Two tenants each deploy ``iso``.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
import pytest_asyncio

from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.stack import Stack, StackConfig

from ..conftest import TEST_SPEEDUP

pytestmark = pytest.mark.integration
RATE = 40
PROMPT = list(range(1000, 1000 + 64))  # four full 16-token blocks


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(mosquitto: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    """The stack, tenants 'alice' and 'bob' each with a deployment 'iso', and the admin."""
    cfg = StackConfig(cluster="isotest", chip="h100-sxm", chips=16, shards=1, speedup=TEST_SPEEDUP, mqtt=mosquitto,
                      ports={k: 0 for k in DEFAULT_PORTS}, state_dir=tmp_path_factory.mktemp("isostack"),
                      http_port=0, restart=False, extra_env={"GIGACLUSTER_ROUTER_RATE_OPS_PER_S": str(RATE)})
    st = Stack(cfg)
    await st.start()
    try:
        keys = {t: await st.create_tenant(t) for t in ("alice", "bob")}
        async with Client(st.endpoints, keys["alice"]) as a, Client(st.endpoints, keys["bob"]) as b, \
                Client(st.endpoints, st.admin_key) as adm:
            for c in (a, b):
                await c.router.DeployModel(router_pb2.DeployModelRequest(
                    deployment_id="iso", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm"),
                    metadata=c.md)
            yield {"stack": st, "alice": a, "bob": b, "admin": adm, "keys": keys}
    finally:
        await st.stop()


async def _usage(gc: Client, model: str) -> Any:
    last = None
    async for r in gc.router.Generate(router_pb2.GenerateRequest(
            model=model, token_ids=router_pb2.TokenIds(ids=PROMPT), max_tokens=2), metadata=gc.md):
        last = r
    assert last is not None
    return last.usage


async def test_prefix_cache_is_scoped_to_the_caller(env: dict[str, Any]) -> None:
    """Alice's repeated prompt hits her cache; the admin sending it to her deployment gets no hit (no oracle)."""
    a, adm = env["alice"], env["admin"]
    await _usage(a, "deployments/iso")
    assert (await _usage(a, "deployments/iso")).cached_prompt_tokens == 48  # 4 blocks, the last recomputed
    assert (await _usage(adm, "tenants/alice/deployments/iso")).cached_prompt_tokens == 0


async def test_deployment_names_are_per_tenant(env: dict[str, Any]) -> None:
    """Both tenants own 'iso'; neither sees nor touches the other's (NOT_FOUND), the admin must qualify it."""
    a, b, adm = env["alice"], env["bob"], env["admin"]
    da = (await a.router.GetDeployment(router_pb2.GetDeploymentRequest(name="deployments/iso"), metadata=a.md))
    db = (await b.router.GetDeployment(router_pb2.GetDeploymentRequest(name="deployments/iso"), metadata=b.md))
    assert (da.deployment.tenant, db.deployment.tenant) == ("tenants/alice", "tenants/bob")
    assert set(da.deployment.instances).isdisjoint(db.deployment.instances)
    for name in ("tenants/alice/deployments/iso", "tenants/alice/deployments/nope", "deployments/nope"):
        for call in (b.router.GetDeployment(router_pb2.GetDeploymentRequest(name=name), metadata=b.md),
                     b.router.DeleteDeployment(router_pb2.DeleteDeploymentRequest(name=name), metadata=b.md)):
            with pytest.raises(grpc.aio.AioRpcError) as ei:
                await call
            assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    listed = (await b.router.ListDeployments(router_pb2.ListDeploymentsRequest(), metadata=b.md)).deployments
    assert [d.tenant for d in listed] == ["tenants/bob"]
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await adm.router.GetDeployment(router_pb2.GetDeploymentRequest(name="deployments/iso"), metadata=adm.md)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    got = await adm.router.GetDeployment(router_pb2.GetDeploymentRequest(name="tenants/bob/deployments/iso"),
                                         metadata=adm.md)
    assert got.deployment.tenant == "tenants/bob"


async def test_deploy_bounds(env: dict[str, Any]) -> None:
    """max_queue 2^32-1 and a huge max_batch are refused before any allocation (INVALID_ARGUMENT)."""
    a = env["alice"]
    for kw in ({"max_queue": 2**32 - 1}, {"max_batch": 2**31}):
        with pytest.raises(grpc.aio.AioRpcError) as ei:
            await a.router.DeployModel(router_pb2.DeployModelRequest(
                deployment_id="big", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm", **kw),
                metadata=a.md)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert next(iter(kw)) in (ei.value.details() or "")


async def test_grpc_prompt_over_the_byte_bound_is_refused(env: dict[str, Any]) -> None:
    """A 3.9 MB text prompt over gRPC is INVALID_ARGUMENT naming max_prompt_bytes."""
    a = env["alice"]
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        async for _ in a.router.Generate(router_pb2.GenerateRequest(model="deployments/iso", text="x" * 3_900_000,
                                                                    max_tokens=4), metadata=a.md):
            pass
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_prompt_bytes" in (ei.value.details() or "")


async def _post(session: aiohttp.ClientSession, url: str, key: str, data: bytes) -> tuple[int, dict[str, Any]]:
    async with session.post(url, data=io.BytesIO(data), headers={"Authorization": f"Bearer {key}",
                                                     "Content-Type": "application/json"}) as r:
        return r.status, await r.json()


async def test_hostile_http_bodies_get_openai_errors(env: dict[str, Any]) -> None:
    """Deep nesting, bad bytes, NaN, oversize bodies and prompts, bad max_tokens: 400/413 JSON errors, never 500."""
    st, key = env["stack"], env["keys"]["alice"]
    url = st.openai_base_url + "/completions"
    cases = {
        b"[" * 100_000: 400,
        b'{"model": "iso", "prompt": ' + b"[" * 1000 + b"]" * 1000 + b"}": 400,
        b"\xff\xfe\x00": 400,
        b'{"model": "iso", "prompt": "hi", "max_tokens": NaN}': 400,
        b'{"model": "iso", "prompt": "hi", "temperature": 1e999}': 400,
        b'{"model": "iso", "prompt": "hi", "max_tokens": -1}': 400,
        b'{"model": "iso", "prompt": [1180591620717411303424]}': 400,
        b'{"model": "iso", "prompt": [' + b"1," * 1_000_000 + b'1]}': 400,
        b'{"model": "iso", "prompt": "hi", "max_tokens": 2.5}': 400,
        b'{"model": "iso", "prompt": "hi", "max_tokens": 10000000}': 400,
        b'{"model": "iso", "prompt": "' + b"a" * 3_900_000 + b'"}': 400,
        b'{"model": "iso", "prompt": "' + b"a" * 5_000_000 + b'"}': 413,
    }
    async with aiohttp.ClientSession() as s:
        for body, want in cases.items():
            await asyncio.sleep(1.5 / RATE)  # stay under the rate limit
            status, obj = await _post(s, url, key, body)
            assert status == want, (body[:40], status, obj)
            assert set(obj["error"]) == {"message", "type", "param", "code"}
        # "max_tokens": null means the documented default (16), not 4,096.
        status, obj = await _post(s, url, key, b'{"model": "iso", "prompt": "hi", "max_tokens": null}')
        assert status == 200, obj
        assert obj["usage"]["completion_tokens"] == 16


async def test_http_rate_limit_answers_429_with_retry_after(env: dict[str, Any]) -> None:
    """A tenant over the router's RPC rate limit gets 429 JSON with Retry-After, not a 500."""
    st, key = env["stack"], env["keys"]["bob"]
    async with aiohttp.ClientSession() as s:
        async def one() -> tuple[int, str | None, dict[str, Any]]:
            async with s.get(st.openai_base_url + "/models", headers={"Authorization": f"Bearer {key}"}) as r:
                return r.status, r.headers.get("Retry-After"), await r.json()
        got = await asyncio.gather(*(one() for _ in range(3 * RATE)))
    assert {g[0] for g in got} == {200, 429}
    limited = [g for g in got if g[0] == 429]
    assert all(int(g[1] or 0) >= 1 and g[2]["error"]["type"] == "rate_limit_error" for g in limited)
    await asyncio.sleep(2)  # let the bucket refill for whoever runs next
