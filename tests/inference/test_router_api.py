"""The client-facing API's pure parts (issue 17): the output-length model, stop strings, per-request energy,
creation times in the store, and the HTTP app driven with raw requests (no processes: aiohttp's test server)."""

from __future__ import annotations

import asyncio.selector_events as _se
import csv
import io
import math
import pathlib
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gigacluster.errors import NotFound
from gigacluster.inference.engine import Handoff, ReplicaConfig, ReplicaEngine, Request
from gigacluster.inference.outputs import EOS_LOG_MU, EOS_LOG_SIGMA, eos_after, find_stop, output_token_ids
from gigacluster.inference.tokenizer import Tokenizer
from gigacluster.model.arch import preset
from gigacluster.model.power import host_overhead_w
from gigacluster.router.http import EventStream, OpenAIServer, check_fields, error_type
from gigacluster.router.store import SCHEMA, DeploymentStore, StoredDeployment
from gigacluster.runtime.auth import Principal
from tests.inference.conftest import make_req
from tests.inference.test_router_units import _dep, _svc

TRACE = pathlib.Path("/work/shared/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv")
ALICE = Principal("tenant", "tenants/alice")


# ----------------------------------------------------------------------------- output length and stop


def test_eos_after_is_deterministic_and_follows_the_fitted_lognormal() -> None:
    """The same request id gives the same length; 20,000 ids have the fitted median exp(mu) = 151 tokens."""
    assert eos_after("req-1") == eos_after("req-1") >= 1
    n = np.array([eos_after(f"r{i}") for i in range(20_000)])
    assert n.min() >= 1
    assert np.median(n) == pytest.approx(math.exp(EOS_LOG_MU), rel=0.05)
    assert np.log(n).std() == pytest.approx(EOS_LOG_SIGMA, rel=0.05)


@pytest.mark.skipif(not TRACE.exists(), reason="the Azure 2023 trace is not on this machine")
def test_eos_parameters_are_the_conversation_traces_mle() -> None:
    """mu and sigma are the mean and standard deviation of ln(GeneratedTokens) of the Azure conversation trace."""
    with TRACE.open() as f:
        g = np.log([int(r["GeneratedTokens"]) for r in csv.DictReader(f)])
    assert (round(float(g.mean()), 3), round(float(g.std()), 3)) == (EOS_LOG_MU, EOS_LOG_SIGMA)


def test_engine_ends_at_eos_with_stop_and_at_max_tokens_with_length(cfg8b: ReplicaConfig) -> None:
    """eos_after before max_tokens finishes 'stop' at that length; max_tokens first finishes 'length'."""
    eng = ReplicaEngine(cfg8b)
    p = np.arange(300, 340)
    eng.admit(Request("a", p, 50, eos_after=7), 0.0)
    eng.admit(Request("b", p, 5, eos_after=7), 0.0)
    eng.admit(Request("c", p, 5), 0.0)
    ends = {e.request_id: e.summary for e in _drain(eng) if e.finished}
    assert (ends["a"].output_tokens, ends["a"].finish_reason) == (7, "stop")
    assert (ends["b"].output_tokens, ends["b"].finish_reason) == (5, "length")
    assert (ends["c"].output_tokens, ends["c"].finish_reason) == (5, "length")


def test_engine_output_tokens_are_the_ones_outputs_predicts(cfg8b: ReplicaConfig) -> None:
    """output_token_ids reproduces the engine's tokens, which is what lets the router find stop strings in advance."""
    eng = ReplicaEngine(cfg8b)
    eng.admit(Request("xyz", np.arange(300, 320), 12), 0.0)
    toks = [e.token_id for e in _drain(eng)]
    assert toks == output_token_ids("xyz", 12, cfg8b.arch.vocab).tolist()


