"""Benchmark: what one advance of the event clock costs, by the number of processes in the mesh.

Starts the real mesh in event mode (the same ``Stack`` as ``gigacluster up --clock event``) with N chip
shards and nothing to do, joins the clock as a participant (``runtime/participant.py``, as the scenario
runner and the load client do) and sleeps ``--advances`` times for one virtual second. Each sleep is one
advance of the coordinator, with nothing else happening: the floor under every event of the mesh. It
reports wall ms per advance, probe rounds per advance, and the CPU the mesh's processes spent per advance
(all of them, from /proc), for each shard count.

    python benchmarks/bench_clock_floor.py [--shards 1,4,16] [--advances 300] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import tempfile
import time

from bench_event_clock import coordinator_counts  # type: ignore[import-not-found]

from gigacluster.runtime.participant import participate
from gigacluster.stack import DEFAULT_PORTS, Stack, StackConfig


def tree_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of the given processes."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return total


async def one(shards: int, advances: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        return await _one(shards, advances, pathlib.Path(tmp))


async def _one(shards: int, advances: int, tmp: pathlib.Path) -> dict[str, float]:
    cfg = StackConfig(chip="trainium3", chips=64 * shards, shards=shards, clock="event", restart=False,
                      ports={k: 0 for k in DEFAULT_PORTS}, mqtt_port=0, state_dir=tmp)
    async with Stack(cfg) as st:
        await st.wait_healthy(120)
        pids = [p.proc.pid for p in st.procs.values() if p.proc is not None]
        async with participate(st.endpoint_of("clock"), "floor", key=st.admin_key) as ck:
            for _ in range(20):  # warm up
                await ck.sleep(1.0)
            a0, p0 = await coordinator_counts(st)
            c0, w0 = tree_cpu_s(pids), time.perf_counter()
            for _ in range(advances):
                await ck.sleep(1.0)
            w1, c1 = time.perf_counter(), tree_cpu_s(pids)
            a1, p1 = await coordinator_counts(st)
    n = max(a1 - a0, 1)
    return {"shards": shards, "processes": len(pids) + 1, "advances": a1 - a0, "wall_ms": 1e3 * (w1 - w0) / n,
            "probes": (p1 - p0) / n, "cpu_ms": 1e3 * (c1 - c0) / n, "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", default="1,4,16")
    ap.add_argument("--advances", type=int, default=300)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rows = [asyncio.run(one(int(s), args.advances)) for s in args.shards.split(",")]
    print("| chip shards | processes (with the participant) | advances | wall ms / advance | probe rounds / advance "
          "| mesh CPU ms / advance | load average |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shards']} | {r['processes']} | {r['advances']} | {r['wall_ms']:.2f} | {r['probes']:.2f} "
              f"| {r['cpu_ms']:.2f} | {r['load']:.1f} |")


if __name__ == "__main__":
    main()
