"""What one streamed gRPC call costs in grpc aio itself, with no router behind it: the floor under the router.

A bare ``grpc.aio`` server (its own process) answers each call with ``--messages`` GenerateResponses
(the router's message, one token each); a load client in this process sends ``--rate`` calls a
second for ``--seconds``. Reported: CPU milliseconds per call of the server process (from /proc)
and of the client (getrusage), so the per-call and per-message costs of the transport can be read
off a few runs:

    python benchmarks/bench_grpc_stream.py --rate 500 --messages 1,4,16
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import pathlib
import resource
import time
from collections.abc import AsyncIterator
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


async def _serve(port_q: Any, messages: int) -> None:
    async def generate(request: router_pb2.GenerateRequest, context: Any) -> AsyncIterator[Any]:
        for i in range(messages):
            yield _response(i)
            await asyncio.sleep(0)  # as a router yields to its loop between tokens

    server = grpc.aio.server(options=[("grpc.server.max_pending_requests", 20000), *OPTIONS])
    handler = grpc.unary_stream_rpc_method_handler(generate, request_deserializer=router_pb2.GenerateRequest.FromString,
                                                   response_serializer=router_pb2.GenerateResponse.SerializeToString)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Stream", {"Generate": handler})])
    port_q.put(server.add_insecure_port("127.0.0.1:0"))
    await server.start()
    await server.wait_for_termination()


def _server_main(port_q: Any, messages: int) -> None:
    eventloop.run(_serve(port_q, messages))


def cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(port: int, rate: float, seconds: float) -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=OPTIONS) as ch:
        call = ch.unary_stream(METHOD, request_serializer=router_pb2.GenerateRequest.SerializeToString,
                               response_deserializer=router_pb2.GenerateResponse.FromString)

        async def one() -> None:
            async for _ in call(router_pb2.GenerateRequest(model="m")):
                pass

        tasks, t0, i = [], time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            tasks.append(asyncio.create_task(one()))
            i += 1
            await asyncio.sleep(max(0.0, t0 + i / rate - time.monotonic()))
        await asyncio.gather(*tasks)
        return len(tasks)


def measure(rate: float, seconds: float, messages: int) -> tuple[float, float]:
    """(server, client) CPU ms per call."""
    q: Any = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=_server_main, args=(q, messages), daemon=True)
    proc.start()
    try:
        port = q.get(timeout=30)
        assert proc.pid is not None
        s0, r0 = cpu_s(proc.pid), resource.getrusage(resource.RUSAGE_SELF)
        n = eventloop.run(_load(port, rate, seconds))
        s1, r1 = cpu_s(proc.pid), resource.getrusage(resource.RUSAGE_SELF)
    finally:
        proc.kill()
        proc.join(10)
    client = (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime)
    return 1e3 * (s1 - s0) / n, 1e3 * client / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--messages", default="1,4,16")
    ap.add_argument("--options", default="", help="channel arguments for server and client, k=v,k=v "
                                                  "(e.g. grpc.optimization_target=throughput)")
    args = ap.parse_args()
    os.environ["BENCH_GRPC_OPTIONS"] = args.options  # the server process (spawned) reads it at import
    OPTIONS[:] = [(k, int(v) if v.lstrip("-").isdigit() else v)
                  for k, _, v in (o.partition("=") for o in args.options.split(",") if o)]
    print("| messages per call | server CPU ms/call | client CPU ms/call |\n|---|---|---|")
    for m in (int(x) for x in args.messages.split(",")):
        server, client = measure(args.rate, args.seconds, m)
        print(f"| {m} | {server:.3f} | {client:.3f} |", flush=True)
    print(f"rate={args.rate:g}/s seconds={args.seconds:g} loop={eventloop.chosen()} options={args.options or '-'} "
          f"loadavg={os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
