"""The router's OpenAI-compatible endpoint and disaggregated prefill/decode, on a real mesh.

One small stack of its own (32 H100 in four HGX nodes, the router's HTTP endpoint on a free port)
with a deliberately oversubscribed fabric (leaf:spine 64:1, so a leaf's two uplink ports carry
four chips' NICs) and equal sharing between inference and training flows (inference weight 1),
so that a KV cache crossing the spine visibly shares it with training traffic.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import grpc
import numpy as np
import openai
import pytest
import pytest_asyncio

from gigacluster.broker.v1 import broker_pb2
from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.common.v1 import common_pb2
from gigacluster.fabric.topology import TIER_NAMES, TopologyConfig, build_topology
from gigacluster.fabric.v1 import fabric_pb2, fabric_pb2_grpc
from gigacluster.hw.catalog import get_chip
from gigacluster.inference.engine import ReplicaConfig
from gigacluster.inference.outputs import eos_after, find_stop, output_token_ids
from gigacluster.inference.tokenizer import Tokenizer
from gigacluster.model.arch import preset
from gigacluster.model.power import host_overhead_w
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime import convert
from gigacluster.runtime.auth import call_metadata
from gigacluster.stack import Stack, StackConfig

from ..conftest import TEST_SPEEDUP

pytestmark = pytest.mark.integration
CHIPS = 32
OVERSUB = 64.0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def env(mosquitto: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    """The stack, a tenant with a disaggregated 'pd' deployment (1 prefill + 1 decode) and a colocated 'chat' one,
    and a training tenant holding the two middle HGX nodes."""
    cfg = StackConfig(cluster="httptest", chip="h100-sxm", chips=CHIPS, shards=1, speedup=TEST_SPEEDUP, mqtt=mosquitto,
                      ports={k: 0 for k in DEFAULT_PORTS}, state_dir=tmp_path_factory.mktemp("httpstack"),
                      http_port=0, restart=False,
                      extra_env={"GIGACLUSTER_FABRIC_OVERSUBSCRIPTION": str(OVERSUB),
                                 "GIGACLUSTER_FABRIC_INFERENCE_WEIGHT": "1"})
    st = Stack(cfg)
    t0 = time.time()
    await st.start()
    try:
        key = await st.create_tenant("svc")
        train_key = await st.create_tenant("trainer")
        async with Client(st.endpoints, key) as gc, Client(st.endpoints, train_key) as tr:
            pd = (await gc.router.DeployModel(router_pb2.DeployModelRequest(
                deployment_id="pd", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
                prefill_replicas=1, decode_replicas=1, max_batch=16), metadata=gc.md)).deployment
            inst = await tr.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                chip_type="h100-sxm", count=16, topology=broker_pb2.TOPOLOGY_CONSTRAINT_SAME_DOMAIN), metadata=tr.md)
            chat = (await gc.router.DeployModel(router_pb2.DeployModelRequest(
                deployment_id="chat", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
                replicas=1, max_batch=2, max_queue=2), metadata=gc.md)).deployment
            yield {"stack": st, "key": key, "gc": gc, "tr": tr, "train_inst": inst, "pd": pd, "chat": chat,
                   "base": st.openai_base_url, "train_key": train_key, "t0": t0}
    finally:
        await st.stop()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_models_lists_ready_deployments_and_errors_are_openai_json(env: dict[str, Any]) -> None:
    """GET /v1/models lists the tenant's deployments; bad key 401, unknown model 404, bad field 400, as OpenAI JSON."""
    base, key = env["base"], env["key"]
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{base}/models", headers=_auth(key)) as r:
            assert r.status == 200
            body = await r.json()
        assert body["object"] == "list" and sorted(m["id"] for m in body["data"]) == ["chat", "pd"]
        async with s.get(f"{base}/models", headers=_auth("gc_bogus")) as r:
            assert r.status == 401 and (await r.json())["error"]["type"] == "invalid_request_error"
        async with s.post(f"{base}/completions", headers=_auth(key),
                          json={"model": "nope", "prompt": "hi", "max_tokens": 2}) as r:
            err = (await r.json())["error"]
            assert r.status == 404 and err["code"] == "model_not_found" and "deployments/nope" in err["message"]
        async with s.post(f"{base}/completions", headers=_auth(key),
                          json={"model": "chat", "prompt": "hi", "max_tokens": 100_000}) as r:
            err = (await r.json())["error"]
            assert r.status == 400 and err["param"] == "max_tokens" and err["type"] == "invalid_request_error"
        async with s.get(f"{base}/models", headers=_auth(env["stack"].admin_key)) as r:
            assert {m["id"] for m in (await r.json())["data"]} >= {"chat", "pd"}  # admin sees all tenants'


