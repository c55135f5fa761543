"""The Llama 3 405B run with its failures through the live mesh (event mode) against the offline model.

Runs ``faults.replay`` (the same code as ``examples/llama3_405b_failures.py``): the job on the live mesh in
event mode with the fault injector breaking chips and links, then ``simulate_goodput`` for the same seed,
failure table, checkpoint and restart costs over the same virtual makespan. Targets (issue 14): goodput within
1 point of the offline model, and the 54-day run in at most 5 minutes of wall time. Nothing here depends on
steady-state windows; with them the same command simply runs faster.

    python benchmarks/bench_faults_run.py                                   # 54 days, 16,384 + 64 H100
    python benchmarks/bench_faults_run.py --hours 0.25 --chips 32 --spare-chips 8 --shards 1 \\
        --job examples/demo-train-h100.yaml --table tests/faults/data/fast-repairs.yaml   # a short check
"""

from __future__ import annotations

import asyncio
import os
import sys

from _table import print_rows

from gigacluster.faults.replay import replay

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from llama3_405b_failures import parse  # the example's flags, one definition

TARGET_POINTS = 1.0
TARGET_WALL_S = 300.0


def main(argv: list[str]) -> int:
    markdown = "--markdown" in argv
    rep = asyncio.run(replay(parse([a for a in argv if a != "--markdown"])))
    print_rows([rep], [
        ("chips", lambda r: f"{r['chips']:,} + {r['spare_chips']}"),
        ("virtual days", lambda r: f"{r['virtual_days']:.3f}"),
        ("steps", lambda r: f"{r['steps']:,}"), ("interruptions", lambda r: f"{r['interruptions']}"),
        ("offline interruptions", lambda r: f"{r['offline_interruptions']}"),
        ("goodput", lambda r: f"{100 * r['goodput']:.2f}%"),
        ("offline goodput", lambda r: f"{100 * r['offline_goodput']:.2f}%"),
        ("difference", lambda r: f"{r['goodput_diff_points']:+.2f} pt"), ("wall (s)", lambda r: f"{r['wall_s']:.0f}"),
        ("virtual/wall", lambda r: f"{r['virtual_per_wall']:.0f}x")], markdown=markdown)
    print(f"by cause (live): {rep['by_cause']}")
    print(f"by cause (offline): {rep['offline_by_cause']}")
    print(f"lost {rep['lost_s'] / 3600:.2f} h, restarts {rep['restart_s'] / 3600:.2f} h, checkpoint pauses "
          f"{rep['checkpoint_pause_s'] / 3600:.2f} h; energy {rep['energy_facility_mwh']:.1f} MWh (facility), "
          f"cost ${rep['cost_usd']:,.0f}")
    ok_g = abs(rep["goodput_diff_points"]) <= TARGET_POINTS
    ok_w = rep["wall_s"] <= TARGET_WALL_S
    print(f"goodput within {TARGET_POINTS:g} point: {'yes' if ok_g else 'NO'}; wall <= {TARGET_WALL_S:g} s: "
          f"{'yes' if ok_w else 'NO'}")
    return 0 if rep["state"] == "STATE_SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
