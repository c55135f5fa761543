"""Benchmark: max-min fair-share solve time vs flows: compiled kernel, numpy rounds, plain Python.

Workload: random point-to-point flows between chips of an H100 cluster on a two-tier (up to 8k
chips) or three-tier Tomahawk 5 fat-tree, routed by ECMP, so the incidence has 2-6 links per flow
and realistic bottleneck structure (NICs, leaf uplinks). Every solver gets the same instance and
must agree to 1e-9. Times are CPU seconds of the process (``time.process_time``), best of N, so
that other work on a shared machine inflates them less than wall time would. Also times topology
builds of 100k+ accelerators, and the incremental update: 100,000 random flows on 131,072 chips,
then one collective starts (and finishes), re-solved incrementally vs from scratch.

    python benchmarks/bench_maxmin.py            # 1k..1M flows (kernel), numpy to 100k, Python to 10k
    python benchmarks/bench_maxmin.py --full     # also numpy at 1M (minutes) and Python at 100k
    python benchmarks/bench_maxmin.py --markdown # print the tables for docs/performance.md
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from gigacluster.fabric.maxmin import maxmin_rates, progressive_filling_py
from gigacluster.fabric.pool import FlowPool
from gigacluster.fabric.routing import route
from gigacluster.fabric.topology import TopologyConfig, build_topology


def _best_of(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def instance(n_flows: int, n_chips: int, seed: int = 0) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Random flows routed on an H100 fat-tree of ``n_chips``: (n_links, e_flow, e_link, e_coef, capacity)."""
    tiers = 2 if n_chips <= 8192 else 3
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=n_chips, tiers=tiers))
    rng = np.random.default_rng(seed)
    src = rng.integers(0, n_chips, n_flows)
    dst = (src + 1 + rng.integers(0, n_chips - 1, n_flows)) % n_chips
    r = route(topo, src, dst, np.arange(n_flows))
    return topo.n_links, r.e_flow, r.e_link, r.e_coef, topo.link_capacity_Bps