async def read_completion_stream(stream: Any) -> tuple[list[str], str | None, Any]:
    """The text of each event, the last finish reason and the usage of a streamed openai completion."""
    texts: list[str] = []
    finish, usage = None, None
    async for chunk in stream:
        if chunk.choices:
            texts.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    return texts, finish, usage


async def test_openai_client_streams_a_completion_and_a_chat(env: dict[str, Any]) -> None:
    """The real openai client streams /v1/completions and /v1/chat/completions; usage counts every token."""
    client = openai.AsyncOpenAI(base_url=env["base"], api_key=env["key"], max_retries=0)
    try:
        stream = await client.completions.create(model="chat", prompt="Explain max-min fairness", max_tokens=24,
                                                 stream=True, stream_options={"include_usage": True})
        texts, finish, usage = await read_completion_stream(stream)
        assert len(texts) >= 2 and "".join(texts).strip()  # tokens arrive as several events
        assert finish == "length" and usage is not None and usage.completion_tokens == 24
        assert usage.prompt_tokens > 0 and usage.total_tokens == usage.prompt_tokens + 24

        full = await client.completions.create(model="chat", prompt="Explain max-min fairness", max_tokens=8)
        assert full.usage is not None and full.usage.completion_tokens == 8 and full.choices[0].text

        chat = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "Say hi"}], max_tokens=6, stream=True)
        deltas = [c.choices[0].delta.content or "" async for c in chat if c.choices]
        assert "".join(deltas).strip()
    finally:
        await client.close()


async def test_raw_sse_stream_is_well_formed(env: dict[str, Any]) -> None:
    """A raw POST with stream=true gets text/event-stream: 'data: {json}' events, then 'data: [DONE]'."""
    async with aiohttp.ClientSession() as s, s.post(
        f"{env['base']}/completions", headers=_auth(env["key"]),
        json={"model": "chat", "prompt": [300, 301, 302, 303], "max_tokens": 10, "stream": True,
              "stream_options": {"include_usage": True}}) as r:
        assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    objs = [json.loads(e[6:]) for e in events[:-1]]
    choice_events = [o for o in objs if o["choices"]]
    assert all(o["object"] == "text_completion" and o["id"] == objs[0]["id"] for o in objs)
    assert [o["choices"][0]["finish_reason"] for o in choice_events][-1] == "length"
    times = [o["gigacluster"]["time_s"] for o in choice_events]
    assert times == sorted(times)  # virtual timestamps advance
    usage = objs[-1]["usage"]
    assert usage.pop("energy_j") > 0
    assert usage == {"prompt_tokens": 4, "completion_tokens": 10, "total_tokens": 14,
                     "prompt_tokens_details": {"cached_tokens": 0}}


async def test_saturation_is_429_with_retry_after(env: dict[str, Any]) -> None:
    """A burst of 12 on a queue of 2 (batch 2): the overflow is answered 429 with Retry-After, the rest served."""
    async def one(s: aiohttp.ClientSession) -> tuple[int, dict[str, str], Any]:
        async with s.post(f"{env['base']}/completions", headers=_auth(env["key"]),
                          json={"model": "chat", "prompt": [400] * 64, "max_tokens": 200}) as r:
            return r.status, dict(r.headers), await r.json()

    async with aiohttp.ClientSession() as s:
        got = await asyncio.gather(*(one(s) for _ in range(12)))
    codes = sorted(g[0] for g in got)
    assert codes.count(200) >= 2 and codes.count(429) >= 6 and set(codes) <= {200, 429}
    for status, headers, body in got:
        if status == 429:
            assert int(headers["Retry-After"]) >= 1 and float(headers["retry-after-ms"]) > 0
            assert body["error"]["code"] == "rate_limit_exceeded" and body["error"]["type"] == "rate_limit_error"
        else:
            assert body["usage"]["completion_tokens"] == 200
    client = openai.AsyncOpenAI(base_url=env["base"], api_key=env["key"], max_retries=0)
    try:  # the openai client sees it as its RateLimitError
        tasks = [asyncio.ensure_future(client.completions.create(model="chat", prompt=[400] * 64, max_tokens=200))
                 for _ in range(12)]
        res = await asyncio.gather(*tasks, return_exceptions=True)
        assert any(isinstance(r, openai.RateLimitError) for r in res)
    finally:
        await client.close()


