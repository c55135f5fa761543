"""What one streamed HTTP completion costs in aiohttp itself, with no router behind it: the floor under the router's
HTTP front end, as ``bench_grpc_stream.py`` is under its gRPC one.

A bare ``aiohttp`` server (its own process) answers each ``POST /v1/completions`` with ``--messages`` server-sent
events (an OpenAI completion chunk each, as the router sends) and ``data: [DONE]``; a load client in this process,
an ``aiohttp.ClientSession`` reading the stream line by line as ``gigacluster loadtest`` does, sends ``--rate``
calls a second for ``--seconds``. Reported as in ``bench_grpc_stream.py``: CPU milliseconds per call of the server
process and of the client, and the client-observed latency of the first and last event from the call's due time
(open loop). ``--stream-ms`` spreads each call's events over that many milliseconds after the first:

    python benchmarks/bench_http_stream.py --rate 1000 --messages 2,4 --stream-ms 200 --seconds 8
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import time
from typing import Any

import aiohttp
from aiohttp import web
from bench_grpc_stream import measure, open_loop, parser, table

from gigacluster.runtime import eventloop

CHUNK = json.dumps({"id": "cmpl-0123456789abcdef", "object": "text_completion", "model": "bench",
                    "choices": [{"index": 0, "text": " word", "finish_reason": None}]})


async def _serve(port_q: Any, messages: int, stream_s: float) -> None:
    gap = stream_s / (messages - 1) if messages > 1 else 0.0

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for i in range(messages):
            await resp.write(f"data: {CHUNK}\n\n".encode())
            if i < messages - 1:
                await asyncio.sleep(gap)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    port_q.put(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    await asyncio.Event().wait()


def _server_main(port_q: Any, messages: int, stream_s: float) -> None:
    eventloop.run(_serve(port_q, messages, stream_s))


async def _load(port: int, rate: float, seconds: float, stream_s: float) -> tuple[int, list[float], list[float]]:
    url = f"http://127.0.0.1:{port}/v1/completions"
    body = {"model": "bench", "prompt": [1, 2, 3], "max_tokens": 16, "stream": True}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def call_once() -> float:
            t_first = math.nan
            async with session.post(url, json=body) as resp:
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    if line[5:].strip() == "[DONE]":
                        break
                    json.loads(line[5:])
                    if t_first != t_first:
                        t_first = time.monotonic()
            return t_first

        return await open_loop(rate, seconds, stream_s, call_once)


def main() -> None:
    args = parser(__doc__, "event").parse_args()
    table(args, "event", functools.partial(measure, server_main=_server_main, load=_load))

if __name__ == "__main__":
    main()
