"""The accept probe sees calls wait in gRPC's core queue, where the event loop's own lag does not show them.

A real grpc.aio server (not one of ours: the probe is runtime plumbing) whose handler spends 2 ms of the
loop per call, flooded with 1,500 calls at once: grpc aio takes one call per few loop passes, so the
calls wait seconds in the core while each loop pass stays short.
"""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from gigacluster.runtime.accept_probe import HEADER, AcceptProbe

METHOD = "/t.Svc/Work"


async def _work(request: bytes, context: grpc.aio.ServicerContext):  # type: ignore[no-untyped-def]
    time.sleep(0.002)  # the loop's own work per call
    yield b"served"


async def _server(probe: AcceptProbe) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(interceptors=[probe.interceptor()],
                             options=[("grpc.server.max_pending_requests", 20000),
                                      ("grpc.server.max_pending_requests_hard_limit", 20000)])
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "t.Svc", {"Work": grpc.unary_stream_rpc_method_handler(_work)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    assert server.add_insecure_port(probe.address)
    await server.start()
    return server, port


async def test_the_probe_measures_the_wait_in_grpcs_queue_that_the_loop_lag_misses() -> None:
    probe = AcceptProbe(METHOD, 0.02)
    server, port = await _server(probe)
    runner = asyncio.ensure_future(probe.run())
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    work = channel.unary_stream(METHOD)
    worst = {"probe": 0.0, "loop": 0.0}

    async def sample() -> None:
        while True:
            t0 = time.monotonic()
            await asyncio.sleep(0.01)
            worst["loop"] = max(worst["loop"], time.monotonic() - t0 - 0.01)
            worst["probe"] = max(worst["probe"], probe.lag_s())

    async def one() -> list[bytes]:
        return [m async for m in work(b"")]

    try:
        await asyncio.sleep(0.2)
        assert probe.answered >= 1 and probe.lag_s() < 0.05  # idle: answered at once (and seldom asked)
        sampler = asyncio.ensure_future(sample())
        answers = await asyncio.gather(*(one() for _ in range(1500)))
        sampler.cancel()
        assert all(a == [b"served"] for a in answers)  # every real call reached the handler
        # 1,500 x 2 ms = 3 s of work: the calls at the back waited seconds, each loop pass stayed short.
        assert worst["probe"] > 1.0 and worst["probe"] > 5 * worst["loop"], worst
        await asyncio.sleep(0.2)
        assert probe.lag_s() < 0.05  # the queue drained: the next probe went through at once
    finally:
        runner.cancel()
        await channel.close()
        await server.stop(0)


async def test_a_call_with_the_probe_header_but_not_its_secret_is_an_ordinary_call() -> None:
    """Only the process's own probe is answered early: a client sending the header reaches the handler."""
    probe = AcceptProbe(METHOD, 0.02)
    server, port = await _server(probe)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        got = [m async for m in channel.unary_stream(METHOD)(b"", metadata=((HEADER, "guess"),))]
        assert got == [b"served"] and probe.answered == 0
    finally:
        await channel.close()
        await server.stop(0)


async def test_an_idle_server_is_probed_seldom_and_traffic_brings_the_probe_back_at_once() -> None:
    """No calls: about one probe per idle interval (an idle router must stay quiet); the first call wakes the probe
    and calls coming in keep it at its interval."""
    probe = AcceptProbe(METHOD, 0.02, idle_interval_s=0.5)
    server, port = await _server(probe)
    runner = asyncio.ensure_future(probe.run())
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    work = channel.unary_stream(METHOD)
    try:
        await asyncio.sleep(1.3)
        idle = probe.answered
        assert 2 <= idle <= 5, idle  # against 65 at the 20 ms interval
        for _ in range(30):  # 0.3 s of calls, one every 10 ms
            assert [m async for m in work(b"")] == [b"served"]
            await asyncio.sleep(0.01)
        assert probe.answered - idle >= 6, probe.answered - idle
    finally:
        runner.cancel()
        await channel.close()
        await server.stop(0)


async def test_without_an_abstract_namespace_the_probe_uses_a_socket_file_and_removes_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Off Linux (no abstract Unix sockets) the probe listens on a file in the temp directory, works the same,
    and leaves nothing behind once it stops."""
    import os
    import sys

    monkeypatch.setattr(sys, "platform", "darwin")
    probe = AcceptProbe(METHOD, 0.02)
    assert probe.address.startswith("unix:/")
    server, _port = await _server(probe)
    runner = asyncio.ensure_future(probe.run())
    try:
        await asyncio.sleep(0.1)
        assert probe.answered >= 1 and os.path.exists(probe.address.removeprefix("unix:"))
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await server.stop(0)
    assert not os.path.exists(probe.address.removeprefix("unix:"))
