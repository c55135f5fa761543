"""Benchmark: fabric time to start one training step's collectives for a 100k-chip job.

The job is Llama 3 405B laid out TP8 x PP16 x DP800 (102,400 chips), its collectives the calls
the scheduler's runner makes every step (``scheduler.runner``: one StartCollective per run of
identical groups, from ``scheduler.core.rank_groups``): TP all-reduce (12,800 groups of 8), PP
send/recv (6,400 pairs), and the DP reduce-scatter and all-gather (16 calls of 8 groups of 800
ranks each). It measures, in process, what the fabric does for them:

* ``plan``: shapes, algorithm choice and phase layout (the part the service runs off the event loop);
* ``commit``: booking the groups in the simulator for a later start (the part on the loop);
* ``first phase``: routing every sub-flow of the first phases when they start, and one max-min solve.

The process sets glibc's allocator as a fabric service process does (``runtime/allocator.py``);
``--malloc default`` leaves glibc's defaults, to show what that saves.

Times are CPU seconds of the benchmark process (``time.process_time``), best of N, so that other
work on a shared machine inflates them less than wall time would.

The first step plans every shape; later steps find the plans in the cache (``steady``). The old
path (every group planned on its own) is timed on a sample of groups and scaled up.

    python benchmarks/bench_collectives.py                 # H100 and Trainium3 at 131,072 chips
    python benchmarks/bench_collectives.py --million       # adds H100 at 1,048,576 chips (Tomahawk 6)
    python benchmarks/bench_collectives.py --markdown
"""

from __future__ import annotations

import argparse
import gc
import time
from types import SimpleNamespace

import numpy as np

from gigacluster.fabric.collectives import clear_terms_cache, plan_collective
from gigacluster.fabric.sim import FlowSim
from gigacluster.fabric.topology import TopologyConfig, build_topology
from gigacluster.runtime import allocator
from gigacluster.scheduler.core import rank_groups
from gigacluster.scheduler.runner import arithmetic_runs

OPS = {"tp": ("all_reduce", 64e6), "pp": ("send_recv", 64e6), "dp_grad": ("reduce_scatter", 6.3e9),
       "dp_param": ("all_gather", 6.3e9)}


def step_calls(tp: int, pp: int, dp: int) -> list[tuple[str, np.ndarray, int, int, float]]:
    """(op, ranks of group 0, group stride, groups, bytes) of every StartCollective of one step."""
    spec = SimpleNamespace(tp=tp, cp=1, dp=dp, pp=pp, count=tp * pp * dp)
    calls = []
    for name, (op, bytes_) in OPS.items():
        size, stride, _copies, offsets = rank_groups(spec, name)  # type: ignore[arg-type]
        for first, count, gstride in arithmetic_runs(offsets):
            calls.append((op, first + stride * np.arange(size), gstride, count, bytes_))
    return calls


def one_step(sim: FlowSim, calls: list[tuple[str, np.ndarray, int, int, float]], start_s: float) -> dict[str, float]:
    clock = time.process_time  # CPU seconds of this process: what the fabric spends, whatever the neighbours do
    t0 = clock()
    planned = [sim.plan_collectives(op, r, st, g, b) for op, r, st, g, b in calls]
    t1 = clock()
    for p in planned:
        sim.start_planned(p, start_s=start_s)
    t2 = clock()
    sim.advance(start_s)  # every first phase starts: route all sub-flows
    sim.next_event_s()  # and one max-min solve over the pool
    t3 = clock()
    shapes = sum(len(p.plans) for p in planned)
    return {"plan_s": t1 - t0, "commit_s": t2 - t1, "first_phase_s": t3 - t2, "shapes": shapes,
            "flows": sim.link_stats().active_flows_total}


def old_path(sim: FlowSim, calls: list[tuple[str, np.ndarray, int, int, float]], sample: int = 20) -> float:
    """Seconds the per-group planning (plan_collective per group, all algorithms) would take for the step."""
    total = 0.0
    for op, r, st, g, b in calls:
        k = min(g, sample)
        t = time.process_time()
        for i in range(k):
            plan_collective(op, r + st * i, b, sim.topo)
        total += (time.process_time() - t) / k * g
    return total


def bench(label: str, cfg: TopologyConfig, tp: int, pp: int, dp: int, repeat: int) -> dict[str, object]:
    t = time.perf_counter()
    topo = build_topology(cfg)
    build_s = time.perf_counter() - t
    calls = step_calls(tp, pp, dp)
    first = steady = None
    for rep in range(repeat):
        clear_terms_cache(topo)  # every first step plans from nothing, its routes included
        sim = FlowSim(topo)
        res = one_step(sim, calls, 1.0)
        if rep == 0:
            first = res
            # a second step on the same simulator: plans come from the cache
            sim.run_until_idle()
            steady = one_step(sim, calls, sim.now_s + 1.0)
        else:
            clear_terms_cache(topo)
            again = one_step(FlowSim(topo), calls, 1.0)
            first = {k: min(v, again[k]) if k.endswith("_s") else v for k, v in first.items()}  # type: ignore[union-attr]
        del sim
        gc.collect()
    row = {"label": label, "chips": topo.n_chips, "links": topo.n_links, "build_s": build_s, "calls": len(calls),
           "first": first, "steady": steady, "old_s": old_path(FlowSim(topo), calls)}
    print(row, flush=True)
    return row


def markdown(rows: list[dict[str, object]]) -> str:
    out = ["| topology | StartCollective calls | shapes | plan (ms) | commit (ms) | first phases + solve (ms) | "
           "steady-step plan + commit (ms) | old per-group planning (s, extrapolated) |",
           "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        f, s = r["first"], r["steady"]
        assert isinstance(f, dict) and isinstance(s, dict)
        out.append(f"| {r['label']} ({r['chips']:,} chips, {r['links']:,} links) | {r['calls']} | {f['shapes']} | "
                   f"{f['plan_s'] * 1e3:.1f} | {f['commit_s'] * 1e3:.1f} | {f['first_phase_s'] * 1e3:.0f} | "
                   f"{(s['plan_s'] + s['commit_s']) * 1e3:.1f} | {r['old_s']:.0f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--million", action="store_true", help="add H100 at 1,048,576 chips (Tomahawk 6, 3 tiers)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N for the first step")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--malloc", choices=("service", "default"), default="service",
                    help="service: glibc's thresholds as `gigacluster serve` sets them (default); default: glibc's own")
    args = ap.parse_args()
    if args.malloc == "service":
        print("allocator:", allocator.tune() or "glibc defaults (not glibc, or the environment sets them)", flush=True)
    rows = [
        bench("H100, 3 tiers", TopologyConfig(chip="h100-sxm", count=131072, tiers=3), 8, 16, 800, args.repeat),
        bench("Trainium3, 3 tiers", TopologyConfig(chip="trainium3", count=131072, tiers=3), 8, 16, 800, args.repeat),
    ]
    if args.million:
        gc.collect()
        rows.append(bench("H100, 3 tiers, Tomahawk 6", TopologyConfig(chip="h100-sxm", count=1048576, tiers=3,
                                                                       switch="tomahawk6"), 8, 16, 800, args.repeat))
    if args.markdown:
        print(markdown(rows))


if __name__ == "__main__":
    main()
