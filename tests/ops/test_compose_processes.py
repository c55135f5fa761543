"""Every service deploy/docker-compose.yml starts runs here as a plain process with the same command,
flags and variables (compose host names mapped to loopback ports), behind a real Mosquitto using the
generated password and ACL files: all answer SERVING, the broker sees both shards, metrics are served,
telemetry arrives for the admin MQTT user, and SIGTERM stops each cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator

import aiomqtt
import grpc
import pytest
import pytest_asyncio

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.cli.health import SERVING, check
from gigacluster.runtime.auth import call_metadata
from gigacluster.stack import free_port as _free_port
from tests.conftest import mosquitto_exe
from tests.ops.compose import DEPLOY, ServiceRun, service_runs

pytestmark = pytest.mark.integration
ORDER = ("chip", "fabric", "broker", "scheduler", "router")


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class LocalCompose:
    """The compose file's gigacluster services and Mosquitto as local processes on free ports."""

    def __init__(self, tmp: pathlib.Path) -> None:
        self.tmp = tmp
        self.runs = sorted(service_runs(), key=lambda r: ORDER.index(r.service))
        self.grpc: dict[str, int] = {}
        self.metrics: dict[str, int] = {}
        self.procs: dict[str, asyncio.subprocess.Process] = {}
        self.mosquitto_port = _free_port()
        self.mosquitto: asyncio.subprocess.Process | None = None
        self.env = self.runs[0].env

    def _local(self, run: ServiceRun, value: str) -> str:
        """Map compose HOST:PORT references to the loopback ports this test picked."""
        def sub(m: re.Match[str]) -> str:
            host = m.group(1)
            if host == "mosquitto":
                return f"127.0.0.1:{self.mosquitto_port}"
            return f"127.0.0.1:{self.grpc[host]}" if host in self.grpc else m.group(0)
        return re.sub(r"([\w][\w.-]*):(\d+)", sub, value)

    def argv_env(self, run: ServiceRun) -> tuple[list[str], dict[str, str]]:
        flags = dict(run.flags)
        flags["port"] = str(self.grpc[run.name])
        if "http_port" in flags:
            flags["http_port"] = str(_free_port())
        argv = [sys.executable, "-m", "gigacluster.cli.main", "serve", run.service]
        for k, v in flags.items():
            argv += ["--" + k.replace("_", "-"), self._local(run, v)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIGACLUSTER_")}
        env.update({k: self._local(run, v) for k, v in run.env.items()})
        env.update(GIGACLUSTER_HOST="127.0.0.1", GIGACLUSTER_METRICS_PORT=str(self.metrics[run.name]),
                   PYTHONUNBUFFERED="1")
        if "GIGACLUSTER_STATE_DIR" in env:
            state = self.tmp / run.name
            state.mkdir(exist_ok=True)
            env["GIGACLUSTER_STATE_DIR"] = str(state)
        return argv, env

    async def start(self) -> None:
        conf = (DEPLOY / "mosquitto" / "mosquitto.conf").read_text()
        conf = re.sub(r"^listener \d+", f"listener {self.mosquitto_port} 127.0.0.1", conf, flags=re.M)
        for name in ("passwd", "acl"):
            dst = self.tmp / name
            shutil.copy(DEPLOY / "mosquitto" / name, dst)
            dst.chmod(0o644)
            conf = conf.replace(f"/mosquitto/config/{name}", str(dst))
        conf = conf.replace("log_dest stdout", "log_dest none")
        (self.tmp / "mosquitto.conf").write_text(conf)
        for path in (self.tmp, *self.tmp.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)  # Mosquitto drops root for its own user
        self.mosquitto = await asyncio.create_subprocess_exec(
            mosquitto_exe(), "-c", str(self.tmp / "mosquitto.conf"),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not _listening(self.mosquitto_port):
            assert self.mosquitto.returncode is None, "mosquitto exited at start"
            assert time.monotonic() < deadline, "mosquitto not listening"
            await asyncio.sleep(0.05)
        for r in self.runs:
            self.grpc[r.name] = _free_port()
            self.metrics[r.name] = _free_port()
        for r in self.runs:
            argv, env = self.argv_env(r)
            log = (self.tmp / f"{r.name}.log").open("wb")
            self.procs[r.name] = await asyncio.create_subprocess_exec(*argv, env=env, stdout=log, stderr=log,
                                                                      start_new_session=True)
            log.close()

    async def wait_serving(self, timeout_s: float = 60.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        status: dict[str, str] = {}
        for name, port in self.grpc.items():
            while True:
                code, status[name] = await check(f"127.0.0.1:{port}", timeout_s=1.0)
                if code == SERVING:
                    break
                p = self.procs[name]
                if p.returncode is not None or time.monotonic() > deadline:
                    log = (self.tmp / f"{name}.log").read_text()[-2000:]
                    raise AssertionError(f"{name} not SERVING ({status[name]}, rc={p.returncode}):\n{log}")
                await asyncio.sleep(0.1)
        return status

    async def stop(self) -> dict[str, int | None]:
        codes: dict[str, int | None] = {}
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(p.wait(), 15)
                except TimeoutError:
                    p.kill()
                    await p.wait()
            codes[name] = p.returncode
        if self.mosquitto is not None and self.mosquitto.returncode is None:
            self.mosquitto.terminate()
            await self.mosquitto.wait()
        return codes


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def local_compose() -> AsyncIterator[LocalCompose]:
    # Not tmp_path: its parents are private to root, and Mosquitto reads the files as its own user.
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="gc-compose-"))
    lc = LocalCompose(tmp)
    try:
        await lc.start()
        yield lc
    finally:
        await lc.stop()
        shutil.rmtree(tmp, ignore_errors=True)


async def test_health_cli_exits_0_for_serving_and_2_for_no_answer(local_compose: LocalCompose) -> None:
    """`python -m gigacluster.cli.health HOST:PORT` (the compose health check) exits 0 on a SERVING service
    and 2 where nothing listens."""
    await local_compose.wait_serving()
    port = local_compose.grpc["scheduler"]
    ok = await asyncio.create_subprocess_exec(sys.executable, "-m", "gigacluster.cli.health", f"127.0.0.1:{port}",
                                              stdout=asyncio.subprocess.PIPE)
    out, _ = await ok.communicate()
    assert ok.returncode == 0 and out.decode().strip() == f"127.0.0.1:{port} SERVING"
    dead = await asyncio.create_subprocess_exec(sys.executable, "-m", "gigacluster.cli.health",
                                                f"127.0.0.1:{_free_port()}", "--timeout", "0.5", "--quiet")
    assert await dead.wait() == 2


async def test_compose_services_run_as_plain_processes_and_stop_on_sigterm(local_compose: LocalCompose) -> None:
    """Each compose service, started with the compose command and variables, answers SERVING; the broker
    inventories both chip shards (64 devices); chip and fabric serve their Prometheus metrics; the services
    publish telemetry through Mosquitto with the generated credentials; SIGTERM ends every one with 0."""
    lc = local_compose
    status = await lc.wait_serving()
    assert set(status.values()) == {"SERVING"} and len(status) == len(lc.runs) >= 6

    admin_key = lc.env["GIGACLUSTER_ADMIN_KEY"]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{lc.grpc['broker']}") as ch:
        inv = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (inv is None or len(inv.shards) < 2):
            with contextlib.suppress(grpc.aio.AioRpcError):
                inv = await broker_pb2_grpc.BrokerServiceStub(ch).GetInventory(
                    broker_pb2.GetInventoryRequest(), metadata=call_metadata(api_key=admin_key), timeout=2)
            await asyncio.sleep(0.1)
    assert inv is not None and inv.cluster == lc.env["GIGACLUSTER_CLUSTER"]
    assert len(inv.shards) == 2 and inv.free_devices == 64

    def scrape(name: str) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{lc.metrics[name]}/metrics", timeout=5) as resp:
            return resp.read().decode()

    assert "DCGM_FI_DEV_POWER_USAGE{" in await asyncio.to_thread(scrape, "chip-1")
    assert "gigacluster_link_utilization" in await asyncio.to_thread(scrape, "fabric")

    topics: list[str] = []
    async with aiomqtt.Client("127.0.0.1", lc.mosquitto_port, username="admin",
                              password=lc.env["MQTT_PASSWORD_ADMIN"]) as mq:
        await mq.subscribe(f"gigacluster/{lc.env['GIGACLUSTER_CLUSTER']}/#")
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                async for msg in mq.messages:
                    topics.append(str(msg.topic))
                    json.loads(msg.payload)  # type: ignore[arg-type]
                    if any("/chip/" in t for t in topics):
                        break
    assert any("/chip/" in t for t in topics), topics

    codes = await lc.stop()
    assert codes == {name: 0 for name in lc.procs}, codes
