"""``gigacluster demo``: a live mesh, a training job and an inference burst sharing it, a report.

The stack runs on free ports with its own embedded MQTT broker, so the demo never collides with
a ``gigacluster up`` already running. Prompts share a few long system prompts (as chat traffic
does), which the router's prefix-aware policy exploits.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pathlib
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiomqtt
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.cli.up import DEFAULT_MODEL, add_stack_args, bring_up, stack_config
from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.hw.catalog import facility
from gigacluster.report import ChipTotals, cluster_it_energy_j, load, render
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.clock import EventClock
from gigacluster.runtime.logging import configure
from gigacluster.runtime.participant import participate
from gigacluster.scheduler.v1 import scheduler_pb2
from gigacluster.stack import Stack

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"
SYSTEM_PROMPTS = [
    "You are a careful assistant for platform engineers. Answer with exact commands and explain each flag. " * 6,
    "You are a capacity planner. Give numbers with units and state every assumption you make. " * 6,
    "You review Python services for correctness, latency and memory use, citing the line you mean. " * 6,
    "You summarise incident reports into cause, impact, timeline and follow-up actions. " * 6,
]


def _prompt(rng: np.random.Generator, i: int) -> str:
    system = SYSTEM_PROMPTS[int(rng.integers(len(SYSTEM_PROMPTS)))]
    return f"{system}\nUser {i}: how long would request {i} take on this cluster, and why?"


async def _inference(gc: Client, n: int, duration_s: float, sleep: Callable[[float], Awaitable[None]],
                     progress: Progress, task: Any, requests: list[dict[str, float]]) -> list[str]:
    """Poisson arrivals (open loop) over ``duration_s`` virtual seconds (``sleep`` waits virtual seconds);
    returns error strings."""
    rng = np.random.default_rng(7)
    gaps = rng.exponential(duration_s / n, size=n)
    errors: list[str] = []

    async def one(i: int) -> None:
        try:
            async for chunk in gc.generate(f"deployments/{DEFAULT_MODEL['deployment_id']}", _prompt(rng, i),
                                           max_tokens=int(rng.integers(32, 128))):
                if chunk.HasField("usage"):
                    u = chunk.usage
                    requests.append({"ttft_s": u.ttft_s, "e2e_s": u.e2e_s, "tokens": u.completion_tokens})
        except Exception as exc:  # noqa: BLE001 - reported, the demo goes on
            errors.append(f"request {i}: {exc}")
        progress.advance(task)

    tasks = []
    for i in range(n):
        await sleep(float(gaps[i]))
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return errors


def _clocked(stack: Stack) -> contextlib.AbstractAsyncContextManager[EventClock | None]:
    """In event-clock mode the demo takes part in the clock (its arrivals are virtual-time events); else nothing."""
    if stack.cfg.clock != "event":
        return contextlib.nullcontext(None)
    return participate(stack.endpoint_of("clock"), "demo", key=stack.admin_key)


async def _watch(gc: Client, name: str, progress: Progress, task: Any) -> scheduler_pb2.Job:
    job = None
    async for upd in gc.watch_job(name):
        job = upd.job
        progress.update(task, completed=job.step, total=job.steps_total,
                        description=f"training {name} [{scheduler_pb2.Job.State.Name(job.state)[6:].lower()}]")
    assert job is not None
    return job


async def _record(stack: Stack, path: pathlib.Path) -> None:
    """Append every telemetry message of the demo's cluster to ``path`` (as the admin MQTT user)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    host, _, port = stack.mqtt.rpartition(":")
    with path.open("a") as f:
        async with aiomqtt.Client(host, int(port), username="admin", password=stack.mqtt_admin_password) as c:
            await c.subscribe(f"gigacluster/{stack.cfg.cluster}/#")
            async for msg in c.messages:
                f.write(json.dumps({"topic": str(msg.topic), "payload": json.loads(bytes(msg.payload))}) + "\n")


