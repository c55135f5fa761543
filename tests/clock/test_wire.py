"""The event clock's interceptors on a real in-process gRPC server: calls and streamed messages are
counted at both ends while in flight, and time travels with them (no service, no coordinator)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from gigacluster.runtime.clock import EventClock
from gigacluster.runtime.clock_wire import VT_KEY, ClockServerInterceptor, client_interceptors


def _same(b: bytes) -> bytes:
    return b


async def _mesh(server_clock: EventClock) -> tuple[grpc.aio.Server, int]:
    async def wait(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await server_clock.sleep_until(float(request.decode()))
        return b"done"

    async def watch(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for i in range(int(request.decode())):
            yield str(i).encode()
            await server_clock.sleep(1.0)

    server = grpc.aio.server(interceptors=[ClockServerInterceptor(server_clock)])
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler("test.Clock", {
            "Wait": grpc.unary_unary_rpc_method_handler(wait, _same, _same),
            "Watch": grpc.unary_stream_rpc_method_handler(watch, _same, _same)}),
    ))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def _until(cond: Any) -> None:
    for _ in range(500):
        if cond():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


async def test_a_unary_call_is_open_at_both_ends_and_carries_time_back() -> None:
    """While the server sleeps on its clock the call is open at client and server; the answer brings the
    server's later time to the client."""
    server_clock, client_clock = EventClock(), EventClock()
    server, port = await _mesh(server_clock)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                             interceptors=client_interceptors(client_clock)) as ch:
            call = asyncio.ensure_future(ch.unary_unary("/test.Clock/Wait", _same, _same)(b"5.0"))
            await _until(lambda: server_clock.next_wake_s() == 5.0)
            assert (client_clock.calls_out, server_clock.calls_in) == (1, 1)
            server_clock.advance(5.0)
            assert await call == b"done"
            assert (client_clock.calls_out, server_clock.calls_in) == (0, 0)
            assert client_clock.now() == 5.0
    finally:
        await server.stop(None)


async def test_streamed_messages_are_counted_until_taken_and_settled_at_the_end() -> None:
    """A message the server streamed counts as sent until the client takes it; both counts go back to 0
    when the stream ends."""
    server_clock, client_clock = EventClock(), EventClock()
    server, port = await _mesh(server_clock)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                             interceptors=client_interceptors(client_clock)) as ch:
            stream = ch.unary_stream("/test.Clock/Watch", _same, _same)(b"2")
            it = stream.__aiter__()
            await _until(lambda: server_clock.next_wake_s() == 1.0)
            assert server_clock.msgs_sent == 1 and client_clock.msgs_received == 0  # in transit
            assert await it.__anext__() == b"0"
            assert client_clock.msgs_received == 1
            server_clock.advance(1.0)
            assert await it.__anext__() == b"1"
            await _until(lambda: server_clock.next_wake_s() == 2.0)  # as the coordinator would: once it waits
            server_clock.advance(2.0)
            with pytest.raises(StopAsyncIteration):
                await it.__anext__()
            await _until(lambda: client_clock.calls_out == 0)
            assert (server_clock.msgs_sent, client_clock.msgs_received, server_clock.calls_in) == (0, 0, 0)
    finally:
        await server.stop(None)


async def test_a_non_finite_time_on_a_call_is_ignored() -> None:
    """A caller's time of inf or nan moves nothing: the server's clock keeps its own time."""
    server_clock = EventClock(3.0)
    server, port = await _mesh(server_clock)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            for bad in ("inf", "nan", "-inf", "1e999"):
                assert await ch.unary_unary("/test.Clock/Wait", _same, _same)(b"1.0", metadata=((VT_KEY, bad),)) \
                    == b"done"
        assert server_clock.now() == 3.0
    finally:
        await server.stop(None)


async def test_the_coordinator_takes_only_the_service_key() -> None:
    """A Sync stream without the service key is UNAUTHENTICATED; GetTime (read-only) answers anyone."""
    from gigacluster.clock.service import ClockConfig, ClockService
    from gigacluster.clock.v1 import clock_pb2, clock_pb2_grpc
    from gigacluster.runtime.server import create_server

    server, port = await create_server(ClockService(ClockConfig(port=0, service_key="sk-test")))
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            stub = clock_pb2_grpc.ClockServiceStub(ch)
            call = stub.Sync(metadata=(("authorization", "Bearer wrong"),))
            with pytest.raises(grpc.aio.AioRpcError) as err:  # the write itself may meet the refusal
                await call.write(clock_pb2.SyncRequest(process="intruder", idle=True))
                await call.read()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            t = await stub.GetTime(clock_pb2.GetTimeRequest())
            assert (t.now_s, t.processes) == (0.0, 0)
    finally:
        await server.stop(None)


