"""A gRPC fuzzer over every RPC of every service, read from the proto descriptors.

Each RPC gets the same seeded cases (the empty request, every field at its maximum, negative, NaN,
then random field-by-field requests with 2^64-1, 2^63, -1, NaN, inf, 1e308, 1 MB strings, repeated
fields up to 2,000 long, and one case in eight random bytes as the whole body) from four callers:
no credentials, a tenant's API key, the admin key and (chip and fabric) a tenant's capability.
The mesh must answer each with a precise status: never INTERNAL or UNKNOWN, never past the call's
deadline, UNAUTHENTICATED for every call without credentials, an error message of bounded length,
and every service must still be healthy and answering afterwards.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gigacluster.broker.v1 import broker_pb2
from gigacluster.chip.v1 import chip_pb2
from gigacluster.client import Client
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime.auth import call_metadata
from gigacluster.scheduler.v1 import scheduler_pb2
from gigacluster.stack import Stack

from .conftest import MAX_ERROR_CHARS, deploy, report, stack_config
from .fuzz import Generator, Rpc, all_rpcs, describe

pytestmark = [pytest.mark.chaos, pytest.mark.integration]
SEED = int(os.environ.get("GIGACLUSTER_CHAOS_SEED", "1111"))
CASES_PER_RPC = int(os.environ.get("GIGACLUSTER_CHAOS_CASES", "20"))  # per RPC and caller
CALL_TIMEOUT_S = 10.0
STREAM_FIRST_MESSAGE_S = 3.0  # a stream still open and silent after this is an open watch, not a hang
HANG_SLACK_S = 2.0  # a call that returns later than its deadline plus this has hung
BUDGET_S = 170.0  # the whole fuzz, wall time (2-core machine)
CONCURRENCY = 8
FUZZ_TTL_S = BUDGET_S + 30  # short, yet outlasting the fuzz: the capability caller must reach the handlers
UNAUTH, IA = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fuzz_mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Any]]:
    """A 32-chip mesh of its own (no restarts, so a crash shows), a tenant with an 8-chip instance and a
    READY deployment 'fz' the fuzzer's names can reach."""
    st = Stack(stack_config(tmp_path_factory.mktemp("chaos-fuzz"), "fuzz", chips=32, ttl_s=FUZZ_TTL_S))
    await st.start()
    try:
        key = await st.create_tenant("fuzz")
        async with Client(st.endpoints, key) as gc:
            inst = await gc.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                chip_type="h100-sxm", count=8, topology=broker_pb2.TOPOLOGY_CONSTRAINT_SAME_DOMAIN),
                metadata=gc.md, timeout=30)
            await deploy(gc, "fz")
            yield {"stack": st, "client": gc, "instance": inst.instance.name, "md": {
                "none": (), "tenant": call_metadata(api_key=key), "admin": call_metadata(api_key=st.admin_key),
                "cap": call_metadata(capability=inst.capability)}}
    finally:
        await st.stop()


async def _one(ch: grpc.aio.Channel, rpc: Rpc, body: bytes, md: Any) -> tuple[grpc.StatusCode, str, float]:
    """One raw call: (status, message, seconds). Streams are read to their first message."""
    t0 = time.monotonic()
    try:
        if rpc.server_streaming:
            # A watch with nothing to report yet stays open by design: an open stream is an answer.
            call = ch.unary_stream(rpc.path)(body, metadata=md, timeout=CALL_TIMEOUT_S)
            try:
                await asyncio.wait_for(call.read(), STREAM_FIRST_MESSAGE_S)
            except TimeoutError:
                pass
            finally:
                call.cancel()
        else:
            await ch.unary_unary(rpc.path)(body, metadata=md, timeout=CALL_TIMEOUT_S)
        return grpc.StatusCode.OK, "", time.monotonic() - t0
    except grpc.aio.AioRpcError as err:
        return err.code(), err.details() or "", time.monotonic() - t0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def fuzz_run(fuzz_mesh: dict[str, Any]) -> dict[str, Any]:
    """Run the whole fuzz once (bounded in count and wall time); the tests below judge its record."""
    st: Stack = fuzz_mesh["stack"]
    gc: Client = fuzz_mesh["client"]
    fresh = await gc.broker.RefreshCapability(broker_pb2.RefreshCapabilityRequest(instance=fuzz_mesh["instance"]),
                                              metadata=gc.md, timeout=10)
    fuzz_mesh["md"]["cap"] = call_metadata(capability=fresh.capability)  # valid for the whole (bounded) fuzz
    gen = Generator(SEED)
    rpcs = all_rpcs()
    jobs: list[tuple[str, Rpc, str, bytes, Any]] = []
    for rpc in rpcs:
        callers = ["none", "tenant", "admin"] + (["cap"] if rpc.service in ("chip", "fabric") else [])
        for who in callers:
            for kind, body, msg in gen.cases(rpc, CASES_PER_RPC):
                jobs.append((who, rpc, kind, body, msg))
    channels = {s: grpc.aio.insecure_channel(st.endpoint_of(s), options=[
        ("grpc.max_send_message_length", 8 << 20), ("grpc.max_receive_message_length", 8 << 20)])
        for s in ("chip", "fabric", "broker", "scheduler", "router")}
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    records: list[dict[str, Any]] = []
    sem = asyncio.Semaphore(CONCURRENCY)
    t_start = time.monotonic()
    skipped = 0

    async def run(who: str, rpc: Rpc, kind: str, body: bytes, msg: Any) -> None:
        nonlocal skipped
        async with sem:
            if time.monotonic() - t_start > BUDGET_S:
                skipped += 1
                return
            code, details, took = await _one(channels[rpc.service], rpc, body, fuzz_mesh["md"][who])
        counts[who][code.name] += 1
        counts["all"][code.name] += 1
        records.append({"who": who, "rpc": f"{rpc.service}.{rpc.name}", "kind": kind, "code": code.name,
                        "details": details, "took_s": took, "input": describe(msg, body)})

    try:
        await asyncio.gather(*(run(*j) for j in jobs))
    finally:
        for ch in channels.values():
            await ch.close()
    wall = time.monotonic() - t_start
    summary = {"rpcs": len(rpcs), "calls": len(records), "skipped_over_budget": skipped, "wall_s": round(wall, 1),
               "seed": SEED, "by_caller": {k: dict(v) for k, v in counts.items()}}
    report("grpc_fuzz", summary)
    return {"records": records, "summary": summary, "rpcs": rpcs}