def _kv_bytes_per_token() -> float:
    return ReplicaConfig(preset("llama3-8b"), "h100-sxm").shard.kv_bytes_per_token


async def _generate(gc: Client, model: str, ids: list[int], max_tokens: int) -> list[Any]:
    return [r async for r in gc.router.Generate(router_pb2.GenerateRequest(
        model=model, token_ids=router_pb2.TokenIds(ids=ids), max_tokens=max_tokens), metadata=gc.md)]


async def test_disaggregated_generate_sends_the_kv_cache_over_the_fabric(env: dict[str, Any]) -> None:
    """Prefill on one replica, KV over the fabric (prompt x kv bytes/token), decode on another; TTFT includes it."""
    gc, pd = env["gc"], env["pd"]
    assert pd.prefill_replicas == 1 and pd.decode_replicas == 1 and pd.replicas == 2
    ids = [int(x) for x in np.random.default_rng(7).integers(256, 128_000, 3000)]
    out = await _generate(gc, "pd", ids, 12)
    toks = [t for r in out for t in r.token_ids]
    assert len(toks) == 12 and out[0].index == 0
    u = out[-1].usage
    assert u.completion_tokens == 12 and u.prompt_tokens == 3000
    assert u.kv_transfer_bytes == pytest.approx(3000 * _kv_bytes_per_token())  # 393 MB for llama3-8b bf16
    assert u.prefill_replica == "deployments/pd/replicas/0" and out[-1].replica == "deployments/pd/replicas/1"
    nic = _nic_goodput_Bps()
    assert u.kv_transfer_s == pytest.approx(u.kv_transfer_bytes / nic, rel=0.05)  # NIC-bound on an idle fabric
    assert u.ttft_s > u.kv_transfer_s
    print(f"\ndisaggregated 3000-token prompt: {u.kv_transfer_bytes / 1e6:.0f} MB in {u.kv_transfer_s * 1e3:.2f} ms, "
          f"TTFT {u.ttft_s * 1e3:.1f} ms, e2e {u.e2e_s * 1e3:.1f} ms")
    stats = (await gc.router.GetStats(router_pb2.GetStatsRequest(deployment="deployments/pd"),
                                      metadata=gc.md)).deployments[0]
    assert stats.completed >= 1 and stats.kv_cache_usage == 0.0  # both sides freed their blocks


def _nic_goodput_Bps() -> float:
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=CHIPS, oversubscription=OVERSUB))
    return float(topo.link_capacity_Bps[topo.link_tier == TIER_NAMES.index("nic")].max())


async def test_kv_transfer_contends_with_training_traffic(env: dict[str, Any]) -> None:
    """Two training flows crossing the same oversubscribed leaf uplink slow the KV transfer by max-min's 1.5x."""
    gc = env["gc"]
    ids = [int(x) for x in np.random.default_rng(8).integers(256, 128_000, 4000)]
    alone = (await _generate(gc, "pd", ids, 2))[-1].usage.kv_transfer_s
    # The trainer's rail-0 chips (8 and 16; leaf 0, as the prefill chip 0) send to its rail-7 chips in the
    # other node (23 and 15; leaf 7, as the decode chip 31): the same leaf-0 uplink and leaf-7 downlink.
    devs = {d for a, b in convert.ranges(env["train_inst"].instance.devices) for d in range(a, b)}
    assert {8, 15, 16, 23} <= devs
    fab = fabric_pb2_grpc.FabricServiceStub(env["gc"].channel("fabric"))
    md = call_metadata(capability=env["train_inst"].capability)
    for src, dst in ((8, 23), (16, 15)):
        await fab.StartTransfer(fabric_pb2.StartTransferRequest(
            src_device=src, dst_device=dst, bytes=5e12, traffic_class=fabric_pb2.TRAFFIC_CLASS_TRAINING,
            tag="training"), metadata=md)
    ids2 = [int(x) for x in np.random.default_rng(9).integers(256, 128_000, 4000)]
    contended = (await _generate(gc, "pd", ids2, 2))[-1].usage.kv_transfer_s
    # Leaf uplink = 2 NIC ports: three equal-weight flows get 2/3 NIC each instead of the KV flow's full NIC.
    print(f"\nkv transfer of 4000 tokens: alone {alone * 1e3:.2f} ms, with training {contended * 1e3:.2f} ms")
    assert contended / alone == pytest.approx(1.5, rel=0.05)


