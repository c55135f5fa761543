"""The event clock: how much faster than real time does the live mesh run, and does it still match the model?

Starts the real mesh (the same Stack as ``gigacluster up``) in event mode (``--clock event``: a
clock coordinator process, virtual time jumps to the next event once every service is idle and no
call is in flight), runs one training job and reports:

- virtual / wall: the job's virtual makespan (finished - started) over the wall time from submit
  to its last step (dispatch included); and the same for the step loop alone (first to last step);
- step error: mean live step time / ``estimate_train``'s step time - 1;
- makespan error: makespan / (steps x model step + checkpoint pauses) - 1 (no clock to fall
  behind in event mode, so 0 up to float noise);
- advances and probe rounds of the coordinator, and wall milliseconds per step.

With ``--wall-speedup X`` it also runs the job on the wall clock at X for comparison. Event mode runs
steady-state windows (scheduler/window.py) unless ``--per-step``; ``--both`` runs the two. The job's
checkpoint interval and the scheduler's progress interval (``watch`` gets every Nth step; every step is
still accounted and kept in the trace) can be set for long runs; ``windows`` counts the windows run.

    python benchmarks/bench_event_clock.py [--steps 20] [--job FILE] [--wall-speedup 10] [--markdown]
        [--checkpoint-interval N] [--progress-interval N] [--per-step | --both]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
import tempfile
import time
from typing import Any

import yaml

from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.clock.v1 import clock_pb2, clock_pb2_grpc
from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train
from gigacluster.runtime.channels import open_channel
from gigacluster.scheduler.spec import split_job_file
from gigacluster.stack import Stack, StackConfig

JOB = pathlib.Path(__file__).resolve().parents[1] / "examples" / "demo-train-h100.yaml"


async def run_job(st: Stack, spec: dict[str, Any], job: dict[str, Any]) -> tuple[float, list[tuple[float, Any]]]:
    """Submit the job and watch it to the end: the wall time of submission and every update with its wall time."""
    async with Client(st.endpoints, await st.create_tenant("bench")) as gc:
        t0 = time.monotonic()
        name = (await gc.submit_job(spec, **job)).name
        return t0, [(time.monotonic(), u) async for u in gc.watch_job(name)]


async def coordinator_counts(st: Stack) -> tuple[int, int]:
    """How often the clock coordinator advanced time, and how many probe rounds it ran."""
    async with open_channel(st.endpoint_of("clock")) as ch:
        t = await clock_pb2_grpc.ClockServiceStub(ch).GetTime(clock_pb2.GetTimeRequest())
    return t.advances, t.probes


async def one(clock: str, speedup: float, steps: int, job_file: pathlib.Path, *, per_step: bool = False,
              checkpoint_interval: int = 0, progress_interval: int = 1) -> dict[str, Any]:
    data = yaml.safe_load(job_file.read_text())
    data["steps"] = steps
    if checkpoint_interval:
        data["checkpoint_interval_steps"] = checkpoint_interval
    spec, job = split_job_file(data)
    model = estimate_train(TrainSpec.from_dict(spec)).step_time_s
    env = {"GIGACLUSTER_SCHEDULER_PROGRESS_INTERVAL_STEPS": str(progress_interval)}
    if per_step:
        env["GIGACLUSTER_SCHEDULER_MAX_WINDOW_STEPS"] = "0"
    with tempfile.TemporaryDirectory() as tmp:
        cfg = StackConfig(chip="h100-sxm", chips=64, speedup=speedup, clock=clock, extra_env=env,
                          ports={k: 0 for k in DEFAULT_PORTS}, mqtt_port=0, state_dir=pathlib.Path(tmp), restart=False)
        async with Stack(cfg) as st:
            t0, timed = await run_job(st, spec, job)
            advances, probes = await coordinator_counts(st) if clock == "event" else (0, 0)
        log = pathlib.Path(tmp) / "logs" / "scheduler.log"
        windows = log.read_text().count('"event": "window"') if log.exists() else 0
    final = timed[-1][1].job
    assert final.step == steps, final
    progress = [(w, u.job.last_step_time_s) for w, u in timed if u.kind == "progress"]
    step_times = [s for _, s in progress]
    wall = timed[-1][0] - t0
    mean = sum(step_times) / len(step_times)
    makespan = final.finished_s - final.started_s
    loop_wall = progress[-1][0] - progress[0][0]  # the step loop alone, without dispatch and start-up
    seen = [u.job.step for _, u in timed if u.kind == "progress"]
    loop_virtual = (final.finished_s - final.started_s) * (seen[-1] - seen[0]) / steps
    label = ("event, per step" if per_step else "event, windows") if clock == "event" else f"wall {speedup:g}x"
    return {"clock": label, "model_step_s": model, "steps": steps, "windows": windows,
            "live_step_s": mean, "step_err": mean / model - 1,
            "makespan_err": makespan / (steps * model + final.checkpoint_pause_s) - 1,
            "makespan_s": makespan, "wall_s": wall, "ratio": makespan / wall,
            "loop_ratio": loop_virtual / loop_wall, "ms_per_step": loop_wall / max(seen[-1] - seen[0], 1) * 1e3,
            "advances": advances, "probes": probes, "mfu": final.mfu, "energy_j": final.usage.energy_it_j}


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--job", type=pathlib.Path, default=JOB, help="job file (default: the demo job)")
    ap.add_argument("--wall-speedup", type=float, default=0.0, help="also run on the wall clock at this speed-up")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--checkpoint-interval", type=int, default=0, help="the job's checkpoint interval (0: the file's)")
    ap.add_argument("--progress-interval", type=int, default=1, help="the scheduler's progress_interval_steps")
    ap.add_argument("--per-step", action="store_true", help="event mode without steady-state windows")
    ap.add_argument("--both", action="store_true", help="event mode per step, then with windows")
    args = ap.parse_args(argv)
    kw = {"checkpoint_interval": args.checkpoint_interval, "progress_interval": args.progress_interval}
    modes = [True, False] if args.both else [args.per_step]
    rows = [await one("event", 1.0, args.steps, args.job, per_step=m, **kw) for m in modes]
    if args.wall_speedup:
        rows.append(await one("wall", args.wall_speedup, args.steps, args.job, **kw))
    if args.markdown:
        print("| clock | steps | windows | model step (s) | live step (s) | step error | makespan error | virtual (s) "
              "| wall (s) | virtual / wall | step loop virtual / wall | wall ms / step | advances | probe rounds |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['clock']} | {r['steps']} | {r['windows']} | {r['model_step_s']:.4f} | "
                  f"{r['live_step_s']:.4f} | {r['step_err'] * 100:+.2f}% | "
                  f"{r['makespan_err'] * 100:+.2f}% | {r['makespan_s']:.2f} | {r['wall_s']:.2f} | "
                  f"{r['ratio']:.1f}x | {r['loop_ratio']:.1f}x | {r['ms_per_step']:.2f} | {r['advances']} | "
                  f"{r['probes']} |")
    else:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main(sys.argv[1:])))
