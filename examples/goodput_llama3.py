"""Goodput of the Llama 3 405B run (54 days, 16,384 H100) under the Llama 3 failure mix: the table
in docs/scheduler.md. Run: python examples/goodput_llama3.py  (about 10 s)."""

from __future__ import annotations

import pathlib

import numpy as np
import yaml

from gigacluster.faults.draw import mean_time_between_s
from gigacluster.faults.goodput import simulate_goodput, young_daly_interval_s
from gigacluster.faults.table import llama3
from gigacluster.model.training import TrainSpec, plan_step
from gigacluster.planning import estimate_train
from gigacluster.scheduler import checkpoint
from gigacluster.scheduler.spec import split_job_file

spec_d, _ = split_job_file(yaml.safe_load((pathlib.Path(__file__).parent / "llama3-405b-8k.yaml").read_text()))
spec_d["hardware"]["count"] = 16_384
spec = TrainSpec.from_dict(spec_d)
step, plan = estimate_train(spec).step_time_s, plan_step(spec)
table = llama3()
mtbf = mean_time_between_s(table, spec.count)
pause, write, restart = checkpoint.pause_s(plan), checkpoint.write_s(spec), checkpoint.restart_s(spec)
WALL = 54 * 86_400.0


def row(label: str, steps: int, pause_s: float, restart_s: float) -> None:
    rr = [simulate_goodput(chips=spec.count, wall_s=WALL, step_s=step, checkpoint_interval_steps=steps,
                           checkpoint_pause_s=pause_s, checkpoint_write_s=write, restart_s=restart_s, table=table,
                           seed=s) for s in range(5)]
    g = np.array([r.goodput for r in rr])
    print(f"| {label} | {steps} ({steps * step / 60:.1f} min) | {np.mean([r.interruptions for r in rr]):.0f} | "
          f"{100 * g.mean():.1f}% ({100 * g.min():.1f}-{100 * g.max():.1f}) | "
          f"{100 * np.mean([r.lost_s for r in rr]) / WALL:.2f}% | "
          f"{100 * np.mean([r.restart_s for r in rr]) / WALL:.2f}% | "
          f"{100 * np.mean([r.checkpoint_pause_s for r in rr]) / WALL:.2f}% |")


yd = max(1, round(young_daly_interval_s(pause, mtbf) / step))
print(f"step {step:.2f} s, pause {pause:.2f} s, write {write:.2f} s, restart {restart:.1f} s, MTBF {mtbf / 3600:.2f} h")
row("async, Young-Daly interval (default model)", yd, pause, restart)
row("async, every hour", round(3600 / step), pause, restart)
row("synchronous (pause = write), Young-Daly",
    max(1, round(young_daly_interval_s(pause + write, mtbf) / step)), pause + write, restart)
row("async, Young-Daly, 10-minute relaunch", yd, pause, 600 + write)
row("async, Young-Daly, 30-minute relaunch", yd, pause, 1800 + write)
