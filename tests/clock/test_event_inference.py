"""Inference in event mode end to end: a seeded trace replayed by ``gigacluster loadtest`` as a participant of
the event clock gives the wall clock's TTFT and ITL, and training beside it still steps as the model has it."""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import numpy as np
import pytest

from gigacluster.clock.v1 import clock_pb2, clock_pb2_grpc
from gigacluster.loadtest import runner, scenario
from gigacluster.loadtest.drivers import Result
from gigacluster.runtime.channels import open_channel
from gigacluster.stack import Stack
from tests.clock.test_event_mesh import run_demo
from tests.conftest import live_stack

pytestmark = pytest.mark.integration
REQUESTS = 16
BUSY_REQUESTS = 40
GAP_S = 0.5  # virtual seconds between arrivals: each request is served alone, so its timing is the model's
WALL_SPEEDUP = 2.0
PCTS = (50, 90, 99)


def _scenario(tmp: pathlib.Path) -> scenario.Scenario:
    """A seeded trace (prompts of 64-2,048 tokens, 8-32 out) sent half over gRPC and half over HTTP."""
    rng = np.random.default_rng(3)
    rows = [{"arrival_s": GAP_S * i, "prompt_tokens": int(rng.integers(64, 2048)),
             "output_tokens": int(rng.integers(8, 32))} for i in range(REQUESTS)]
    paths = []
    for k in range(2):
        p = tmp / f"trace-{k}.jsonl"
        p.write_text("".join(json.dumps({**r, "arrival_s": r["arrival_s"] + 0.25 * k}) + "\n" for r in rows[k::2]))
        paths.append(str(p))
    return scenario.parse({
        "name": "evc", "duration_s": GAP_S * REQUESTS, "seed": 5, "drain_s": 60,
        "deploy": {"deployment_id": "evc", "preset": "llama3-8b", "chip": "h100-sxm", "tp": 1, "replicas": 1},
        "streams": [{"name": "grpc", "kind": "generate", "arrival": {"type": "trace", "path": paths[0]}},
                    {"name": "http", "kind": "http_completions", "arrival": {"type": "trace", "path": paths[1]}}]})


async def _load(st: Stack, sc: scenario.Scenario, key: str) -> runner.Run:
    coordinator = st.endpoint_of("clock") if st.cfg.clock == "event" else ""
    http = st.openai_base_url.removesuffix("/v1")
    run = await runner.run(sc, runner.Target(st.endpoints, key, st.admin_key, http, clock_coordinator=coordinator))
    assert len(run.results) == REQUESTS and all(r.ok for r in run.results), [
        (r.status, r.detail) for r in run.results if not r.ok]
    return run


def _pcts(values: list[float]) -> list[float]:
    return [float(x) for x in np.percentile(np.asarray(values), PCTS)]


def _ttft_itl(results: list[Result], *, client: bool) -> tuple[list[float], list[float]]:
    """TTFT and ITL percentiles: as the client measured them, or from the router's virtual stamps."""
    ttft = [r.ttft_s if client else r.virtual_ttft_s for r in results]
    itl = [x for r in results for x in (r.itl_s if client else r.virtual_itl_s)]
    return _pcts(ttft), _pcts(itl)


async def test_inference_in_event_mode_equals_wall_mode(mosquitto: str, tmp_path: pathlib.Path,
                                                        record_property: Any) -> None:
    """The same seeded trace (gRPC and HTTP streams) in both clock modes: TTFT and ITL p50/p90/p99 within 1%
    (issue 14). In event mode the load generator stamps arrivals in virtual time, so what it measures is the
    router's own virtual TTFT exactly, and no request is sent late."""
    sc = _scenario(tmp_path)
    async with live_stack("evcwall", mosquitto, tmp_path / "wall", shards=1, speedup=WALL_SPEEDUP,
                          http_port=0) as st:
        wall = await _load(st, sc, await st.create_tenant("lt"))
    async with live_stack("evcevent", mosquitto, tmp_path / "event", shards=1, clock="event", http_port=0) as st:
        event = await _load(st, sc, await st.create_tenant("lt"))
    assert event.virtual and not wall.virtual
    for r in event.results:
        assert r.send_lag_s == 0.0 and r.ttft_s == pytest.approx(r.virtual_ttft_s, rel=1e-9)
    (et, ei), (wt, wi) = _ttft_itl(event.results, client=True), _ttft_itl(wall.results, client=False)
    assert et == pytest.approx(wt, rel=0.01) and ei == pytest.approx(wi, rel=0.01), (et, wt, ei, wi)
    record_property("event_virtual_per_wall", event.elapsed_s / event.wall_s)
    print(f"TTFT p50/90/99 event {et} wall {wt}; ITL event {ei} wall {wi}; event run "
          f"{event.elapsed_s:.2f} virtual s in {event.wall_s:.2f} wall s")


