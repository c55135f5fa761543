"""Start and supervise a whole local mesh: five service processes and an MQTT broker.

Used by ``gigacluster up``, ``gigacluster demo`` and the integration tests, so the tests run the
exact processes a user runs. Each service is its own OS process (``gigacluster serve ...``);
the supervisor restarts one that dies, with exponential backoff (0.5 s doubling to 30 s) that
starts again from 0.5 s once the service has stayed up ``healthy_reset_s`` (60 s), and stops all on
exit.

With a state directory, the mesh's own secrets (admin key, service key, MQTT service and admin
passwords) live in ``<state_dir>/secrets.json`` (mode 0600) and are reused on the next start, so
restarting the stack on the same directory keeps every key; tenants and their keys live in the
isolation broker's database (``<state_dir>/broker.db``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import random
import signal
import socket
import sys
import time
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.client import DEFAULT_PORTS, Endpoints
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.channels import Tls, make_dev_pki, open_channel
from gigacluster.runtime.clock import CLOCK_MODES
from gigacluster.runtime.telemetry import EmbeddedBroker
from gigacluster.security.apikeys import new_api_key
from gigacluster.security.mqtt_auth import new_password

log = structlog.get_logger()
ORDER = ("chip", "fabric", "broker", "scheduler", "router")


#: Ports handed to services are drawn below the kernel's ephemeral range: a port picked from that
#: range can be taken as the local port of an outgoing connection (to the broker, a peer, MQTT)
#: between the moment it is picked and the moment its service binds it, and the service then fails
#: to start. Below the range only a listener can take it.
_LOW_PORT = 20000


def _ephemeral_low() -> int:
    try:
        return int(pathlib.Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing holds now, outside the ephemeral range when the system has room
    below it (else any free port the kernel offers)."""
    hi = _ephemeral_low()
    if hi - _LOW_PORT >= 1000:
        rng = random.SystemRandom()
        for _ in range(200):
            port = rng.randrange(_LOW_PORT, hi)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclasses.dataclass
class StackConfig:
    """What to start. Ports of 0 are picked free at start."""

    cluster: str = "local"
    chip: str = "h100-sxm"
    system: str = ""  # scale-up system (empty = the chip's default, e.g. trn3-ultraserver for trainium3)
    chips: int = 64
    shards: int = 1
    # Scale-out fat-tree: 0 / "" = chosen by the fabric from the size (sites.choose_scaleout); nic "" = the chip's own.
    tiers: int = 0
    switch: str = ""
    nic: str = ""
    routing: str = ""  # fabric routing mode (ecmp, spray); "" = the fabric's default (ecmp)
    oversubscription: float = 0.0  # leaf downlink:uplink ratio; 0 = the fabric's default (1, non-blocking)
    speedup: float = 1.0
    clock: str = "wall"  # or "event": a clock coordinator process, virtual time jumps when the mesh is idle
    mqtt: str = ""  # empty: start an embedded broker
    mqtt_port: int = 1883
    ports: dict[str, int] = dataclasses.field(default_factory=lambda: dict(DEFAULT_PORTS))
    state_dir: pathlib.Path | None = None
    http_port: int = -1  # the router's OpenAI-compatible endpoint: -1 off, 0 a free port
    log_format: str = "json"
    extra_env: dict[str, str] = dataclasses.field(default_factory=dict)
    restart: bool = True
    metrics: bool = False  # give every service a Prometheus /metrics port (see Stack.metrics_ports)
    # First metrics port: chip, fabric, broker, scheduler, router get base+0..4, chip shards 1.. base+5..;
    # 0 = free ports.
    metrics_base_port: int = 0
    tls: bool = False  # mutual TLS between every service and client (a local CA under state_dir/tls)
    restart_backoff_s: float = 0.5  # first restart delay; doubles per quick death up to restart_backoff_max_s
    restart_backoff_max_s: float = 30.0
    healthy_reset_s: float = 60.0  # a service up this long restarts again after restart_backoff_s
    router_frontends: int = 0  # router front-end processes sharing its ports (router.frontends; 0 = one process)

    def __post_init__(self) -> None:
        if self.chips < 1 or self.shards < 1 or self.chips % self.shards:
            raise ValueError("chips must be a positive multiple of shards")
        if not 0 <= self.metrics_base_port <= 65535 - len(ORDER) - self.shards:
            raise ValueError(f"metrics_base_port must leave room for {len(ORDER) + self.shards - 1} ports below 65536")
        if not 0 < self.restart_backoff_s <= self.restart_backoff_max_s or self.healthy_reset_s < 0:
            raise ValueError("need 0 < restart_backoff_s <= restart_backoff_max_s and healthy_reset_s >= 0")
        if self.clock not in CLOCK_MODES:
            raise ValueError(f"clock must be one of {', '.join(CLOCK_MODES)}; got {self.clock[:40]!r}")


