"""Replay a training run with its failures through the live mesh in event mode, and the offline model beside it.

:func:`replay` starts the mesh (a :class:`~gigacluster.stack.Stack` with the event clock) sized for the job
plus spare chips, starts the fault injector (``gigacluster faults run``, its own process on the same
clock), submits the job for ``hours`` of virtual time at its modelled step, watches it to the end and
reports goodput, interruptions by cause, energy, cost and the time lost to checkpoints and restarts,
next to :func:`~gigacluster.faults.goodput.simulate_goodput` for the same seed, table and costs.
``examples/llama3_405b_failures.py`` is the 54-day Llama 3 405B run; ``benchmarks/bench_faults_run.py``
measures it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

import grpc
import yaml

from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.clock.v1 import clock_pb2, clock_pb2_grpc
from gigacluster.faults.draw import mean_time_between_s
from gigacluster.faults.goodput import Mesh, simulate_goodput, young_daly_interval_s
from gigacluster.faults.journal import read_log
from gigacluster.faults.table import load_table
from gigacluster.hw.catalog import get_system
from gigacluster.model.training import TrainSpec, plan_step
from gigacluster.planning import estimate_train
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.participant import participate
from gigacluster.scheduler import checkpoint
from gigacluster.scheduler.spec import split_job_file
from gigacluster.stack import Proc, Stack, StackConfig

EXAMPLES = pathlib.Path(__file__).resolve().parents[3] / "examples"
INJECTOR_READY_S = 60.0  # wall seconds the fault injector may take to start and join the clock


@dataclasses.dataclass(frozen=True)
class Replay:
    """What to run: ``job_file`` on ``chips`` chips (plus ``spare_chips``) for ``hours`` of virtual time."""

    job_file: pathlib.Path = EXAMPLES / "llama3-405b-8k.yaml"
    chips: int = 16_384
    spare_chips: int = 64
    shards: int = 4
    hours: float = 54 * 24.0
    table: str = "llama3"
    scale: float = 1.0
    seed: int = 0
    max_restarts: int = 1000  # the scheduler's bound; the Llama 3 run has about 419
    state_dir: pathlib.Path | None = None


def job_spec(r: Replay) -> tuple[dict[str, Any], dict[str, Any], TrainSpec]:
    """The job file resized to ``chips``, run for ``hours`` at its modelled step, checkpointed at the
    Young-Daly interval for the table's failure rate."""
    data = yaml.safe_load(r.job_file.read_text())
    spec_d, job = split_job_file(data)
    spec_d["hardware"]["count"] = r.chips
    spec = TrainSpec.from_dict(spec_d)
    step_s = estimate_train(spec).step_time_s
    table = load_table(r.table).scaled(r.scale)
    mtbf = mean_time_between_s(table, r.chips)
    interval = max(1, round(young_daly_interval_s(checkpoint.pause_s(plan_step(spec)), mtbf) / step_s))
    spec_d.pop("tokens", None)
    spec_d["steps"] = max(1, round(r.hours * 3600 / step_s))
    job.update(checkpoint_interval_steps=interval, max_restarts=r.max_restarts)
    return spec_d, job, spec


def offline(r: Replay, spec: TrainSpec, wall_s: float, interval: int, domain: int) -> Any:
    """The offline goodput of the same job, seed, table and costs over ``wall_s``."""
    return simulate_goodput(
        chips=r.chips, wall_s=wall_s, step_s=estimate_train(spec).step_time_s, checkpoint_interval_steps=interval,
        checkpoint_pause_s=checkpoint.pause_s(plan_step(spec)), checkpoint_write_s=checkpoint.write_s(spec),
        restart_s=checkpoint.restart_s(spec), table=load_table(r.table).scaled(r.scale), seed=r.seed,
        mesh=Mesh(r.chips + r.spare_chips, domain))


async def start_injector(st: Stack, r: Replay, state: pathlib.Path, start_s: float) -> Proc:
    """``gigacluster faults run`` on the mesh's event clock, started and registered with the clock (keys in the
    environment, not argv; its log in ``state/faults.log``); ``Proc.stop`` ends it.

    It returns only once the injector is one of the clock's processes and waits for its first failure: a job
    submitted before then could run past failures the clock did not yet know of (a window of a thousand
    steps is a few wall milliseconds)."""
    env = dict(os.environ)
    env.update(GIGACLUSTER_ADMIN_KEY=st.admin_key, GIGACLUSTER_SERVICE_KEY=st.service_key,
               GIGACLUSTER_BROKER=st.endpoint_of("broker"), GIGACLUSTER_CLOCK="event",
               GIGACLUSTER_CLOCK_COORDINATOR=st.endpoint_of("clock"), GIGACLUSTER_LOG_FORMAT="json")
    argv = [sys.executable, "-m", "gigacluster.cli.main", "faults", "run", "--table", r.table, "--scale",
            repr(r.scale), "--seed", str(r.seed), "--start-s", repr(start_s), "--state-dir", str(state),
            "--duration-s", repr(r.hours * 3600 * 1.5)]
    before = (await clock_time(st)).processes
    proc = Proc("faults", argv, env, state / "faults.log")
    await proc.start()
    deadline = time.monotonic() + INJECTOR_READY_S
    while (await clock_time(st)).processes <= before or "fault injector running" not in _text(state / "faults.log"):
        if proc.proc is not None and proc.proc.returncode is not None:
            raise RuntimeError(f"the fault injector exited: see {state / 'faults.log'}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the fault injector did not join the clock in {INJECTOR_READY_S:g} s")
        await asyncio.sleep(0.05)
    return proc


