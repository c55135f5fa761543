"""How fast can the virtual clock run before live results leave the offline model?

For each speed-up, start the real five-process mesh (the same Stack as ``gigacluster up``), run
the demo training job, and compare with ``estimate_train`` for the same spec:

- step error: mean live step time / model step time - 1 (each step is timed by the services in
  virtual time, so gRPC latency should not leak into it);
- makespan error: (finished - started) / (steps x model step time) - 1, which includes any time
  the job's step loop falls behind the clock because its RPCs take longer in wall time than a
  step lasts at that speed-up.

    python benchmarks/bench_speedup.py [--speedups 1 10 100 1000] [--steps 20] [--job FILE] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import sys
import tempfile
import time

import yaml
from _table import print_rows

from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train
from gigacluster.scheduler.spec import split_job_file
from gigacluster.stack import Stack, StackConfig

JOB = pathlib.Path(__file__).resolve().parents[1] / "examples" / "demo-train-h100.yaml"


async def one(speedup: float, steps: int, job_file: pathlib.Path) -> dict[str, float]:
    data = yaml.safe_load(job_file.read_text())
    data["steps"] = steps
    spec, job = split_job_file(data)
    model = estimate_train(TrainSpec.from_dict(spec)).step_time_s
    with tempfile.TemporaryDirectory() as tmp:
        cfg = StackConfig(chip="h100-sxm", chips=64, speedup=speedup, ports={k: 0 for k in DEFAULT_PORTS},
                          mqtt_port=0, state_dir=pathlib.Path(tmp), restart=False)
        async with Stack(cfg) as st:
            key = await st.create_tenant("bench")
            async with Client(st.endpoints, key) as gc:
                t0 = time.monotonic()
                submitted = await gc.submit_job(spec, **job)
                step_times = []
                final = None
                async for upd in gc.watch_job(submitted.name):
                    final = upd.job
                    if upd.kind == "progress":
                        step_times.append(upd.job.last_step_time_s)
                wall = time.monotonic() - t0
    assert final is not None and final.step == steps, final
    mean = sum(step_times) / len(step_times)
    makespan = final.finished_s - final.started_s
    return {"speedup": speedup, "model_step_s": model, "live_step_s": mean, "step_err": mean / model - 1,
            "makespan_err": makespan / (steps * model) - 1, "wall_s": wall}


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--speedups", type=float, nargs="+", default=[1, 10, 100, 300, 1000, 3000])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--job", type=pathlib.Path, default=JOB, help="job file (default: the demo job)")
    args = ap.parse_args(argv)
    rows = [await one(s, args.steps, args.job) for s in args.speedups]
    print_rows(rows, [
        ("speed-up", lambda r: f"{r['speedup']:g}x"), ("model step (s)", lambda r: f"{r['model_step_s']:.4f}"),
        ("live step (s)", lambda r: f"{r['live_step_s']:.4f}"),
        ("step error", lambda r: f"{r['step_err'] * 100:+.2f}%"),
        ("makespan error", lambda r: f"{r['makespan_err'] * 100:+.1f}%"),
        ("wall (s)", lambda r: f"{r['wall_s']:.1f}")],
        markdown=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