async def chip_totals(stack: Stack) -> ChipTotals:
    """Every chip shard's metered energy, devices and power, summed (the admin reads all devices)."""
    md = call_metadata(api_key=stack.admin_key)
    energy_j = power_w = now_s = 0.0
    devices = 0
    for i in range(len(stack.shard_ports)):
        async with open_channel(stack.endpoint_of(f"chip-{i}"), stack.tls) as ch:
            r = await chip_pb2_grpc.ChipServiceStub(ch).GetStats(chip_pb2.GetStatsRequest(), metadata=md, timeout=10)
        energy_j, power_w, devices, now_s = energy_j + r.energy_j, power_w + r.power_w, devices + r.devices, r.now_s
    return ChipTotals(energy_j=energy_j, devices=devices, power_w=power_w, now_s=now_s)


def _pct(s: Any) -> str:
    return f"{s.p50_s * 1e3:.0f} / {s.p90_s * 1e3:.0f} / {s.p99_s * 1e3:.0f} ms"


def register(subparsers: Any) -> None:
    d = subparsers.add_parser("demo", help="start the stack, run a training job and an inference burst, report")
    add_stack_args(d)
    d.set_defaults(handler=run_demo)
    d.add_argument("--requests", type=int, default=48, help="inference requests in the burst (default 48)")
    d.add_argument("--job", default="", help="job file (default: examples/demo-train-h100.yaml)")
    d.add_argument("--record", default="", metavar="DIR",
                   help="also record the run's telemetry and write plots and report.html into DIR")


def run_demo(args: argparse.Namespace) -> int:
    configure("demo", fmt="console", level="warning")
    return asyncio.run(demo(args))


async def demo(args: argparse.Namespace) -> int:
    console = Console()
    job_file = pathlib.Path(args.job) if args.job else EXAMPLES / "demo-train-h100.yaml"
    with tempfile.TemporaryDirectory(prefix="gigacluster-demo-") as tmp:
        args.base_port = 0
        cfg = stack_config(args, state=pathlib.Path(tmp))
        cfg.ports = {k: 0 for k in DEFAULT_PORTS}
        cfg.mqtt_port = 0
        stack = Stack(cfg)
        t0 = time.monotonic()
        console.print(f"[bold]gigacluster demo[/]: {cfg.chips} x {cfg.chip}, "
                      + ("event clock" if cfg.clock == "event" else f"speed-up {cfg.speedup:g}x"))
        try:
            key = await bring_up(stack, deploy=True, disaggregated=True)
            console.print(f"mesh up in {time.monotonic() - t0:.1f} s: five services, MQTT at {stack.mqtt}")
            async with _clocked(stack) as clock, Client(stack.endpoints, key, tls=stack.tls) as gc:
                sleep = clock.sleep if clock is not None else (lambda v: asyncio.sleep(v / cfg.speedup))
                chips0 = await chip_totals(stack)
                job = await gc.submit_job_file(job_file)
                predicted = job.predicted_step_time_s
                duration = predicted * job.steps_total
                with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), console=console) as progress:
                    jt = progress.add_task(f"training {job.name}", total=job.steps_total)
                    it = progress.add_task("inference requests", total=args.requests)
                    requests: list[dict[str, float]] = []
                    recorder = (asyncio.create_task(_record(stack, pathlib.Path(args.record) / "run.jsonl"))
                                if args.record else None)
                    final, errors = await asyncio.gather(
                        _watch(gc, job.name, progress, jt),
                        _inference(gc, args.requests, duration, sleep, progress, it, requests))
                    if recorder is not None:
                        await asyncio.sleep(2.0)  # the last telemetry ticks (1 s interval)
                        recorder.cancel()
                        await asyncio.gather(recorder, return_exceptions=True)
                stats = (await gc.router.GetStats(router_pb2.GetStatsRequest(
                    deployment=f"deployments/{DEFAULT_MODEL['deployment_id']}"), metadata=gc.md)).deployments[0]
                chips = await chip_totals(stack)
            _report(console, final, predicted, stats, chips0, chips, errors, time.monotonic() - t0)
            if args.record:
                out = pathlib.Path(args.record)
                with (out / "run.jsonl").open("a") as f:
                    for r in requests:
                        f.write(json.dumps({"request": r}) + "\n")
                page = render(load((out / "run.jsonl").read_text().splitlines()), out, title="gigacluster demo")
                console.print(f"plots and report: {page}")
        finally:
            await stack.stop()
    return 0 if final.state == scheduler_pb2.Job.STATE_SUCCEEDED else 1