async def test_training_beside_inference_in_event_mode_steps_as_alone(mosquitto: str, tmp_path: pathlib.Path) -> None:
    """The demo job in event mode steps within 1% of its steps alone while the trace is served beside it (on
    other chips of the same mesh), and every request completes."""
    sc = _scenario(tmp_path)
    async with live_stack("evcmix", mosquitto, tmp_path / "mix", shards=1, clock="event", http_port=0) as st:
        alone = await run_demo(st)
        key = await st.create_tenant("lt")
        together, _ = await asyncio.gather(run_demo(st, tenant="demo2"), _load(st, sc, key))
    assert len(together["steps"]) == len(alone["steps"])
    for a, t in zip(alone["steps"], together["steps"], strict=True):
        assert t == pytest.approx(a, rel=0.01)
    assert together["mfu"] == pytest.approx(alone["mfu"], rel=0.01)


def _busy_scenario(tmp: pathlib.Path) -> scenario.Scenario:
    """Arrivals 30 ms apart with 16-64 tokens out: requests overlap, so iterations batch several of them."""
    rng = np.random.default_rng(11)
    rows = [{"arrival_s": 0.03 * i, "prompt_tokens": int(rng.integers(64, 1024)),
             "output_tokens": int(rng.integers(16, 64))} for i in range(BUSY_REQUESTS)]
    p = tmp / "busy.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return scenario.parse({
        "name": "busy", "duration_s": 0.03 * BUSY_REQUESTS, "seed": 5, "drain_s": 60,
        "deploy": {"deployment_id": "busy", "preset": "llama3-8b", "chip": "h100-sxm", "tp": 1, "replicas": 2},
        "streams": [{"name": "grpc", "kind": "generate", "arrival": {"type": "trace", "path": str(p)}}]})


async def _advances(st: Stack) -> int:
    async with open_channel(st.endpoint_of("clock")) as ch:
        return int((await clock_pb2_grpc.ClockServiceStub(ch).GetTime(clock_pb2.GetTimeRequest())).advances)


async def test_replicas_running_ahead_to_the_horizon_give_the_same_tokens_at_the_same_times(
        mosquitto: str, tmp_path: pathlib.Path) -> None:
    """The same overlapping trace on the event clock with replicas completing iterations ahead of the clock up
    to the coordinator's horizon, and with one clock round per iteration (``run_ahead_iterations`` 0): every
    request's virtual TTFT and every inter-token gap equal to 1e-9, in far fewer clock advances (over 4x)."""
    sc = _busy_scenario(tmp_path)
    runs: dict[int, tuple[list[Result], int]] = {}
    for ahead in (0, 4096):
        env = {"GIGACLUSTER_ROUTER_RUN_AHEAD_ITERATIONS": str(ahead)}
        async with live_stack(f"ahead{ahead}", mosquitto, tmp_path / f"a{ahead}", shards=1, clock="event",
                              extra_env=env) as st:
            key = await st.create_tenant("lt")
            before = await _advances(st)
            run = await runner.run(sc, runner.Target(st.endpoints, key, st.admin_key,
                                                     clock_coordinator=st.endpoint_of("clock")))
            assert all(r.ok for r in run.results), [(r.status, r.detail) for r in run.results if not r.ok]
            runs[ahead] = (sorted(run.results, key=lambda r: r.intended_s), await _advances(st) - before)
    (step, n_step), (ahead, n_ahead) = runs[0], runs[4096]
    assert len(step) == len(ahead) == BUSY_REQUESTS
    for a, b in zip(step, ahead, strict=True):
        assert b.virtual_ttft_s == pytest.approx(a.virtual_ttft_s, rel=1e-9, abs=1e-12)
        assert b.virtual_itl_s == pytest.approx(a.virtual_itl_s, rel=1e-9, abs=1e-12)
        assert b.tokens == a.tokens
    # 376 and 80 advances here: the replicas of one router also wake at once for each other's horizons
    # (clock.sleep_until ahead=True); with one advance per replica's crossing iteration it was 119
    assert n_ahead * 4 < n_step, (n_ahead, n_step)
