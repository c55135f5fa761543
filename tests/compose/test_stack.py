"""deploy/docker-compose.yml for real: images built (on the Debian base, deploy/local/make-base-image.sh),
the stack started with podman through deploy/local/compose.sh, every container healthy, then driven from
the host as a user would (CLI, openai client, MQTT with the generated credentials, PromQL), a service
killed and brought back by its restart policy, and `down -v` leaving nothing behind.

Marked ``compose``: `.ci/run` runs it as its last step (`python -m pytest -m compose`). The modules'
tests run in file order against one stack (the fixture); each says what it proves on its own."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import aiomqtt
import grpc
import openai
import pytest
import pytest_asyncio
import yaml

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.cli.main import build_parser
from gigacluster.cli.mqtt_files import parse_env
from gigacluster.client import Client, Endpoints
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime import config as cfgmod
from gigacluster.runtime.auth import call_metadata
from tests.integration.test_prometheus import DASHBOARD, _exprs, metric_names, query_until
from tests.integration.test_router_http import read_completion_stream
from tests.ops.compose import endpoint_refs
from tests.ops.prometheus import PrometheusApi, local_config
from tests.ops.test_compose_processes import _listening as port_in_use

from .podman import HOST_PORTS, PROJECT, ROOT, ComposeLoader, ComposeStack, require_tools

pytestmark = pytest.mark.compose
ENV = parse_env((ROOT / "deploy" / "gigacluster.env").read_text())
CLUSTER = ENV["GIGACLUSTER_CLUSTER"]
MODEL = "llama3-8b"
GIGACLUSTER_SERVICES = ("chip-0", "chip-1", "fabric", "broker", "scheduler", "router")


@dataclasses.dataclass
class Tenant:
    api_key: str
    home: pathlib.Path  # GIGACLUSTER_HOME for the CLI: no credentials.json of a local `up` is read


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComposeStack]:
    """The compose stack, built and started (`compose.sh build`, `up -d`); `down -v` afterwards whatever happens."""
    require_tools()
    cs = ComposeStack(tmp_path_factory.mktemp("compose"))
    cs.run("down", "-v", check=False, timeout_s=180)  # what an interrupted run may have left
    cs.baseline_volumes = set(cs.volumes())
    busy = [p for p in HOST_PORTS if port_in_use(p)]
    if busy:
        pytest.fail(f"ports the local compose run binds are in use on this host: {busy}")
    try:
        cs.run("build", timeout_s=900)
        cs.run("up", "-d", timeout_s=300)
        yield cs
    finally:
        cs.run("down", "-v", check=False, timeout_s=180)
        print(f"\ncompose timings (s): { {k: round(v, 1) for k, v in cs.timings.items()} }")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def tenant(stack: ComposeStack, tmp_path_factory: pytest.TempPathFactory) -> Tenant:
    """Tenant ``default`` created with the admin key from deploy/gigacluster.env, with ``llama3-8b`` deployed."""
    if not stack.all_healthy:
        await asyncio.to_thread(stack.wait_healthy)
    async with grpc.aio.insecure_channel("127.0.0.1:50053") as ch:
        broker = broker_pb2_grpc.BrokerServiceStub(ch)
        admin = call_metadata(api_key=ENV["GIGACLUSTER_ADMIN_KEY"])
        deadline = time.monotonic() + 60
        while True:  # the broker answers health before it has inventoried both shards
            inv = await broker.GetInventory(broker_pb2.GetInventoryRequest(), metadata=admin, timeout=5)
            if len(inv.shards) == 2 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert (len(inv.shards), inv.free_devices) == (2, 64)
        key = (await broker.CreateTenant(broker_pb2.CreateTenantRequest(tenant_id="default"),
                                         metadata=admin, timeout=10)).api_key
    async with Client(Endpoints(), key) as gc:  # the compose ports; no credentials.json of a local `up`
        await gc.router.DeployModel(router_pb2.DeployModelRequest(
            deployment_id=MODEL, model=common_pb2.ModelArchitecture(preset=MODEL), chip="h100-sxm",
            tp=1, replicas=1), metadata=gc.md)
    return Tenant(str(key), tmp_path_factory.mktemp("home"))


def cli(tenant: Tenant, *args: str, timeout_s: float = 120.0) -> str:
    """`gigacluster ARGS` from the host, as the tenant (GIGACLUSTER_API_KEY); its stdout."""
    env = {**os.environ, "GIGACLUSTER_API_KEY": tenant.api_key, "GIGACLUSTER_HOME": str(tenant.home)}
    r = subprocess.run([sys.executable, "-m", "gigacluster.cli.main", *args], capture_output=True, text=True,
                       env=env, timeout=timeout_s, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"gigacluster {' '.join(args)} exited {r.returncode}: {r.stderr[-1500:]}"
    return r.stdout


def job_file(tmp: pathlib.Path, steps: int) -> pathlib.Path:
    """examples/demo-train-h100.yaml (32 H100, about 0.7 s a step) cut to ``steps``, a checkpoint every 4."""
    spec = yaml.safe_load((ROOT / "examples" / "demo-train-h100.yaml").read_text())
    spec.update(steps=steps, checkpoint_interval_steps=4)
    path = tmp / f"job-{steps}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def jobs(tenant: Tenant) -> dict[str, dict[str, Any]]:
    return {j["name"]: j for j in json.loads(cli(tenant, "jobs", "--json"))}


def test_podman_compose_merges_the_override_into_configs_the_services_accept() -> None:
    """`compose.sh config` (podman-compose merging docker-compose.yml and the local override) gives every
    gigacluster container a command the CLI parses and a config that validates, bound to loopback on a port
    no other container binds; every HOST:PORT it is given is one a container binds; health checks probe the
    service's own port; Grafana is left out and Prometheus scrapes every service's metrics port."""
    require_tools()
    out = subprocess.run(["bash", str(ROOT / "deploy/local/compose.sh"), "config"], capture_output=True,
                         text=True, timeout=120, check=True, stdin=subprocess.DEVNULL).stdout
    services = yaml.load(out, ComposeLoader)["services"]
    assert set(services) == {*GIGACLUSTER_SERVICES, "mosquitto", "prometheus"}
    assert {s["network_mode"] for s in services.values()} == {"host"}
    configs = {}
    for name in GIGACLUSTER_SERVICES:
        spec = services[name]
        argv = [str(a) for a in spec["command"]]
        args = build_parser().parse_args(argv)
        env = {**parse_env((ROOT / "deploy" / "gigacluster.env").read_text()), **spec["environment"]}
        configs[name] = cfgmod.load(cfgmod.CONFIGS[args.service], flags=vars(args), env=env)
        assert configs[name].host == "127.0.0.1"
        assert spec["healthcheck"]["test"][3] == f"127.0.0.1:{configs[name].port}"
    bound = [c.port for c in configs.values()] + [c.metrics_port for c in configs.values()]
    bound += [configs["router"].http_port, 1883]  # type: ignore[attr-defined]
    assert len(bound) == len(set(bound)), bound
    for name, c in configs.items():
        for field in ("mqtt", "broker", "shards", "fabric"):
            for host, port in endpoint_refs(str(getattr(c, field, ""))):
                assert host == "127.0.0.1" and port in bound, f"{name}.{field} = {getattr(c, field)}"
    local = yaml.safe_load((ROOT / "deploy/local/prometheus.yml").read_text())
    assert local == local_config({n: c.metrics_port for n, c in configs.items()})


def test_every_container_becomes_healthy(stack: ComposeStack) -> None:
    """After `up -d`, all eight containers (six gigacluster services, Mosquitto, Prometheus) run from the
    images built here and pass their health checks; Grafana is not started."""
    status = stack.wait_healthy()
    assert status == {s: "healthy" for s in (*GIGACLUSTER_SERVICES, "mosquitto", "prometheus")}
    images = {svc: c["ImageName"] for svc, c in stack.containers().items()}
    assert {images[s] for s in GIGACLUSTER_SERVICES} == {"localhost/gigacluster:latest"}
    assert images["mosquitto"] == "localhost/gigacluster-mosquitto:bookworm"
    assert images["prometheus"] == "localhost/gigacluster-prometheus:bookworm"


def test_cli_submits_a_job_and_watches_it_finish(tenant: Tenant, tmp_path: pathlib.Path) -> None:
    """`gigacluster submit` on the host queues a 32-chip job in the containers; `gigacluster watch` follows
    it step by step to SUCCEEDED, and `gigacluster jobs` reports it done with its energy and cost."""
    name = cli(tenant, "submit", str(job_file(tmp_path, 12))).strip()
    assert re.fullmatch(r"jobs/j-\d+", name), name
    lines = cli(tenant, "watch", name).strip().splitlines()
    assert len(lines) >= 2 and lines[-1].startswith(f"{name} SUCCEEDED step 12/12"), lines[-3:]
    job = jobs(tenant)[name]
    assert (job["state"], job["step"], job["chips"]) == ("SUCCEEDED", 12, 32)
    assert job["energy_it_kwh"] > 0 and job["cost_usd"] > 0


async def test_openai_client_streams_a_completion(tenant: Tenant) -> None:
    """The openai client streams a completion from the router container's HTTP API, token events then a
    'length' finish, and usage counts every token."""
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key=tenant.api_key, max_retries=0)
    try:
        stream = await client.completions.create(model=MODEL, prompt="Explain max-min fairness", max_tokens=16,
                                                 stream=True, stream_options={"include_usage": True})
        texts, finish, usage = await read_completion_stream(stream)
        assert len(texts) >= 2 and "".join(texts).strip()
        assert finish == "length" and usage is not None and usage.completion_tokens == 16
    finally:
        await client.close()


async def _topics(user: str, password: str, topic: str, until: str, budget_s: float) -> list[str]:
    """Topics received as ``user`` on ``topic`` until one contains ``until`` (or the budget runs out)."""
    seen: list[str] = []
    async with aiomqtt.Client("127.0.0.1", 1883, username=user, password=password) as mq:
        await mq.subscribe(topic)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(budget_s):
                async for msg in mq.messages:
                    seen.append(str(msg.topic))
                    json.loads(msg.payload)  # type: ignore[arg-type]
                    if until in seen[-1]:
                        break
    return seen


async def test_mqtt_telemetry_reaches_the_generated_users(tenant: Tenant) -> None:
    """Mosquitto's container enforces the generated passwd and ACL: `admin` (MQTT_PASSWORD_ADMIN) reads the
    chips' telemetry; `tenant-default` subscribed to everything gets only its own deployment's stats; a
    wrong password is refused."""
    root = f"gigacluster/{CLUSTER}"
    admin = await _topics("admin", ENV["MQTT_PASSWORD_ADMIN"], f"{root}/#", "/chip/", 20)
    assert any(t.startswith(f"{root}/chip/shards/") for t in admin), admin[:10]
    own = await _topics("tenant-default", ENV["MQTT_PASSWORD_TENANT_DEFAULT"], f"{root}/#",
                        f"/deployments/{MODEL}/", 20)
    assert own and all(t.startswith(f"{root}/router/tenants/default/") or t.startswith(
        f"{root}/scheduler/tenants/default/") for t in own), own[:10]
    assert any(f"/deployments/{MODEL}/" in t for t in own)
    with pytest.raises(aiomqtt.MqttError):
        await _topics("admin", "not-the-password", f"{root}/#", "", 5)


async def test_prometheus_serves_dcgm_vllm_and_link_series_and_the_dashboard_queries(tenant: Tenant) -> None:
    """The Prometheus container scrapes all six services; PromQL returns DCGM power for the 64 chips, the
    deployment's vLLM token counter, link utilisation per tier; and every query of the Grafana dashboard
    (Grafana is left out of the local run) returns series from the real Prometheus."""
    prom = PrometheusApi("http://127.0.0.1:9090")
    up = await query_until(prom, "up", lambda r: len(r) == 6 and {float(x["value"][1]) for x in r} == {1.0}, 60)
    assert sorted(r["metric"]["service"] for r in up) == ["broker", "chip", "chip", "fabric", "router", "scheduler"]
    power = await query_until(prom, "DCGM_FI_DEV_POWER_USAGE", lambda r: len(r) == 64, 30)
    assert sorted(int(r["metric"]["gpu"]) for r in power) == list(range(64))
    async with Client(Endpoints(), tenant.api_key) as gc:
        _ = [c async for c in gc.generate(f"deployments/{MODEL}", "tokens for prometheus", max_tokens=16)]
    tokens = await query_until(prom, f'vllm:generation_tokens_total{{model_name="{MODEL}"}}',
                               lambda r: bool(r) and float(r[0]["value"][1]) >= 16, 30)
    assert tokens and float(tokens[0]["value"][1]) >= 16
    links = await query_until(prom, "gigacluster_link_utilization", lambda r: len(r) >= 2, 30)
    assert {"scaleup", "nic"} <= {r["metric"]["tier"] for r in links}
    dash = json.loads(DASHBOARD.read_text())
    exprs = _exprs(dash)
    names = set(await asyncio.to_thread(prom.api, "label/__name__/values"))
    wanted = set().union(*(metric_names(e) for e in exprs))
    assert wanted and wanted <= names, sorted(wanted - names)
    for expr in exprs:
        q = expr.replace("$chip", "h100-sxm")
        assert await query_until(prom, q, bool, 30), f"dashboard query returned nothing: {q}"


def test_a_killed_service_is_restarted_by_its_policy_and_the_job_still_finishes(
        stack: ComposeStack, tenant: Tenant, tmp_path: pathlib.Path) -> None:
    """The scheduler container's process killed (SIGKILL, as a crash) mid-job: `restart: unless-stopped`
    brings the container back, healthy, on its state volume, and the job it was running finishes."""
    name = cli(tenant, "submit", str(job_file(tmp_path, 20))).strip()
    deadline = time.monotonic() + 60
    while jobs(tenant)[name]["step"] < 5:  # past a durable checkpoint (every 4 steps)
        assert time.monotonic() < deadline, jobs(tenant)[name]
        time.sleep(0.5)
    before = stack.containers()["scheduler"]
    os.kill(before["State"]["Pid"], signal.SIGKILL)
    deadline = time.monotonic() + 60
    while True:
        after = stack.containers()["scheduler"]
        if after["RestartCount"] > before["RestartCount"] and after["State"]["Status"] == "running":
            break
        assert time.monotonic() < deadline, after["State"]
        time.sleep(0.5)
    assert after["State"]["Pid"] != before["State"]["Pid"]
    assert stack.wait_healthy(60, only=("scheduler",)) == {"scheduler": "healthy"}
    lines = cli(tenant, "watch", name).strip().splitlines()
    assert lines[-1].startswith(f"{name} SUCCEEDED step 20/20"), lines[-3:]
    assert jobs(tenant)[name]["state"] == "SUCCEEDED"


def test_compose_down_leaves_no_container_volume_or_port(stack: ComposeStack) -> None:
    """`compose.sh down -v` removes every container of the project, their named and anonymous volumes,
    and frees every port the stack bound."""
    assert set(stack.volumes()) > stack.baseline_volumes, "the stack's volumes exist before down"
    stack.run("down", "-v", timeout_s=180)
    assert stack.containers() == {}
    assert stack.podman("ps", "-a", "-q", "--filter", f"label=io.podman.compose.project={PROJECT}").split() == []
    assert set(stack.volumes()) == stack.baseline_volumes
    assert [p for p in HOST_PORTS if port_in_use(p)] == []
