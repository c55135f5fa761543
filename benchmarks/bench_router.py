"""The router at 200, 500 and 1,000 requests/s, over gRPC and HTTP, and where it saturates.

Starts the real mesh (``gigacluster.stack.Stack``, as ``gigacluster up`` and the load tests do:
chip shard, fabric, broker, scheduler and router as separate processes, speed-up 1), deploys one
small-prompt model (llama3-8b on H100, ``--replicas`` replicas), then drives it open-loop with
the load client of ``gigacluster loadtest`` (``gigacluster.loadtest.runner``) from separate
processes (``--clients``), one phase per protocol and rate. For every successful request:

* TTFT overhead = client-observed TTFT (wall, from the moment the call went out) minus the
  router's modelled TTFT (virtual, ``usage.ttft_s``, divided by the speed-up): what the emulation
  itself adds (transport, event-loop lag, chip round trips on the token path);
* latency overhead = client-observed end-to-end minus modelled end-to-end, likewise.

Reported per phase: p50/p99 of both, the statuses (no CANCELLED is the target; overload must be
RESOURCE_EXHAUSTED / HTTP 429), and over the arrival window the CPU share (of one core) of the
router (all its processes; with ``--frontends``, also its front ends alone), of the chip shard and of
the load client (all its processes), and the load average at the phase's end.
Then the rate is raised (x1.5 a step) until the router no longer keeps up (served < 95% of
offered, or p99 TTFT overhead above ``--sat-p99-ms``): the saturation point is the last rate
that kept up.

    python benchmarks/bench_router.py [--seconds 5] [--rates 200,500,1000] [--clients 2] [--frontends 0,2]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import math
import multiprocessing as mp
import os
import pathlib
import resource
import sys
import tempfile
import time
from typing import Any

import numpy as np

from gigacluster.client import DEFAULT_PORTS, Client
from gigacluster.common.v1 import common_pb2
from gigacluster.loadtest import runner
from gigacluster.loadtest.scenario import Arrival, Scenario, Stream
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime import eventloop
from gigacluster.stack import Stack, StackConfig

DEPLOYMENT = "bench-router"
KIND = {"grpc": "generate", "http": "http_completions"}


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc (0 once it is gone)."""
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def family_pids(pid: int) -> list[int]:
    """``pid`` and its children (the router's worker processes), from /proc."""
    out = [pid]
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


async def _drive(proto: str, rate: float, seconds: float, seed: int, target: runner.Target,
                 prompt_tokens: int, max_tokens: int) -> dict[str, Any]:
    stream = Stream(name=proto, kind=KIND[proto], arrival=Arrival(type="poisson", rate_per_s=rate),
                    model=DEPLOYMENT, prompt_tokens=prompt_tokens, max_tokens=max_tokens)
    scenario = Scenario(name=f"router-{proto}-{rate:g}", streams=(stream,), duration_s=seconds, seed=seed,
                        max_in_flight=100_000, drain_s=30.0)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    run = await runner.run(scenario, target)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.monotonic() - t0
    # The arrival window (CLOCK_MONOTONIC is the same in every process): CPU shares are measured over it.
    window = (t0 + runner.START_LEAD_S + 0.3, t0 + runner.START_LEAD_S + seconds)
    rows = []
    for r in run.results:
        rows.append((r.status, r.ttft_s - r.send_lag_s, r.virtual_ttft_s, r.e2e_s - r.send_lag_s,
                     getattr(r, "virtual_e2e_s", math.nan),  # absent from older load clients
                     r.send_lag_s, r.e2e_s, r.detail[:160], getattr(r, "chunks", 0), r.tokens))
    cpu = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return {"rows": rows, "cpu_s": cpu, "wall_s": wall, "window": window}


def _drive_proc(q: Any, *args: Any) -> None:
    q.put(eventloop.run(_drive(*args)))


async def _sample(pids: dict[str, list[int]], out: list[tuple[float, dict[str, float]]], stop: asyncio.Event) -> None:
    """CPU seconds of each group of processes every 0.2 s, with the time, until ``stop``."""
    while not stop.is_set():
        out.append((time.monotonic(), {k: sum(cpu_s(p) for p in v) for k, v in pids.items()}))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.2)


def _share(samples: list[tuple[float, dict[str, float]]], key: str, t0: float, t1: float) -> float:
    """CPU share (of one core) of group ``key`` between the samples nearest ``t0`` and ``t1``."""
    a = min(samples, key=lambda s: abs(s[0] - t0))
    b = min(samples, key=lambda s: abs(s[0] - t1))
    return (b[1][key] - a[1][key]) / (b[0] - a[0]) if b[0] > a[0] else math.nan


def _pct(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p)) if xs else math.nan