def bench_solver(sizes: list[int], baseline_max: int, numpy_max: int) -> list[dict[str, float]]:
    rows = []
    maxmin_rates(2, np.array([0, 1]), np.array([0, 0]), None, np.ones(1), compiled=True)  # load the kernel
    for n in sizes:
        n_chips = min(131072, max(1024, n // 4 // 8 * 8))
        n_links, ef, el, ec, cap = instance(n, n_chips)
        repeat = 3
        t_k = _best_of(lambda: maxmin_rates(n, ef, el, ec, cap, compiled=True), repeat)  # noqa: B023
        row = {"flows": n, "chips": n_chips, "links": n_links, "entries": int(ef.size), "kernel_s": t_k}
        if n <= numpy_max:
            row["numpy_s"] = _best_of(lambda: maxmin_rates(n, ef, el, ec, cap, compiled=False),  # noqa: B023
                                      repeat if n <= 100_000 else 1)
            assert np.allclose(maxmin_rates(n, ef, el, ec, cap, compiled=False),
                               maxmin_rates(n, ef, el, ec, cap, compiled=True), rtol=1e-9), "engines disagree"
        if n <= baseline_max:
            paths: list[list[tuple[int, float]]] = [[] for _ in range(n)]
            for f, lk, c in zip(ef.tolist(), el.tolist(), ec.tolist(), strict=True):
                paths[f].append((lk, c))
            caps = cap.tolist()
            t0 = time.process_time()
            ref = progressive_filling_py(paths, caps)
            row["python_s"] = time.process_time() - t0
            fast = maxmin_rates(n, ef, el, ec, cap, compiled=True)
            assert np.allclose(fast, ref, rtol=1e-9), "solvers disagree"
        rows.append(row)
        print(row, flush=True)
    return rows


def bench_build(counts: list[int]) -> list[dict[str, float]]:
    rows = []
    for n in counts:
        cfg = TopologyConfig(chip="h100-sxm", count=n, tiers=3)
        t = _best_of(lambda: build_topology(cfg), 3)  # noqa: B023
        topo = build_topology(cfg)
        rows.append({"chips": n, "nodes": topo.n_nodes, "links": topo.n_links, "build_s": t})
        print(rows[-1], flush=True)
    return rows


def bench_incremental(repeat: int) -> list[dict[str, object]]:
    """100k random flows on 131,072 H100; one collective starts, is solved, and finishes, is solved."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=131072, tiers=3))
    cap = topo.link_capacity_Bps
    rng = np.random.default_rng(0)
    n = 100_000
    src = rng.integers(0, topo.n_chips, n)
    dst = (src + 1 + rng.integers(0, topo.n_chips - 1, n)) % topo.n_chips
    r = route(topo, src, dst, np.arange(n))
    cases = {"TP8 ring inside one node": np.arange(8) + 8 * 777, "transfer between two nodes": np.array([5, 99_999]),
             "DP64 ring across pods": np.arange(64) * 2048 + 3}
    rows: list[dict[str, object]] = []
    for name, ranks in cases.items():
        best: dict[str, float] = {}
        for incremental in (True, False):
            for k in range(repeat):
                pool = FlowPool(topo.n_links)
                pool.incremental = incremental
                pool.add(1, n, 1e9, 1.0, 0, np.arange(n), r, src, dst, np.arange(n))
                pool.solve(cap, 0.0)
                s, d = (ranks[:1], ranks[1:]) if ranks.size == 2 else (ranks, np.roll(ranks, -1))
                lab = np.arange(s.size) + 10**7 + 100 * k
                rc = route(topo, s, d, lab)
                t0 = time.process_time()
                pool.add(2, 1, 1e9, 1.0, 0, np.zeros(s.size, dtype=np.int64), rc, s, d, lab)
                pool.solve(cap, 0.0)
                t1 = time.process_time()
                pool.remove(pool.gseq == 2)
                pool.solve(cap, 0.0)
                t2 = time.process_time()
                tag = "incr" if incremental else "full"
                best[f"{tag}_start_s"] = min(best.get(f"{tag}_start_s", np.inf), t1 - t0)
                best[f"{tag}_finish_s"] = min(best.get(f"{tag}_finish_s", np.inf), t2 - t1)
        rows.append({"case": name, **best})
        print(rows[-1], flush=True)
    return rows


def markdown(solver: list[dict[str, float]], build: list[dict[str, float]], incr: list[dict[str, object]]) -> str:
    out = [
        "| flows | chips | links | incidence entries | kernel (s) | numpy rounds (s) | pure Python (s) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in solver:
        py, npy = r.get("python_s"), r.get("numpy_s")
        out.append(f"| {r['flows']:,} | {r['chips']:,} | {r['links']:,} | {r['entries']:,} | {r['kernel_s']:.4f} | "
                   + (f"{npy:.3f} | " if npy else "not run | ") + (f"{py:.2f} |" if py else "not run |"))
    out += ["", "| accelerators | nodes | links | build (s) |", "|---:|---:|---:|---:|"]
    for r in build:
        out.append(f"| {r['chips']:,} | {r['nodes']:,} | {r['links']:,} | {r['build_s']:.3f} |")
    out += ["", "| one collective among 100k flows (131,072 H100) | start: incremental (ms) | start: from scratch (ms) "
            "| finish: incremental (ms) | finish: from scratch (ms) |", "|---|---:|---:|---:|---:|"]
    for c in incr:
        v = {k: float(x) * 1e3 for k, x in c.items() if k != "case"}  # type: ignore[arg-type]
        out.append(f"| {c['case']} | {v['incr_start_s']:.1f} | {v['full_start_s']:.0f} | {v['incr_finish_s']:.1f} | "
                   f"{v['full_finish_s']:.0f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="numpy rounds at 1M flows, the Python baseline at 100k")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables at the end")
    ap.add_argument("--repeat", type=int, default=3, help="best of N for the incremental update")
    args = ap.parse_args()
    sizes = [1_000, 10_000, 100_000, 1_000_000]
    solver = bench_solver(sizes, baseline_max=100_000 if args.full else 10_000,
                          numpy_max=1_000_000 if args.full else 100_000)
    build = bench_build([131_072] + ([524_288] if args.full else []))
    incr = bench_incremental(args.repeat)
    if args.markdown:
        print(f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
              f"numpy {np.__version__}\n")
        print(markdown(solver, build, incr))


if __name__ == "__main__":
    main()