def test_find_stop_cuts_before_the_first_completed_stop_string() -> None:
    """A stop string inside the output ends it after the token completing it; the text stops before it."""
    tok = Tokenizer(128256)
    ids = output_token_ids("s1", 40, 128256).tolist()
    text = tok.decode(ids)
    stop = text[50:56]
    at = find_stop(tok, "s1", 40, [stop, "never there \x00"])
    assert at is not None and at.chars == text.find(stop)
    assert len(tok.decode(ids[: at.tokens])) >= at.chars + len(stop) > len(tok.decode(ids[: at.tokens - 1]))
    assert find_stop(tok, "s1", 40, ["never there \x00"]) is None
    assert find_stop(tok, "s1", 5, [text[150:160]]) is None  # beyond the tokens that will be generated


# ----------------------------------------------------------------------------- energy


def _drain(eng: ReplicaEngine, t: float = 0.0) -> list[Any]:
    events = []
    while (it := eng.next_iteration(t)) is not None:
        t += it.predicted_s
        events.extend(eng.complete(it, t))
    return events


def test_request_energy_shares_add_up_to_the_iterations_energy(cfg8b: ReplicaConfig) -> None:
    """The requests' energy_j sum to the energy of every iteration they ran in (the power model's, nothing lost)."""
    eng = ReplicaEngine(cfg8b)
    for i in range(3):
        eng.admit(make_req(f"r{i}", 200 + 100 * i, 10 + 5 * i, seed=i), 0.0)
    t, total, summaries = 0.0, 0.0, []
    while (it := eng.next_iteration(t)) is not None:
        total += eng.iteration_energy_j(it)
        t += it.predicted_s
        summaries += [e.summary for e in eng.complete(it, t) if e.finished]
    assert len(summaries) == 3 and all(s.energy_j > 0 for s in summaries)
    assert sum(s.energy_j for s in summaries) == pytest.approx(total, rel=1e-9)


def test_iteration_energy_is_power_times_time_on_every_chip(cfg8b: ReplicaConfig) -> None:
    """Measured inputs are used as given: tp x (idle + host) x time + energy above idle (tp=1: no link energy)."""
    eng = ReplicaEngine(cfg8b)
    eng.admit(make_req("a", 64, 2), 0.0)
    it = eng.next_iteration(0.0)
    assert it is not None
    chip = cfg8b.chip_spec
    assert eng.iteration_energy_j(it, duration_s=0.5, above_idle_j=100.0) == pytest.approx(
        (chip.idle_w + host_overhead_w()) * 0.5 + 100.0)
    modelled = eng.iteration_energy_j(it)
    host = host_overhead_w()
    assert (chip.idle_w + host) * it.predicted_s < modelled < (chip.tdp_w + host) * it.predicted_s


def test_a_handed_off_request_keeps_its_prefill_energy(cfg8b: ReplicaConfig) -> None:
    """A decode replica's summary carries the prefill side's energy plus its own."""
    dec = ReplicaEngine(ReplicaConfig(preset("llama3-8b"), "a100-40gb", role="decode"))
    dec.admit(Request("h", np.arange(300, 364), 4, handoff=Handoff(300, 0.0, 0.1, energy_j=5.0)), 0.1)
    s = next(e.summary for e in _drain(dec, 0.1) if e.finished)
    assert s.energy_j > 5.0 and s.output_tokens == 4


# ----------------------------------------------------------------------------- store


def test_store_keeps_creation_times_and_upgrades_an_old_database(tmp_path: pathlib.Path) -> None:
    """created_s survives a reopen; a database without the column gains it (old rows read 0)."""
    old = tmp_path / "old.db"
    db = sqlite3.connect(old)
    db.executescript(SCHEMA.replace(",\n    created_s REAL NOT NULL DEFAULT 0", ""))
    db.execute("INSERT INTO deployments VALUES ('k', 1, 'tenants/a', 'm', x'00', '[]')")
    db.commit()
    db.close()
    s = DeploymentStore(old)
    assert s.load()[0].created_s == 0.0
    s.save(StoredDeployment(2, "tenants/a", "n", b"r", (), 1_700_000_000.5))
    s.close()
    assert DeploymentStore(old).load()[1].created_s == 1_700_000_000.5