def _failures(records: list[dict[str, Any]], bad: Any) -> list[str]:
    """One line per (rpc, caller, status) that failed, with its first input and message."""
    seen: dict[tuple[str, str, str], list[Any]] = {}
    raw_rpcs: dict[str, set[str]] = defaultdict(set)
    for r in records:
        if bad(r):
            # Undecodable bodies fail the same way on every RPC: one line per status, not per RPC.
            k = ("(any RPC)", "raw body", r["code"]) if r["kind"] == "raw" else (r["rpc"], r["who"], r["code"])
            raw_rpcs[r["code"]].add(r["rpc"]) if r["kind"] == "raw" else None
            if k not in seen:
                seen[k] = [0, r]
            seen[k][0] += 1
    out = []
    for (rpc, who, code), (n, r) in sorted(seen.items()):
        where = f"{len(raw_rpcs[code])} RPCs, any caller" if rpc == "(any RPC)" else f"[{who}]"
        out.append(f"{rpc} {where} -> {code} x{n}: input {r['input']} :: {r['details'][:160]!r}")
    return out


async def test_every_rpc_was_fuzzed_within_budget(fuzz_run: dict[str, Any]) -> None:
    """All 46 RPCs of the five services were called by every caller, a few thousand calls in all, in budget."""
    s = fuzz_run["summary"]
    called = {r["rpc"] for r in fuzz_run["records"]}
    assert len(called) == len(fuzz_run["rpcs"]) >= 46, sorted(called)
    assert s["skipped_over_budget"] == 0 and s["calls"] >= 2000, s


async def test_no_internal_or_unknown(fuzz_run: dict[str, Any]) -> None:
    """No input, from any caller, yields INTERNAL or UNKNOWN (undecodable bodies are INVALID_ARGUMENT)."""
    bad = _failures(fuzz_run["records"], lambda r: r["code"] in ("INTERNAL", "UNKNOWN"))
    report("grpc_fuzz_internal_unknown", {"failures": bad})
    assert bad == []


async def test_no_call_hangs_or_loses_its_service(fuzz_run: dict[str, Any]) -> None:
    """No call runs into its deadline, returns late, or finds its service gone (UNAVAILABLE)."""
    bad = _failures(fuzz_run["records"], lambda r: r["code"] in ("DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED")
                    or r["took_s"] > CALL_TIMEOUT_S + HANG_SLACK_S)
    report("grpc_fuzz_hangs", {"failures": bad})
    assert bad == []


async def test_unauthenticated_calls_are_refused_first(fuzz_run: dict[str, Any]) -> None:
    """Every call without credentials is UNAUTHENTICATED, whatever its fields (authentication before
    validation); a body that cannot even be decoded may instead be INVALID_ARGUMENT."""
    def bad(r: dict[str, Any]) -> bool:
        if r["who"] != "none":
            return False
        return not (r["code"] == "UNAUTHENTICATED" or (r["kind"] == "raw" and r["code"] == "INVALID_ARGUMENT"))

    fails = _failures(fuzz_run["records"], bad)
    report("grpc_fuzz_unauthenticated", {"failures": fails})
    assert fails == []


async def test_error_messages_are_bounded(fuzz_run: dict[str, Any]) -> None:
    """No error message is longer than MAX_ERROR_CHARS (nor too long to send): hostile input is quoted by a short
    prefix only."""
    # A message too long for gRPC's metadata limit reaches the client as a short "metadata size exceeds" error.
    fails = _failures(fuzz_run["records"], lambda r: len(r["details"]) > MAX_ERROR_CHARS
                      or "metadata size exceeds" in r["details"])
    report("grpc_fuzz_long_messages", {"failures": fails})
    assert fails == []


async def test_every_service_is_healthy_and_answering_after(fuzz_run: dict[str, Any],
                                                            fuzz_mesh: dict[str, Any]) -> None:
    """After the fuzz every process is alive, SERVING on gRPC health, and answers a plain call with OK."""
    st: Stack = fuzz_mesh["stack"]
    gc: Client = fuzz_mesh["client"]
    dead = {n: p.proc.returncode for n, p in st.procs.items() if p.proc is not None and p.proc.returncode is not None}
    assert dead == {}, f"services died under the fuzz: {dead}"
    for name in st.procs:
        async with grpc.aio.insecure_channel(st.endpoint_of(name)) as ch:
            r = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING, name
    admin = fuzz_mesh["md"]["admin"]
    await gc.chip.GetShard(chip_pb2.GetShardRequest(), metadata=admin, timeout=5)
    await gc.fabric.GetTopology(fabric_pb2.GetTopologyRequest(), metadata=admin, timeout=5)
    await gc.broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=gc.md, timeout=5)
    await gc.scheduler.ListJobs(scheduler_pb2.ListJobsRequest(), metadata=gc.md, timeout=5)
    await gc.router.ListDeployments(router_pb2.ListDeploymentsRequest(), metadata=gc.md, timeout=5)
