"""deploy/k8s: kustomize renders (kubectl's built-in kustomize), every object validates against the
Kubernetes 1.30 OpenAPI schemas (kubernetes-validate, strict), and the chip StatefulSet, broker shard
list, fabric size, commands, variables and ports agree with what the services accept."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil
import stat
import subprocess
from typing import Any

import pytest
import yaml

from gigacluster.cli import preset_files
from gigacluster.cli.main import build_parser
from gigacluster.cli.mqtt_files import parse_env
from gigacluster.runtime import config as cfgmod
from gigacluster.sites import PRESETS
from tests.ops.compose import NON_CONFIG_VARS

ROOT = pathlib.Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BASE, MILLION = K8S / "base", K8S / "overlays" / "million"
PRESET_OVERLAYS = {name: K8S / "overlays" / name for name in PRESETS}
EVENT_CLOCK = K8S / "overlays" / "event-clock"
K8S_VERSION = "1.30.0"  # oldest supported release with GA gRPC probes and StatefulSet ordinals


def render(path: pathlib.Path) -> list[dict[str, Any]]:
    """kustomize build through kubectl (no kustomize binary needed); skip where kubectl is absent."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed (its built-in kustomize renders the manifests)")
    out = subprocess.run([kubectl, "kustomize", str(path)], capture_output=True, text=True, timeout=60, check=True)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def objects(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    """The variables every gigacluster pod gets from the ConfigMap and the Secret (generated from files)."""
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("gigacluster-"))
    env = dict(cm["data"])
    env.update(parse_env((BASE / "gigacluster.env").read_text()))
    return env


def k8s_expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of command/args: $(VAR) from the container env, $$ a literal $."""
    def sub(m: re.Match[str]) -> str:
        return "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0))
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", sub, s)


def container_argv(container: dict[str, Any], env: dict[str, str], hostname: str,
                   tmp: pathlib.Path) -> list[str]:
    """The argv `gigacluster` receives in a container, by running its command with a stand-in binary."""
    if container.get("command") is None:
        return [str(a) for a in container["args"]]
    fake = tmp / "bin" / "gigacluster"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    argv = [k8s_expand(str(a), env) for a in container["command"] + container.get("args", [])]
    run_env = {**env, "HOSTNAME": hostname, "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    out = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=10, check=True)
    return out.stdout.splitlines()


def load_config(argv: list[str], env: dict[str, str]) -> cfgmod.CommonConfig:
    args = build_parser().parse_args(argv)
    return cfgmod.load(cfgmod.CONFIGS[args.service], flags=vars(args), env=env)


@pytest.mark.parametrize("path", [BASE, MILLION, EVENT_CLOCK, *PRESET_OVERLAYS.values()],
                         ids=["base", "million", "event-clock", *PRESET_OVERLAYS])
def test_manifests_validate_against_the_kubernetes_schemas(path: pathlib.Path) -> None:
    """Every rendered object is valid for Kubernetes 1.30 under the strict schemas (unknown fields fail)."""
    kv = pytest.importorskip("kubernetes_validate")
    docs = render(path)
    assert {d["kind"] for d in docs} >= {"Namespace", "StatefulSet", "Deployment", "Service", "ConfigMap", "Secret"}
    for d in docs:
        kv.validate(d, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("path", "shards", "per_shard"), [
    (BASE, 2, 32), (MILLION, 16, 65_536),
    *((PRESET_OVERLAYS[n], PRESETS[n].shards, PRESETS[n].chips() // PRESETS[n].shards) for n in PRESET_OVERLAYS)],
    ids=["base", "million", *PRESET_OVERLAYS])
def test_chip_statefulset_tiles_the_devices_the_fabric_and_broker_expect(
        path: pathlib.Path, shards: int, per_shard: int, tmp_path: pathlib.Path) -> None:
    """Pod chip-N of the StatefulSet serves devices [N x per_shard, (N+1) x per_shard) (its command run with
    HOSTNAME=chip-N); shards x per_shard equals the fabric's count; the broker lists every shard pod."""
    docs = render(path)
    env = pod_env(docs)
    sts = objects(docs, "StatefulSet")["chip"]
    assert sts["spec"]["replicas"] == shards and sts["spec"]["serviceName"] == "chip"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    for n in range(shards):
        cfg = load_config(container_argv(container, env, f"chip-{n}", tmp_path), env)
        assert (cfg.device_offset, cfg.device_count) == (n * per_shard, per_shard)  # type: ignore[attr-defined]
    fabric = load_config(objects(docs, "Deployment")["fabric"]["spec"]["template"]["spec"]["containers"][0]["args"],
                         env)
    assert fabric.count == shards * per_shard  # type: ignore[attr-defined]
    broker = load_config(objects(docs, "Deployment")["broker"]["spec"]["template"]["spec"]["containers"][0]["args"],
                         env)
    assert broker.shard_endpoints == [f"chip-{n}.chip:50051" for n in range(shards)]  # type: ignore[attr-defined]


def test_a_million_chips_is_16_shards_of_65536() -> None:
    """The million overlay is 16 x 65,536 = 1,048,576 H100 on a three-tier fat-tree."""
    docs = render(MILLION)
    env = pod_env(docs)
    assert objects(docs, "StatefulSet")["chip"]["spec"]["replicas"] * int(env["DEVICES_PER_SHARD"]) == 1_048_576
    assert env["GIGACLUSTER_FABRIC_COUNT"] == "1048576" and env["GIGACLUSTER_FABRIC_TIERS"] == "3"