async def phase(st: Stack, key: str, proto: str, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    """One open-loop phase at ``rate`` from ``args.clients`` load processes; measured as the module says."""
    target = runner.Target(st.endpoints, key, http_url=f"http://127.0.0.1:{st.http_port}")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_drive_proc, args=(q, proto, rate / args.clients, args.seconds, 1000 * i + int(rate),
                                                   target, args.prompt_tokens, args.max_tokens))
             for i in range(args.clients)]
    router_pid = st.procs["router"].proc.pid  # type: ignore[union-attr]
    chip_pid = st.procs["chip"].proc.pid  # type: ignore[union-attr]
    for p in procs:
        p.start()
    family = family_pids(router_pid)
    groups = {"router": family, "frontends": family[1:], "chip": [chip_pid], "client": [p.pid for p in procs if p.pid]}
    samples: list[tuple[float, dict[str, float]]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample(groups, samples, stop))
    got = [await asyncio.to_thread(q.get, True, args.seconds + 120) for _ in procs]
    stop.set()
    await sampler
    for p in procs:
        p.join(30)
    w0, w1 = max(g["window"][0] for g in got), min(g["window"][1] for g in got)
    rows = [row for g in got for row in g["rows"]]
    statuses = collections.Counter(r[0] for r in rows)
    ok = [r for r in rows if r[0] == "OK" and not math.isnan(r[2])]
    ttft_over = [(r[1] - r[2] / st.cfg.speedup) * 1e3 for r in ok]
    e2e_over = [(r[3] - r[4] / st.cfg.speedup) * 1e3 for r in ok if not math.isnan(r[4])]
    details = collections.Counter(f"{r[0]}: {r[7]}" for r in rows if r[0] != "OK")
    return {"proto": proto, "rate": rate, "offered": len(rows), "ok": len(ok), "statuses": dict(statuses),
            "ttft_p50": _pct(ttft_over, 50), "ttft_p99": _pct(ttft_over, 99),
            "e2e_p50": _pct(e2e_over, 50), "e2e_p99": _pct(e2e_over, 99),
            "send_lag_p99": _pct([r[5] * 1e3 for r in rows], 99),
            "tokens_per_msg": sum(r[9] for r in ok) / max(1, sum(r[8] for r in ok)),
            "router_cpu": _share(samples, "router", w0, w1), "frontends_cpu": _share(samples, "frontends", w0, w1),
            "load": os.getloadavg()[0], "chip_cpu": _share(samples, "chip", w0, w1),
            "client_cpu": _share(samples, "client", w0, w1),
            "details": dict(details.most_common(3))}


def kept_up(r: dict[str, Any], args: argparse.Namespace) -> bool:
    """The router followed the offered load: >= 95% served, TTFT overhead p50 within ``--sat-p50-ms``."""
    return r["ok"] >= 0.95 * r["offered"] and r["ttft_p50"] <= args.sat_p50_ms


def row(r: dict[str, Any]) -> str:
    other = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()) if k != "OK") or "-"
    if r["details"]:
        print(f"  {r['build']} {r['proto']} {r['rate']:g}: {r['details']}", file=sys.stderr)
    return (f"| {r['build']} | {r['proto']} | {r['rate']:g} | {r['offered']} | {r['ok']} | {other} | "
            f"{r['ttft_p50']:.1f} | "
            f"{r['ttft_p99']:.1f} | {r['e2e_p50']:.1f} | {r['e2e_p99']:.1f} | {r['router_cpu']:.0%} | "
            f"{r['frontends_cpu']:.0%} | {cpu_per_request_ms(r):.2f} | {r['chip_cpu']:.0%} | {r['client_cpu']:.0%} | "
            f"{r['load']:.1f} | {r['tokens_per_msg']:.1f} |")


def cpu_per_request_ms(r: dict[str, Any]) -> float:
    """Router CPU (all its processes) per request served, in ms: less sensitive to other load than latency."""
    served_per_s = r["rate"] * r["ok"] / r["offered"] if r["offered"] else 0.0
    return 1e3 * r["router_cpu"] / served_per_s if served_per_s else math.nan


