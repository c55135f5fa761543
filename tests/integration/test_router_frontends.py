"""The router with two front-end processes (``frontends`` 2) on a real mesh.

One stack of its own whose router runs as a core and two front ends sharing its gRPC and HTTP
ports (SO_REUSEPORT). Requests go through both front ends; kill -9 of one front end loses no
deployment, the other keeps serving and the core starts a new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import pytest
import pytest_asyncio

from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime import eventloop
from gigacluster.stack import Stack

from ..conftest import live_stack

pytestmark = pytest.mark.integration
MODEL = "deployments/fe"


def frontend_pids(st: Stack) -> list[int]:
    """The router's front-end processes (children of the router core), from /proc."""
    core = st.procs["router"].proc.pid  # type: ignore[union-attr]
    out = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (d / "cmdline").read_bytes()
            except (OSError, IndexError):
                continue
            if int(stat[1]) == core and b"gigacluster.router.frontend" in cmd:
                out.append(int(d.name))
    return sorted(out)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(mosquitto: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[tuple[Stack, str]]:
    """The stack (router with 2 front ends, HTTP on) and a tenant key owning deployment 'fe'."""
    async with live_stack("fetest", mosquitto, tmp_path_factory.mktemp("festack"), chips=8, http_port=0,
                          extra_env={"GIGACLUSTER_ROUTER_FRONTENDS": "2"}) as st:
        key = await st.create_tenant("fe")
        async with Client(st.endpoints, key) as gc:
            await gc.router.DeployModel(router_pb2.DeployModelRequest(
                deployment_id="fe", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
                replicas=1, max_batch=16, max_queue=64), metadata=gc.md, timeout=60)
        yield st, key


async def _grpc_once(st: Stack, key: str, max_tokens: int = 4) -> list[Any]:
    """One Generate on a connection of its own (so the kernel may pick either front end); its responses."""
    async with Client(st.endpoints, key) as gc:
        return [r async for r in gc.router.Generate(router_pb2.GenerateRequest(
            model=MODEL, token_ids=router_pb2.TokenIds(ids=[5, 6, 7]), max_tokens=max_tokens),
            metadata=gc.md, timeout=30)]


async def _http_once(st: Stack, key: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as s, s.post(
            f"{st.openai_base_url}/completions", headers={"Authorization": f"Bearer {key}"},
            json={"model": "fe", "prompt": "hello there", "max_tokens": 3}) as r:
        return r.status, await r.json()


def listeners(port: int) -> int:
    """Sockets listening on ``port`` (the core's reservation does not listen), from /proc/net/tcp."""
    n = 0
    for f in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in pathlib.Path(f).read_text().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                n += int(local.rsplit(":", 1)[1], 16) == port and state == "0A"
    return n


async def _wait_frontends(st: Stack, n: int, not_in: frozenset[int] = frozenset()) -> list[int]:
    """The front ends' pids once ``n`` of them (none in ``not_in``) listen on both ports."""
    for _ in range(400):
        pids = frontend_pids(st)
        if (len(pids) == n and not set(pids) & not_in and listeners(st.ports["router"]) == n
                and listeners(st.http_port) == n):
            return pids
        await asyncio.sleep(0.05)
    raise AssertionError(f"front ends now {frontend_pids(st)}")


def _on_uvloop(pid: int) -> bool:
    """Whether process ``pid`` has uvloop's extension loaded (its event loop, since nothing else imports it)."""
    return "/uvloop/loop." in pathlib.Path(f"/proc/{pid}/maps").read_text()


async def test_front_ends_run_on_uvloop_and_the_core_on_asyncio(env: tuple[Stack, str]) -> None:
    """Unless GIGACLUSTER_EVENT_LOOP says otherwise, each front end runs on uvloop and the core on asyncio's loop
    (runtime/eventloop.py; docs/performance.md "Router front ends on uvloop")."""
    st, _ = env
    pids = await _wait_frontends(st, 2)
    assert [_on_uvloop(p) for p in pids] == [eventloop.chosen(prefer="uvloop") == "uvloop"] * 2
    assert _on_uvloop(st.procs["router"].proc.pid) is (eventloop.chosen() == "uvloop")  # type: ignore[union-attr]


async def test_requests_through_front_ends_over_grpc_and_http(env: tuple[Stack, str]) -> None:
    """Two front ends run; gRPC and HTTP requests through them stream every token with the core's usage."""
    st, key = env
    assert len(await _wait_frontends(st, 2)) == 2
    outs = await asyncio.gather(*[_grpc_once(st, key) for _ in range(6)])
    for out in outs:
        assert sum(len(r.token_ids) for r in out) == 4
        assert out[-1].finish_reason == "length" and out[-1].usage.completion_tokens == 4
        assert out[-1].usage.prompt_tokens == 3 and out[-1].replica == f"{MODEL}/replicas/0"
    for status, body in await asyncio.gather(*[_http_once(st, key) for _ in range(6)]):
        assert status == 200 and body["usage"]["completion_tokens"] == 3
        assert body["choices"][0]["finish_reason"] == "length" and body["gigacluster"]["ttft_s"] > 0
    ids: list[str] = []
    for _ in range(40):  # the core sends its deployments to the front ends within frontend_link_interval_s
        async with aiohttp.ClientSession() as s, s.get(f"{st.openai_base_url}/models",
                                                       headers={"Authorization": f"Bearer {key}"}) as r:
            ids = [m["id"] for m in (await r.json())["data"]]
        if ids:
            break
        await asyncio.sleep(0.05)
    assert ids == ["fe"]


async def test_errors_come_back_as_the_core_gives_them(env: tuple[Stack, str]) -> None:
    """Auth first at the front end; the core's refusals keep their status and field through the link."""
    st, key = env
    async with Client(st.endpoints, "gc_bogus") as bad:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            [r async for r in bad.router.Generate(router_pb2.GenerateRequest(model=MODEL, text="hi"),
                                                  metadata=bad.md, timeout=10)]
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    async with Client(st.endpoints, key) as gc:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            [r async for r in gc.router.Generate(router_pb2.GenerateRequest(model="deployments/none", text="hi"),
                                                 metadata=gc.md, timeout=10)]
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await gc.router.GetDeployment(router_pb2.GetDeploymentRequest(name="deployments/none"), metadata=gc.md)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    async with aiohttp.ClientSession() as s, s.post(
            f"{st.openai_base_url}/completions", headers={"Authorization": f"Bearer {key}"},
            json={"model": "fe", "prompt": "hi", "max_tokens": 10**30}) as r:
        err = (await r.json())["error"]
        assert r.status == 400 and err["param"] == "max_tokens"


async def test_kill_9_of_a_front_end_keeps_the_deployment_and_the_router_serving(env: tuple[Stack, str]) -> None:
    """kill -9 of either front end: the core (same pid) keeps the deployment, requests keep succeeding through
    the other front end, and the core starts a new front end."""
    st, key = env
    core = st.procs["router"].proc.pid  # type: ignore[union-attr]
    first = await _wait_frontends(st, 2)
    for victim in first:  # one, then the other (the first's replacement serving by then)
        os.kill(victim, signal.SIGKILL)
        while pathlib.Path(f"/proc/{victim}").exists():  # its sockets close when it is gone (and reaped)
            await asyncio.sleep(0.01)
        outs = await asyncio.gather(*[_grpc_once(st, key) for _ in range(4)], return_exceptions=True)
        assert all(not isinstance(o, BaseException) and o[-1].usage.completion_tokens == 4 for o in outs), outs
        status, _ = await _http_once(st, key)
        assert status == 200
        await _wait_frontends(st, 2, not_in=frozenset({victim}))
    assert st.procs["router"].proc.pid == core  # type: ignore[union-attr]
    async with Client(st.endpoints, key) as gc:
        d = (await gc.router.GetDeployment(router_pb2.GetDeploymentRequest(name=MODEL), metadata=gc.md)).deployment
        assert d.state == router_pb2.Deployment.STATE_READY


async def test_kill_9_of_the_core_ends_open_streams_at_once_and_the_front_ends_exit(env: tuple[Stack, str]) -> None:
    """kill -9 of the router's core: a gRPC and an HTTP stream in progress end within seconds (UNAVAILABLE, an error
    event), not after a gRPC grace or an HTTP shutdown timeout; the orphaned front ends exit; the supervisor's new
    core and front ends serve again. (A soak run found HTTP calls sent during the restart hanging for 60 s and an
    orphaned front end living on for 2 minutes.)"""
    st, key = env
    old = await _wait_frontends(st, 2)
    core = st.procs["router"].proc.pid  # type: ignore[union-attr]

    async def grpc_long() -> tuple[str, float]:
        async with Client(st.endpoints, key) as gc:
            call = gc.router.Generate(router_pb2.GenerateRequest(
                model=MODEL, token_ids=router_pb2.TokenIds(ids=[5, 6, 7]), max_tokens=4000), metadata=gc.md, timeout=20)
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as e:
                return e.code().name, time.monotonic()
            return "OK", time.monotonic()

    async def http_long() -> tuple[str, float]:
        async with aiohttp.ClientSession() as s:
            try:
                async with s.post(f"{st.openai_base_url}/completions", headers={"Authorization": f"Bearer {key}"},
                                  json={"model": "fe", "prompt": [5, 6, 7], "max_tokens": 4000, "stream": True},
                                  timeout=aiohttp.ClientTimeout(total=20)) as r:
                    body = (await r.read()).decode()
                    return ("ERROR_EVENT" if '"error"' in body else f"HTTP_{r.status}"), time.monotonic()
            except (aiohttp.ClientError, TimeoutError) as e:
                return type(e).__name__, time.monotonic()

    calls = [asyncio.ensure_future(grpc_long()), asyncio.ensure_future(http_long())]
    await asyncio.sleep(1.0)  # both streaming (4,000 tokens take far longer)
    assert not any(c.done() for c in calls)
    killed = time.monotonic()
    os.kill(core, signal.SIGKILL)
    (g, g_t), (h, h_t) = await asyncio.gather(*calls)
    assert g == "UNAVAILABLE" and g_t - killed < 3.0, (g, g_t - killed)
    assert h == "ERROR_EVENT" and h_t - killed < 3.0, (h, h_t - killed)  # the stream's own error event, 503
    for pid in old:  # orphaned front ends stop promptly
        for _ in range(200):
            if not pathlib.Path(f"/proc/{pid}").exists():
                break
            await asyncio.sleep(0.05)
        assert not pathlib.Path(f"/proc/{pid}").exists(), f"front end {pid} still running 10 s after its core died"
    await _wait_frontends(st, 2, not_in=frozenset(old))  # the supervisor's new core started new front ends
    for _ in range(200):
        try:
            out = await _grpc_once(st, key)
            break
        except grpc.aio.AioRpcError:
            await asyncio.sleep(0.1)
    assert out[-1].usage.completion_tokens == 4
