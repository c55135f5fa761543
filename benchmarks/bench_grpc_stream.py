"""What one streamed gRPC call costs in grpc aio itself, with no router behind it: the floor under the router.

A bare ``grpc.aio`` server (its own process) answers each call with ``--messages`` GenerateResponses
(the router's message, one token each); a load client in this process sends ``--rate`` calls a
second for ``--seconds``. Reported: CPU milliseconds per call of the server process (from /proc)
and of the client (getrusage), so the per-call and per-message costs of the transport can be read
off a few runs, and the client-observed latency of the first and the last message (p50, p99, from
the moment the call went out): with nothing behind the server, that latency is the least any
router on grpc aio can add at that rate on this machine, the floor under the router's "emulation
overhead". ``--stream-ms`` spreads each call's messages over that many milliseconds after the first
(as a router's tokens follow their iterations), so that as many streams are open at once as in the
router's benchmark:

    python benchmarks/bench_grpc_stream.py --rate 500 --messages 1,4,16
    python benchmarks/bench_grpc_stream.py --rate 1000 --messages 4 --stream-ms 200 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing as mp
import os
import pathlib
import resource
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from gigacluster.router.v1 import router_pb2
from gigacluster.runtime import eventloop

METHOD = "/bench.Stream/Generate"
# Extra channel arguments for both sides (--options), e.g. grpc.optimization_target=throughput.
OPTIONS: list[tuple[str, Any]] = [
    (k, int(v) if v.lstrip("-").isdigit() else v)
    for k, _, v in (o.partition("=") for o in os.environ.get("BENCH_GRPC_OPTIONS", "").split(",") if o)]


def _response(i: int) -> router_pb2.GenerateResponse:
    return router_pb2.GenerateResponse(request_id="0123456789abcdef", index=i, token_ids=[1234], text=" word",
                                       time_s=1.5, replica="tenants/t/deployments/bench-router/replicas/0")


async def _serve(port_q: Any, messages: int, stream_s: float) -> None:
    gap = stream_s / (messages - 1) if messages > 1 else 0.0

    async def generate(request: router_pb2.GenerateRequest, context: Any) -> AsyncIterator[Any]:
        for i in range(messages):
            yield _response(i)
            await asyncio.sleep(gap if i < messages - 1 else 0)  # as a router yields to its loop between tokens

    interceptors: list[Any] = []
    if os.environ.get("BENCH_GRPC_INTERCEPTORS"):  # the interceptors every service of ours runs (runtime/server.py)
        from gigacluster.runtime.server import DecodeErrorInterceptor, RequestIdInterceptor
        interceptors = [RequestIdInterceptor(), DecodeErrorInterceptor()]
    server = grpc.aio.server(options=[("grpc.server.max_pending_requests", 20000), *OPTIONS],
                             interceptors=interceptors)
    handler = grpc.unary_stream_rpc_method_handler(generate, request_deserializer=router_pb2.GenerateRequest.FromString,
                                                   response_serializer=router_pb2.GenerateResponse.SerializeToString)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Stream", {"Generate": handler})])
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    await server.start()
    await server.wait_for_termination()


def _server_main(port_q: Any, messages: int, stream_s: float) -> None:
    eventloop.run(_serve(port_q, messages, stream_s))


def cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def open_loop(rate: float, seconds: float, stream_s: float, call_once: Callable[[], Awaitable[float]]
                    ) -> tuple[int, list[float], list[float]]:
    """Send ``rate`` calls a second for ``seconds`` (open loop; ``call_once`` makes one call and returns when its
    first message came). Calls sent, and per call the wall seconds from its due time to its first and last
    message minus the server's own spacing (``stream_s``): what the transport and the two loops added."""
    first: list[float] = []
    last: list[float] = []

    async def one(due: float) -> None:
        first.append(await call_once() - due)
        last.append(time.monotonic() - due - stream_s)

    tasks, t0, i = [], time.monotonic(), 0
    while time.monotonic() - t0 < seconds:
        tasks.append(asyncio.create_task(one(t0 + i / rate)))  # latency from the due time
        i += 1
        await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
    await asyncio.gather(*tasks)
    return len(tasks), first, last


