"""Prometheus metrics under the names existing dashboards use (dcgm-exporter for chips)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import urllib.request
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gigacluster.stack import Stack
from tests.conftest import required_exe

pytestmark = pytest.mark.integration
MIB = 2**20


async def scrape_text(port: int) -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    return await asyncio.to_thread(get)


async def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    text = await scrape_text(port)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


async def test_chip_shards_export_dcgm_metric_names_per_device(stack: Stack) -> None:
    """Each chip shard exports DCGM_FI_DEV_* per device (gpu label = global id) with physical values."""
    m = await scrape(stack.metrics_ports["chip"])
    power = m["DCGM_FI_DEV_POWER_USAGE"]
    assert sorted(int(lbl["gpu"]) for lbl, _ in power) == list(range(32))
    idle = 90.0  # H100 idle power in the catalog (assumed, see catalog.yaml)
    assert all(idle * 0.999 <= v <= 700.0 for _, v in power)
    assert all(0.0 <= v <= 100.0 for _, v in m["DCGM_FI_DEV_GPU_UTIL"])
    assert all(20.0 <= v <= 110.0 for _, v in m["DCGM_FI_DEV_GPU_TEMP"])
    free = {lbl["gpu"]: v for lbl, v in m["DCGM_FI_DEV_FB_FREE"]}
    used = {lbl["gpu"]: v for lbl, v in m["DCGM_FI_DEV_FB_USED"]}
    assert all(abs(free[g] + used[g] - 81559) < 1 for g in free)  # MiB, as nvidia-smi and DCGM report an H100 80GB
    m2 = await scrape(stack.metrics_ports["chip-1"])
    assert min(int(lbl["gpu"]) for lbl, _ in m2["DCGM_FI_DEV_POWER_USAGE"]) == 32


async def test_fabric_and_broker_export_their_aggregates(stack: Stack) -> None:
    """The fabric exports utilisation per tier; the broker devices by state adding up to the cluster."""
    f = await scrape(stack.metrics_ports["fabric"])
    tiers = {lbl["tier"] for lbl, _ in f["gigacluster_link_utilization"]}
    assert {"scaleup", "nic"} <= tiers
    assert all(0.0 <= v <= 1.0 for _, v in f["gigacluster_link_utilization_max"])
    b = await scrape(stack.metrics_ports["broker"])
    assert sum(v for _, v in b["gigacluster_devices"]) == 64


async def test_router_exports_vllm_metrics_and_flags_a_slow_replica(stack: Stack) -> None:
    """The router exports vLLM's metric names per deployment; a replica whose chip runs at half clock makes the
    deployment's slowdown gauge rise past 5% with cause throttled_or_faulty_chip, and clearing the fault ends it."""
    from gigacluster.broker.v1 import broker_pb2
    from gigacluster.chip.v1 import chip_pb2
    from gigacluster.client import Client
    from gigacluster.common.v1 import common_pb2
    from gigacluster.router.v1 import router_pb2
    from gigacluster.runtime.auth import call_metadata

    gc = Client(stack.endpoints, await stack.create_tenant("metrics-router"))
    admin = call_metadata(api_key=stack.admin_key)
    dep = (await gc.router.DeployModel(router_pb2.DeployModelRequest(
        deployment_id="slowdep", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
        replicas=1), metadata=gc.md)).deployment
    inst = (await gc.broker.GetInstance(broker_pb2.GetInstanceRequest(name=dep.instances[0]), metadata=gc.md)).instance
    dev = common_pb2.DeviceRange(start=inst.devices[0].start, end=inst.devices[0].start + 1)
    shard = Client(dataclasses.replace(stack.endpoints, chip=stack.endpoint_of("chip" if dev.start < 32 else "chip-1")),
                   None)
    chip = shard.chip
    for _ in range(3):
        _ = [c async for c in gc.generate("deployments/slowdep", "warm up the replica", max_tokens=8)]
    m = await scrape(stack.metrics_ports["router"])
    ttft = {lbl["le"]: v for lbl, v in m["vllm:time_to_first_token_seconds_bucket"] if lbl["model_name"] == "slowdep"}
    assert ttft["+Inf"] == 3
    assert any(lbl["model_name"] == "slowdep" for lbl, _ in m["vllm:num_requests_running"])
    # The router's own overload series: the accept probe runs and a lightly loaded router neither waits nor refuses.
    (_, probes), = m["gigacluster_router_accept_probes_total"]
    (_, wait), = m["gigacluster_router_accept_wait_seconds"]
    (_, share), = m["gigacluster_router_refuse_fraction"]
    (_, refused), = m["gigacluster_router_refused_total"]
    assert probes >= 1 and 0 <= wait < 0.25 and share == 0 and refused == 0, (probes, wait, share, refused)
    await chip.InjectFault(chip_pb2.InjectFaultRequest(devices=[dev], kind=chip_pb2.FAULT_KIND_SLOW,
                                                       clock_factor=0.5), metadata=admin)
    try:
        for _ in range(4):
            # Long prompts: prefill is compute bound, so a slow clock shows (batch-1 decode reads HBM and barely
            # slows, as on real hardware).
            _ = [c async for c in gc.generate("deployments/slowdep", list(range(1, 3000)), max_tokens=16)]
        m = await scrape(stack.metrics_ports["router"])
        slow = {lbl["model_name"]: v for lbl, v in m["gigacluster_deployment_slowdown"]}
        assert slow["slowdep"] > 0.05
        await asyncio.sleep(1.5)  # the next stats tick publishes the alert
        m = await scrape(stack.metrics_ports["router"])
        events = {lbl["cause"]: v for lbl, v in m.get("gigacluster_deployment_performance_loss_events_total", [])}
        assert events.get("throttled_or_faulty_chip", 0) >= 1
    finally:
        await chip.ClearFault(chip_pb2.ClearFaultRequest(devices=[dev]), metadata=admin)
        await gc.router.DeleteDeployment(router_pb2.DeleteDeploymentRequest(name=dep.name), metadata=gc.md)
        await gc.close()
        await shard.close()


