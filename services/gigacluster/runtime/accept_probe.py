"""How long a new call waits inside gRPC's core before the application sees it, measured by a probe call.

gRPC's core queues a server's incoming calls per method until the application asks for the next one, and
grpc aio asks for one call at a time: each accepted call costs a few event-loop passes before the next is
requested. A process whose loop is busy therefore takes calls more slowly than they come, and they wait
in that queue, where no application-level bound sees them (the event loop is not behind, the streams
already open are on time), until the core gives up on them: it cancels a call left unrequested for
``grpc.server_max_unrequested_time_in_server`` (30 s by default), and the client sees CANCELLED. On this
2-core machine at 1,000 requests/s the router served about 750 a second and the rest queued there: served
calls waited up to 30 s and 5,877 of 24,901 ended CANCELLED (docs/performance.md, "Router: calls waiting
in gRPC's queue").

The probe measures that wait the way CoDel measures a queue, by its sojourn time: a call of the guarded
method, sent by the process to its own server over a private abstract Unix socket the same server listens
on (the queue belongs to the server and the method, whichever port a call came in by), marked with a
secret. The first interceptor recognises it, notes how long it waited and answers it at once, before any
other interceptor or the servicer. One probe is in flight at a time, the next ``interval_s`` after the last
was answered while calls of the method come in or the last probe waited (once ``idle_interval_s`` while
neither, and at once when a call comes: an idle router pays about one probe a second);
:meth:`AcceptProbe.lag_s` is the head of the queue's sojourn: the age of the probe in flight, or the last
probe's wait. The router's overload bound
(:mod:`gigacluster.router.overload`) refuses a share of new calls RESOURCE_EXHAUSTED while it is above its
target, so the queue stays short and the calls behind get an answer with a retry-after instead of a
cancellation.

The same interceptor is where those refusals happen (``shed``): first, before any other interceptor,
the decoding or the servicer, answered with a status built once per message, and not logged (counted
by the router's ``gigacluster_router_refused_total``). gRPC's own cost of a call is most of what is
left (about 0.55 ms of CPU on this machine for a refused call against 0.59 ms for a served one-message
call on a bare grpc aio server), so a refusal has to cost nothing beyond it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import structlog

from gigacluster.runtime.errors import to_status

log = structlog.get_logger()

HEADER = "x-gigacluster-accept-probe"


class AcceptProbe:
    """A probe of one method's queue in this process's gRPC server (see the module's docstring)."""

    def __init__(self, method: str, interval_s: float, idle_interval_s: float = 1.0) -> None:
        self.method = method
        self.interval_s = interval_s
        self.idle_interval_s = max(idle_interval_s, interval_s)
        self.calls = 0  # calls of ``method`` seen (not the probe's)
        self._traffic = asyncio.Event()  # set by the first call while the probe idles
        name = f"gigacluster-accept-probe-{secrets.token_hex(12)}"
        # Linux's abstract namespace leaves no file behind, even after kill -9; elsewhere a socket file in the temp
        # directory, removed when the probe stops.
        self._path = None if sys.platform.startswith("linux") else os.path.join(tempfile.gettempdir(), name)
        self.address = f"unix-abstract:{name}" if self._path is None else f"unix:{self._path}"
        self._secret = secrets.token_hex(16)
        self._sent_at: float | None = None  # time.monotonic() of the probe in flight
        self.last_s = 0.0  # the last answered probe's wait
        self.answered = 0
        #: Asked for every other call of ``method`` before any work on it: an exception to refuse the call with
        #: (its status, see runtime/errors.py), or None to let it through.
        self.shed: Callable[[], BaseException | None] | None = None

    def lag_s(self) -> float:
        """How long the call at the head of the method's queue has waited: the probe in flight's age, or the last
        probe's wait while none is in flight."""
        sent = self._sent_at
        return max(self.last_s, time.monotonic() - sent) if sent is not None else self.last_s

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        """The server interceptor that answers the probe; it must come first, so the probe pays nothing else."""
        return _ProbeInterceptor(self)

    def _arrived(self, metadata: Any) -> bool:
        """Whether a call with ``metadata`` is this probe (then its wait is recorded)."""
        for k, v in metadata or ():
            if k == HEADER:
                if v != self._secret or self._sent_at is None:
                    return False
                self.last_s = time.monotonic() - self._sent_at
                self._sent_at = None
                self.answered += 1
                return True
        return False

    async def run(self) -> None:
        """Probe for ever (cancel to stop). A probe that fails unseen (the server stopping, or the core cancelling
        it after its unrequested-time limit) counts as having waited until it failed."""
        channel = grpc.aio.insecure_channel(self.address)
        call = channel.unary_stream(self.method)  # raw bytes both ways: nothing to decode
        md = ((HEADER, self._secret),)
        try:
            while True:
                self._sent_at = time.monotonic()
                try:
                    async for _ in call(b"", metadata=md):
                        pass
                except grpc.aio.AioRpcError as exc:
                    log.debug("accept probe failed", code=exc.code().name, detail=(exc.details() or "")[:120])
                if self._sent_at is not None:
                    self.last_s = time.monotonic() - self._sent_at
                    self._sent_at = None
                seen = self.calls
                await asyncio.sleep(self.interval_s)
                if self.calls == seen and self.last_s < self.interval_s:  # quiet, and no queue: probe seldom
                    self._traffic.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._traffic.wait(), self.idle_interval_s - self.interval_s)
        finally:
            self._sent_at = None
            await channel.close()
            if self._path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(self._path)


async def _answer(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    return
    yield  # pragma: no cover - an async generator with nothing to send


def _refusal(status: grpc.Status) -> grpc.RpcMethodHandler:
    """A handler for a unary-stream call that skips decoding and answers ``status`` at once."""

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        await context.abort_with_status(status)
        yield b""  # pragma: no cover - never reached: abort raises

    return grpc.unary_stream_rpc_method_handler(refuse, request_deserializer=lambda raw: None)


class _ProbeInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, probe: AcceptProbe) -> None:
        self.probe = probe
        self._handler = grpc.unary_stream_rpc_method_handler(_answer)
        self._refusal: tuple[str, grpc.RpcMethodHandler] = ("", self._handler)  # the last one, by its message

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        probe = self.probe
        if handler_call_details.method == probe.method:
            if probe._arrived(handler_call_details.invocation_metadata):
                return self._handler
            probe.calls += 1
            if not probe._traffic.is_set():
                probe._traffic.set()
            if probe.shed is not None and (exc := probe.shed()) is not None:
                text = str(exc)
                if self._refusal[0] != text:
                    self._refusal = (text, _refusal(to_status(exc)))
                return self._refusal[1]
        return await continuation(handler_call_details)
