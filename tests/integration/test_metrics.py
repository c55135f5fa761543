"""Prometheus metrics under the names existing dashboards use (dcgm-exporter for chips)."""

from __future__ import annotations

import asyncio
import dataclasses
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gigacluster.stack import Stack

pytestmark = pytest.mark.integration


async def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode()

    text = await asyncio.to_thread(get)
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
    assert all(abs(free[g] + used[g] - 80e9 / 2**20) < 1 for g in free)
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