#: Run in a small launcher process, then exec the service: ask for SIGTERM when the supervisor
#: dies, even by SIGKILL (Linux PR_SET_PDEATHSIG, kept across execve), so a killed ``up`` or test
#: run never leaves orphaned services holding ports and CPU; exit at once if the supervisor is
#: already gone. Not a ``preexec_fn``: that forces a plain fork of the supervisor, and a fork of a
#: process with live gRPC channels runs gRPC's fork handlers, which abort the child (SIGABRT,
#: "epoll_wait error: Bad file descriptor", grpc/grpc#43055); without it CPython spawns with vfork.
_LAUNCHER = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL('libc.so.6', use_errno=True).prctl(1, signal.SIGTERM)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(0)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def launch_argv(argv: list[str]) -> list[str]:
    """``argv`` wrapped so the service dies with this process (Linux); unchanged elsewhere."""
    if not sys.platform.startswith("linux"):
        return argv
    return [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *argv]


class Proc:
    """One supervised child process."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_path: pathlib.Path | None) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.started_s = 0.0  # time.monotonic() of the last start

    async def start(self) -> None:
        out: Any = asyncio.subprocess.DEVNULL
        if self.log_path is not None:
            out = self.log_path.open("ab")
        self.proc = await asyncio.create_subprocess_exec(*launch_argv(self.argv), env=self.env, stdout=out,
                                                         stderr=out, start_new_session=True)
        self.started_s = time.monotonic()
        if self.log_path is not None:
            out.close()

    async def stop(self, timeout_s: float = 10.0) -> None:
        p = self.proc
        if p is None or p.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(p.wait(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()


SECRETS = ("admin_key", "service_key", "mqtt_service_password", "mqtt_admin_password")


def load_or_create_secrets(state_dir: pathlib.Path | None) -> dict[str, str]:
    """The mesh's own secrets: read from ``<state_dir>/secrets.json`` if there, else new (and
    written there, mode 0600, before any service sees them)."""
    path = state_dir / "secrets.json" if state_dir is not None else None
    old: dict[str, Any] = {}
    if path is not None and path.is_file():
        try:
            old = json.loads(path.read_text())
        except ValueError as exc:
            raise ValueError(f"{path} is not valid JSON; restore it or remove the state directory") from exc
    out = {
        "admin_key": str(old.get("admin_key") or new_api_key()),
        "service_key": str(old.get("service_key") or new_api_key()),
        "mqtt_service_password": str(old.get("mqtt_service_password") or new_password()),
        "mqtt_admin_password": str(old.get("mqtt_admin_password") or new_password()),
    }
    if path is not None and out != old:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(".secrets.json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(out, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    return out


def next_backoff(delay_s: float, up_s: float, cfg: StackConfig) -> tuple[float, float]:
    """``(wait now, wait after the next quick death)`` for a service that died after ``up_s``:
    a healthy run (``up_s >= healthy_reset_s``) starts the backoff again from the first delay."""
    if up_s >= cfg.healthy_reset_s:
        delay_s = cfg.restart_backoff_s
    return delay_s, min(delay_s * 2, cfg.restart_backoff_max_s)


class Stack:
    """A running local mesh."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        secrets = load_or_create_secrets(cfg.state_dir)
        self.admin_key = secrets["admin_key"]
        self.service_key = secrets["service_key"]
        self.mqtt_service_password = secrets["mqtt_service_password"]
        self.mqtt_admin_password = secrets["mqtt_admin_password"]
        self.tenant_mqtt: dict[str, tuple[str, str]] = {}
        self.api_key: str | None = None
        self.epoch = time.time()
        self.procs: dict[str, Proc] = {}
        self.embedded: EmbeddedBroker | None = None
        self.mqtt = cfg.mqtt
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False
        self.ports = dict(cfg.ports)
        self.shard_ports: list[int] = []
        self.metrics_ports: dict[str, int] = {}
        self.tls: Tls | None = None
        self.tls_env: dict[str, str] = {}
        self.http_port = cfg.http_port
        self._picked: set[int] = set()

    def _free_port(self) -> int:
        """A free port not already handed to another service of this stack (the kernel may offer the
        same free port twice before the first taker binds it)."""
        for _ in range(100):
            port = free_port()
            if port not in self._picked:
                self._picked.add(port)
                return port
        raise RuntimeError("no distinct free port found")

    @property
    def openai_base_url(self) -> str:
        """Base URL of the router's OpenAI-compatible endpoint (empty when off)."""
        return f"http://127.0.0.1:{self.http_port}/v1" if self.http_port > 0 else ""

    @property
    def endpoints(self) -> Endpoints:
        return Endpoints(**{k: f"127.0.0.1:{self.ports[k]}" for k in DEFAULT_PORTS})

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update({
            "GIGACLUSTER_CLUSTER": self.cfg.cluster,
            "GIGACLUSTER_CLOCK_EPOCH": repr(self.epoch),
            "GIGACLUSTER_SPEEDUP": repr(self.cfg.speedup),
            "GIGACLUSTER_CLOCK": self.cfg.clock,
            "GIGACLUSTER_MQTT": self.mqtt,
            "GIGACLUSTER_ADMIN_KEY": self.admin_key,
            "GIGACLUSTER_SERVICE_KEY": self.service_key,
            "GIGACLUSTER_MQTT_USERNAME": "service",
            "GIGACLUSTER_MQTT_PASSWORD": self.mqtt_service_password,
            "GIGACLUSTER_BROKER_MQTT_ADMIN_PASSWORD": self.mqtt_admin_password,
            "GIGACLUSTER_BROKER": f"127.0.0.1:{self.ports['broker']}",
            "GIGACLUSTER_LOG_FORMAT": self.cfg.log_format,
            "PYTHONUNBUFFERED": "1",
        })
        if "clock" in self.ports:
            env["GIGACLUSTER_CLOCK_COORDINATOR"] = f"127.0.0.1:{self.ports['clock']}"
        if self.cfg.state_dir is not None:
            env["GIGACLUSTER_STATE_DIR"] = str(self.cfg.state_dir)
        env.update(self.tls_env)
        env.update(self.cfg.extra_env)
        return env

    def metrics_port_of(self, name: str) -> int:
        """The metrics port of service ``name`` (``chip-2`` for the third shard): fixed from
        ``metrics_base_port`` (the five services first, so their ports do not move with the shard
        count), else a free one; the same across supervisor restarts."""
        if name not in self.metrics_ports:
            base = self.cfg.metrics_base_port
            if not base:
                self.metrics_ports[name] = self._free_port()
            elif name in ORDER:
                self.metrics_ports[name] = base + ORDER.index(name)
            else:
                self.metrics_ports[name] = base + len(ORDER) - 1 + int(name.split("-")[1])
        return self.metrics_ports[name]

    @property
    def metrics_urls(self) -> dict[str, str]:
        """``/metrics`` URL of every service (empty when metrics are off)."""
        return {n: f"http://127.0.0.1:{p}/metrics" for n, p in self.metrics_ports.items()}

    def _argv(self, service: str, *flags: str, name: str = "") -> list[str]:
        extra: list[str] = []
        if self.cfg.metrics:
            extra = ["--metrics-port", str(self.metrics_port_of(name or service))]
        return [sys.executable, "-m", "gigacluster.cli.main", "serve", service, *flags, *extra]

    async def start(self) -> None:
        cfg = self.cfg
        self._picked.update(p for p in self.ports.values() if p)
        for k, v in list(self.ports.items()):
            if v == 0:
                self.ports[k] = self._free_port()
        if self.http_port == 0:
            self.http_port = self._free_port()
        if cfg.state_dir is not None:
            cfg.state_dir.mkdir(parents=True, exist_ok=True)
        if cfg.tls:
            if cfg.state_dir is None:
                raise ValueError("tls needs a state_dir for the certificates")
            self.tls_env = make_dev_pki(cfg.state_dir / "tls")
            self.tls = Tls.from_env(self.tls_env)
        if not self.mqtt:
            port = cfg.mqtt_port or self._free_port()
            # With a state dir, the embedded broker enforces the isolation broker's generated
            # credentials and ACLs (services write; each tenant reads only its own topics).
            pw = str(cfg.state_dir / "mqtt" / "passwd") if cfg.state_dir is not None else ""
            self.embedded = EmbeddedBroker("127.0.0.1", port, password_file=pw, cluster=cfg.cluster)
            await self.embedded.start()
            self.mqtt = self.embedded.endpoint
        per = cfg.chips // cfg.shards
        self.shard_ports = [self.ports["chip"]] + [self._free_port() for _ in range(cfg.shards - 1)]
        if cfg.clock == "event":
            self.ports["clock"] = self.ports.get("clock") or self._free_port()
        env = self._env()
        logs = cfg.state_dir / "logs" if cfg.state_dir is not None else None
        if logs is not None:
            logs.mkdir(exist_ok=True)

        def lp(name: str) -> pathlib.Path | None:
            return logs / f"{name}.log" if logs is not None else None

        if cfg.clock == "event":  # first: every other service registers with it as it starts
            services = cfg.shards + len(ORDER) - 1
            self.procs["clock"] = Proc("clock", [sys.executable, "-m", "gigacluster.clock", "--port",
                                                 str(self.ports["clock"]), "--expect", str(services)], env, lp("clock"))

        for i, port in enumerate(self.shard_ports):
            name = "chip" if i == 0 else f"chip-{i}"
            sysflag = ["--system", cfg.system] if cfg.system else []
            self.procs[name] = Proc(name, self._argv("chip", "--port", str(port), "--chip", cfg.chip, *sysflag,
                                                     "--device-offset", str(i * per), "--device-count", str(per),
                                                     name=name),
                                    env, lp(name))
        shards = ",".join(f"127.0.0.1:{p}" for p in self.shard_ports)
        tree = [f for k, v in (("--tiers", cfg.tiers), ("--switch", cfg.switch), ("--nic", cfg.nic),
                               ("--routing", cfg.routing), ("--oversubscription", cfg.oversubscription)) if v
                for f in (k, str(v))]
        self.procs["fabric"] = Proc("fabric", self._argv("fabric", "--port", str(self.ports["fabric"]), "--chip",
                                                         cfg.chip, "--count", str(cfg.chips),
                                                         *(["--system", cfg.system] if cfg.system else []), *tree),
                                    env, lp("fabric"))
        self.procs["broker"] = Proc("broker", self._argv("broker", "--port", str(self.ports["broker"]), "--shards",
                                                         shards, "--fabric", f"127.0.0.1:{self.ports['fabric']}"),
                                    env, lp("broker"))
        self.procs["scheduler"] = Proc("scheduler", self._argv("scheduler", "--port", str(self.ports["scheduler"])),
                                       env, lp("scheduler"))
        fe = ["--frontends", str(cfg.router_frontends)] if cfg.router_frontends else []
        self.procs["router"] = Proc("router", self._argv("router", "--port", str(self.ports["router"]),
                                                         "--http-port", str(self.http_port), *fe), env, lp("router"))
        for p in self.procs.values():
            await p.start()
        # Supervised from the first moment: a service that dies while the mesh starts (a port taken,
        # a peer not up yet) is restarted like one that dies later, instead of failing the start.
        if cfg.restart:
            self._supervisor = asyncio.create_task(self._supervise())
        try:
            await self.wait_healthy()
        except BaseException:
            await self.stop()
            raise

    def endpoint_of(self, name: str) -> str:
        """``HOST:PORT`` of service ``name`` (``chip-2`` for the third shard; ``clock`` for the event clock's
        coordinator in event mode)."""
        if name.startswith("chip"):
            idx = 0 if name == "chip" else int(name.split("-")[1])
            return f"127.0.0.1:{self.shard_ports[idx]}"
        return f"127.0.0.1:{self.ports[name]}"

    async def wait_healthy(self, timeout_s: float = 60.0, names: list[str] | None = None) -> None:
        """Wait until every service answers SERVING on the gRPC health service."""
        deadline = time.monotonic() + timeout_s
        for name in names or list(self.procs):
            async with open_channel(self.endpoint_of(name), self.tls) as ch:
                stub = health_pb2_grpc.HealthStub(ch)
                while True:
                    p = self.procs[name].proc
                    if p is not None and p.returncode is not None and not self.cfg.restart:
                        raise RuntimeError(f"{name} exited with {p.returncode} during start-up{self._log_tail(name)}")
                    try:
                        r = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                        if r.status == health_pb2.HealthCheckResponse.SERVING:
                            break
                    except grpc.aio.AioRpcError:
                        pass
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{name} not healthy after {timeout_s}s{self._log_tail(name)}")
                    await asyncio.sleep(0.1)
        # The broker answers health before it has discovered the shards; wait for that too.
        async with open_channel(self.endpoint_of("broker"), self.tls) as ch:
            stub2 = broker_pb2_grpc.BrokerServiceStub(ch)
            while True:
                try:
                    await stub2.GetInventory(broker_pb2.GetInventoryRequest(),
                                             metadata=call_metadata(api_key=self.admin_key), timeout=5)
                    return
                except grpc.aio.AioRpcError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)

    def _log_tail(self, name: str, lines: int = 15) -> str:
        """The last ``lines`` of service ``name``'s log, for an error that says why it is not up."""
        path = self.procs[name].log_path if name in self.procs else None
        if path is None or not path.exists():
            return ""
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - 16384))
            tail = f.read().decode("utf-8", "replace").splitlines()[-lines:]
        p = self.procs[name]
        state = f"restarts={p.restarts}" + (f", exit {p.proc.returncode}" if p.proc and p.proc.returncode is not None
                                            else "")
        return f" ({state}); last lines of {path}:\n" + "\n".join(tail)

    async def _supervise(self) -> None:
        backoff: dict[str, float] = {}
        while not self._stopping:
            await asyncio.sleep(0.2)
            for name, p in self.procs.items():
                if self._stopping or p.proc is None or p.proc.returncode is None:
                    continue
                up_s = time.monotonic() - p.started_s
                delay, backoff[name] = next_backoff(backoff.get(name, self.cfg.restart_backoff_s), up_s, self.cfg)
                log.warning("service died; restarting", service=name, returncode=p.proc.returncode,
                            restart_in_s=delay, restarts=p.restarts, up_s=round(up_s, 1))
                await asyncio.sleep(delay)
                if self._stopping:
                    return
                p.restarts += 1
                await p.start()

    async def create_tenant(self, tenant_id: str, weight: float = 1.0) -> str:
        """Create a tenant through the broker (as admin); returns its API key."""
        async with open_channel(self.endpoint_of("broker"), self.tls) as ch:
            resp = await broker_pb2_grpc.BrokerServiceStub(ch).CreateTenant(
                broker_pb2.CreateTenantRequest(tenant_id=tenant_id, weight=weight),
                metadata=call_metadata(api_key=self.admin_key), timeout=10)
        self.tenant_mqtt[tenant_id] = (resp.mqtt_username, resp.mqtt_password)
        return str(resp.api_key)

    def read_credentials(self) -> dict[str, Any]:
        """What the last :meth:`write_credentials` left in the state directory (empty if nothing)."""
        path = self.cfg.state_dir / "credentials.json" if self.cfg.state_dir is not None else None
        if path is None or not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text())
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    async def default_tenant_key(self, tenant_id: str = "default") -> str:
        """The API key of ``tenant_id``: the one in credentials.json if it still authenticates (a
        restart on the same state directory keeps it), else a new tenant's."""
        creds = self.read_credentials()
        key = str(creds.get("api_key") or "")
        if key and creds.get("tenant") == f"tenants/{tenant_id}":
            async with open_channel(self.endpoint_of("broker"), self.tls) as ch:
                try:
                    await broker_pb2_grpc.BrokerServiceStub(ch).GetTenant(
                        broker_pb2.GetTenantRequest(name=f"tenants/{tenant_id}"),
                        metadata=call_metadata(api_key=key), timeout=10)
                except grpc.aio.AioRpcError as err:
                    if err.code() not in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.NOT_FOUND):
                        raise
                else:
                    self.tenant_mqtt[tenant_id] = (str(creds.get("mqtt_username", "")),
                                                   str(creds.get("mqtt_password", "")))
                    return key
        try:
            return await self.create_tenant(tenant_id)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.ALREADY_EXISTS:
                raise RuntimeError(
                    f"tenant {tenant_id!r} exists in the broker database but credentials.json in "
                    f"{self.cfg.state_dir} holds no valid key for it: restore the file, or remove the "
                    "state directory to start afresh") from err
            raise

    def write_credentials(self, api_key: str) -> pathlib.Path | None:
        if self.cfg.state_dir is None:
            return None
        path = self.cfg.state_dir / "credentials.json"
        text = json.dumps({
            "cluster": self.cfg.cluster, "tenant": "tenants/default", "api_key": api_key,
            "admin_key": self.admin_key, "mqtt": self.mqtt,
            "mqtt_username": self.tenant_mqtt.get("default", ("", ""))[0],
            "mqtt_password": self.tenant_mqtt.get("default", ("", ""))[1],
            "mqtt_admin": {"username": "admin", "password": self.mqtt_admin_password},
            "endpoints": dataclasses.asdict(self.endpoints),
            "tls": self.tls_env,
            # event-clock mode: where a load generator joins the clock (gigacluster loadtest)
            "clock_coordinator": self.endpoint_of("clock") if "clock" in self.ports else "",
        }, indent=2)
        tmp = path.with_name(".credentials.json.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return path

    async def stop(self) -> None:
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        for name in reversed(list(self.procs)):
            await self.procs[name].stop()
        if self.embedded is not None:
            await self.embedded.stop()

    async def __aenter__(self) -> Stack:
        try:
            await self.start()
        except BaseException:
            await self.stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