async def test_promtool_checks_every_service_endpoint(stack: Stack) -> None:
    """``promtool check metrics`` finds nothing on the chip shards, fabric, broker and scheduler; on the
    router nothing but its reserved-character note on vLLM's own ``vllm:`` names (vLLM's endpoint gets the
    same), and every ``*_total`` family is typed counter (a served deployment, so vLLM's families exist)."""
    promtool = required_exe("promtool", "prometheus")
    from gigacluster.client import Client
    from gigacluster.common.v1 import common_pb2
    from gigacluster.router.v1 import router_pb2

    async with Client(stack.endpoints, await stack.create_tenant("metrics-promtool")) as gc:
        dep = (await gc.router.DeployModel(router_pb2.DeployModelRequest(
            deployment_id="promtool", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
            replicas=1), metadata=gc.md)).deployment
        try:
            _ = [c async for c in gc.generate("deployments/promtool", "count the tokens", max_tokens=8)]
            assert set(stack.metrics_ports) == {"chip", "chip-1", "fabric", "broker", "scheduler", "router"}
            for name, port in stack.metrics_ports.items():
                text = await scrape_text(port)
                r = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True,
                                   timeout=30, check=False)
                problems = [ln for ln in r.stderr.decode().splitlines() if ln.strip()]
                if name == "router":
                    assert r.returncode in (0, 3), problems
                    assert all(ln.startswith("vllm:") and ln.endswith("metric names should not contain ':'")
                               for ln in problems), problems
                else:
                    assert (r.returncode, problems) == (0, []), name
                types = {f.name: f.type for f in text_string_to_metric_families(text)}
                for fam, typ in types.items():
                    # prometheus_client's parser strips a counter's _total from the family name
                    assert not fam.endswith("_total") or typ != "gauge", (name, fam)
                if name == "router":
                    assert {types[n] for n in ("vllm:prompt_tokens", "vllm:generation_tokens",
                                               "vllm:request_success")} == {"counter"}
                if name.startswith("chip"):
                    assert types["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
                    assert types["gigacluster_shard_energy_joules"] == "counter"
        finally:
            await gc.router.DeleteDeployment(router_pb2.DeleteDeploymentRequest(name=dep.name), metadata=gc.md)


async def _memory_by_device(stack: Stack) -> dict[int, float]:
    out: dict[int, float] = {}
    for name in ("chip", "chip-1"):
        m = await scrape(stack.metrics_ports[name])
        out.update({int(lbl["gpu"]): v * MIB for lbl, v in m["DCGM_FI_DEV_FB_USED"]})
    return out


async def _shard_memory(stack: Stack) -> float:
    total = 0.0
    for name in ("chip", "chip-1"):
        m = await scrape(stack.metrics_ports[name])
        total += sum(v for _, v in m["gigacluster_shard_memory_used_bytes"])
    return total


def _ids(ranges: Any) -> list[int]:
    return [i for r in ranges for i in range(r.start, r.end)]


async def test_hbm_in_use_shows_a_job_and_two_replicas_and_drops_to_zero_on_release(
        stack: Stack, mosquitto: str) -> None:
    """While a 32-chip training job and a two-replica deployment run, their chips show HBM in use in
    DCGM_FI_DEV_FB_USED (the job: its plan's per-chip memory; a replica: its weight shard plus KV in
    use), in gigacluster_shard_memory_used_bytes and in the MQTT shard stats; released, all drop to 0."""
    import aiomqtt

    from gigacluster.broker.v1 import broker_pb2
    from gigacluster.client import Client
    from gigacluster.common.v1 import common_pb2
    from gigacluster.model.training import TrainSpec, plan_step
    from gigacluster.router.v1 import router_pb2
    from gigacluster.scheduler.v1 import scheduler_pb2

    from ..conftest import wait_for

    spec = {"model": {"preset": "llama3-8b", "seq_len": 2048}, "batch": {"global_batch": 64},
            "parallelism": {"tp": 8, "microbatch_size": 2, "recompute": "selective"},
            "hardware": {"chip": "h100-sxm", "count": 32}, "precision": "bf16", "steps": 1_000_000}
    job_mem = plan_step(TrainSpec.from_dict(spec)).memory.total_bytes
    weights = 8.03e9 * 2  # Llama 3 8B in bf16, about 16 GB per tp=1 replica chip
    gc = Client(stack.endpoints, await stack.create_tenant("metrics-hbm"))
    mqtt_host, _, mqtt_port = mosquitto.rpartition(":")
    shard_mem: dict[str, int] = {}

    async def listen() -> None:
        async with aiomqtt.Client(mqtt_host, int(mqtt_port)) as client:
            await client.subscribe(f"gigacluster/{stack.cfg.cluster}/chip/shards/+/stats")
            async for msg in client.messages:
                shard_mem[str(msg.topic)] = int(json.loads(bytes(msg.payload))["memory_used_bytes"])

    listener = asyncio.create_task(listen())
    before = await _shard_memory(stack)  # what earlier tests' deployments still hold
    job = await gc.submit_job(spec, name="hbm")
    dep = None
    try:
        dep = (await gc.router.DeployModel(router_pb2.DeployModelRequest(
            deployment_id="hbm", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
            replicas=2), metadata=gc.md)).deployment

        async def job_stepping() -> bool:
            j = await gc.get_job(job.name)
            return j.state == scheduler_pb2.Job.STATE_RUNNING and j.step >= 1

        await wait_for(job_stepping, 60)
        j = await gc.get_job(job.name)
        job_devs = _ids((await gc.broker.GetInstance(broker_pb2.GetInstanceRequest(name=j.instance),
                                                     metadata=gc.md)).instance.devices)
        rep_devs = []
        for inst in dep.instances:
            rep_devs += _ids((await gc.broker.GetInstance(broker_pb2.GetInstanceRequest(name=inst),
                                                          metadata=gc.md)).instance.devices)
        assert len(job_devs) == 32 and len(rep_devs) == 2

        async def replicas_report() -> bool:
            used = await _memory_by_device(stack)
            return all(used[d] > 0 for d in rep_devs)

        await wait_for(replicas_report, 30)  # idle replicas report their weights once placed
        used = await _memory_by_device(stack)
        assert all(abs(used[d] - job_mem) < MIB for d in job_devs)
        assert 5e9 < job_mem < 80e9  # weights, grads, sharded optimizer state and activations of tp=8
        assert all(weights * 0.95 < used[d] < weights * 1.05 for d in rep_devs)  # idle: no KV in use
        total = await _shard_memory(stack)
        assert total - before >= 32 * job_mem + 2 * weights * 0.95

        async def mqtt_shows_it() -> bool:
            return sum(shard_mem.values()) - before >= 32 * job_mem + 2 * weights * 0.95

        await wait_for(mqtt_shows_it, 15)
    finally:
        await gc.scheduler.CancelJob(scheduler_pb2.CancelJobRequest(name=job.name), metadata=gc.md)
        if dep is not None:
            await gc.router.DeleteDeployment(router_pb2.DeleteDeploymentRequest(name=dep.name), metadata=gc.md)

    async def all_released() -> bool:
        return await _shard_memory(stack) == before

    await wait_for(all_released, 30)
    used = await _memory_by_device(stack)
    assert {used[d] for d in job_devs + rep_devs} == {0.0}
    shard_mem.clear()

    async def mqtt_released() -> bool:
        return len(shard_mem) == 2 and sum(shard_mem.values()) == before

    await wait_for(mqtt_released, 15)
    listener.cancel()
    await gc.close()
