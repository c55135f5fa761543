"""One image for compose and Kubernetes: deploy/k8s/base runs the image the root Dockerfile builds (the one
docker-compose.yml builds and names), starts every service through its entrypoint, and gives each service
the configuration compose gives it. Read from the files (kustomization included), no kubectl needed."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Any

import yaml

from gigacluster.cli.mqtt_files import parse_env
from tests.ops.compose import DEPLOY, IMAGE, ROOT, load_compose, service_runs
from tests.ops.test_k8s import container_argv, load_config

K8S = DEPLOY / "k8s" / "base"


def dockerfile() -> dict[str, Any]:
    """ENTRYPOINT, ENV, VOLUME, EXPOSE and USER of the root Dockerfile (continuation lines joined)."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    out: dict[str, Any] = {"ENV": {}}
    for line in text.splitlines():
        word, _, rest = line.partition(" ")
        if word == "ENV":
            out["ENV"].update(dict(re.findall(r"(\w+)=(\S+)", rest)))
        elif word in ("ENTRYPOINT", "VOLUME"):
            out[word] = json.loads(rest)
        elif word == "EXPOSE":
            out[word] = {int(p) for p in rest.split()}
        elif word == "USER":
            out[word] = rest.strip()
    return out


def kustomization() -> dict[str, Any]:
    return dict(yaml.safe_load((K8S / "kustomization.yaml").read_text()))


def k8s_containers() -> dict[str, tuple[str, dict[str, Any]]]:
    """Each workload of the base's resources: name -> (kind, its first container)."""
    out = {}
    for res in kustomization()["resources"]:
        for doc in yaml.safe_load_all((K8S / res).read_text()):
            if doc and doc["kind"] in ("Deployment", "StatefulSet"):
                out[doc["metadata"]["name"]] = (doc["kind"], doc["spec"]["template"]["spec"]["containers"][0])
    return out


def k8s_pod_env(container: dict[str, Any]) -> dict[str, str]:
    """A gigacluster pod's variables: the generated ConfigMap, the Secret's env file, then the container's env."""
    gen = next(g for g in kustomization()["configMapGenerator"] if g["name"] == "gigacluster")
    env = dict(lit.split("=", 1) for lit in gen["literals"])
    env.update(parse_env((K8S / "gigacluster.env").read_text()))
    env.update({e["name"]: e["value"] for e in container.get("env", [])})
    return env


def test_kubernetes_runs_the_image_compose_builds_from_the_dockerfile() -> None:
    """Every gigacluster container of docker-compose.yml builds the root Dockerfile (context the repository)
    into gigacluster:latest and keeps its entrypoint; kustomize maps every gigacluster pod's image to that
    same name and tag; the third-party image (Mosquitto) is the same on both."""
    compose = load_compose()["services"]
    runs = service_runs()
    assert len(runs) == 6
    for r in runs:
        assert r.spec["build"] == {"context": "..", "dockerfile": "Dockerfile"} and "entrypoint" not in r.spec
    images = {i["name"]: f"{i['newName']}:{i['newTag']}" for i in kustomization()["images"]}
    for name, (_, c) in k8s_containers().items():
        if name == "mosquitto":
            assert c["image"] == compose["mosquitto"]["image"]
        else:
            assert images[c["image"]] == IMAGE, name


def test_every_kubernetes_container_starts_its_service_through_the_image_entrypoint(tmp_path: pathlib.Path) -> None:
    """A pod without a command runs the Dockerfile's ENTRYPOINT with `serve <service>` as arguments, as compose
    does; the chip pod's shell `exec`s that same entrypoint (so it is PID 1 and gets SIGTERM)."""
    entrypoint = dockerfile()["ENTRYPOINT"]
    assert entrypoint == ["gigacluster"]
    for name, (_, c) in k8s_containers().items():
        if name == "mosquitto":
            continue
        if "command" not in c:
            assert c["args"][:2] == ["serve", name], name
        else:
            script = " ".join(c["args"])
            assert re.search(rf"\bexec {entrypoint[0]} serve {name}\b", script), script
            assert container_argv(c, k8s_pod_env(c), f"{name}-0", tmp_path)[:2] == ["serve", name]


def _normalise(value: Any) -> Any:
    """Kubernetes names a chip shard ``chip-N.chip`` (its headless Service); compose names it ``chip-N``."""
    return re.sub(r"\b(chip-\d+)\.chip\b", r"\1", value) if isinstance(value, str) else value


def test_each_service_gets_the_same_configuration_in_compose_and_kubernetes(tmp_path: pathlib.Path) -> None:
    """Loaded as the service would load it, every field of every service's config (chip shards by ordinal)
    is equal in compose and Kubernetes, endpoints included, except the secrets each platform generates into
    its own env file, which name the same variables."""
    compose_env, k8s_env = (parse_env((p / "gigacluster.env").read_text()) for p in (DEPLOY, K8S))
    assert set(compose_env) == set(k8s_env)
    secret_fields = {k.removeprefix("GIGACLUSTER_").lower() for k in compose_env}
    k8s = k8s_containers()
    for r in service_runs():
        kind, c = k8s[r.service]
        pod = r.name if kind == "StatefulSet" else f"{r.service}-0"
        env = k8s_pod_env(c)
        theirs = dataclasses.asdict(load_config(container_argv(c, env, pod, tmp_path), env))
        ours = dataclasses.asdict(r.config())
        assert ours.keys() == theirs.keys()
        differ = {k: (ours[k], theirs[k]) for k in ours
                  if k not in secret_fields and _normalise(ours[k]) != _normalise(theirs[k])}
        assert not differ, f"{r.name}: {differ}"


def test_the_image_environment_state_volume_and_ports_serve_both() -> None:
    """The Dockerfile's environment (bind every interface, home in the state volume) is what both platforms
    run with; broker and scheduler keep state in the Dockerfile's VOLUME on both; every port a service binds
    is one the image EXPOSEs; both run as the image's non-root user."""
    df = dockerfile()
    assert df["ENV"]["GIGACLUSTER_HOST"] == "0.0.0.0" and df["USER"] == "gigacluster"
    volume = df["VOLUME"][0]
    assert df["ENV"]["GIGACLUSTER_HOME"] == volume
    k8s = k8s_containers()
    for r in service_runs():
        cfg = r.config()
        assert cfg.host == df["ENV"]["GIGACLUSTER_HOST"]
        assert {cfg.port, cfg.metrics_port} | ({cfg.http_port} if r.service == "router" else set()) <= df["EXPOSE"]  # type: ignore[attr-defined]
        _, c = k8s[r.service]
        assert "securityContext" not in c or c["securityContext"].get("runAsUser") in (None, 10001)
        if r.service in ("broker", "scheduler"):
            assert cfg.state_dir == volume
            assert any(v.endswith(f":{volume}") for v in r.spec["volumes"])
            assert [m["mountPath"] for m in c["volumeMounts"]] == [volume]
            assert k8s_pod_env(c)["GIGACLUSTER_STATE_DIR"] == volume