async def test_a_client_participant_joins_with_the_admin_key_only() -> None:
    """participate() with the admin key is told the time and counts as a process; with a tenant's key it is
    refused (holding the mesh's time is an operator's power)."""
    from gigacluster.clock.service import ClockConfig, ClockService
    from gigacluster.clock.v1 import clock_pb2, clock_pb2_grpc
    from gigacluster.runtime import clock
    from gigacluster.runtime.participant import participate
    from gigacluster.runtime.server import create_server

    svc = ClockService(ClockConfig(port=0, service_key="sk-test", admin_key="ak-test"))
    server, port = await create_server(svc)
    await server.start()
    try:
        async with participate(f"127.0.0.1:{port}", "loadtest", key="ak-test", connect_timeout_s=5) as ck:
            assert clock.active() is ck
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
                await _until(lambda: svc.servicer.core.latest)
                t = await clock_pb2_grpc.ClockServiceStub(ch).GetTime(clock_pb2.GetTimeRequest())
            assert t.processes == 1
        assert clock.active() is None and ck.left
        with pytest.raises(TimeoutError, match="did not tell the time"):
            async with participate(f"127.0.0.1:{port}", "loadtest", key="tenant-key", connect_timeout_s=0.5):
                pass  # pragma: no cover - refused before the block runs
        assert clock.active() is None
    finally:
        await server.stop(None)


async def test_a_time_without_its_proof_under_the_mesh_key_neither_moves_nor_holds_the_clock() -> None:
    """With the mesh's keys set, an unsigned or wrongly signed ``x-gigacluster-vt`` (an outside caller trying to
    jump the mesh's time) is ignored and the call counts only as activity; a call from a process holding the
    service key moves the server's time and counts open while it runs."""
    from gigacluster.runtime.clock import VT_MAC_KEY, vt_mac

    server_clock = EventClock(3.0, sign_key="sk-mesh", wire_keys=("sk-mesh", "ak-admin"))
    server, port = await _mesh(server_clock)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            wait = ch.unary_unary("/test.Clock/Wait", _same, _same)
            for md in (((VT_KEY, "1e9"),), ((VT_KEY, "1e9"), (VT_MAC_KEY, vt_mac("guess", "1e9"))),
                       ((VT_KEY, "1e9"), (VT_MAC_KEY, vt_mac("sk-mesh", "2e9")))):
                assert await wait(b"1.0", metadata=md) == b"done"
                assert server_clock.now() == 3.0 and server_clock.calls_in == 0
        member = EventClock(10.0, sign_key="sk-mesh")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", interceptors=client_interceptors(member)) as ch:
            assert await ch.unary_unary("/test.Clock/Wait", _same, _same)(b"1.0") == b"done"
        assert server_clock.now() == 10.0
        participant = EventClock(12.0, sign_key="ak-admin")  # a client participant signs with the admin key
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                             interceptors=client_interceptors(participant)) as ch:
            assert await ch.unary_unary("/test.Clock/Wait", _same, _same)(b"1.0") == b"done"
        assert server_clock.now() == 12.0
    finally:
        await server.stop(None)


class _Stream:
    """A server-streaming call whose end (the done callback) and messages the test delivers separately, in
    the order gRPC may deliver them: the status of a finished stream before its last message's read."""

    def __init__(self) -> None:
        self.messages: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.finished = False
        self.callbacks: list[Any] = []

    def add_done_callback(self, cb: Any) -> None:
        self.callbacks.append(cb)

    def done(self) -> bool:
        return self.finished

    def finish(self) -> None:
        self.finished = True
        for cb in self.callbacks:
            cb(self)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (m := await self.messages.get()) is not None:
            yield m


