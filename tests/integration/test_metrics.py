"""Prometheus metrics under the names existing dashboards use (dcgm-exporter for chips)."""

from __future__ import annotations

import asyncio
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
