"""The event clock on the wire: interceptors that count a process's mesh calls and carry its time.

Installed only in event mode (``--clock event``), on every server (``runtime/server.py``) and every
channel a service opens (``runtime/channels.py``). A call between two services carries the
caller's virtual time in ``x-gigacluster-vt`` and is counted open at its client from before it
leaves until its answer is in, and at its server while its handler runs; the server answers with
its own time in the trailing metadata. The coordinator compares the totals (a call in transit is
open at one end only) and each side takes the later of the two times, so a process never acts on
an answer from its future. Calls from outside the mesh (the CLI, loadtest) carry no time: they
count as activity, never as open calls (no client would close them).

A few calls are outside the clock at both ends (``UNCOUNTED``): they read state that no virtual time
depends on (the broker's verification keys and revocations, which every chip shard and the fabric pull
each wall second; health checks; reflection), so they neither carry a time nor wake a dormant process.
Counted, they kept an idle mesh out of dormancy: each pull woke the puller and the broker through the
coordinator.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from gigacluster.runtime.clock import VT_KEY, VT_MAC_KEY, EventClock, proven_vt, vt_mac

Continuation = Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]]

#: Methods outside the event clock: no time carried, no count, no wake-up (module docstring).
UNCOUNTED: frozenset[str] = frozenset({
    "/gigacluster.broker.v1.BrokerService/GetVerificationKeys",
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
})


def uncounted(method: str | bytes) -> bool:
    """Whether calls of ``method`` (a full method name, as a server or a client interceptor sees it) are outside
    the clock."""
    return (method.decode() if isinstance(method, bytes) else method) in UNCOUNTED

def _vt(clock: EventClock, metadata: Any) -> float | None:
    """The time a call's metadata carries, if signed under one of the clock's wire keys."""
    got = {k: v for k, v in metadata or () if k in (VT_KEY, VT_MAC_KEY)}
    return proven_vt(clock, got.get(VT_KEY), got.get(VT_MAC_KEY))


def _stamped(clock: EventClock) -> tuple[tuple[str, str], ...]:
    """This process's time as call metadata, with its proof when it holds a key."""
    vt = repr(clock.now())
    return ((VT_KEY, vt), (VT_MAC_KEY, vt_mac(clock.sign_key, vt))) if clock.sign_key else ((VT_KEY, vt),)


class ClockServerInterceptor(grpc.aio.ServerInterceptor):
    """Counts the calls this server handles for the event clock and answers with its time."""

    def __init__(self, clock: EventClock) -> None:
        self.clock = clock

    async def _begin(self, vt: float | None) -> None:
        """Count the call open (a call from outside the mesh as ``external``), then, if this process is dormant,
        wake it through the coordinator before the handler runs (clock/core.py, "Dormant processes")."""
        if vt is None:
            self.clock.external += 1
            self.clock.bump()
        else:
            self.clock.advance(vt)
            self.clock.call_started(inbound=True)
        await self.clock.awaken()

    def _end(self, vt: float | None) -> None:
        if vt is None:
            self.clock.external -= 1
            self.clock.bump()
        else:
            self.clock.call_ended(inbound=True)

    def _stamp(self, context: grpc.aio.ServicerContext) -> None:
        context.set_trailing_metadata(_stamped(self.clock))

    async def intercept_service(self, continuation: Continuation,
                                handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or uncounted(handler_call_details.method):
            return handler  # no mesh call streams its requests
        vt = _vt(self.clock, handler_call_details.invocation_metadata)
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary, vt),
                                                       request_deserializer=handler.request_deserializer,
                                                       response_serializer=handler.response_serializer)
        return grpc.unary_stream_rpc_method_handler(self._stream(handler.unary_stream, vt),
                                                    request_deserializer=handler.request_deserializer,
                                                    response_serializer=handler.response_serializer)

    def _unary(self, inner: Callable[..., Any], vt: float | None) -> Callable[..., Any]:
        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                await self._begin(vt)
                response = await inner(request, context)
                self._stamp(context)
                return response
            finally:
                self._end(vt)

        return unary

    def _stream(self, inner: Callable[..., Any], vt: float | None) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(inner) or inspect.isasyncgenfunction(getattr(inner, "__func__", None)):

            async def stream_gen(request: Any, context: grpc.aio.ServicerContext) -> Any:
                sent = 0
                try:
                    await self._begin(vt)
                    async for item in inner(request, context):
                        if vt is None:
                            self.clock.bump()
                        else:
                            sent += 1
                            self.clock.stream_messages(1, sent=True)
                        yield item
                    self._stamp(context)
                finally:
                    if sent:
                        self.clock.stream_messages(-sent, sent=True)
                    self._end(vt)

            return stream_gen

        async def stream_coro(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                await self._begin(vt)
                await inner(request, context)
                self._stamp(context)
            finally:
                self._end(vt)

        return stream_coro


class _ClientClock:
    def __init__(self, clock: EventClock) -> None:
        self.clock = clock

    @property
    def live(self) -> bool:
        """The clock is still the process's: a client participant that left the clock (runtime/participant.py)
        sends its later calls on these channels as calls from outside the mesh."""
        return not self.clock.left

    def details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        md = grpc.aio.Metadata(*(d.metadata or ()))
        for k, v in _stamped(self.clock):
            md.add(k, v)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, md, d.credentials, d.wait_for_ready)


