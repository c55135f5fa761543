"""deploy/docker-compose.yml and the root Dockerfile: structure, and that every service, flag,
variable and port in them is one the services accept (read as files; tests/compose builds and runs
the stack with podman)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml

from gigacluster.cli.main import build_parser
from gigacluster.cli.mqtt_files import parse_env
from gigacluster.runtime import config as cfgmod
from gigacluster.security.mqtt_auth import TelemetryAcl, parse_password_file, verify_mosquitto_hash
from tests.ops.compose import DEPLOY, NON_CONFIG_VARS, ROOT, ServiceRun, endpoint_refs, load_compose, service_runs

REQUIRED_DASHBOARD_METRICS = [
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP",
    "gigacluster_link_utilization", "gigacluster_jobs",
    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket",
]


def _runs() -> dict[str, ServiceRun]:
    return {r.name: r for r in service_runs()}


def _accepted_vars(service: str) -> set[str]:
    fields = [f.name.upper() for f in __import__("dataclasses").fields(cfgmod.CONFIGS[service])]
    return {f"GIGACLUSTER_{f}" for f in fields} | {f"GIGACLUSTER_{service.upper()}_{f}" for f in fields}


def test_dockerfile_builds_one_image_with_the_gigacluster_entrypoint() -> None:
    """The root Dockerfile builds on python:3.11-slim unless given another BASE_IMAGE, pip-installs the
    package, runs as a non-root user, and its entrypoint is the gigacluster console script; .dockerignore
    keeps the generated secrets out."""
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim\s*$", text, re.M)
    assert re.search(r"^FROM \$\{BASE_IMAGE\}( AS \w+)?\s*$", text, re.M)
    assert re.search(r"^RUN pip install --no-deps \.", text, re.M)
    assert json.loads(re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1)) == ["gigacluster"]  # type: ignore[union-attr]
    assert re.search(r"^USER gigacluster\s*$", text, re.M)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert "deploy" in ignored and ".git" in ignored


def test_every_gigacluster_container_is_a_real_serve_command_with_accepted_flags() -> None:
    """Each container runs `gigacluster serve <service>` that the real CLI parser accepts and whose config
    (flags + environment + env_file) validates, and all five services are present."""
    runs = _runs()
    assert {r.service for r in runs.values()} == set(cfgmod.CONFIGS)
    parser = build_parser()
    for r in runs.values():
        assert r.argv[:2] == ["serve", r.service], r.name
        args = parser.parse_args(r.argv)  # unknown flags exit here
        assert args.service == r.service
        cfg = r.config()
        assert cfg.host == "0.0.0.0"
        assert cfg.metrics_port == 9464  # what prometheus.yml scrapes


def test_every_gigacluster_variable_is_one_the_service_reads() -> None:
    """Every GIGACLUSTER_* variable a container gets (environment or env_file) names a field of that
    service's config (GIGACLUSTER_<FIELD> or GIGACLUSTER_<SERVICE>_<FIELD>)."""
    for r in _runs().values():
        accepted = _accepted_vars(r.service) | NON_CONFIG_VARS
        unknown = {k for k in r.env if k.startswith("GIGACLUSTER_")} - accepted
        assert not unknown, f"{r.name}: {sorted(unknown)}"


def test_chip_shards_tile_the_device_range_the_fabric_connects() -> None:
    """Chip shards (2+) own contiguous, non-overlapping device ranges that add up to the fabric's count,
    of the same chip type, and the broker lists every shard."""
    runs = _runs()
    chips = sorted((r.config() for r in runs.values() if r.service == "chip"), key=lambda c: c.device_offset)
    assert len(chips) >= 2
    offset = 0
    for c in chips:
        assert c.device_offset == offset
        offset += c.device_count
    fabric = next(r.config() for r in runs.values() if r.service == "fabric")
    assert fabric.count == offset == 64
    assert {c.chip for c in chips} == {fabric.chip}
    broker = next(r.config() for r in runs.values() if r.service == "broker")
    shard_names = {r.name for r in runs.values() if r.service == "chip"}
    assert {h for h, _ in endpoint_refs(broker.shards)} == shard_names  # type: ignore[attr-defined]