# ----------------------------------------------------------------------------- the HTTP app, raw


@pytest_asyncio.fixture
async def http() -> AsyncIterator[tuple[TestClient[Any, Any], Any]]:
    svc = _svc()
    svc.reconciled.clear()

    async def principal(ctx: Any) -> Principal:
        return ALICE

    svc.auth.principal = principal  # type: ignore[method-assign]
    client = TestClient(TestServer(OpenAIServer(svc).app()))
    await client.start_server()
    try:
        yield client, svc
    finally:
        await client.close()
        await svc.auth.close()


_TRANSPORT_WRITE = (_se._SelectorSocketTransport.write, _se._SelectorSocketTransport.writelines)


async def _server_writes(monkeypatch: pytest.MonkeyPatch, response: type[web.StreamResponse]) -> list[bytes]:
    """The socket writes of one streamed response of type ``response`` (two events, then the end), as sent."""
    sent: dict[int, list[bytes]] = {}
    write, writelines = _TRANSPORT_WRITE  # the unpatched methods, whatever an earlier call patched

    def count(t: Any, data: Any) -> None:
        sent.setdefault(id(t), []).append(bytes(data))
        write(t, data)

    def count_lines(t: Any, lines: Any) -> None:
        lines = list(lines)
        sent.setdefault(id(t), []).append(b"".join(bytes(x) for x in lines))
        writelines(t, lines)

    monkeypatch.setattr(_se._SelectorSocketTransport, "write", count)
    monkeypatch.setattr(_se._SelectorSocketTransport, "writelines", count_lines)

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = response(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: 1\n\n")
        await resp.write_eof(b"data: 2\n\ndata: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_post("/s", handler)
    async with TestClient(TestServer(app)) as client:
        r = await client.post("/s", json={})
        assert (await r.read()) == b"data: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
    [server] = [w for w in sent.values() if w[0].startswith(b"HTTP/1.1 200")]
    return server


async def test_a_streams_headers_go_out_with_its_first_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """EventStream sends the headers and the first event in one write (two writes for two events and the end),
    where aiohttp's StreamResponse writes the headers alone first: one sendmsg fewer a streamed request."""
    ours = await _server_writes(monkeypatch, EventStream)
    assert len(ours) == 2 and ours[0].startswith(b"HTTP/1.1 200") and b"data: 1" in ours[0]
    theirs = await _server_writes(monkeypatch, web.StreamResponse)
    assert len(theirs) == 3 and b"data: 1" not in theirs[0]


async def test_health_and_ping_follow_the_routers_readiness(http: tuple[TestClient[Any, Any], Any]) -> None:
    """/health and /ping answer 503 while the router restores and 200 once it serves, with empty bodies and no auth."""
    client, svc = http
    for path in ("/health", "/ping"):
        r = await client.get(path)
        assert (r.status, await r.text()) == (503, "")
    svc.reconciled.set()
    for method, path in (("GET", "/health"), ("GET", "/ping"), ("POST", "/ping"), ("HEAD", "/health")):
        r = await client.request(method, path)
        assert (r.status, await r.text()) == (200, "")


def _err(body: dict[str, Any]) -> tuple[str, Any]:
    return body["error"]["type"], body["error"]["param"]


async def test_every_status_of_the_endpoint_has_its_openai_type(http: tuple[TestClient[Any, Any], Any]) -> None:
    """400/404/405/413 are invalid_request_error, 500 and 503 server_error; 405 names the allowed method."""
    client, svc = http
    svc.reconciled.set()
    dep = _dep(svc, "tenants/alice", "m")
    r = await client.get("/v1/completions")
    assert r.status == 405 and _err(await r.json()) == ("invalid_request_error", None) and "POST" in r.headers["Allow"]
    r = await client.get("/v1/nothing-here")
    assert r.status == 404 and _err(await r.json())[0] == "invalid_request_error"
    r = await client.post("/v1/completions", json={"model": "m", "prompt": "hi", "logprobs": 2})
    assert r.status == 400 and _err(await r.json()) == ("invalid_request_error", "logprobs")
    r = await client.post("/v1/completions", data=io.BytesIO(b"x" * (svc.config.http_max_body_bytes + 1)))
    assert r.status == 413 and _err(await r.json())[0] == "invalid_request_error"
    r = await client.get("/v1/models/other")
    assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
    dep.state = "deploying"
    r = await client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
    assert r.status == 503 and _err(await r.json())[0] == "server_error" and r.headers["Retry-After"] == "1"
    r = await client.get("/v1/models/m")  # not serving: not listed, not retrievable
    assert r.status == 404

    def bug(*a: Any, **k: Any) -> Any:
        raise RuntimeError("a bug")

    svc.generate = bug
    r = await client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
    assert r.status == 500 and _err(await r.json())[0] == "server_error"
    assert [error_type(s) for s in (400, 401, 403, 404, 405, 409, 413, 429, 500, 503)] == [
        *["invalid_request_error"] * 7, "rate_limit_error", "server_error", "server_error"]


async def test_models_retrieve_reports_the_creation_time(http: tuple[TestClient[Any, Any], Any]) -> None:
    """GET /v1/models/{id} answers the deployment with its created time, as GET /v1/models lists it."""
    client, svc = http
    svc.reconciled.set()
    dep = _dep(svc, "tenants/alice", "m")
    one = await (await client.get("/v1/models/m")).json()
    listed = (await (await client.get("/v1/models")).json())["data"]
    assert one == listed[0] and one["created"] == int(dep.created_s) > 1_700_000_000 and one["object"] == "model"


@pytest.mark.parametrize(("field", "value"), [
    ("logprobs", True), ("n", 2), ("n", True), ("best_of", 3), ("echo", True), ("top_logprobs", 5),
    ("tools", [{"type": "function"}]), ("response_format", {"type": "json_object"}), ("logit_bias", {"5": 1}),
    ("guided_json", {}), ("frobnicate", 1), ("stream_options", {"bogus": True}), ("suffix", "x")])
def test_unsupported_fields_are_refused_by_name(field: str, value: Any) -> None:
    """Every field the emulator cannot honour is INVALID_ARGUMENT naming it, never silently ignored."""
    from gigacluster.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as ei:
        check_fields({"model": "m", field: value}, "text_completion")
    assert ei.value.field.split(".")[0] == field


def test_off_values_and_sampling_parameters_pass() -> None:
    """Features at their off value, sampling parameters and vLLM's ignore_eos/continuous_usage_stats are accepted."""
    check_fields({"model": "m", "messages": [], "n": 1, "logprobs": False, "temperature": 0.2, "top_p": 1.0,
                  "seed": 7, "tools": None, "tool_choice": "none", "ignore_eos": True, "stop": None,
                  "stream_options": {"include_usage": True, "continuous_usage_stats": True}, "user": "u",
                  "max_completion_tokens": 5}, "chat.completion")


async def test_non_text_content_parts_are_refused(http: tuple[TestClient[Any, Any], Any]) -> None:
    """An image part in a chat message is a 400 naming messages[0].content[1] (the model reads text only)."""
    client, svc = http
    svc.reconciled.set()
    _dep(svc, "tenants/alice", "m")
    r = await client.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": "http://x"}}]}]})
    assert r.status == 400 and (await r.json())["error"]["param"] == "messages[0].content[1]"


def test_retrieving_another_tenants_model_is_not_found() -> None:
    """visible() hides another tenant's deployment behind NOT_FOUND (the 404 GET /v1/models/{id} answers)."""
    svc = _svc()
    _dep(svc, "tenants/bob", "m")
    with pytest.raises(NotFound):
        svc.visible(ALICE, "m")
