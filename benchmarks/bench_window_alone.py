"""Benchmark: what a steady-state window request costs the fabric on the 2 GW site.

``ReserveWindow`` runs one step of the job's collective pattern alone on a scratch simulator with the
live link state (``fabric/service/windows.py`` ``isolated_step``): every collective of a Llama 3 405B
step laid out TP 8 x PP 16 x DP ``--dp`` (the calls of ``bench_collectives.step_calls``, the scheduler's
own) on the ``2gw-trainium3`` fabric (1,623,040 Trainium3, three tiers of Tomahawk 5, spraying:
11,032,576 links), routed and solved to its end. Times are CPU seconds of the process (best of
``--repeat``, after one warm-up for numba's compiles), so a shared machine inflates them little.

``--baseline DIR`` runs the same in the tree at DIR (its ``services/``) in a subprocess, for the ratio.

    python benchmarks/bench_window_alone.py [--dp 768] [--repeat 3] [--baseline /path/to/other/tree]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def measure(dp: int, repeat: int) -> dict[str, float]:
    from bench_collectives import step_calls  # type: ignore[import-not-found]

    from gigacluster.fabric.service.windows import LinkState, PatternCollective, isolated_step
    from gigacluster.fabric.sim import FlowSim
    from gigacluster.fabric.topology import TopologyConfig, build_topology

    topo = build_topology(TopologyConfig(chip="trainium3", count=1623040, system="trn3-ultraserver", tiers=3,
                                         switch="tomahawk5", routing="spray"))
    live = FlowSim(topo)
    pattern = [PatternCollective(op, r, st, g, b, None, "training", "bench", 0.0, 0.0)
               for op, r, st, g, b in step_calls(8, 16, dp)]
    isolated_step(LinkState.of(live), pattern)  # warm-up: numba compiles, plan caches of nothing (a new scratch)
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        iso = isolated_step(LinkState.of(live), pattern)
        best = min(best, time.process_time() - t)
    return {"cpu_s": best, "links_used": int(iso.links.size), "links": int(topo.n_links), "chips": 8 * 16 * dp}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dp", type=int, default=768)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", default="", help="another tree to measure the same in (its services/)")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    row = measure(args.dp, args.repeat)
    if args.json:
        print(json.dumps(row))
        return
    rows = [("this tree", row)]
    if args.baseline:
        env = dict(os.environ, PYTHONPATH=str(pathlib.Path(args.baseline) / "services"))
        out = subprocess.run([sys.executable, str(HERE / "bench_window_alone.py"), "--dp", str(args.dp), "--repeat",
                              str(args.repeat), "--json"], env=env, check=True, capture_output=True, text=True)
        rows.insert(0, ("baseline", json.loads(out.stdout.strip().splitlines()[-1])))
    print(f"Llama 3 405B step alone, TP 8 x PP 16 x DP {args.dp} ({row['chips']:,} chips) on 2gw-trainium3 "
          f"({row['links']:,} links; the step uses {row['links_used']:,}); load average {os.getloadavg()[0]:.1f}")
    print("| tree | CPU s per window request (the step alone) |")
    print("|---|---:|")
    for name, r in rows:
        print(f"| {name} | {r['cpu_s']:.2f} |")


if __name__ == "__main__":
    main()
