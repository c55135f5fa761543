"""Fire a scenario's timeline at a cluster: set-up (tenants, deployments), the open-loop send loop,
drain, clean-up (delete what was deployed, cancel submitted jobs).

Against a mesh in event-clock mode (``Target.clock_coordinator``) the load generator takes part in
the clock (``runtime/participant.py``, with the admin key): every arrival is sent at its exact
virtual time, as a virtual-time event the mesh cannot run past, and latencies are virtual seconds,
so a scenario or a trace replays at whatever speed the mesh can serve it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import grpc
import numpy as np

from gigacluster import safeyaml
from gigacluster.broker.v1 import broker_pb2
from gigacluster.client import Client, Endpoints
from gigacluster.common.v1 import common_pb2
from gigacluster.errors import InvalidArgument
from gigacluster.loadtest import drivers, schedule
from gigacluster.loadtest.drivers import Result, Timebase
from gigacluster.loadtest.scenario import Scenario
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.convert import PRECISION_ENUMS
from gigacluster.runtime.participant import participate
from gigacluster.scheduler.spec import split_job_file

START_LEAD_S = 0.2  # the timeline starts this long after set-up, so the first sends are not late


@dataclasses.dataclass
class Target:
    """Where to send: the cluster's endpoints, the caller's key, and optionally the admin key (needed for
    more than one tenant) and the router's OpenAI-compatible base URL (needed for HTTP streams)."""

    endpoints: Endpoints
    api_key: str | None
    admin_key: str | None = None
    http_url: str = ""
    clock_coordinator: str = ""  # HOST:PORT of an event-clock mesh's coordinator: arrivals in virtual time


@dataclasses.dataclass
class Run:
    scenario: Scenario
    results: list[Result]
    wall_s: float
    tenants: list[str]
    start_s: float = 0.0  # the timebase's time at intended_s 0 (to place results on another clock)
    elapsed_s: float = 0.0  # start of the timeline to the end of the drain, in the run's timebase
    virtual: bool = False  # the timebase is the mesh's virtual time (event clock), not wall time


class _Tenant:
    def __init__(self, name: str, key: str | None, client: Client) -> None:
        self.name, self.key, self.client = name, key, client
        self.deployed: list[str] = []
        self.jobs: list[str] = []


async def _create_tenants(target: Target, n: int, run_id: str) -> list[tuple[str, str | None]]:
    if n == 1:
        return [("caller", target.api_key)]
    if not target.admin_key:
        raise InvalidArgument("tenants", f"{n} tenants need the admin key (GIGACLUSTER_ADMIN_KEY or credentials)")
    out: list[tuple[str, str | None]] = []
    async with Client(target.endpoints, target.admin_key) as admin:
        for i in range(n):
            tid = f"lt-{run_id}-{i}"
            resp = await admin.broker.CreateTenant(broker_pb2.CreateTenantRequest(tenant_id=tid),
                                                   metadata=call_metadata(api_key=target.admin_key), timeout=10)
            out.append((tid, str(resp.api_key)))
    return out


async def _ensure_deployment(t: _Tenant, deploy: dict[str, Any], timeout_s: float = 120.0) -> None:
    d = dict(deploy)
    did = str(d.pop("deployment_id"))
    req = router_pb2.DeployModelRequest(
        deployment_id=did, model=common_pb2.ModelArchitecture(preset=str(d.pop("preset", "llama3-8b"))),
        chip=str(d.pop("chip", "")), tp=int(d.pop("tp", 1)), replicas=int(d.pop("replicas", 1)),
        max_batch=int(d.pop("max_batch", 0)), policy=str(d.pop("policy", "")), max_queue=int(d.pop("max_queue", 0)),
        ep=int(d.pop("ep", 0)))
    if "precision" in d:
        precision = d.pop("precision")
        if precision not in PRECISION_ENUMS:
            raise InvalidArgument("deploy.precision", f"must be one of {', '.join(sorted(PRECISION_ENUMS))}, "
                                                      f"got {str(precision)[:20]!r}")
        req.precision = PRECISION_ENUMS[precision]  # type: ignore[assignment]  # protobuf enums are int NewTypes
    if d:
        raise InvalidArgument("deploy", f"unknown keys {sorted(d)}")
    try:
        await t.client.router.DeployModel(req, metadata=t.client.md, timeout=60)
        t.deployed.append(f"deployments/{did}")
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise
    deadline = time.monotonic() + timeout_s
    while True:
        dep = (await t.client.router.GetDeployment(router_pb2.GetDeploymentRequest(name=f"deployments/{did}"),
                                                   metadata=t.client.md, timeout=10)).deployment
        if dep.state == router_pb2.Deployment.STATE_READY:
            return
        if dep.state == router_pb2.Deployment.STATE_FAILED or time.monotonic() > deadline:
            raise RuntimeError(f"deployment {did} of {t.name} not ready: {dep.reason or dep.state}")
        await asyncio.sleep(0.2)


async def _cleanup(tenants: list[_Tenant]) -> None:
    for t in tenants:
        for job in t.jobs:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await t.client.cancel_job(job)
        for name in t.deployed:
            with contextlib.suppress(grpc.aio.AioRpcError):
                await t.client.router.DeleteDeployment(router_pb2.DeleteDeploymentRequest(name=name),
                                                       metadata=t.client.md, timeout=30)


