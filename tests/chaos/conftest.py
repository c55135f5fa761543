"""Shared pieces of the chaos suite: small stacks of its own, a tally that prints, bounded waits.

Every test here starts real processes on free loopback ports and bounds every loop in count and
wall time. Counts are printed (run with ``-s`` to see them) and, when ``GIGACLUSTER_CHAOS_REPORT``
names a file, merged into it as JSON so docs/reliability.md can quote the last run.
"""

from __future__ import annotations

import json
import os
import pathlib
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
import pytest_asyncio

from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.stack import Stack, StackConfig

from ..conftest import TEST_SPEEDUP

CAPABILITY_TTL_S = 3.0  # short token lifetime, so "several lifetimes" fits in a test
MAX_ERROR_CHARS = 1024  # an error message quotes at most a short prefix of hostile input


def report(section: str, data: dict[str, Any]) -> None:
    """Print a section of figures and merge it into $GIGACLUSTER_CHAOS_REPORT (JSON) when set."""
    print(f"\n[chaos] {section}: {json.dumps(data, sort_keys=True, default=str)}")
    path = os.environ.get("GIGACLUSTER_CHAOS_REPORT")
    if not path:
        return
    p = pathlib.Path(path)
    cur = json.loads(p.read_text()) if p.is_file() else {}
    cur[section] = data
    p.write_text(json.dumps(cur, indent=2, sort_keys=True, default=str))


class Tally:
    """Attempts and leaks of one adversarial family, with the failing cases named."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []

    def ok(self, what: str = "attempts") -> None:
        self.counts["attempts"] += 1
        self.counts["denied"] += 1

    def leak(self, detail: str) -> None:
        self.counts["attempts"] += 1
        self.counts["leaks"] += 1
        self.failures.append(detail)

    def check(self, cond: bool, detail: str) -> bool:
        (self.ok() if cond else self.leak(detail))
        return cond


def stack_config(tmp: pathlib.Path, cluster: str, *, chips: int = 16, restart: bool = False, http: bool = False,
                 ttl_s: float = CAPABILITY_TTL_S, extra_env: dict[str, str] | None = None) -> StackConfig:
    """A small mesh of its own: embedded enforcing MQTT broker, free ports, short capability lifetime."""
    env = {"GIGACLUSTER_BROKER_CAPABILITY_TTL_S": repr(ttl_s)}
    env.update(extra_env or {})
    return StackConfig(cluster=cluster, chip="h100-sxm", chips=chips, shards=1, speedup=TEST_SPEEDUP, mqtt="",
                       mqtt_port=0, ports={k: 0 for k in DEFAULT_PORTS}, state_dir=tmp, http_port=0 if http else -1,
                       log_format="json", restart=restart, extra_env=env)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def shared_mesh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """A 32-chip mesh (HTTP endpoint on) per module, so one module's damage (poisoned devices) cannot blur
    another's results. Its tokens live 120 s, so token expiry (the idle test's subject) cannot either."""
    st = Stack(stack_config(tmp_path_factory.mktemp("chaos-shared"), "chaos", chips=32, http=True, ttl_s=120))
    await st.start()
    try:
        yield st
    finally:
        await st.stop()


async def deploy(gc: Client, deployment_id: str, *, replicas: int = 1, wait_s: float = 60.0) -> router_pb2.Deployment:
    """Deploy a one-chip llama3-8b and wait (bounded) until it is READY."""
    import asyncio

    dep = (await gc.router.DeployModel(router_pb2.DeployModelRequest(
        deployment_id=deployment_id, model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm", tp=1,
        replicas=replicas, max_batch=16), metadata=gc.md, timeout=30)).deployment
    deadline = time.monotonic() + wait_s
    while dep.state != router_pb2.Deployment.STATE_READY:
        if time.monotonic() > deadline or dep.state == router_pb2.Deployment.STATE_FAILED:
            raise AssertionError(f"deployment {dep.name} not ready: {dep.state} {dep.reason}")
        await asyncio.sleep(0.2)
        dep = (await gc.router.GetDeployment(router_pb2.GetDeploymentRequest(name=dep.name), metadata=gc.md,
                                             timeout=10)).deployment
    return dep


async def generate_once(gc: Client, model: str, prompt: str, *, max_tokens: int = 4,
                        timeout_s: float = 10.0) -> router_pb2.GenerateResponse:
    """One whole generation; returns the last chunk (with usage). Raises AioRpcError on failure."""
    last: router_pb2.GenerateResponse | None = None
    call = gc.router.Generate(router_pb2.GenerateRequest(model=model, text=prompt, max_tokens=max_tokens),
                              metadata=gc.md, timeout=timeout_s)
    async for chunk in call:
        last = chunk
    if last is None:
        raise AssertionError("Generate ended without a chunk")
    return last


async def serves_within(gc: Client, model: str, budget_s: float, prompt: str = "are you back?") -> float:
    """Seconds until ``model`` answers a whole generation again (raises after ``budget_s`` + one call)."""
    import asyncio

    t0 = time.monotonic()
    last_err = ""
    while time.monotonic() - t0 < budget_s:
        try:
            await generate_once(gc, model, prompt, timeout_s=max(1.0, budget_s))
            return time.monotonic() - t0
        except grpc.aio.AioRpcError as err:
            last_err = f"{err.code().name}: {(err.details() or '')[:200]}"
        await asyncio.sleep(0.1)
    raise AssertionError(f"{model} not served within {budget_s}s: {last_err}")
