"""Performance-loss detection: a job slowed by a slow chip or a degraded link is flagged with the cause."""

from __future__ import annotations

import asyncio
import pathlib
import urllib.request
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gigacluster.broker.v1 import broker_pb2
from gigacluster.chip.v1 import chip_pb2
from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.fabric.v1 import fabric_pb2
from gigacluster.runtime.auth import call_metadata
from gigacluster.scheduler.spec import split_job_file
from gigacluster.stack import Stack

pytestmark = pytest.mark.integration
JOB = pathlib.Path(__file__).resolve().parents[2] / "examples" / "demo-train-h100.yaml"


async def run_with_fault(stack: Stack, gc: Client, inject: Any, steps: int = 12) -> list[str]:
    """Run the demo job, call ``inject(devices)`` after its second step, return the WatchJob messages."""
    data = yaml.safe_load(JOB.read_text())
    data["steps"] = steps
    spec, job = split_job_file(data)
    submitted = await gc.submit_job(spec, **job)
    messages: list[str] = []
    injected = None
    async for upd in gc.watch_job(submitted.name):
        messages.append(upd.message)
        if injected is None and upd.job.step >= 2 and upd.job.instance:
            inst = await gc.broker.GetInstance(broker_pb2.GetInstanceRequest(name=upd.job.instance), metadata=gc.md)
            injected = await inject([(r.start, r.end) for r in inst.instance.devices])
    return [m for m in messages if m]


async def scrape(port: int, name: str) -> dict[str, float]:
    text = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode())
    return {s.labels.get("cause", ""): s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == name}


async def test_a_slow_chip_is_flagged_as_the_cause(stack: Stack, tenant: Client) -> None:
    """A SLOW fault (half clock) on one of the job's chips makes its steps slower than the model; the
    scheduler flags a performance loss naming a throttled or faulty chip, in WatchJob and Prometheus."""
    admin = call_metadata(api_key=stack.admin_key)
    before = await scrape(stack.metrics_ports["scheduler"], "gigacluster_performance_loss_events_total")
    faulted: list[tuple[int, int]] = []

    async def slow(ranges: list[tuple[int, int]]) -> bool:
        start = ranges[0][0]
        assert start < 32, "the test expects the job on the first chip shard"
        await tenant.chip.InjectFault(chip_pb2.InjectFaultRequest(
            devices=[common_pb2.DeviceRange(start=start, end=start + 1)], kind=chip_pb2.FAULT_KIND_SLOW,
            clock_factor=0.5), metadata=admin)
        faulted.append((start, start + 1))
        return True

    try:
        msgs = await run_with_fault(stack, tenant, slow)
    finally:
        for a, b in faulted:
            await tenant.chip.ClearFault(chip_pb2.ClearFaultRequest(
                devices=[common_pb2.DeviceRange(start=a, end=b)]), metadata=admin)
    alerts = [m for m in msgs if m.startswith("performance loss")]
    assert alerts and "throttled_or_faulty_chip" in alerts[0] and "1 of 32 chips" in alerts[0]
    after = await scrape(stack.metrics_ports["scheduler"], "gigacluster_performance_loss_events_total")
    assert after["throttled_or_faulty_chip"] > before.get("throttled_or_faulty_chip", 0)


async def test_a_degraded_link_is_flagged_as_the_cause(stack: Stack, tenant: Client) -> None:
    """Degrading the NIC link of one of the job's chips slows its data-parallel collectives; the scheduler
    names a degraded link."""
    admin = call_metadata(api_key=stack.admin_key)
    target: list[str] = []

    async def degrade(ranges: list[tuple[int, int]]) -> bool:
        nic = await tenant.fabric.ListLinks(fabric_pb2.ListLinksRequest(tier="nic", page_size=1000), metadata=admin)
        start = ranges[0][0]
        name = next(ln.name for ln in nic.links if ln.name.startswith(f"links/chip{start}-"))
        await tenant.fabric.InjectLinkFault(fabric_pb2.InjectLinkFaultRequest(
            target=name, kind=fabric_pb2.InjectLinkFaultRequest.KIND_DEGRADED, capacity_factor=0.2), metadata=admin)
        target.append(name)
        return True

    try:
        msgs = await run_with_fault(stack, tenant, degrade)
    finally:
        for name in target:
            await tenant.fabric.ClearLinkFault(fabric_pb2.ClearLinkFaultRequest(target=name), metadata=admin)
    alerts = [m for m in msgs if m.startswith("performance loss")]
    assert alerts and "degraded_link" in alerts[0] and "nic" in alerts[0]
