"""kill -9 of ``gigacluster up`` itself, then ``up`` again on the same state directory.

``up`` runs as a real subprocess with its own GIGACLUSTER_HOME and free ports. Before the kill a
second tenant is created, jobs are submitted (one finished, one running) and each tenant has a
deployment. After the kill (its services follow it down) and a fresh ``up`` on the same state
directory: the same API keys and admin key work, the second tenant still exists, no job is lost
(the finished one stays finished), both deployments are listed and serve within 5 s of ``up``
reporting itself up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import random
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import grpc
import pytest

from gigacluster.broker.v1 import broker_pb2
from gigacluster.client import Client, Endpoints
from gigacluster.runtime.auth import call_metadata
from gigacluster.scheduler.v1 import scheduler_pb2

from .conftest import deploy, report, serves_within

pytestmark = [pytest.mark.chaos, pytest.mark.integration]
UP_BUDGET_S = 120.0
SERVE_AGAIN_S = 5.0
SPEC = {"model": {"preset": "llama3-8b", "seq_len": 2048}, "batch": {"global_batch": 16},
        "parallelism": {"tp": 8}, "hardware": {"chip": "h100-sxm", "count": 8}, "precision": "bf16"}


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _free_block(n: int) -> int:
    """The first of ``n`` consecutive free loopback ports (bounded random search)."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 60000 - n)
        if all(_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no block of free ports")


class Up:
    """One ``gigacluster up`` subprocess on fixed (pre-picked free) ports and a temp home."""

    def __init__(self, home: pathlib.Path, base: int) -> None:
        self.home, self.base = home, base
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = home / f"up-{base}.log"

    @property
    def ports(self) -> list[int]:
        return [self.base + i for i in range(7)]  # five gRPC, HTTP, MQTT

    def start(self) -> None:
        env = dict(os.environ, GIGACLUSTER_HOME=str(self.home))
        argv = [sys.executable, "-m", "gigacluster.cli.main", "up", "--cluster", "chaosup", "--chips", "24",
                "--speedup", "10", "--base-port", str(self.base), "--http-port", str(self.base + 5),
                "--mqtt-port", str(self.base + 6), "--metrics-port", "0"]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    async def wait_up(self) -> float:
        deadline = time.monotonic() + UP_BUDGET_S
        while b"gigacluster is up" not in self.log.read_bytes().split(b"== restart ==")[-1]:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"up exited {self.proc.returncode}: {self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"up not up in {UP_BUDGET_S}s: {self.tail()}")
            await asyncio.sleep(0.2)
        return time.monotonic()

    def tail(self) -> str:
        return self.log.read_bytes()[-1500:].decode(errors="replace")

    def credentials(self) -> dict[str, Any]:
        return dict(json.loads((self.home / "chaosup" / "credentials.json").read_text()))

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    async def wait_services_gone(self, budget_s: float = 30.0) -> None:
        """The killed up's services follow it down (PDEATHSIG): nothing answers on its ports any more."""
        deadline = time.monotonic() + budget_s
        while True:
            live = [p for p in self.ports[:6] if _listening(p)]
            if not live:
                return
            assert time.monotonic() < deadline, f"services of the killed up still listen on {live}"
            await asyncio.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


async def test_kill9_of_up_then_up_again_loses_nothing(tmp_path: pathlib.Path) -> None:
    """Keys, tenants, jobs and deployments survive kill -9 of ``up`` and a restart on the same state dir."""
    up = Up(tmp_path, _free_block(7))
    up.start()
    problems: list[str] = []
    figures: dict[str, Any] = {}
    try:
        await up.wait_up()
        creds = up.credentials()
        eps = Endpoints.from_dict(creds["endpoints"])
        async with Client(eps, creds["admin_key"]) as admin, Client(eps, creds["api_key"]) as dflt:
            extra_key = (await admin.broker.CreateTenant(broker_pb2.CreateTenantRequest(tenant_id="extra"),
                                                         metadata=admin.md, timeout=10)).api_key
            async with Client(eps, extra_key) as extra:
                done = await dflt.submit_job({**SPEC, "steps": 2}, name="short")
                async for _ in dflt.watch_job(done.name):
                    pass
                long = await dflt.submit_job({**SPEC, "steps": 5000}, name="long", checkpoint_interval_steps=5,
                                             max_restarts=20)
                extra_dep = await deploy(extra, "extra-dep")
                await serves_within(dflt, "deployments/llama3-8b", 60.0)
        up.kill9()
        await up.wait_services_gone()
        with up.log.open("ab") as f:
            f.write(b"\n== restart ==\n")
        up.start()
        t_up = await up.wait_up()
        creds2 = up.credentials()
        if creds2["api_key"] != creds["api_key"] or creds2["admin_key"] != creds["admin_key"]:
            problems.append("up rotated the keys in credentials.json")
        async with Client(eps, creds["admin_key"]) as admin:
            for who, key in (("admin", creds["admin_key"]), ("default", creds["api_key"]), ("extra", extra_key)):
                try:
                    await admin.broker.GetInventory(broker_pb2.GetInventoryRequest(),
                                                    metadata=call_metadata(api_key=key), timeout=10)
                except grpc.aio.AioRpcError as err:
                    problems.append(f"the {who} key from before the kill is refused: {err.code().name}")
        # Whether the keys survived is judged above; what they guarded is judged with the keys up wrote now,
        # so a rotated key is not misreported as lost jobs and deployments.
        async with Client(eps, creds2["admin_key"]) as admin2, Client(eps, creds2["api_key"]) as dflt2:
            try:
                tenants = {t.name for t in (await admin2.broker.ListTenants(
                    broker_pb2.ListTenantsRequest(page_size=100), metadata=admin2.md, timeout=10)).tenants}
                if "tenants/extra" not in tenants:
                    problems.append(f"tenant 'extra' lost (tenants now {sorted(tenants)})")
            except grpc.aio.AioRpcError as err:
                problems.append(f"ListTenants: {err.code().name}")
            for name, want in ((done.name, scheduler_pb2.Job.STATE_SUCCEEDED), (long.name, None)):
                try:
                    job = await admin2.get_job(name)
                    if want is not None and job.state != want:
                        problems.append(f"{name} is {scheduler_pb2.Job.State.Name(job.state)} after restart")
                except grpc.aio.AioRpcError as err:
                    problems.append(f"job {name} lost: {err.code().name}")
            for gc, dep in ((dflt2, "deployments/llama3-8b"), (admin2, extra_dep.name)):
                try:
                    figures[dep] = round(await serves_within(gc, dep, SERVE_AGAIN_S), 2)
                except (AssertionError, grpc.aio.AioRpcError) as exc:
                    problems.append(f"{dep} not served within {SERVE_AGAIN_S}s of up: {str(exc)[:160]}")
            figures["up_to_first_check_s"] = round(time.monotonic() - t_up, 2)
            with contextlib.suppress(grpc.aio.AioRpcError):
                await admin2.cancel_job(long.name)
    finally:
        up.stop()
        report("kill9_up", {"figures": figures, "problems": problems})
    assert problems == []