def _report(console: Console, job: scheduler_pb2.Job, predicted: float, stats: Any, chips0: ChipTotals,
            chips: ChipTotals, errors: list[str], wall_s: float) -> None:
    t = Table(title="gigacluster demo report (virtual time)", show_header=False)
    t.add_column("metric")
    t.add_column("value")
    state = scheduler_pb2.Job.State.Name(job.state)[6:]
    t.add_row("training job", f"{job.name}: {state}, {job.step}/{job.steps_total} steps, {job.tokens:,.0f} tokens")
    t.add_row("step time (last / model)", f"{job.last_step_time_s:.3f} s / {predicted:.3f} s "
              f"({(job.last_step_time_s / predicted - 1) * 100:+.1f}%)")
    t.add_row("step breakdown (mean)", f"compute {job.compute_s:.3f} s, exposed comm {job.exposed_comm_s:.3f} s, "
              f"bubble {job.bubble_s:.3f} s")
    t.add_row("MFU", f"{job.mfu * 100:.1f}%")
    t.add_row("training energy", f"{job.usage.energy_it_j / 3.6e6:.3f} kWh IT, "
              f"{job.usage.energy_facility_j / 3.6e6:.3f} kWh at the meter")
    t.add_row("training cost", f"${job.usage.cost_usd:.2f} ({job.usage.chip_hours:.2f} chip-hours)")
    if stats is not None:
        t.add_row("inference requests", f"{stats.completed} completed, {stats.rejected} rejected, "
                  f"{len(errors)} errors")
        t.add_row("TTFT p50 / p90 / p99", _pct(stats.ttft))
        t.add_row("ITL p50 / p90 / p99", _pct(stats.itl))
        t.add_row("decode throughput", f"{stats.tokens_per_s:,.0f} tokens/s; prefix hit rate "
                  f"{stats.prefix_hit_rate * 100:.0f}%")
        t.add_row("KV caches over the fabric", f"{stats.kv_transfers} transfers, "
                  f"{stats.kv_transfer_bytes / 1e9:.2f} GB (prefill and decode replicas on different chips, "
                  "sharing the fabric with training)")
    # The cluster on the job's boundary: IT (chips plus each chip's host share), from submission to the
    # end, every chip (the idle ones too). Link energy is booked per job only, so it is not in here.
    window_s = chips.now_s - chips0.now_s
    it_j = cluster_it_energy_j(chips.energy_j - chips0.energy_j, chips.devices, window_s)
    u = job.usage
    pue = u.energy_facility_j / u.energy_it_j if u.energy_it_j > 0 else facility().pue_default  # the job's PUE
    t.add_row("cluster energy (same boundary)",
              f"{it_j / 3.6e6:.3f} kWh IT, {it_j * pue / 3.6e6:.3f} kWh at the meter: all "
              f"{chips.devices} chips with their host share, idle ones included, over the "
              f"{window_s:.0f} s from submission to the end (the job: its {job.usage.chip_hours:.2f} chip-hours only)")
    t.add_row("cluster chips now", f"{chips.devices} devices, {chips.power_w / 1e3:.1f} kW (chips alone)")
    t.add_row("wall time", f"{wall_s:.1f} s")
    console.print(t)
    for e in errors[:5]:
        console.print(f"[red]{e}[/]")
