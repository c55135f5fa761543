"""The Llama 3 405B pre-training run (16,384 H100, about 54 days) with its failures, through the live mesh.

The mesh runs in event mode (virtual time jumps from event to event); the fault injector draws the Llama 3
failure mix (419 unexpected interruptions in 54 days, Llama 3 paper Table 5) over every chip, spares
included, and breaks chips and links with InjectFault / InjectLinkFault at their virtual times; the job
finds out when its step fails, restarts from its last durable checkpoint and pays the relaunch. Prints the
report (goodput, interruptions by cause, energy, cost, time lost) and the offline model's goodput for the
same seed.

    python examples/llama3_405b_failures.py                      # the 54-day run (needs steady-state windows)
    python examples/llama3_405b_failures.py --hours 6 --chips 32 --job examples/demo-train-h100.yaml --scale 2e4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys

from gigacluster.faults.replay import EXAMPLES, Replay, replay


def parse(argv: list[str]) -> Replay:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", type=pathlib.Path, default=EXAMPLES / "llama3-405b-8k.yaml", help="training job file")
    ap.add_argument("--chips", type=int, default=16_384, help="the job's chips (default 16,384)")
    ap.add_argument("--spare-chips", type=int, default=64, help="spare chips for quarantined ones (default 64)")
    ap.add_argument("--shards", type=int, default=4, help="chip service shards (default 4)")
    ap.add_argument("--hours", type=float, default=54 * 24.0, help="virtual hours of training (default 54 days)")
    ap.add_argument("--table", default="llama3", help="failure table: llama3 or a YAML file")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplier on the table's rates")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--state-dir", type=pathlib.Path, default=None, help="keep the mesh's and injector's state here")
    a = ap.parse_args(argv)
    return Replay(job_file=a.job, chips=a.chips, spare_chips=a.spare_chips, shards=a.shards, hours=a.hours,
                  table=a.table, scale=a.scale, seed=a.seed, state_dir=a.state_dir)


def main(argv: list[str]) -> int:
    rep = asyncio.run(replay(parse(argv)))
    print(json.dumps(rep, indent=2))
    return 0 if rep["state"] == "STATE_SUCCEEDED" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
