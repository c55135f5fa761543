"""Benchmark: what booking work on a chip shard costs (``ChipShard.execute_many``), the hot path of every
per-step job's ExecuteWork and of the router's work reports.

A 64-chip shard; a group of ``--group`` devices books one work item (a decode-sized GEMM, 32 repetitions)
``--calls`` times back to back (``execute``), then the same count as reports of ``--plan`` iterations each
(``execute_many``, as a replica's ``ReportWork`` carries them). Each booking reads the group's temperature
from its thermal history at the work's start (its clock) and books the work into the history
(``chip/shard.py``). Reported: CPU microseconds per call (process time, best of ``--repeat``).

``--baseline DIR`` runs the same in the tree at DIR (its ``services/``) in a subprocess, for the ratio.

    python benchmarks/bench_chip_execute.py [--chip trainium3] [--calls 20000] [--baseline /path/to/tree]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time


def measure(chip_name: str, group: int, calls: int, plan: int, repeat: int) -> dict[str, float]:
    import numpy as np

    from gigacluster.chip.shard import ChipShard
    from gigacluster.hw.catalog import default_system, get_chip, get_system
    from gigacluster.model.roofline import Work

    chip = get_chip(chip_name)
    work = [Work(2 * 64 * 4096 * 4096, 2 * 4096 * 4096, "bf16", "matmul", 32, (64, 4096, 4096))]
    idx = np.arange(group)
    out: dict[str, float] = {}
    for name, n_items in (("execute", 1), ("execute_many", plan)):
        best = float("inf")
        for _ in range(repeat):
            shard = ChipShard(chip, get_system(default_system(chip_name)), offset=0, count=64, start_s=0.0)
            t = 0.0
            c0 = time.process_time()
            for _ in range(calls // n_items if n_items > 1 else calls):
                items = [(work, t + 0.001 * k) for k in range(n_items)]
                res = shard.execute_many(idx, items, now_s=t)
                t = res[-1].end_s + 0.001
            n = calls // n_items if n_items > 1 else calls
            best = min(best, (time.process_time() - c0) / n)
        out[name] = 1e6 * best
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chip", default="trainium3")
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--plan", type=int, default=8, help="iterations per execute_many report")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", default="")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    got = measure(a.chip, a.group, a.calls, a.plan, a.repeat)
    if a.json:
        print(json.dumps(got))
        return
    rows = [("this tree", got)]
    if a.baseline:
        env = {**os.environ, "PYTHONPATH": str(pathlib.Path(a.baseline) / "services")}
        cmd = [sys.executable, __file__, "--chip", a.chip, "--group", str(a.group), "--calls", str(a.calls),
               "--plan", str(a.plan), "--repeat", str(a.repeat), "--json"]
        base = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
        rows.insert(0, ("baseline", base))
    print(f"chip {a.chip}, group of {a.group}, {a.calls} calls, {a.plan} iterations per execute_many")
    print("| tree | execute us/call | execute_many us/call |")
    print("|---|---|---|")
    for name, r in rows:
        print(f"| {name} | {r['execute']:.1f} | {r['execute_many']:.1f} |")
    if a.baseline:
        print(f"ratio baseline/this: execute {rows[0][1]['execute'] / got['execute']:.2f}x, "
              f"execute_many {rows[0][1]['execute_many'] / got['execute_many']:.2f}x")


if __name__ == "__main__":
    main()