def _text(path: pathlib.Path) -> str:
    return path.read_text() if path.exists() else ""


async def clock_time(st: Stack, attempts: int = 4) -> Any:
    """The coordinator's GetTime, on a new channel; a connection that times out on a loaded machine is tried
    again (twice in the 54-day and 140-hour runs at load average 10-12 the connection got no SETTINGS frame
    within the 10 s deadline, which ended the whole replay)."""
    for attempt in range(attempts):
        try:
            async with open_channel(st.endpoint_of("clock")) as ch:
                return await clock_pb2_grpc.ClockServiceStub(ch).GetTime(clock_pb2.GetTimeRequest(), timeout=10)
        except grpc.aio.AioRpcError as err:
            if attempt + 1 == attempts or err.code() not in (grpc.StatusCode.UNAVAILABLE,
                                                               grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            await asyncio.sleep(0.5 * (attempt + 1))
    raise AssertionError("unreachable")


async def mesh_time(st: Stack) -> float:
    return float((await clock_time(st)).now_s)


async def replay(r: Replay) -> dict[str, Any]:
    """Run ``r`` through the live mesh in event mode; the report (see :func:`report`)."""
    spec_d, job, spec = job_spec(r)
    with contextlib.ExitStack() as stack:
        root = r.state_dir or pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gc-replay-")))
        cfg = StackConfig(chip=spec.chip, chips=r.chips + r.spare_chips, shards=r.shards, clock="event",
                          ports={k: 0 for k in DEFAULT_PORTS}, mqtt_port=0, state_dir=root / "mesh", restart=True)
        async with Stack(cfg) as st:
            key = await st.create_tenant("replay")
            faults_dir = root / "faults"
            faults_dir.mkdir(parents=True, exist_ok=True)
            # Time holds from before the injector starts until the job is in: the injector's first failure
            # is a wake-up of an otherwise idle mesh, to which the clock would jump before the job began.
            async with participate(st.endpoint_of("clock"), "replay", key=st.service_key) as ck:
                with ck.busy():
                    inj = await start_injector(st, r, faults_dir, ck.now())
                    t0 = time.monotonic()
                    async with Client(st.endpoints, key) as sub_client:
                        sub = await sub_client.submit_job(spec_d, **job)
            try:
                async with Client(st.endpoints, key) as gc:
                    events: list[tuple[float, str]] = []  # (mesh time, reason) of each job failure seen
                    final = None
                    seen = 0  # the most failures any update showed (a window's steps come as copies of the
                    async for upd in gc.watch_job(sub.name):  # job taken at each step, after newer updates)
                        final = upd.job
                        if upd.job.failures > seen:  # updates may coalesce: one entry per failure counted
                            now = await mesh_time(st)
                            events += [(now, upd.job.reason)] * (upd.job.failures - seen)
                            seen = upd.job.failures
                    wall = time.monotonic() - t0
                    final = await gc.get_job(sub.name)
            finally:
                await inj.stop(5.0)
    assert final is not None
    return report(r, spec, job, final, events, read_log(faults_dir), wall, int(get_system(spec.system).chips))


def report(r: Replay, spec: TrainSpec, job: dict[str, Any], final: Any, restarts: list[tuple[float, str]],
           log: list[dict[str, Any]], wall_s: float, domain: int) -> dict[str, Any]:
    """Goodput, interruptions by cause (each restart attributed to the latest failure injected before it),
    energy, cost, time lost, and the offline model's goodput for the same run."""
    injected = [e for e in log if e["action"] == "inject"]
    causes: dict[str, int] = {}
    used: set[int] = set()
    for t, _ in restarts:
        cand = [e for e in injected if e["t_s"] <= t + 1e-6 and e["index"] not in used]
        if cand:
            e = max(cand, key=lambda e: e["t_s"])
            used.add(e["index"])
            causes[e["cause"]] = causes.get(e["cause"], 0) + 1
        else:
            causes["unattributed"] = causes.get("unattributed", 0) + 1
    makespan = final.finished_s - final.started_s
    off = offline(r, spec, makespan, int(job["checkpoint_interval_steps"]), domain)
    u = final.usage
    return {
        "job": final.name, "state": final.State.Name(final.state), "chips": r.chips, "spare_chips": r.spare_chips,
        "steps": int(final.step), "virtual_days": makespan / 86_400, "wall_s": wall_s,
        "virtual_per_wall": makespan / wall_s if wall_s else 0.0,
        "goodput": float(final.goodput), "offline_goodput": off.goodput,
        "goodput_diff_points": 100 * (float(final.goodput) - off.goodput),
        "interruptions": int(final.failures), "offline_interruptions": off.interruptions,
        "failures_injected": len(injected), "by_cause": dict(sorted(causes.items(), key=lambda kv: -kv[1])),
        "offline_by_cause": dict(sorted(off.causes.items(), key=lambda kv: -kv[1])),
        "lost_s": float(final.lost_s), "restart_s": float(final.restart_s),
        "checkpoint_pause_s": float(final.checkpoint_pause_s),
        "checkpoint_interval_steps": int(job["checkpoint_interval_steps"]),
        "energy_facility_mwh": float(u.energy_facility_j) / 3.6e9, "energy_it_mwh": float(u.energy_it_j) / 3.6e9,
        "cost_usd": float(u.cost_usd), "table": r.table, "scale": r.scale, "seed": r.seed,
    }