class ClockUnaryClientInterceptor(_ClientClock, grpc.aio.UnaryUnaryClientInterceptor):
    """Counts a unary mesh call open from before it leaves until its answer is in."""

    async def intercept_unary_unary(self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails,
                                    request: Any) -> Any:
        if not self.live or uncounted(client_call_details.method):
            return await continuation(client_call_details, request)
        self.clock.call_started(inbound=False)
        try:
            await self.clock.awaken()
            call = await continuation(self.details(client_call_details), request)
            try:
                await call
            except grpc.aio.AioRpcError:
                return call  # the caller sees the error when it awaits the call
            vt = _vt(self.clock, await call.trailing_metadata())
            if vt is not None:
                self.clock.advance(vt)
            return call
        finally:
            self.clock.call_ended(inbound=False)


class ClockStreamClientInterceptor(_ClientClock, grpc.aio.UnaryStreamClientInterceptor):
    """Counts a server-streaming mesh call open until it ends (finished, failed or cancelled), and each
    message its caller took while it was open (its server counts each one it sent: the difference is in
    transit). The end is the call's own done callback, so a caller that leaves the stream early does not
    hold the clock until the stream is garbage-collected.

    A read that is waiting when the call ends, or that starts after it ended, holds the clock until it hands
    its message (or the stream's end) to the caller: the server's count of that message went with its end,
    and the done callback and the read's completion are separate events of gRPC's poller, so between them
    the process would look idle with the stream's last message (a window's final report) not yet taken."""

    async def intercept_unary_stream(self, continuation: Any, client_call_details: grpc.aio.ClientCallDetails,
                                     request: Any) -> Any:
        if not self.live or uncounted(client_call_details.method):
            return await continuation(client_call_details, request)
        self.clock.call_started(inbound=False)
        try:
            await self.clock.awaken()
            call = await continuation(self.details(client_call_details), request)
        except BaseException:
            self.clock.call_ended(inbound=False)
            raise
        received = [0]
        read = _Read(self.clock)

        def done(_call: Any) -> None:
            if received[0]:
                self.clock.stream_messages(-received[0], sent=False)
                received[0] = 0
            if read.waiting:
                read.hold()
            self.clock.call_ended(inbound=False)

        call.add_done_callback(done)
        return self._counted(call, received, read)

    async def _counted(self, call: Any, received: list[int], read: _Read) -> AsyncIterator[Any]:
        it = call.__aiter__()
        while True:
            read.waiting = True
            if call.done():
                read.hold()
            try:
                msg = await it.__anext__()
            except StopAsyncIteration:
                return
            finally:
                read.waiting = False
                read.release()
            if not call.done():  # a message read after the end was already settled by done()
                received[0] += 1
                self.clock.stream_messages(1, sent=False)
            yield msg


class _Read:
    """Whether the caller of one stream is waiting for its next message, and the clock hold taken for it."""

    def __init__(self, clock: EventClock) -> None:
        self.clock = clock
        self.waiting = False
        self.held = False

    def hold(self) -> None:
        if not self.held:
            self.held = True
            self.clock.holds += 1
            self.clock.bump()

    def release(self) -> None:
        if self.held:
            self.held = False
            self.clock.holds -= 1
            self.clock.bump()


def client_interceptors(clock: EventClock | None) -> list[grpc.aio.ClientInterceptor]:
    """The interceptors a channel of this process needs (none in wall-clock mode)."""
    if clock is None:
        return []
    return [ClockUnaryClientInterceptor(clock), ClockStreamClientInterceptor(clock)]


__all__ = ["UNCOUNTED", "VT_KEY", "ClockServerInterceptor", "client_interceptors", "uncounted"]
