"""What one service process serves, and what a tenant at full speed does to its neighbour.

Starts the real mesh (the same Stack as ``gigacluster up``), gives two tenants an instance each
on the same chip shard, and measures, with the cheap authenticated RPC ``ChipService.GetStats``
(capability verified on every call):

1. idle: tenant B's latency alone (sequential calls, ``--probe-rate`` per second);
2. capacity: tenant A alone at full speed (a separate load-client process, ``--concurrency`` calls
   in flight) with rate limiting off: the calls per second one chip process can serve;
3. neighbour: A at full speed again, B probing at the same time, with the per-tenant RPC limit
   set to ``--rate`` (default: the configured default): B's p50/p99 against idle, A's accepted
   and refused calls per second.

CPU seconds of the chip process and of the load client are reported for each phase, since on a
small machine the load client competes with the service for cores.

    python benchmarks/bench_neighbour.py [--seconds 8] [--concurrency 16] [--rate R] [--markdown]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import resource
import statistics
import sys
import tempfile
import time
from typing import Any

import grpc

from gigacluster.broker.v1 import broker_pb2
from gigacluster.chip.v1 import chip_pb2, chip_pb2_grpc
from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.common.v1 import common_pb2
from gigacluster.runtime.auth import call_metadata
from gigacluster.runtime.config import CommonConfig
from gigacluster.stack import Stack, StackConfig


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _flood(endpoint: str, capability: str, devices: tuple[int, int], seconds: float,
                 concurrency: int) -> dict[str, Any]:
    md = call_metadata(capability=capability)
    req = chip_pb2.GetStatsRequest(devices=[common_pb2.DeviceRange(start=devices[0], end=devices[1])])
    counts: dict[str, int] = {}
    async with grpc.aio.insecure_channel(endpoint) as ch:
        stub = chip_pb2_grpc.ChipServiceStub(ch)
        deadline = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < deadline:
                try:
                    await stub.GetStats(req, metadata=md, timeout=10)
                    code = "OK"
                except grpc.aio.AioRpcError as err:
                    code = err.code().name
                counts[code] = counts.get(code, 0) + 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"counts": counts, "cpu_s": usage.ru_utime + usage.ru_stime}


def _flood_proc(q: Any, *args: Any) -> None:
    q.put(asyncio.run(_flood(*args)))


async def _probe(stub: Any, md: Any, req: Any, seconds: float, rate: float) -> list[float]:
    lat: list[float] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        try:
            await stub.GetStats(req, metadata=md, timeout=10)
        except grpc.aio.AioRpcError as err:
            if err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
        dt = time.perf_counter() - t0
        lat.append(dt)
        await asyncio.sleep(max(0.0, 1.0 / rate - dt))
    return lat


def _pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))] * 1e3


async def run_stack(rate: float, args: argparse.Namespace, *, phases: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        import pathlib

        cfg = StackConfig(chip="h100-sxm", chips=16, shards=1, speedup=10.0, ports={k: 0 for k in DEFAULT_PORTS},
                          mqtt_port=0, state_dir=pathlib.Path(tmp), log_format="json",
                          extra_env={"GIGACLUSTER_CHIP_RATE_OPS_PER_S": repr(rate)})
        st = Stack(cfg)
        await st.start()
        try:
            admin = call_metadata(api_key=st.admin_key)
            caps = {}
            async with Client(st.endpoints, st.admin_key) as gc:
                for i, t in enumerate(("a", "b")):
                    await st.create_tenant(t)
                    r = await gc.broker.AllocateInstance(broker_pb2.AllocateInstanceRequest(
                        chip_type="h100-sxm", count=8, devices=[common_pb2.DeviceRange(start=8 * i, end=8 * i + 8)],
                        tenant=f"tenants/{t}"), metadata=admin)
                    caps[t] = r.capability
                chip_pid = next(p.proc.pid for n, p in st.procs.items() if n.startswith("chip") and p.proc)
                endpoint = st.endpoint_of("chip")
                b_md = call_metadata(capability=caps["b"])
                b_req = chip_pb2.GetStatsRequest(devices=[common_pb2.DeviceRange(start=8, end=16)])
                for _ in range(50):  # warm up the channel and the broker's key cache
                    await gc.chip.GetStats(b_req, metadata=b_md)
                for phase in phases:
                    ctx = mp.get_context("spawn")
                    q = ctx.Queue()
                    flood = None
                    if phase != "idle":
                        flood = ctx.Process(target=_flood_proc, args=(q, endpoint, caps["a"], (0, 8), args.seconds,
                                                                      args.concurrency))
                        flood.start()
                        await asyncio.sleep(1.0)  # the load client is up and saturating
                    cpu0, t0 = _cpu_s(chip_pid), time.monotonic()
                    lat = await _probe(gc.chip, b_md, b_req, args.seconds - 1.5 if flood else args.seconds,
                                       args.probe_rate)
                    wall = time.monotonic() - t0
                    server_cpu = _cpu_s(chip_pid) - cpu0
                    res: dict[str, Any] = {"p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99), "n": len(lat),
                                           "server_cpu_share": server_cpu / wall}
                    if flood is not None:
                        got = q.get(timeout=args.seconds + 30)
                        flood.join(30)
                        res["a_ok_per_s"] = got["counts"].get("OK", 0) / args.seconds
                        res["a_refused_per_s"] = got["counts"].get("RESOURCE_EXHAUSTED", 0) / args.seconds
                        res["a_other"] = {k: v for k, v in got["counts"].items()
                                          if k not in ("OK", "RESOURCE_EXHAUSTED")}
                        res["client_cpu_share"] = got["cpu_s"] / args.seconds
                    out.setdefault(phase, []).append(res)
        finally:
            await st.stop()
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--probe-rate", type=float, default=50.0)
    ap.add_argument("--rate", type=float, default=CommonConfig.rate_ops_per_s)
    ap.add_argument("--rounds", type=int, default=1, help="alternate idle and loaded phases this many times "
                                                         "(each loaded phase is compared with the idle one before it)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    unlimited = await run_stack(0.0, args, phases=["idle", "capacity"] * args.rounds)
    limited = await run_stack(args.rate, args, phases=["idle", "neighbour"] * args.rounds)
    rows = []
    for i in range(args.rounds):
        rows += [("idle, no limit", unlimited["idle"][i], unlimited["idle"][i]),
                 ("A at full speed, no limit", unlimited["capacity"][i], unlimited["idle"][i]),
                 ("idle, limit", limited["idle"][i], limited["idle"][i]),
                 (f"A at full speed, limit {args.rate:g}/s", limited["neighbour"][i], limited["idle"][i])]
    print(f"cpus={os.cpu_count()} loadavg={load0:.1f}->{os.getloadavg()[0]:.1f} seconds={args.seconds} "
          f"concurrency={args.concurrency} rate={args.rate:g}", file=sys.stderr)
    if args.markdown:
        print("| phase | B p50 ms | B p99 ms | B p99 / idle | A served/s | A refused/s | chip CPU | client CPU |")
        print("|---|---|---|---|---|---|---|---|")
    for name, r, base in rows:
        cells = [name, f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}", f"{r['p99_ms'] / base['p99_ms']:.2f}",
                 f"{r.get('a_ok_per_s', 0):.0f}", f"{r.get('a_refused_per_s', 0):.0f}",
                 f"{r['server_cpu_share']:.0%}", f"{r.get('client_cpu_share', 0):.0%}"]
        print(("| " + " | ".join(cells) + " |") if args.markdown else "  ".join(cells))
        if r.get("a_other"):
            print(f"  other codes for A: {r['a_other']}", file=sys.stderr)
    ratios = [n["p99_ms"] / i["p99_ms"] for n, i in zip(limited["neighbour"], limited["idle"], strict=True)]
    print(f"B p99 loaded/idle with the limit, per round: {', '.join(f'{r:.2f}' for r in ratios)}; "
          f"median {statistics.median(ratios):.2f}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