async def test_disaggregated_deploy_validation(env: dict[str, Any]) -> None:
    """prefill_replicas without decode_replicas is INVALID_ARGUMENT naming the field; too many is RESOURCE_EXHAUSTED."""
    gc = env["gc"]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await gc.router.DeployModel(router_pb2.DeployModelRequest(
            deployment_id="bad", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
            prefill_replicas=1), metadata=gc.md)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "decode_replicas" in (e.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await gc.router.DeployModel(router_pb2.DeployModelRequest(
            deployment_id="huge", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
            prefill_replicas=20, decode_replicas=20), metadata=gc.md)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "40 free groups" in (e.value.details() or "")
    ids = {d.name for d in (await gc.router.ListDeployments(router_pb2.ListDeploymentsRequest(),
                                                            metadata=gc.md)).deployments}
    assert ids == {"deployments/pd", "deployments/chat"}


async def test_client_disconnect_frees_the_request(env: dict[str, Any]) -> None:
    """A streaming client that hangs up mid-stream leaves nothing running or queued on the replica."""
    gc = env["gc"]
    async with aiohttp.ClientSession() as s, s.post(
            f"{env['base']}/completions", headers=_auth(env["key"]),
            json={"model": "chat", "prompt": "a long story", "max_tokens": 2000, "stream": True}) as r:
        await r.content.readline()  # first event, then hang up
    for _ in range(100):
        st = (await gc.router.GetStats(router_pb2.GetStatsRequest(deployment="deployments/chat"),
                                       metadata=gc.md)).deployments[0]
        if st.running == 0 and st.queue_depth == 0:
            break
        await asyncio.sleep(0.05)
    assert st.running == 0 and st.queue_depth == 0


# ----------------------------------------------------------------------------- issue 17: real clients


def _client(env: dict[str, Any], key: str | None = None) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=env["base"], api_key=key or env["key"], max_retries=0)


def _rid_with_eos(lo: int, hi: int, prefix: str) -> str:
    """A request id whose drawn end-of-sequence falls in [lo, hi] tokens (the draw is seeded by the id)."""
    return next(f"{prefix}-{i}" for i in range(10_000) if lo <= eos_after(f"{prefix}-{i}") <= hi)


async def test_health_and_ping_answer_without_a_key_and_say_nothing(env: dict[str, Any]) -> None:
    """GET /health and /ping on the OpenAI port answer 200 with an empty body, with or without a key (as vLLM)."""
    root = env["base"].removesuffix("/v1")
    async with aiohttp.ClientSession() as s:
        for path, headers in (("/health", {}), ("/health", _auth("gc_bogus")), ("/ping", {})):
            async with s.get(root + path, headers=headers) as r:
                assert (r.status, await r.read()) == (200, b"")
        async with s.post(root + "/ping") as r:
            assert r.status == 200


async def test_405_and_unknown_paths_are_invalid_request_errors(env: dict[str, Any]) -> None:
    """A GET on a POST route is 405 invalid_request_error with Allow: POST; an unknown path 404 of the same type."""
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{env['base']}/chat/completions", headers=_auth(env["key"])) as r:
            err = (await r.json())["error"]
            assert r.status == 405 and err["type"] == "invalid_request_error" and r.headers["Allow"] == "POST"
        async with s.get(f"{env['base']}/embeddings", headers=_auth(env["key"])) as r:
            assert r.status == 404 and (await r.json())["error"]["type"] == "invalid_request_error"


