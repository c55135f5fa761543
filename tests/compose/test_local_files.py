"""The local compose run's files agree with the compose stack they adapt (no podman needed): the override
(deploy/docker-compose.local.yml), its Prometheus and Mosquitto configs, the images it builds, the base
image argument, and that the image's CLI runs without the dev extras."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

import yaml

from tests.ops.compose import DEPLOY, ROOT, load_compose
from tests.ops.prometheus import local_config

from .podman import SCRIPT, ComposeTag, load_override

BASE_IMAGE = "localhost/debian-base:bookworm"


def _dockerfile_base(path: str) -> str:
    """The default of ``ARG BASE_IMAGE`` in a Dockerfile, which must also be what it builds ``FROM``."""
    text = (ROOT / path).read_text()
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", text, re.M)
    assert default is not None and re.search(r"^FROM \$\{BASE_IMAGE\}( AS \w+)?$", text, re.M), path
    return default.group(1)


def test_the_dockerfile_defaults_to_the_official_python_image_and_the_local_ones_to_the_debian_base() -> None:
    """Docker users build on python:3.11-slim by default; Mosquitto and Prometheus build on the base the script
    makes, and the script, the runner and the override all name the same base image."""
    assert _dockerfile_base("Dockerfile") == "python:3.11-slim"
    assert _dockerfile_base("deploy/local/mosquitto.Dockerfile") == BASE_IMAGE
    assert _dockerfile_base("deploy/local/prometheus.Dockerfile") == BASE_IMAGE
    for script in ("deploy/local/make-base-image.sh", "deploy/local/compose.sh"):
        assert f'"${{GIGACLUSTER_BASE_IMAGE:-{BASE_IMAGE}}}"' in (ROOT / script).read_text(), script
    args = {str(s["build"]["args"]["BASE_IMAGE"]) for s in load_override()["services"].values() if "build" in s}
    assert args == {f"${{GIGACLUSTER_BASE_IMAGE:-{BASE_IMAGE}}}"}


def test_the_override_changes_only_services_of_the_compose_file_and_leaves_grafana_out() -> None:
    """Every service the override names is in docker-compose.yml; all but Grafana run on the host's network
    and Grafana (not packaged in Debian) only gets a profile, so a plain `up` does not start it."""
    base, local = load_compose()["services"], load_override()["services"]
    assert set(local) == set(base)
    assert local["grafana"] == {"profiles": ["grafana"]}
    for name, spec in local.items():
        if name != "grafana":
            assert spec["network_mode"] == "host", name
            assert isinstance(spec["networks"], ComposeTag) and spec["networks"].tag == "!reset", name


def test_compose_sh_builds_every_image_of_the_stack_once() -> None:
    """The services compose.sh builds (one per image) cover every image the merged stack builds."""
    services = re.search(r'^BUILD_SERVICES="([^"]+)"$', SCRIPT.read_text(), re.M)
    assert services is not None
    base, local = load_compose()["services"], load_override()["services"]

    def image(name: str) -> str:
        return str(local.get(name, {}).get("image") or base[name]["image"])

    built = {image(n) for n in base if n != "grafana" and ("build" in base[n] or "build" in local.get(n, {}))}
    chosen = services.group(1).split()
    assert len({image(n) for n in chosen}) == len(chosen) and {image(n) for n in chosen} == built


def test_local_prometheus_scrapes_what_the_compose_prometheus_scrapes_on_the_override_ports() -> None:
    """deploy/local/prometheus.yml is prometheus.yml (jobs, intervals, labels) with each container's target
    swapped for the metrics port the override gives it on the host."""
    local = load_override()["services"]
    ports = {n: int(s["environment"]["GIGACLUSTER_METRICS_PORT"]) for n, s in local.items()
             if "GIGACLUSTER_METRICS_PORT" in s.get("environment", {})}
    assert len(ports) == 6 and len(set(ports.values())) == 6
    assert yaml.safe_load((DEPLOY / "local" / "prometheus.yml").read_text()) == local_config(ports)


def test_local_mosquitto_conf_is_the_compose_one_on_loopback() -> None:
    """deploy/local/mosquitto.conf has the compose Mosquitto's settings, users and ACL, its listener on
    127.0.0.1 only (the container shares the host's network)."""
    def settings(name: str) -> list[str]:
        return [ln for ln in name.splitlines() if ln and not ln.startswith("#")]

    upstream = settings((DEPLOY / "mosquitto" / "mosquitto.conf").read_text())
    local = settings((DEPLOY / "local" / "mosquitto.conf").read_text())
    assert [ln.replace("listener 1883 127.0.0.1", "listener 1883") for ln in local] == upstream


def test_the_cli_imports_without_the_dev_extras() -> None:
    """The image installs the package's runtime dependencies only: `gigacluster` loads with grpcio-tools (a
    dev dependency) unimportable, so every container's entrypoint starts."""
    code = "import sys; sys.modules['grpc_tools'] = None; import gigacluster.cli.main"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-1500:]


def test_ci_installs_what_the_compose_step_drives_and_runs_it_after_the_chaos_step() -> None:
    """tests/install-deps.sh installs podman, runc and debootstrap, the dev extra podman-compose, and .ci/run
    runs the compose tests as a step after the chaos suite."""
    script = (ROOT / "tests" / "install-deps.sh").read_text()
    for pkg in ("podman", "runc", "debootstrap"):
        assert f"missing+=({pkg})" in script
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    assert any(d.startswith("podman-compose") for d in dev)
    ci = (ROOT / ".ci" / "run").read_text()
    steps = [ln.strip() for ln in ci.splitlines() if ln.strip().startswith("python -m pytest -m ")]
    assert steps[-2:] == ["python -m pytest -m chaos", "python -m pytest -m compose"]