def test_ports_and_endpoints_are_consistent() -> None:
    """Every HOST:PORT a service is given names a compose service on the port it binds; health checks
    probe the port the service binds; published ports map to ports the service binds."""
    compose = load_compose()
    runs = _runs()
    bound = {r.name: r.config().port for r in runs.values()}
    mosq_conf = (DEPLOY / "mosquitto" / "mosquitto.conf").read_text()
    bound["mosquitto"] = int(re.search(r"^listener (\d+)", mosq_conf, re.M).group(1))  # type: ignore[union-attr]
    for r in runs.values():
        cfg = r.config()
        values = [*r.flags.values(), *(v for k, v in r.env.items() if k.startswith("GIGACLUSTER_"))]
        for host, port in (ref for v in values for ref in endpoint_refs(v)):
            assert host in compose["services"], f"{r.name} refers to unknown host {host}"
            assert bound[host] == port, f"{r.name} calls {host}:{port}, which binds {bound[host]}"
        test = r.spec["healthcheck"]["test"]
        assert test[:3] == ["CMD", "gigacluster", "health"]
        assert endpoint_refs(test[3])[0][1] == cfg.port
        own = {cfg.port, cfg.metrics_port} | ({cfg.http_port} if r.service == "router" else set())  # type: ignore[attr-defined]
        for mapping in r.spec.get("ports", []):
            assert int(str(mapping).split(":")[-1]) in own, f"{r.name} publishes {mapping}"
    host_ports = [str(m).split(":")[0] for s in compose["services"].values() for m in s.get("ports", [])]
    assert len(host_ports) == len(set(host_ports)), "two services publish the same host port"


def test_prometheus_scrapes_every_service_metrics_port() -> None:
    """prometheus.yml has exactly one target per gigacluster container, on its metrics port."""
    prom = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert targets == {f"{r.name}:{r.config().metrics_port}" for r in _runs().values()}
    volumes = load_compose()["services"]["prometheus"]["volumes"]
    assert "./prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in volumes