def synthetic_prompt(seed: int, index: int, n_tokens: int) -> list[int]:
    """The prompt of arrival ``index``: ``n_tokens`` ids drawn from (seed, index) alone, so a replay sends the
    same prompts whatever was dropped or reordered before it (ids within every preset's vocabulary)."""
    return np.random.default_rng((seed, index)).integers(100, 30000, n_tokens).tolist()


async def run(scenario: Scenario, target: Target, *, run_id: str | None = None,
              progress: Callable[[str], None] | None = None, timebase: Timebase | None = None) -> Run:
    """Set up, send the whole timeline open-loop, drain, clean up; returns every arrival's result. ``timebase``:
    the event clock this process already takes part in (a scenario run), instead of joining one."""
    if timebase is not None:
        return await _run(scenario, target, timebase, run_id, progress)
    if not target.clock_coordinator:
        return await _run(scenario, target, Timebase(), run_id, progress)
    if not target.admin_key:
        raise InvalidArgument("admin_key", "a load generator in event-clock mode takes part in the clock, which "
                                           "needs the admin key (GIGACLUSTER_ADMIN_KEY or credentials)")
    async with participate(target.clock_coordinator, "loadtest", key=target.admin_key) as clock:
        return await _run(scenario, target, Timebase(clock, target.admin_key), run_id, progress)


async def _run(scenario: Scenario, target: Target, tb: Timebase, run_id: str | None,
               progress: Callable[[str], None] | None) -> Run:
    say = progress or (lambda _msg: None)
    run_id = run_id or f"{int(time.time()) % 100000}"
    if any(s.kind == "http_completions" for s in scenario.streams) and not target.http_url:
        raise InvalidArgument("http_url", "an http_completions stream needs the router's HTTP URL (--http)")
    timeline = schedule.build(scenario)
    jobs: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}
    for i, s in enumerate(scenario.streams):
        if s.kind == "submit_job":
            jobs[i] = split_job_file(safeyaml.load_file(scenario.resolve(s.job)))
    tenants = [_Tenant(name, key, Client(target.endpoints, key))
               for name, key in await _create_tenants(target, scenario.tenants, run_id)]
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                    connector=aiohttp.TCPConnector(limit=0))
    results: list[Result] = []
    start = 0.0
    try:
        if scenario.deploy:
            say(f"deploying {scenario.deploy.get('deployment_id')} for {len(tenants)} tenant(s)")
            await asyncio.gather(*(_ensure_deployment(t, scenario.deploy) for t in tenants))
        say(f"{len(timeline)} arrivals over {scenario.duration_s:g} s")
        loop = asyncio.get_running_loop()
        in_flight: dict[asyncio.Task[Any], Result] = {}
        wall0 = loop.time()
        start = tb.now() + START_LEAD_S
        per_stream_count = [0] * len(scenario.streams)

        async def one(i: int, intended: float, r: Result) -> None:
            si = int(timeline.stream[i])
            s = scenario.streams[si]
            t = tenants[per_stream_count[si] % len(tenants)]
            per_stream_count[si] += 1
            n_prompt, n_out = int(timeline.prompt_tokens[i]), int(timeline.max_tokens[i])
            prompt = synthetic_prompt(scenario.seed, i, n_prompt) if s.kind != "submit_job" else []
            if s.kind == "generate":
                await drivers.generate(t.client, r, intended, model=scenario.model_of(s), prompt=prompt,
                                       max_tokens=n_out, priority=s.priority, tb=tb)
            elif s.kind == "http_completions":
                await drivers.http_completion(session, target.http_url, t.key, r, intended,
                                              model=scenario.model_of(s), prompt=prompt, max_tokens=n_out,
                                              priority=s.priority, tb=tb)
            else:
                spec, job = jobs[si]
                _, name = await drivers.submit_job(t.client, r, intended, spec=spec,
                                                   job={**job, "name": f"{job.get('name', 'lt')}-{i}"}, tb=tb)
                if name:
                    t.jobs.append(name)

        for i in range(len(timeline)):
            intended = start + float(timeline.t_s[i])
            await tb.until(intended)
            if len(in_flight) >= scenario.max_in_flight:
                results.append(Result(int(timeline.stream[i]), intended - start, status="DROPPED"))
                continue
            r = Result(int(timeline.stream[i]), intended - start)
            results.append(r)
            task = asyncio.create_task(one(i, intended, r))
            in_flight[task] = r
            task.add_done_callback(in_flight.pop)
        say(f"sent; draining {len(in_flight)} in flight (up to {scenario.drain_s:g} s)")
        if in_flight:
            _done, pending = await asyncio.wait(set(in_flight), timeout=scenario.drain_s)
            given_up = [in_flight[task] for task in pending]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            # Calls the client gave up on at the drain's end: whatever the cancellation made the call raise
            # (gRPC reports CANCELLED for a call its own client cancels), the server had not answered them.
            for r in given_up:
                r.status, r.detail = "TIMEOUT", f"no answer within the {scenario.drain_s:g} s drain"

        elapsed_s = tb.now() - start
        wall_s = loop.time() - wall0 - (0.0 if tb.virtual else START_LEAD_S)
    finally:
        await session.close()
        await _cleanup(tenants)
        for t in tenants:
            await t.client.close()
    return Run(scenario, results, wall_s, [t.name for t in tenants], start, elapsed_s=elapsed_s, virtual=tb.virtual)
