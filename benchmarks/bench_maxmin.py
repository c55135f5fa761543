"""Benchmark: max-min fair-share solve time vs flows, numpy progressive filling vs plain Python.

Workload: random point-to-point flows between chips of an H100 cluster on a two-tier (up to 8k
chips) or three-tier Tomahawk 5 fat-tree, routed by ECMP, so the incidence has 2-6 links per flow
and realistic bottleneck structure (NICs, leaf uplinks). Both solvers get the same instance; the
ratio is baseline time / vectorised time. Also times topology builds of 100k+ accelerators.

    python benchmarks/bench_maxmin.py            # 1k..100k flows, baseline up to 10k (about a minute)
    python benchmarks/bench_maxmin.py --full     # adds 1M flows and the baseline at 100k
    python benchmarks/bench_maxmin.py --markdown # print the tables for docs/performance.md
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from gigacluster.fabric.maxmin import maxmin_rates, progressive_filling_py
from gigacluster.fabric.routing import route
from gigacluster.fabric.topology import TopologyConfig, build_topology


def _best_of(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
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


def bench_solver(sizes: list[int], baseline_max: int) -> list[dict[str, float]]:
    rows = []
    for n in sizes:
        n_chips = min(131072, max(1024, n // 4 // 8 * 8))
        n_links, ef, el, ec, cap = instance(n, n_chips)
        repeat = 3 if n <= 100_000 else 1
        t_np = _best_of(lambda: maxmin_rates(n, ef, el, ec, cap), repeat)  # noqa: B023
        row = {"flows": n, "chips": n_chips, "links": n_links, "entries": int(ef.size), "numpy_s": t_np}
        if n <= baseline_max:
            paths: list[list[tuple[int, float]]] = [[] for _ in range(n)]
            for f, lk, c in zip(ef.tolist(), el.tolist(), ec.tolist(), strict=True):
                paths[f].append((lk, c))
            caps = cap.tolist()
            t0 = time.perf_counter()
            ref = progressive_filling_py(paths, caps)
            row["python_s"] = time.perf_counter() - t0
            fast = maxmin_rates(n, ef, el, ec, cap)
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


def markdown(solver: list[dict[str, float]], build: list[dict[str, float]]) -> str:
    out = [
        "| flows | chips | links | incidence entries | numpy (s) | pure Python (s) | speed-up |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in solver:
        py = r.get("python_s")
        out.append(
            f"| {r['flows']:,} | {r['chips']:,} | {r['links']:,} | {r['entries']:,} | {r['numpy_s']:.4f} | "
            + (f"{py:.3f} | {py / r['numpy_s']:.0f}x |" if py else "not run | |")
        )
    out += ["", "| accelerators | nodes | links | build (s) |", "|---:|---:|---:|---:|"]
    for r in build:
        out.append(f"| {r['chips']:,} | {r['nodes']:,} | {r['links']:,} | {r['build_s']:.3f} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="add 1M flows and the Python baseline at 100k")
    ap.add_argument("--markdown", action="store_true", help="print markdown tables at the end")
    args = ap.parse_args()
    sizes = [1_000, 10_000, 100_000] + ([1_000_000] if args.full else [])
    solver = bench_solver(sizes, baseline_max=100_000 if args.full else 10_000)
    build = bench_build([131_072] + ([524_288] if args.full else []))
    if args.markdown:
        print(f"\n{platform.processor() or platform.machine()}, Python {platform.python_version()}, "
              f"numpy {np.__version__}\n")
        print(markdown(solver, build))


if __name__ == "__main__":
    main()