async def test_openai_client_retrieves_a_model_with_its_creation_time(env: dict[str, Any]) -> None:
    """client.models.retrieve works and reports when the deployment was created; unknown or another tenant's: 404."""
    client, other = _client(env), _client(env, env["train_key"])
    try:
        m = await client.models.retrieve("chat")
        assert m.id == "chat" and m.owned_by == "tenants/svc" and env["t0"] <= m.created <= time.time()
        listed = {x.id: x.created async for x in client.models.list()}
        assert listed["chat"] == m.created and listed["pd"] >= env["t0"]
        for c, name in ((client, "nope"), (other, "chat")):
            with pytest.raises(openai.NotFoundError) as e:
                await c.models.retrieve(name)
            assert e.value.body["code"] == "model_not_found"  # type: ignore[index]
    finally:
        await client.close()
        await other.close()


async def test_chat_without_max_tokens_ends_at_its_end_of_sequence(env: dict[str, Any]) -> None:
    """No max_tokens: the output ends at the drawn end-of-sequence ('stop'); a smaller max_tokens ends it ('length')."""
    client = _client(env)
    msgs = [{"role": "user", "content": "Tell me about chips"}]
    try:
        rid = _rid_with_eos(20, 60, "eos")
        r = await client.chat.completions.create(model="chat", messages=msgs,  # type: ignore[arg-type]
                                                 extra_body={"request_id": rid})
        assert r.choices[0].finish_reason == "stop" and r.usage is not None
        assert r.usage.completion_tokens == eos_after(rid)
        rid2 = _rid_with_eos(20, 60, "eos-stream")
        stream = await client.chat.completions.create(model="chat", messages=msgs,  # type: ignore[arg-type]
                                                      stream=True, stream_options={"include_usage": True},
                                                      extra_body={"request_id": rid2})
        chunks = [c async for c in stream]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == eos_after(rid2)
        r = await client.chat.completions.create(model="chat", messages=msgs,  # type: ignore[arg-type]
                                                 max_tokens=5, extra_body={"request_id": _rid_with_eos(20, 60, "l")})
        assert (r.choices[0].finish_reason, r.usage.completion_tokens) == ("length", 5)  # type: ignore[union-attr]
        # Completions keep OpenAI's default of 16; ignore_eos (vLLM's, as guidellm sends it) runs to that cap.
        c = await client.completions.create(model="chat", prompt="hi",
                                            extra_body={"request_id": _rid_with_eos(100, 400, "c")})
        assert (c.choices[0].finish_reason, c.usage.completion_tokens) == ("length", 16)  # type: ignore[union-attr]
        c = await client.completions.create(model="chat", prompt="hi", extra_body={
            "request_id": _rid_with_eos(2, 10, "ie"), "ignore_eos": True})
        assert (c.choices[0].finish_reason, c.usage.completion_tokens) == ("length", 16)  # type: ignore[union-attr]
    finally:
        await client.close()


def _expected_text(rid: str, n: int) -> str:
    tok = Tokenizer(preset("llama3-8b").vocab)
    return tok.decode(output_token_ids(rid, n, tok.vocab).tolist())


async def test_stop_strings_end_the_output_over_http_and_grpc(env: dict[str, Any]) -> None:
    """A stop string in the emulated text ends it: text up to it, finish_reason 'stop', the same over gRPC."""
    client = _client(env)
    try:
        rid = "stop-http"
        text = _expected_text(rid, 40)
        stop = text[60:65]
        want = text[: text.find(stop)]
        at = find_stop(Tokenizer(preset("llama3-8b").vocab), rid, 40, [stop])
        assert at is not None
        r = await client.chat.completions.create(model="chat", messages=[{"role": "user", "content": "go"}],
                                                 max_tokens=40, stop=[stop, "\x00never"],
                                                 extra_body={"request_id": rid})
        assert r.choices[0].message.content == want and r.choices[0].finish_reason == "stop"
        assert r.usage is not None and r.usage.completion_tokens == at.tokens
        stream = await client.completions.create(model="chat", prompt="go", max_tokens=40, stop=stop, stream=True,
                                                 extra_body={"request_id": rid + "-s"})
        s_text = _expected_text(rid + "-s", 40)
        got = [c async for c in stream]
        cut = s_text.find(stop)
        assert "".join(c.choices[0].text for c in got) == (s_text[:cut] if cut >= 0 else s_text)
        assert got[-1].choices[0].finish_reason == ("stop" if cut >= 0 else "length")
        gc = env["gc"]
        out = [x async for x in gc.router.Generate(router_pb2.GenerateRequest(
            model="chat", text="go", max_tokens=40, stop=[stop], request_id="stop-grpc"), metadata=gc.md)]
        g_text = _expected_text("stop-grpc", 40)
        g_cut = g_text.find(stop)
        assert "".join(x.text for x in out) == (g_text[:g_cut] if g_cut >= 0 else g_text)
        assert out[-1].finish_reason == ("stop" if g_cut >= 0 else "length")
    finally:
        await client.close()


