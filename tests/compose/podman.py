"""Driving deploy/docker-compose.yml through deploy/local/compose.sh (podman, this machine's flags), the
way a person would from a shell: build, up, health checks, a crash, down."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import time
from typing import Any

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
OVERRIDE = DEPLOY / "docker-compose.local.yml"
SCRIPT = DEPLOY / "local" / "compose.sh"
PROJECT = "gigacluster"  # `name:` in docker-compose.yml; podman-compose labels everything with it
#: What the local run binds on the host (docker-compose.local.yml): gRPC, OpenAI HTTP, metrics, MQTT, Prometheus.
HOST_PORTS = (50051, 50052, 50053, 50054, 50055, 50061, 8000, 9464, 9465, 9466, 9467, 9468, 9469, 1883, 9090)


class ComposeTag:
    """A compose merge tag (``!reset``, ``!override``) and the value under it."""

    def __init__(self, tag: str, value: Any) -> None:
        self.tag, self.value = tag, value


class ComposeLoader(yaml.SafeLoader):
    """Reads compose files with merge tags (the override uses ``!reset`` and ``!override``)."""


def _tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> ComposeTag:
    if isinstance(node, yaml.SequenceNode):
        return ComposeTag("!" + suffix, loader.construct_sequence(node, deep=True))
    if isinstance(node, yaml.MappingNode):
        return ComposeTag("!" + suffix, loader.construct_mapping(node, deep=True))
    return ComposeTag("!" + suffix, loader.construct_scalar(node))  # type: ignore[arg-type]


ComposeLoader.add_multi_constructor("!", _tagged)


def load_override() -> dict[str, Any]:
    return dict(yaml.load(OVERRIDE.read_text(), ComposeLoader))


def require_tools() -> None:
    """Fail (never skip) when what the compose step drives is missing, naming the installer."""
    missing = [t for t in ("podman", "runc", "podman-compose") if shutil.which(t) is None]
    if shutil.which("debootstrap") is None and not os.path.exists("/usr/sbin/debootstrap"):
        missing.append("debootstrap")
    if missing:
        pytest.fail(f"the compose step needs {', '.join(missing)}: bash tests/install-deps.sh and "
                    "pip install -e '.[dev]' (see .ci/run)")


class ComposeStack:
    """``bash deploy/local/compose.sh ...`` with a bounded time per command and its output kept for failures."""

    def __init__(self, log_dir: pathlib.Path) -> None:
        self.log_dir = log_dir
        self.timings: dict[str, float] = {}
        self.baseline_volumes: set[str] = set()  # podman's volumes before the stack started
        self.all_healthy = False

    def run(self, *args: str, timeout_s: float = 300.0, check: bool = True) -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout_s,
                           cwd=ROOT, stdin=subprocess.DEVNULL)
        key = " ".join(args[:2])
        self.timings[key] = self.timings.get(key, 0.0) + time.monotonic() - t0
        with (self.log_dir / "compose.log").open("a") as log:
            log.write(f"$ compose.sh {' '.join(args)}\n{r.stdout}{r.stderr}\n")
        if check and r.returncode != 0:
            raise AssertionError(f"compose.sh {' '.join(args)} exited {r.returncode}:\n{r.stderr[-3000:]}")
        return r

    def podman(self, *args: str, check: bool = True) -> str:
        return self.run("podman", *args, timeout_s=60, check=check).stdout

    def containers(self) -> dict[str, dict[str, Any]]:
        """The project's containers (all states), by compose service name: inspect output."""
        ids = self.podman("ps", "-a", "-q", "--filter", f"label=io.podman.compose.project={PROJECT}").split()
        if not ids:
            return {}
        out: dict[str, dict[str, Any]] = {}
        for c in json.loads(self.podman("inspect", *ids)):
            out[c["Config"]["Labels"]["com.docker.compose.service"]] = c
        return out

    def volumes(self) -> list[str]:
        return self.podman("volume", "ls", "-q").split()

    def run_health_checks(self, names: dict[str, str], at_once: int = 2) -> dict[str, int]:
        """Run these containers' health checks now (no systemd here runs them on a timer), ``at_once`` at a
        time: each starts the CLI in its container, and more than the machine's cores at once overrun the
        checks' 4 s timeout. Exit code by service (0: the check passed)."""
        t0 = time.monotonic()
        codes: dict[str, int] = {}
        items = list(names.items())
        for i in range(0, len(items), at_once):
            procs = {svc: subprocess.Popen(["bash", str(SCRIPT), "podman", "healthcheck", "run", name], cwd=ROOT,
                                           stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True)
                     for svc, name in items[i:i + at_once]}
            for svc, p in procs.items():
                try:
                    out, _ = p.communicate(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, _ = p.communicate()
                codes[svc] = p.returncode
                if p.returncode:
                    with (self.log_dir / "compose.log").open("a") as log:
                        log.write(f"health check of {svc} exited {p.returncode}: {out[-500:]}\n")
        self.timings["health checks"] = self.timings.get("health checks", 0.0) + time.monotonic() - t0
        return codes

    def wait_healthy(self, timeout_s: float = 120.0, only: tuple[str, ...] = ()) -> dict[str, str]:
        """Every container (or those of the services ``only``) running and passing a health check run now
        (its own exit code, not podman's status, which stays 'healthy' through failures until the retries
        run out); status by service. Sets :attr:`all_healthy` once every container has passed."""
        deadline = time.monotonic() + timeout_s
        passed: set[str] = set()
        while True:
            cs = {svc: c for svc, c in self.containers().items() if not only or svc in only}
            codes = self.run_health_checks({svc: c["Name"] for svc, c in cs.items()
                                            if svc not in passed and c["State"]["Status"] == "running"})
            passed |= {svc for svc, rc in codes.items() if rc == 0}
            if cs and passed >= set(cs):
                self.all_healthy = self.all_healthy or not only
                return {svc: "healthy" for svc in cs}
            if time.monotonic() > deadline:
                status = {svc: "healthy" if svc in passed else c["State"]["Status"] for svc, c in cs.items()}
                raise AssertionError(f"not every container healthy in {timeout_s:.0f} s: {status}\n"
                                     + self.logs_tail(*[s for s, v in status.items() if v != "healthy"]))
            time.sleep(0.5)

    def logs_tail(self, *services: str) -> str:
        cs = self.containers()
        tails = []
        for s in (s for s in services if s in cs):
            r = self.run("podman", "logs", "--tail", "30", cs[s]["Name"], timeout_s=60, check=False)
            tails.append(f"--- {s}\n{r.stdout}{r.stderr}")
        return "\n".join(tails)