def test_grafana_provisions_the_datasource_and_a_dashboard_of_standard_metric_names() -> None:
    """Grafana gets a Prometheus datasource and a dashboard whose panels query the dcgm-exporter, vLLM and
    gigacluster metric names the issue lists, every panel through the provisioned datasource."""
    compose = load_compose()
    for vol in compose["services"]["grafana"]["volumes"]:
        assert (DEPLOY / vol.split(":")[0]).exists(), vol
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    prov = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/gigacluster.yml").read_text())["providers"][0]
    assert prov["options"]["path"] == "/var/lib/grafana/dashboards"
    dash = json.loads((DEPLOY / "grafana/dashboards/gigacluster.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for name in REQUIRED_DASHBOARD_METRICS:
        assert any(name in e for e in exprs), name
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == ds["uid"]
            assert all(t["datasource"]["uid"] == ds["uid"] for t in p["targets"])


def test_mosquitto_files_are_the_generated_password_and_acl_for_the_services() -> None:
    """Mosquitto denies anonymous clients; its password file holds the hash of the password the services
    use (from gigacluster.env) and its ACL is exactly what TelemetryAcl renders for the cluster."""
    conf = (DEPLOY / "mosquitto" / "mosquitto.conf").read_text()
    assert "allow_anonymous false" in conf
    env = parse_env((DEPLOY / "gigacluster.env").read_text())
    hashes = parse_password_file((DEPLOY / "mosquitto" / "passwd").read_text())
    assert verify_mosquitto_hash(hashes[env["GIGACLUSTER_MQTT_USERNAME"]], env["GIGACLUSTER_MQTT_PASSWORD"])
    assert verify_mosquitto_hash(hashes["admin"], env["MQTT_PASSWORD_ADMIN"])
    tenants = [u.removeprefix("tenant-") for u in hashes if u.startswith("tenant-")]
    acl = TelemetryAcl.of(env["GIGACLUSTER_CLUSTER"], tenants).render_acl_file()
    assert (DEPLOY / "mosquitto" / "acl").read_text() == acl
    mounts = {v.split(":")[1] for v in load_compose()["services"]["mosquitto"]["volumes"]}
    for path in re.findall(r"^(?:password_file|acl_file) (\S+)", conf, re.M):
        assert path in mounts


def _merge(base: Any, over: Any) -> Any:
    """Compose's merge of an override file: mappings merge key by key, anything else is replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: _merge(base[k], over[k]) if k in base and k in over else over.get(k, base.get(k))
                for k in {**base, **over}}
    return over


@pytest.mark.parametrize("name", ["2gw-trainium3", "2gw-mi355x", "2gw-b200"])
def test_a_preset_override_starts_the_site_up_would(name: str) -> None:
    """docker-compose.yml + deploy/presets/<preset>.compose.yml: one chip service per shard tiling the preset's
    chips, the fabric with the preset's count, tree and routing, and a broker listing every shard."""
    from gigacluster.sites import get_preset

    site = get_preset(name).resolve()
    over = yaml.safe_load((DEPLOY / "presets" / f"{name}.compose.yml").read_text())
    # compose's schema wants every command element a string (an unquoted 3 in YAML is an int)
    assert all(isinstance(a, str) for svc in over["services"].values() for a in svc.get("command", []))
    runs = {r.name: r for r in service_runs(_merge(load_compose(), over))}
    chips = sorted((r.config() for r in runs.values() if r.service == "chip"), key=lambda c: c.device_offset)
    assert len(chips) == site["shards"] and {c.chip for c in chips} == {site["chip"]}
    assert [c.device_offset for c in chips] == [i * site["chips"] // site["shards"] for i in range(site["shards"])]
    fabric = next(r.config() for r in runs.values() if r.service == "fabric")
    assert (fabric.chip, fabric.count, fabric.tiers, fabric.switch, fabric.routing) == (  # type: ignore[attr-defined]
        site["chip"], site["chips"], site["tiers"], site["switch"], site["routing"])
    broker = next(r.config() for r in runs.values() if r.service == "broker")
    assert {h for h, _ in endpoint_refs(broker.shards)} == {f"chip-{i}" for i in range(site["shards"])}  # type: ignore[attr-defined]


def test_the_event_clock_override_points_every_service_at_its_coordinator() -> None:
    """docker-compose.yml + docker-compose.event-clock.yml: a `serve clock` container binding the port every
    other gigacluster service's clock_coordinator names (a compose host, not localhost), each of them in
    event mode, the coordinator expecting exactly their number, and every merged config valid."""
    over = yaml.safe_load((DEPLOY / "docker-compose.event-clock.yml").read_text())
    assert all(isinstance(a, str) for svc in over["services"].values() for a in svc.get("command", []))
    merged = _merge(load_compose(), over)
    runs = {r.name: r for r in service_runs(merged)}
    clock = runs.pop("clock")
    ccfg = cfgmod.load(cfgmod.SERVE_CONFIGS["clock"], flags=clock.flags, env=clock.env)
    assert clock.argv[:2] == ["serve", "clock"] and ccfg.host == "0.0.0.0"
    assert build_parser().parse_args(clock.argv).service == "clock"
    assert endpoint_refs(clock.spec["healthcheck"]["test"][3])[0][1] == ccfg.port
    assert ccfg.expect == len(runs) == 6  # type: ignore[attr-defined]
    for r in runs.values():
        cfg = r.config()
        assert cfg.clock == "event" and endpoint_refs(cfg.clock_coordinator) == [("clock", ccfg.port)], r.name
        assert r.env["GIGACLUSTER_MQTT"] == "mosquitto:1883"  # the base environment survives the merge
