"""The router's front-end processes, as the core runs them (``frontends`` > 0).

The core reserves the public gRPC and HTTP ports with sockets bound ``SO_REUSEPORT`` that never
listen (so a port given as 0 is fixed once, and stays the router's while front ends come and
go), starts ``frontends`` processes (:mod:`.frontend`) that listen on those ports with
``SO_REUSEPORT`` too (the kernel spreads connections over them), and serves their links
(:class:`.link.CoreLink`) on a Unix socket in a private directory; each front end proves itself
with a secret it got from the core. A front end that exits (kill -9 included) is started again
with backoff; its open requests are dropped (their clients see the connection close), the
deployments and the other front ends are untouched. Front ends exit when the core goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import socket
import sys
import tempfile
from typing import Any

import structlog

from gigacluster.router.link import CoreLink
from gigacluster.router.overload import Overload
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime.accept_probe import AcceptProbe
from gigacluster.runtime.config import RouterConfig

log = structlog.get_logger()
FRONTEND_ENV = "GIGACLUSTER_ROUTER_FRONTEND"  # the front end's settings (JSON), set by the core for its child
RESTART_BACKOFF_MAX_S = 5.0


#: The Generate method's path, as gRPC names it on the wire (the accept probe sends it).
GENERATE_METHOD = "/{}/Generate".format(router_pb2.DESCRIPTOR.services_by_name["RouterService"].full_name)


def accept_probe(config: RouterConfig, overload: Overload) -> AcceptProbe | None:
    """The probe of Generate calls waiting in gRPC's core for a process that takes them (the router, or a front
    end), feeding ``overload`` and refusing through it; None when ``accept_probe_interval_s`` is 0."""
    if config.accept_probe_interval_s <= 0:
        return None
    probe = AcceptProbe(GENERATE_METHOD, config.accept_probe_interval_s)
    overload.accept_lag = probe.lag_s
    probe.shed = overload.screen
    return probe


async def set_router_health(service: Any, status: Any) -> None:
    """Set the gRPC health of ``service`` (the router, or a front end) for the server and RouterService."""
    health = getattr(service, "health", None)  # set by create_server; absent in unit tests
    if health is not None:
        for name in ("", router_pb2.DESCRIPTOR.services_by_name["RouterService"].full_name):
            await health.set(name, status)


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with SO_REUSEPORT that never listens: it fixes the port (0 = any free
    one) for the front ends without taking any of their connections."""
    info = socket.getaddrinfo(host.strip("[]") or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    s = socket.socket(info[0], socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(info[4])
    return s


class FrontendPool:
    """Reserves the public ports, serves the links, keeps ``config.frontends`` front-end processes running."""

    def __init__(self, config: RouterConfig, link: CoreLink) -> None:
        self.config = config
        self.link = link
        self._reserved = [reserve_port(config.host, config.port)]
        self.port = int(self._reserved[0].getsockname()[1])
        self.http_port = config.http_port
        if config.http_port >= 0:
            self._reserved.append(reserve_port(config.host, config.http_port))
            self.http_port = int(self._reserved[1].getsockname()[1])
        self._dir = tempfile.mkdtemp(prefix="gigacluster-router-")  # mode 0700: only this user reaches the link
        self.path = os.path.join(self._dir, "link.sock")
        self.core_path = os.path.join(self._dir, "core.sock")  # the core's gRPC server (unary calls forwarded)
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.restarts = 0
        self._server: asyncio.AbstractServer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    def settings(self, index: int, core_address: str) -> str:
        """What front end ``index`` runs with: the router's config on the public ports (no telemetry, metrics
        or clock of its own: the core keeps those), the link and the core's gRPC address for the unary calls.
        Its stream-message budget is its share of the router's (``stream_messages_per_s`` is what the router
        as a whole aims to send; each front end paces only its own streams)."""
        cfg = dataclasses.replace(self.config, port=self.port, http_port=self.http_port, frontends=0, mqtt="",
                                  metrics_port=-1, clock="wall", clock_coordinator="",
                                  stream_messages_per_s=self.config.stream_messages_per_s / self.config.frontends)
        return json.dumps({"config": dataclasses.asdict(cfg), "link": self.path, "secret": self.link.secret,
                           "index": index, "core": core_address, "core_pid": os.getpid()})

    async def start(self, core_address: str) -> None:
        self._server = await asyncio.start_unix_server(self.link.serve, path=self.path)
        os.chmod(self.path, 0o600)
        for i in range(self.config.frontends):
            self._tasks.append(asyncio.ensure_future(self._keep(i, core_address)))
        log.info("router front ends", processes=self.config.frontends, grpc_port=self.port, http_port=self.http_port)

    async def _keep(self, index: int, core_address: str) -> None:
        """Run front end ``index``, and start it again whenever it exits (backoff while it keeps failing)."""
        delay = 0.2
        while True:
            env = {**os.environ, FRONTEND_ENV: self.settings(index, core_address)}
            proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "gigacluster.router.frontend", env=env)
            self.procs[index] = proc
            t0 = asyncio.get_running_loop().time()
            code = await proc.wait()
            self.restarts += 1
            if asyncio.get_running_loop().time() - t0 > 10:
                delay = 0.2
            log.warning("router front end exited; restarting it", frontend=index, pid=proc.pid, code=code,
                        restart_in_s=delay)
            await asyncio.sleep(delay)
            delay = min(2 * delay, RESTART_BACKOFF_MAX_S)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for proc in self.procs.values():
            if proc.returncode is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                await asyncio.wait_for(proc.wait(), self.config.grace_s + 2)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        if self._server is not None:
            self._server.close()
        for s in self._reserved:
            s.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(self._dir)
