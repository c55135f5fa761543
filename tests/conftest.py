"""Shared fixtures: a real Mosquitto broker and a real five-process mesh (never mocks).

The mesh is started once per test session with :class:`gigacluster.stack.Stack`, the same code
``gigacluster up`` runs, on free ports, publishing telemetry to the Mosquitto started here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio

from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.stack import Stack, StackConfig
from gigacluster.stack import free_port as _free_port

TEST_SPEEDUP = 10.0


def required_exe(name: str, package: str, *, fallback: str | None = None) -> str:
    """The path of the tool ``name`` (or ``fallback`` when it exists); fails, never skips, naming the
    Debian ``package`` that provides it."""
    exe = shutil.which(name) or (fallback if fallback is not None and os.path.exists(fallback) else None)
    if exe is None:
        pytest.fail(f"{name} is required: apt-get install -y {package} (see .ci/run)")
    return exe


def mosquitto_exe() -> str:
    return required_exe("mosquitto", "mosquitto", fallback="/usr/sbin/mosquitto")


def live_config(cluster: str, mosquitto: str, state_dir: pathlib.Path, **overrides: Any) -> StackConfig:
    """The integration tests' mesh: 64 H100 in two shards on free ports, JSON logs, telemetry to
    ``mosquitto``, state in ``state_dir``, crashed services restarted; ``overrides`` change any field."""
    fields: dict[str, Any] = dict(cluster=cluster, chip="h100-sxm", chips=64, shards=2, speedup=TEST_SPEEDUP,
                                  mqtt=mosquitto, ports={k: 0 for k in DEFAULT_PORTS}, state_dir=state_dir,
                                  log_format="json", restart=True)
    return StackConfig(**(fields | overrides))


@contextlib.asynccontextmanager
async def live_stack(cluster: str, mosquitto: str, state_dir: pathlib.Path, **overrides: Any) -> AsyncIterator[Stack]:
    """A running :func:`live_config` mesh, stopped on exit."""
    st = Stack(live_config(cluster, mosquitto, state_dir, **overrides))
    await st.start()
    try:
        yield st
    finally:
        await st.stop()


@pytest.fixture(scope="session")
def mosquitto() -> Iterator[str]:
    """A real Mosquitto on a free loopback port; yields HOST:PORT."""
    port = _free_port()
    d = tempfile.mkdtemp(prefix="gc-mosquitto-")
    os.chmod(d, 0o755)
    conf = pathlib.Path(d) / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    conf.chmod(0o644)
    proc = subprocess.Popen([mosquitto_exe(), "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None:
            pytest.fail(f"mosquitto exited: {proc.stderr.read().decode() if proc.stderr else ''}")
        time.sleep(0.05)
    yield f"127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)
    if proc.stderr is not None:
        proc.stderr.close()
    shutil.rmtree(d, ignore_errors=True)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def stack(mosquitto: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Stack]:
    """The five services as real processes (64 H100, one shard) on free ports, telemetry to Mosquitto."""
    async with live_stack("itest", mosquitto, tmp_path_factory.mktemp("stack"), metrics=True) as st:
        yield st


_tenant_seq = iter(range(1, 10_000))


@pytest_asyncio.fixture(loop_scope="session")
async def tenant(stack: Stack) -> AsyncIterator[Client]:
    """A fresh tenant with its own API key, connected to the mesh."""
    key = await stack.create_tenant(f"t{next(_tenant_seq)}-{os.getpid() % 1000}")
    async with Client(stack.endpoints, key) as gc:
        yield gc


@pytest_asyncio.fixture(loop_scope="session")
async def admin(stack: Stack) -> AsyncIterator[Client]:
    """A client holding the admin key."""
    async with Client(stack.endpoints, stack.admin_key) as gc:
        yield gc


async def wait_for(cond: object, timeout_s: float = 30.0) -> None:
    """Poll an async predicate until true (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await cond():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise TimeoutError("condition not met in time")
