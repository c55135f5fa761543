"""Reading deploy/docker-compose.yml the way the tests need it: which services run `gigacluster serve`,
with what flags and environment, and how to run the same thing as local processes."""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Any

import yaml

from gigacluster.cli.mqtt_files import parse_env
from gigacluster.runtime import config as cfgmod

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
IMAGE = "gigacluster:latest"
#: GIGACLUSTER_* variables read outside the service configs (client and config-file lookup).
NON_CONFIG_VARS = {"GIGACLUSTER_HOME", "GIGACLUSTER_CONFIG", "GIGACLUSTER_API_KEY"}


def load_compose() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text()))


@dataclasses.dataclass
class ServiceRun:
    """One compose service that runs a gigacluster service."""

    name: str  # compose service name, e.g. chip-1
    service: str  # gigacluster service, e.g. chip
    argv: list[str]  # after the entrypoint: ["serve", "chip", ...]
    env: dict[str, str]  # environment + env_file (env_file first, environment wins, as compose)
    spec: dict[str, Any]

    @property
    def flags(self) -> dict[str, str]:
        out: dict[str, str] = {}
        it = iter(self.argv[2:])
        for tok in it:
            assert tok.startswith("--"), f"{self.name}: unexpected argument {tok!r}"
            out[tok[2:].replace("-", "_")] = next(it)
        return out

    def config(self) -> cfgmod.CommonConfig:
        """The service's config as the container would load it (flags > env), validated."""
        return cfgmod.load(cfgmod.CONFIGS[self.service], flags=self.flags, env=self.env)


def service_runs(compose: dict[str, Any] | None = None) -> list[ServiceRun]:
    compose = compose or load_compose()
    runs = []
    for name, spec in compose["services"].items():
        if spec.get("image") != IMAGE:
            continue
        env: dict[str, str] = {}
        for f in spec.get("env_file", []):
            env.update(parse_env((DEPLOY / f).read_text()))
        env.update({k: str(v) for k, v in (spec.get("environment") or {}).items()})
        argv = [str(a) for a in spec["command"]]
        runs.append(ServiceRun(name, argv[1] if len(argv) > 1 else "", argv, env, spec))
    return runs


def endpoint_refs(value: str) -> list[tuple[str, int]]:
    """Every HOST:PORT in a flag or variable value."""
    return [(h, int(p)) for h, p in re.findall(r"(\w[\w.-]*):(\d+)", value)]