async def _load(port: int, rate: float, seconds: float, stream_s: float) -> tuple[int, list[float], list[float]]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS) as ch:
        call = ch.unary_stream(METHOD, request_serializer=router_pb2.GenerateRequest.SerializeToString,
                               response_deserializer=router_pb2.GenerateResponse.FromString)

        async def call_once() -> float:
            t_first = math.nan
            async for _ in call(router_pb2.GenerateRequest(model="m")):
                if t_first != t_first:
                    t_first = time.monotonic()
            return t_first

        return await open_loop(rate, seconds, stream_s, call_once)


def _pct(xs: list[float], q: float) -> float:
    ys = sorted(xs)
    return 1e3 * ys[min(len(ys) - 1, int(q * len(ys)))] if ys else float("nan")


def measure(rate: float, seconds: float, messages: int, stream_s: float = 0.0, *,
            server_main: Callable[..., None] | None = None, load: Callable[..., Any] | None = None,
            ) -> tuple[float, float, list[float], list[float]]:
    """(server, client) CPU ms per call, and the first- and last-message latencies (s) of every call: the server
    (``server_main(port_queue, messages, stream_s)``, default grpc aio's) in its own process, ``load(port, rate,
    seconds, stream_s)`` (the matching client) in this one."""
    server_main, load = server_main or _server_main, load or _load
    q: Any = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=server_main, args=(q, messages, stream_s), daemon=True)
    proc.start()
    try:
        port = q.get(timeout=30)
        assert proc.pid is not None
        s0, r0 = cpu_s(proc.pid), resource.getrusage(resource.RUSAGE_SELF)
        n, first, last = eventloop.run(load(port, rate, seconds, stream_s if messages > 1 else 0.0))
        s1, r1 = cpu_s(proc.pid), resource.getrusage(resource.RUSAGE_SELF)
    finally:
        proc.kill()
        proc.join(10)
    client = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return 1e3 * (s1 - s0) / n, 1e3 * client / n, first, last


def parser(doc: str | None, unit: str) -> argparse.ArgumentParser:
    """The options both floors take (rate, seconds, messages per call, their spread)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--messages", default="1,4,16", help=f"comma-separated {unit}s per call, one row each")
    ap.add_argument("--stream-ms", type=float, default=0.0,
                    help=f"spread each call's {unit}s over this many ms after the first (0: back to back)")
    return ap


def main() -> None:
    ap = parser(__doc__, "message")
    ap.add_argument("--options", default="", help="channel arguments for server and client, k=v,k=v "
                                                  "(e.g. grpc.optimization_target=throughput)")
    args = ap.parse_args()
    os.environ["BENCH_GRPC_OPTIONS"] = args.options  # the server process (spawned) reads it at import
    OPTIONS[:] = [(k, int(v) if v.lstrip("-").isdigit() else v)
                  for k, _, v in (o.partition("=") for o in args.options.split(",") if o)]
    table(args, "message", measure, f"options={args.options or '-'}")


def table(args: argparse.Namespace, unit: str, measure_fn: Callable[..., tuple[float, float, list[float], list[float]]],
          note: str = "") -> None:
    """Print one row per ``--messages`` value: CPU per call of both sides and the latency percentiles."""
    print(f"| {unit}s per call | server CPU ms/call | client CPU ms/call | first {unit} p50 ms | p99 ms "
          f"| last {unit} p50 ms | p99 ms |\n|---|---|---|---|---|---|---|")
    for m in (int(x) for x in args.messages.split(",")):
        server, client, first, last = measure_fn(args.rate, args.seconds, m, args.stream_ms / 1e3)
        print(f"| {m} | {server:.3f} | {client:.3f} | {_pct(first, 0.5):.2f} | {_pct(first, 0.99):.2f} "
              f"| {_pct(last, 0.5):.2f} | {_pct(last, 0.99):.2f} |", flush=True)
    print(f"rate={args.rate:g}/s seconds={args.seconds:g} stream_ms={args.stream_ms:g} loop={eventloop.chosen()} "
          f"{note} loadavg={os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