HEAD = ("| build | protocol | offered req/s | sent | ok | other statuses | TTFT overhead p50 ms | p99 ms | "
        "latency overhead p50 ms | p99 ms | router CPU | of which front ends | router CPU ms/request | chip CPU | "
        "load client CPU | load avg | tokens per message |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


async def start_stack(tmp: pathlib.Path, env: dict[str, str], replicas: int, max_queue: int) -> tuple[Stack, str]:
    """A mesh with the benchmark's deployment ready, and the tenant key that owns it."""
    cfg = StackConfig(chip="h100-sxm", chips=8, shards=1, speedup=1.0, ports={k: 0 for k in DEFAULT_PORTS},
                      mqtt_port=0, state_dir=tmp, http_port=0, restart=False, extra_env=env)
    st = Stack(cfg)
    await st.start()
    key = await st.default_tenant_key()
    async with Client(st.endpoints, key) as c:
        await c.router.DeployModel(router_pb2.DeployModelRequest(
            deployment_id=DEPLOYMENT, model=common_pb2.ModelArchitecture(preset="llama3-8b"),
            chip="h100-sxm", tp=1, replicas=replicas, max_batch=256, max_queue=max_queue), metadata=c.md, timeout=60)
        for _ in range(600):
            d = (await c.router.GetDeployment(router_pb2.GetDeploymentRequest(name=f"deployments/{DEPLOYMENT}"),
                                              metadata=c.md, timeout=10)).deployment
            if d.state == router_pb2.Deployment.STATE_READY:
                break
            await asyncio.sleep(0.1)
    return st, key


async def sweep(stacks: dict[str, tuple[Stack, str]], proto: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rates, each on every build in turn (so they share the machine's conditions), then the saturation
    search for each build still keeping up."""
    out = []
    for st, key in stacks.values():
        await phase(st, key, proto, 50.0, argparse.Namespace(**{**vars(args), "seconds": 1.0}))  # warm-up
    rate = 0.0
    for rate in (float(x) for x in args.rates.split(",")):
        for build, (st, key) in stacks.items():
            r = {"build": build, **await phase(st, key, proto, rate, args)}
            out.append(r)
            print(row(r), flush=True)
    if not args.saturate:
        return out
    best = {b: max((r["rate"] for r in out if r["build"] == b and kept_up(r, args)), default=0.0) for b in stacks}
    going = {b for b in stacks if all(kept_up(r, args) for r in out if r["build"] == b)}
    while going and rate < args.sat_max:
        rate = round(rate * 1.5, -1)
        for build in sorted(going):
            st, key = stacks[build]
            r = {"build": build, **await phase(st, key, proto, rate, args)}
            out.append(r)
            print(row(r), flush=True)
            if kept_up(r, args):
                best[build] = rate
            else:
                going.discard(build)
    for b, v in best.items():
        print(f"{b} {proto}: saturation point {v:g} req/s (the last rate served >= 95% with TTFT overhead p50 "
              f"<= {args.sat_p50_ms:g} ms)", flush=True)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="wall seconds of arrivals per phase")
    ap.add_argument("--rates", default="200,500,1000")
    ap.add_argument("--protocols", default="grpc,http")
    ap.add_argument("--clients", type=int, default=2, help="load-client processes per phase")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--max-queue", type=int, default=256)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--saturate", action="store_true", help="after the rates, raise the rate until it no longer "
                                                           "keeps up")
    ap.add_argument("--sat-p50-ms", type=float, default=50.0)
    ap.add_argument("--sat-max", type=float, default=6000.0)
    ap.add_argument("--baseline", default="", help="also run the services of this source tree (its services/ "
                                                  "directory), alternating phases with this one: before/after")
    ap.add_argument("--frontends", default="0", help="comma-separated router front-end process counts to run "
                                                    "this tree with, side by side (0 = one router process)")
    ap.add_argument("--event-loops", default="", help="comma-separated event loops (uvloop, asyncio, or default: "
                                                      "the variable unset, each process its own default) to run this "
                                                      "tree's services on, side by side (GIGACLUSTER_EVENT_LOOP; "
                                                      "none given: the environment's). The load clients run on the "
                                                      "loop GIGACLUSTER_EVENT_LOOP names in this process's environment")
    args = ap.parse_args()
    load0 = os.getloadavg()[0]
    env = {"GIGACLUSTER_ROUTER_RATE_OPS_PER_S": "100000"}  # measure the router, not the per-tenant limit
    builds: dict[str, dict[str, str]] = {}
    if args.baseline:
        builds["before"] = {**env, "PYTHONPATH": str(pathlib.Path(args.baseline) / "services")}
    loops = [x for x in args.event_loops.split(",") if x]
    for loop in loops:
        if loop != "default":
            eventloop.chosen(loop)  # an unknown name fails here, not in the services
    for n in (int(x) for x in args.frontends.split(",")):
        for loop in loops or [""]:
            name = (("after" if args.baseline else "this") + (f" {n} front ends" if n else "")
                    + (f" {loop}" if loop else ""))
            pick = {eventloop.ENV: loop} if loop not in ("", "default") else {}  # default: each process's own
            builds[name] = {**env, "GIGACLUSTER_ROUTER_FRONTENDS": str(n), **pick}
    stacks: dict[str, tuple[Stack, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, e in builds.items():
                stacks[name] = await start_stack(pathlib.Path(tmp) / name, e, args.replicas, args.max_queue)
            print(HEAD, flush=True)
            for proto in args.protocols.split(","):
                await sweep(stacks, proto, args)
        finally:
            for st, _ in stacks.values():
                await st.stop()
    print(f"cpus={os.cpu_count()} loadavg={load0:.1f}->{os.getloadavg()[0]:.1f} seconds={args.seconds} "
          f"clients={args.clients} replicas={args.replicas} client_loop={eventloop.chosen()}", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(main())
