"""Benchmark: placing a 100k-chip gang on a 1M-chip cluster, per placement policy.

Cluster: 1,048,576 H100 in 131,072 HGX domains of 8; a Tomahawk 5 rail-optimised fat-tree puts
64 domains on the same 8 rail leaves (a leaf group) and 8 leaf groups in a pod (three tiers), so
the layout is built by arithmetic (``Layout.uniform``) with those numbers (``Layout.from_topology``
gives the same grouping on the topologies the fabric can build; see tests/scheduler).

Scenarios: an empty cluster; and a half-full, fragmented one (random 1,024-chip gangs over whole
domains until 50% is held). Job: 102,400 chips, TP 8, PP 16, DP 800. Reported: the policy's
``place`` call and a whole dispatcher pass (``policy.decide`` with the 100k job at the head of a
queue of 100 jobs over 500 running gangs), median of 5 runs (wall, and CPU seconds of the process), and
the placement quality (leaf groups, DP spine crossings).

    python benchmarks/bench_placement.py             # about 20 s
    python benchmarks/bench_placement.py --markdown  # the table for docs/performance.md
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Any

import numpy as np

from gigacluster.scheduler.placement import Layout, get_policy, placement_stats
from gigacluster.scheduler.policy import Pending, Running, decide

CHIPS = 1 << 20
JOB = 102_400
TP, PP = 8, 16


def fragmented(lay: Layout, rng: np.random.Generator) -> tuple[np.ndarray, list[Running]]:
    """Half the domains held by 1,024-chip gangs of 128 random domains each."""
    n = lay.n_domains
    order = rng.permutation(n)[: n // 2]
    free = np.ones(lay.n_devices, dtype=bool)
    running = []
    for k, chunk in enumerate(np.array_split(order, len(order) // 128)):
        devs = (chunk[:, None] * 8 + np.arange(8)).ravel()
        free[devs] = False
        running.append(Running(f"r{k}", f"tenants/t{k % 7}", "default", 0, "h100-sxm", devs,
                               float(rng.uniform(100, 10_000)), 0.0))
    return free, running


def timed(fn, repeat: int = 5) -> tuple[float, Any]:  # type: ignore[no-untyped-def]
    wall, _, out = timed_cpu(fn, repeat)
    return wall, out


def timed_cpu(fn, repeat: int = 5) -> tuple[float, float, Any]:  # type: ignore[no-untyped-def]
    """Median wall and median CPU seconds of the process (CPU is what other load on the machine does not add)."""
    times, cpu, out = [], [], None
    for _ in range(repeat):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    return statistics.median(times), statistics.median(cpu), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    lay = Layout.uniform(CHIPS, 8, 64, groups_per_pod=8)
    frag_free, frag_running = fragmented(lay, rng)
    scenarios = {"empty": (np.ones(CHIPS, dtype=bool), []), "half full, fragmented": (frag_free, frag_running)}
    pending = [Pending("big", "tenants/a", "default", 0, 0, "h100-sxm", JOB, TP, 3600.0)]
    pending += [Pending(f"q{i}", f"tenants/t{i % 7}", "default", 0, i + 1, "h100-sxm", 1024, TP, 600.0)
                for i in range(99)]
    rows = []
    for scen, (free, running) in scenarios.items():
        for name in ("topology", "binpack", "spread"):
            pol = get_policy(name)
            t_place, devs = timed(lambda pol=pol, free=free: pol.place(lay, free, JOB, TP))
            assert devs is not None and devs.size == JOB
            st = placement_stats(lay, devs, tp=TP, cp=1, dp=JOB // TP // PP, pp=PP)  # type: ignore[arg-type]
            t_pass, c_pass, d = timed_cpu(lambda pol=pol, free=free, running=running: decide(
                0.0, pending, running, layouts={"h100-sxm": lay}, free={"h100-sxm": free}, policy=pol,
                queues={}, weights={}, usage={}), repeat=5)
            rows.append((scen, name, t_place, t_pass, c_pass, len(d.place), st.leaf_groups,  # type: ignore[attr-defined]
                         st.dp_spine_crossings))  # type: ignore[attr-defined]
    load_end = os.getloadavg()[0]
    if args.markdown:
        print(f"{CHIPS:,} H100 (131,072 domains, leaf groups of 64 domains), job {JOB:,} chips (TP {TP}, PP {PP}, "
              f"DP {JOB // TP // PP}); {platform.processor() or platform.machine()}, median of 5; load average "
              f"{os.getloadavg()[0]:.1f} at the start, {load_end:.1f} at the end\n")
        print("| cluster | policy | place (ms) | dispatcher pass, 100 queued (ms) | pass, CPU of the process (ms) | "
              "jobs placed | leaf groups | DP spine crossings |")
        print("|---|---|---|---|---|---|---|---|")
        for scen, name, tp_, tpass, cpass, n, g, x in rows:
            print(f"| {scen} | {name} | {tp_ * 1e3:.0f} | {tpass * 1e3:.0f} | {cpass * 1e3:.0f} | {n} | {g} | {x:,} |")
    else:
        for r in rows:
            print(f"{r[0]:24s} {r[1]:9s} place {r[2] * 1e3:7.1f} ms  pass {r[3] * 1e3:7.1f} ms "
                  f"(CPU {r[4] * 1e3:6.1f})  placed {r[5]:3d}  leaf groups {r[6]:5d}  DP spine crossings {r[7]:,}")


if __name__ == "__main__":
    main()
