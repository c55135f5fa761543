"""The transport floor and the router's own cost, driven by h2load (nghttp2's C load generator) instead of the
Python load client.

The Python client (``loadtest``, ``bench_grpc_stream``) spends about as much CPU per call as the server it drives,
and its own event loop adds to every latency it reads, so on two cores it cannot tell the server's floor from its
own. h2load sends the same gRPC call (a length-prefixed ``GenerateRequest`` over HTTP/2 with ``content-type:
application/grpc``) open-loop at ``--rps`` per connection for a few percent of a core, and logs every call's
end-to-end time (``--log-file``: the last message and the trailers). Two targets:

* ``bare``: ``bench_grpc_stream``'s grpc aio server in its own process, ``--messages`` per call, nothing behind it;
* ``router``: a real mesh (``bench_router``'s: 8 H100, llama3-8b with ``--replicas`` replicas), 32 prompt tokens,
  16 output tokens; the end-to-end time then holds the modelled generation too, so its rise with the rate is the
  batching's and the router's together, and the router's CPU per request (from /proc) is the figure to read.

    apt-get install nghttp2-client
    python benchmarks/bench_h2load.py --target bare --rates 500,1000,2000 --messages 1,16 --markdown
    python benchmarks/bench_h2load.py --target bare --rates 1000 --messages 2,4 --stream-ms 200 --markdown
    python benchmarks/bench_h2load.py --target router --rates 200,500,1000 --markdown
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import bench_grpc_stream as bare
import bench_router as br
from _table import print_rows

from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2


def grpc_body(req: router_pb2.GenerateRequest) -> bytes:
    """One gRPC message as it goes on the wire: uncompressed flag, 4-byte length, the serialized request."""
    raw = req.SerializeToString()
    return b"\x00" + len(raw).to_bytes(4, "big") + raw


def h2load(url: str, body: bytes, rate: float, seconds: float, clients: int, headers: list[str],
           tmp: pathlib.Path, *, h1: bool = False) -> dict[str, Any]:
    """Run h2load open-loop at ``rate`` calls/s for ``seconds``; per-call end-to-end times and its own CPU.

    ``h1``: HTTP/1.1 (the router's OpenAI API), one request at a time per connection, so ``clients`` must
    exceed the calls in flight; then ``ok`` counts the 200s (a refusal is a 429)."""
    exe = shutil.which("h2load")
    if exe is None:
        raise SystemExit("h2load not found: apt-get install nghttp2-client")
    (tmp / "body.bin").write_bytes(body)
    log = tmp / "h2.log"
    log.unlink(missing_ok=True)
    n = int(rate * seconds)
    argv = [exe, "-c", str(clients), "-m", "4000", "-n", str(n), "--rps", str(rate / clients), f"--log-file={log}",
            "-d", str(tmp / "body.bin"), "-T", "60"]
    argv += (["--h1", "-H", "content-type: application/json"] if h1 else
             ["-H", "content-type: application/grpc", "-H", "te: trailers"])
    for h in headers:
        argv += ["-H", h]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([*argv, url], capture_output=True, text=True, check=True).stdout
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = [line.split() for line in log.read_text().splitlines() if line.strip()]  # start_us status duration_us
    ms = np.array([int(r[2]) for r in rows]) / 1e3
    done = next((line for line in out.splitlines() if line.startswith("requests:")), "")
    if os.environ.get("BENCH_H2LOAD_VERBOSE"):
        print(out, file=sys.stderr)
    return {"sent": n, "done": len(ms), "summary": done.strip(), "http_ok": sum(r[1] == "200" for r in rows),
            "client_cpu_s": (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime),
            "p50": float(np.percentile(ms, 50)), "p90": float(np.percentile(ms, 90)),
            "p99": float(np.percentile(ms, 99))}


def bare_rows(args: argparse.Namespace, tmp: pathlib.Path) -> list[dict[str, Any]]:
    rows = []
    body = grpc_body(router_pb2.GenerateRequest(model="deployments/bench", text="hello world " * 3, max_tokens=16))
    for messages in (int(m) for m in args.messages.split(",")):
        q: Any = mp.get_context("spawn").Queue()
        spread_s = args.stream_ms / 1e3 if messages > 1 else 0.0
        proc = mp.get_context("spawn").Process(target=bare._server_main, args=(q, messages, spread_s), daemon=True)
        proc.start()
        try:
            port = q.get(timeout=30)
            assert proc.pid is not None
            for rate in (float(r) for r in args.rates.split(",")):
                s0 = bare.cpu_s(proc.pid)
                r = h2load(f"http://127.0.0.1:{port}/bench.Stream/Generate", body, rate, args.seconds,
                           args.clients, [], tmp)
                for k in ("p50", "p90", "p99"):  # past the spread: what the transport adds to the last message
                    r[k] -= 1e3 * spread_s
                spread = f" over {args.stream_ms:g} ms" if spread_s else ""
                r |= {"target": f"bare, {messages} messages{spread}", "rate": rate,
                      "server_ms": 1e3 * (bare.cpu_s(proc.pid) - s0) / max(1, r["done"])}
                rows.append(r)
        finally:
            proc.kill()
            proc.join(10)
    return rows


async def _deploy(st: Any, key: str, name: str, replicas: int, delete: str = "") -> None:
    """A fresh deployment ``name`` (``delete`` first, to free its chips), READY."""
    async with Client(st.endpoints, key) as c:
        if delete:
            await c.router.DeleteDeployment(router_pb2.DeleteDeploymentRequest(name=f"deployments/{delete}"),
                                            metadata=c.md, timeout=60)
        await c.router.DeployModel(router_pb2.DeployModelRequest(
            deployment_id=name, model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm", tp=1,
            replicas=replicas, max_batch=256, max_queue=256), metadata=c.md, timeout=60)
        for _ in range(600):
            d = (await c.router.GetDeployment(router_pb2.GetDeploymentRequest(name=f"deployments/{name}"),
                                              metadata=c.md, timeout=10)).deployment
            if d.state == router_pb2.Deployment.STATE_READY:
                return
            await asyncio.sleep(0.1)
        raise SystemExit(f"deployment {name} not ready")


async def _modelled_e2e(st: Any, key: str, name: str) -> Any:
    """The router's own summary of the modelled end-to-end latencies of ``name``'s requests."""
    async with Client(st.endpoints, key) as c:
        got = await c.router.GetStats(router_pb2.GetStatsRequest(deployment=f"deployments/{name}"), metadata=c.md,
                                      timeout=30)
    return got.deployments[0].e2e


def router_rows(args: argparse.Namespace, tmp: pathlib.Path) -> list[dict[str, Any]]:
    """Each rate on a fresh deployment, so that the router's summary of its modelled end-to-end latencies
    (``GetStats``) covers that phase alone: overhead p50 / p99 = h2load's p50 / p99 minus the modelled ones (a
    difference of percentiles, the closest h2load, which reads no response, allows)."""
    async def run() -> list[dict[str, Any]]:
        env = {"GIGACLUSTER_ROUTER_FRONTENDS": str(args.frontends)} if args.frontends else {}
        st, key = await br.start_stack(tmp / "state", env, args.replicas, 256)
        rows = []
        try:
            router_pid = st.procs["router"].proc.pid  # type: ignore[union-attr]
            chip_pid = st.procs["chip"].proc.pid  # type: ignore[union-attr]
            url = f"http://{st.endpoints.router}/gigacluster.router.v1.RouterService/Generate"
            await asyncio.sleep(1.0 if args.frontends else 0.0)  # the front ends up and listening
            family = br.family_pids(router_pid)  # the router and its front-end processes

            def router_cpu_s() -> float:
                return sum(bare.cpu_s(pid) for pid in family)

            live = br.DEPLOYMENT
            rates = [float(r) for r in args.rates.split(",")] * args.repeat  # repeats interleaved: drift spreads
            for i, rate in enumerate(rates):
                name = f"{br.DEPLOYMENT}-{i}"
                await _deploy(st, key, name, args.replicas, delete=live)
                live = name
                h1 = args.protocol == "http"
                if h1:  # the OpenAI completions API, streamed (server-sent events)
                    url = f"http://127.0.0.1:{st.http_port}/v1/completions"
                    body = json.dumps({"model": name, "prompt": list(range(100, 132)), "max_tokens": 16,
                                       "stream": True}).encode()
                else:
                    body = grpc_body(router_pb2.GenerateRequest(
                        model=f"deployments/{name}", token_ids=router_pb2.TokenIds(ids=list(range(100, 132))),
                        max_tokens=16))
                s0, c0, k0 = router_cpu_s(), bare.cpu_s(chip_pid), bare.cpu_s(router_pid)
                spies = []
                if args.profile:  # py-spy's folded stacks of the router (and each front end) over the phase
                    for k, pid in enumerate(family):
                        run = f"-phase{i}" if args.repeat > 1 else ""
                        out = f"{args.profile}-{rate:g}{run}{f'-fe{k}' if k else ''}.txt"
                        spies.append(subprocess.Popen(["py-spy", "record", "--nonblocking", "-r", "200", "-f", "raw",
                                                       "-p", str(pid), "-d", str(int(args.seconds)), "-o", out],
                                                      stdout=subprocess.DEVNULL))
                r = await asyncio.to_thread(h2load, url, body, rate, args.seconds,
                                            max(args.clients, int(rate)) if h1 else args.clients,
                                            [f"authorization: Bearer {key}"], tmp, h1=h1)
                fe = f", {args.frontends} front ends" if args.frontends else ""
                r |= {"target": f"router {args.protocol}, {args.replicas} replicas{fe}", "rate": rate,
                      "server_ms": 1e3 * (router_cpu_s() - s0) / max(1, r["done"]),
                      "core_ms": 1e3 * (bare.cpu_s(router_pid) - k0) / max(1, r["done"]),
                      "chip_core": (bare.cpu_s(chip_pid) - c0) / args.seconds}
                for spy in spies:
                    await asyncio.to_thread(spy.wait)
                e2e = await _modelled_e2e(st, key, name)
                r |= {"modelled": int(e2e.count), "model_p50": 1e3 * e2e.p50_s, "model_p99": 1e3 * e2e.p99_s}
                rows.append(r)
                await asyncio.sleep(2)
        finally:
            await st.stop()
        return rows
    return asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", choices=("bare", "router"), default="bare")
    ap.add_argument("--rates", default="500,1000")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--clients", type=int, default=4, help="h2load connections (the rate is split over them)")
    ap.add_argument("--messages", default="16", help="bare: messages per call, comma-separated")
    ap.add_argument("--stream-ms", type=float, default=0.0,
                    help="bare: spread a call's messages over this many ms (times are then reported past the spread)")
    ap.add_argument("--protocol", choices=("grpc", "http"), default="grpc",
                    help="router: gRPC Generate, or the OpenAI completions API over HTTP/1.1 (one connection per "
                         "call in flight: as many connections as calls a second)")
    ap.add_argument("--replicas", type=int, default=4, help="router: replicas of the deployment")
    ap.add_argument("--frontends", type=int, default=0, help="router: front-end processes (router.frontends)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="router: run the list of rates this many times (phases of equal rates differ by 10-15%%)")
    ap.add_argument("--profile", default="", help="router: write py-spy folded stacks to PREFIX-RATE.txt per phase")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-h2load-") as d:
        tmp = pathlib.Path(d)
        rows = bare_rows(args, tmp) if args.target == "bare" else router_rows(args, tmp)
    cols = [("target", lambda r: r["target"]), ("offered req/s", lambda r: f"{r['rate']:,.0f}"),
            ("done", lambda r: f"{r['done']:,} of {r['sent']:,}"),
            # h2load counts a call answered with a gRPC error (its status is in the trailers, HTTP 200) as done;
            # the requests the deployment finished are the router's own count of modelled end-to-end times.
            ("served", lambda r: f"{r['modelled']:,}" if "modelled" in r else "-"),
            ("served req/s", lambda r: f"{r['modelled'] / args.seconds:,.0f}" if "modelled" in r else "-"),
            ("end-to-end p50 ms", lambda r: f"{r['p50']:.1f}"), ("p90 ms", lambda r: f"{r['p90']:.1f}"),
            ("p99 ms", lambda r: f"{r['p99']:.1f}"),
            ("modelled p50 / p99 ms", lambda r: f"{r['model_p50']:.1f} / {r['model_p99']:.1f}" if "model_p50" in r
             else "-"),
            ("overhead p50 / p99 ms", lambda r: f"{r['p50'] - r['model_p50']:.1f} / {r['p99'] - r['model_p99']:.1f}"
             if "model_p50" in r else "-"),
            ("server CPU ms/call", lambda r: f"{r['server_ms']:.2f}"),
            ("of which router core", lambda r: f"{r['core_ms']:.2f}" if "core_ms" in r else "-"),
            ("router CPU ms a request served", lambda r: f"{r['server_ms'] * r['done'] / r['modelled']:.2f}"
             if r.get("modelled") else "-"),
            ("server cores", lambda r: f"{r['server_ms'] * r['rate'] / 1e3:.2f}"),
            ("h2load cores", lambda r: f"{r['client_cpu_s'] / args.seconds:.2f}")]
    print_rows(rows, cols, markdown=args.markdown)


if __name__ == "__main__":
    main()