def test_every_variable_flag_probe_and_port_is_one_the_services_accept(tmp_path: pathlib.Path) -> None:
    """Each gigacluster container's command loads as a valid config with the pod's variables; every
    GIGACLUSTER_* variable names a field of some service; probes hit the gRPC port the service binds;
    Services target named container ports; env sources exist."""
    docs = render(BASE)
    env = pod_env(docs)
    fields = {svc: {f.name.upper() for f in dataclasses.fields(cls)} for svc, cls in cfgmod.CONFIGS.items()}
    accepted = NON_CONFIG_VARS | {f"GIGACLUSTER_{f}" for fs in fields.values() for f in fs}
    accepted |= {f"GIGACLUSTER_{svc.upper()}_{f}" for svc, fs in fields.items() for f in fs}
    assert not {k for k in env if k.startswith("GIGACLUSTER_")} - accepted
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    services = objects(docs, "Service")
    seen = set()
    for kind in ("StatefulSet", "Deployment"):
        for name, obj in objects(docs, kind).items():
            pod = obj["spec"]["template"]
            c = pod["spec"]["containers"][0]
            ports = {p["name"]: p["containerPort"] for p in c["ports"]}
            svc = services[name]
            assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
            assert all(p["targetPort"] in ports for p in svc["spec"]["ports"])
            for src in c.get("envFrom", []):
                ref = src.get("configMapRef") or src.get("secretRef")
                assert (("ConfigMap" if "configMapRef" in src else "Secret"), ref["name"]) in names
            if name == "mosquitto":
                continue
            seen.add(name)
            cenv = {**env, **{e["name"]: e["value"] for e in c.get("env", [])}}
            cfg = load_config(container_argv(c, cenv, f"{name}-0", tmp_path), cenv)
            assert cfg.host == "0.0.0.0" and ports["grpc"] == cfg.port and ports["metrics"] == cfg.metrics_port
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert c[probe]["grpc"]["port"] == cfg.port
    assert seen == set(cfgmod.CONFIGS)


def test_mosquitto_secret_holds_the_hash_of_the_services_password() -> None:
    """The Mosquitto Secret's password file verifies the MQTT password the services' Secret gives them,
    and anonymous clients are refused."""
    from gigacluster.security.mqtt_auth import parse_password_file, verify_mosquitto_hash

    env = parse_env((BASE / "gigacluster.env").read_text())
    hashes = parse_password_file((BASE / "mosquitto" / "passwd").read_text())
    assert verify_mosquitto_hash(hashes[env["GIGACLUSTER_MQTT_USERNAME"]], env["GIGACLUSTER_MQTT_PASSWORD"])
    assert "allow_anonymous false" in (BASE / "mosquitto" / "mosquitto.conf").read_text()


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_deploy_files_are_what_the_preset_generates(name: str) -> None:
    """The committed Kubernetes overlay and compose override of each `up --preset` site are exactly what
    `gigacluster preset-files` writes from gigacluster/sites.py today: the three ways of running the mesh
    start the same site, and a change to a preset that forgets the deploy files fails here."""
    assert (PRESET_OVERLAYS[name] / "kustomization.yaml").read_text() == preset_files.k8s_overlay(name)
    assert (ROOT / "deploy" / "presets" / f"{name}.compose.yml").read_text() == preset_files.compose_override(
        name, ROOT / "deploy" / "docker-compose.yml")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_preset_overlay_configures_the_fabric_as_up_does(name: str, tmp_path: pathlib.Path) -> None:
    """The overlay's fabric loads with the preset's chip, count, tree and routing (what `up --preset` passes)."""
    docs = render(PRESET_OVERLAYS[name])
    env = pod_env(docs)
    site = PRESETS[name].resolve()
    fabric = load_config(objects(docs, "Deployment")["fabric"]["spec"]["template"]["spec"]["containers"][0]["args"],
                         env)
    got = {k: getattr(fabric, k) for k in ("chip", "count", "tiers", "switch", "routing", "nic")}
    assert got == {"chip": site["chip"], "count": site["chips"], "tiers": site["tiers"], "switch": site["switch"],
                   "routing": site["routing"], "nic": site["nic"]}


def test_the_event_clock_overlay_points_every_service_at_its_coordinator(tmp_path: pathlib.Path) -> None:
    """overlays/event-clock: a `serve clock` Deployment whose Service is the address every other pod's
    clock_coordinator names (a Service name, not localhost: the pods may run on any node), every service in
    event mode, the coordinator expecting exactly the mesh's processes, all in the mesh's namespace."""
    docs = render(EVENT_CLOCK)
    env = pod_env(docs)
    assert {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"} == {"gigacluster"}
    c = objects(docs, "Deployment")["clock"]["spec"]["template"]["spec"]["containers"][0]
    argv = container_argv(c, env, "clock-0", tmp_path)
    args = build_parser().parse_args(argv)
    clock = cfgmod.load(cfgmod.SERVE_CONFIGS["clock"], flags=vars(args), env=env)
    svc = objects(docs, "Service")["clock"]
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]}["grpc"] == clock.port
    assert all(c[p]["grpc"]["port"] == clock.port for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    processes = objects(docs, "StatefulSet")["chip"]["spec"]["replicas"]
    for name in ("fabric", "broker", "scheduler", "router"):
        cfg = load_config(objects(docs, "Deployment")[name]["spec"]["template"]["spec"]["containers"][0]["args"], env)
        assert cfg.clock == "event" and cfg.clock_coordinator == f"clock:{clock.port}", name
        processes += 1
    chip = objects(docs, "StatefulSet")["chip"]["spec"]["template"]["spec"]["containers"][0]
    assert load_config(container_argv(chip, env, "chip-1", tmp_path), env).clock == "event"
    assert clock.expect == processes == 6  # type: ignore[attr-defined]