async def _open(clock: EventClock, call: _Stream) -> Any:
    interceptor = client_interceptors(clock)[1]

    async def continuation(details: Any, request: Any) -> _Stream:
        return call

    details = grpc.aio.ClientCallDetails("/test.Clock/Watch", None, None, None, None)
    return await interceptor.intercept_unary_stream(continuation, details, b"")  # type: ignore[union-attr]


def _quiet(clock: EventClock) -> bool:
    return clock.holds == 0 and clock.calls_out == 0 and clock.msgs_received == 0


async def test_a_read_waiting_when_its_stream_ends_holds_the_clock_until_it_has_the_last_message() -> None:
    """The stream's end can reach the client before its last message's read completes: the process is not
    idle (time cannot move) until the caller has that message, then it is quiet again."""
    clock = EventClock()
    call = _Stream()
    stream = await _open(clock, call)
    reader = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)
    call.finish()  # the status is in, the final message not yet handed over
    assert not _quiet(clock)
    call.messages.put_nowait(b"final")
    assert await reader == b"final"
    assert _quiet(clock)


async def test_a_read_started_after_its_stream_ended_holds_the_clock_until_it_returns() -> None:
    """A caller that reads a stream's buffered last message after the stream ended holds time while the read
    completes; the stream's end, read after it, leaves nothing held."""
    clock = EventClock()
    call = _Stream()
    stream = await _open(clock, call)
    call.finish()
    assert _quiet(clock)  # nobody reading: a caller that left the stream early holds nothing
    reader = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)
    assert not _quiet(clock)
    call.messages.put_nowait(b"final")
    assert await reader == b"final"
    assert _quiet(clock)
    reader = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)
    call.messages.put_nowait(None)
    with pytest.raises(StopAsyncIteration):
        await reader
    assert _quiet(clock)


async def test_a_cancelled_read_of_an_ended_stream_releases_its_hold() -> None:
    """A caller that gives up a read it started after the stream ended leaves the clock free."""
    clock = EventClock()
    call = _Stream()
    stream = await _open(clock, call)
    call.finish()
    reader = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)
    assert not _quiet(clock)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert _quiet(clock)


async def test_a_key_pull_neither_counts_nor_wakes_a_dormant_mesh() -> None:
    """GetVerificationKeys (pulled every wall second by each chip shard and the fabric) is outside the clock at
    both ends: served by a dormant server and sent by a dormant client with no count, no activity and no wake-up
    through the coordinator, while a counted call from the same dormant client does wake it first."""
    from gigacluster.runtime.clock_wire import UNCOUNTED, uncounted

    keys = "/gigacluster.broker.v1.BrokerService/GetVerificationKeys"
    assert keys in UNCOUNTED and uncounted(keys.encode()) and not uncounted("/test.Clock/Wait")
    server_clock, client_clock = EventClock(), EventClock()
    woken: list[str] = []

    def dormant(ck: EventClock, name: str) -> None:
        async def on_awaken() -> None:
            woken.append(name)
            ck.dormant = False

        ck.dormant, ck.on_awaken = True, on_awaken

    dormant(server_clock, "server")
    dormant(client_clock, "client")
    seen: list[tuple[int, int, int]] = []

    async def pull(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        seen.append((server_clock.calls_in, server_clock.external, server_clock.activity))
        return b"keys"

    server = grpc.aio.server(interceptors=[ClockServerInterceptor(server_clock)])
    server.add_generic_rpc_handlers((
        grpc.method_handlers_generic_handler("gigacluster.broker.v1.BrokerService", {
            "GetVerificationKeys": grpc.unary_unary_rpc_method_handler(pull, _same, _same)}),
        grpc.method_handlers_generic_handler("test.Clock", {
            "Wait": grpc.unary_unary_rpc_method_handler(pull, _same, _same)}),
    ))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}",
                                             interceptors=client_interceptors(client_clock)) as ch:
            activity = client_clock.activity
            assert await ch.unary_unary(keys, _same, _same)(b"") == b"keys"
            assert seen == [(0, 0, 0)] and woken == []
            assert (client_clock.calls_out, client_clock.activity, client_clock.dormant) == (0, activity, True)
            assert await ch.unary_unary("/test.Clock/Wait", _same, _same)(b"") == b"keys"
            assert woken == ["client", "server"] and seen[1][0] == 1
    finally:
        await server.stop(None)