async def test_unsupported_parameters_are_a_400_naming_them(env: dict[str, Any]) -> None:
    """logprobs, n > 1, best_of, tools and unknown fields are refused by name (openai's BadRequestError)."""
    client = _client(env)
    msgs = [{"role": "user", "content": "hi"}]
    try:
        for kw, param in (({"logprobs": True}, "logprobs"), ({"n": 2}, "n"),
                          ({"extra_body": {"frobnicate": 1}}, "frobnicate"),
                          ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools")):
            with pytest.raises(openai.BadRequestError) as e:
                await client.chat.completions.create(model="chat", messages=msgs, max_tokens=2,  # type: ignore[arg-type]
                                                     **kw)  # type: ignore[call-overload]
            assert e.value.body["param"] == param and param in e.value.body["message"]  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as e:
            await client.completions.create(model="chat", prompt="hi", max_tokens=2, best_of=3)
        assert e.value.body["param"] == "best_of"  # type: ignore[index]
        ok = await client.chat.completions.create(model="chat", messages=msgs, max_tokens=2,  # type: ignore[arg-type]
                                                  temperature=0.7, top_p=0.9, seed=1, n=1, logprobs=False)
        assert ok.usage is not None and ok.usage.completion_tokens == 2
    finally:
        await client.close()


async def test_usage_reports_the_requests_energy(env: dict[str, Any]) -> None:
    """gRPC GenerateUsage.energy_j and the HTTP usage's energy_j: between idle and TDP power over its batch time."""
    gc = env["gc"]
    out = await _generate(gc, "chat", [300 + i for i in range(500)], 50)
    u = out[-1].usage
    chip = get_chip("h100-sxm")
    busy_s = u.e2e_s - u.queue_s  # alone on the replica: in every iteration from its first to its last
    assert 0.5 * (chip.idle_w + host_overhead_w()) * busy_s < u.energy_j < (chip.tdp_w + host_overhead_w()) * u.e2e_s
    print(f"\n500-token prompt + 50 tokens on one H100: {u.energy_j:.1f} J over {busy_s * 1e3:.0f} ms")
    client = _client(env)
    try:
        r = await client.completions.create(model="chat", prompt="energy", max_tokens=8)
        assert r.usage is not None and (r.usage.model_extra or {})["energy_j"] > 0
    finally:
        await client.close()


async def test_guidellm_shaped_client_validates_and_streams(env: dict[str, Any]) -> None:
    """The requests guidellm's OpenAI HTTP backend sends: its /health check (raise_for_status), /v1/models, then a
    chat stream with max_completion_tokens, ignore_eos, text content parts and continuous_usage_stats."""
    target = env["base"].rstrip("/").removesuffix("/v1")  # guidellm strips /v1 from --target
    headers = {"Authorization": f"Bearer {env['key']}"}
    async with aiohttp.ClientSession(raise_for_status=True) as s:
        async with s.get(f"{target}/health", headers=headers) as r:
            assert r.status == 200
        async with s.get(f"{target}/v1/models", headers=headers) as r:
            assert "chat" in [m["id"] for m in (await r.json())["data"]]
        body = {"model": "chat", "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                "max_completion_tokens": 12, "ignore_eos": True,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "benchmark me"}]}]}
        async with s.post(f"{target}/v1/chat/completions", json=body, headers=headers) as r:
            lines = [ln.decode().strip() async for ln in r.content if ln.startswith(b"data:")]
    assert lines[-1] == "data: [DONE]"
    objs = [json.loads(ln[5:]) for ln in lines[:-1]]
    with_tokens = [o for o in objs if o["choices"] and o["choices"][0]["delta"].get("content")]
    done = [o["usage"]["completion_tokens"] for o in with_tokens]
    assert done == sorted(done) and done[-1] == 12 and objs[-1]["usage"]["completion_tokens"] == 12
    assert [o["choices"][0]["finish_reason"] for o in objs if o["choices"]][-1] == "length"
