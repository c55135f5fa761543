"""One router front-end process (``frontends`` > 0; started by the core, :mod:`.frontends`).

It listens on the router's public gRPC and HTTP ports (``SO_REUSEPORT``, beside the other front
ends) and does the per-request work there: the client's stream, authentication (first, through
the broker as the core would), parsing the HTTP body, the router-wide overload refusal
(RESOURCE_EXHAUSTED / 429 with retry-after, from its own open streams and event-loop lag),
writing the tokens to the client (merging the chunks that piled up while the client was behind).
Generate calls go to the core over the link (:mod:`.link`), which bounds, routes and admits them
and streams their chunks back; the core's answers (errors included) reach the client unchanged.
The unary calls (deployments, stats) are forwarded to the core's own gRPC server.

    python -m gigacluster.router.frontend   (with GIGACLUSTER_ROUTER_FRONTEND set by the core)
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import os
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health_pb2

from gigacluster.errors import InvalidArgument, Unavailable
from gigacluster.router.frontends import FRONTEND_ENV, accept_probe, set_router_health
from gigacluster.router.generation import Chunk
from gigacluster.router.http import OpenAIServer
from gigacluster.router.link import Outbox, domain_error, read_frame
from gigacluster.router.manager import find_visible
from gigacluster.router.messages import chunk_of, generate_args, generate_request, merged
from gigacluster.router.overload import Overload
from gigacluster.router.pacing import Pacer, TokenBox
from gigacluster.router.store import DeploymentStore
from gigacluster.router.v1 import frontend_pb2, router_pb2, router_pb2_grpc
from gigacluster.runtime import eventloop
from gigacluster.runtime.auth import Principal
from gigacluster.runtime.channels import open_channel
from gigacluster.runtime.config import RouterConfig
from gigacluster.runtime.errors import grpc_errors
from gigacluster.runtime.logging import configure
from gigacluster.runtime.server import Service, serve

log = structlog.get_logger()
INT64 = 2**63 - 1


@dataclasses.dataclass(frozen=True)
class _Arch:
    seq_len: int


@dataclasses.dataclass(frozen=True)
class _Cfg:
    arch: _Arch


@dataclasses.dataclass(frozen=True)
class RemoteDeployment:
    """What a front end knows of a deployment (sent by the core): enough for /v1/models."""

    tenant: str
    deployment_id: str
    qualified_name: str
    created_s: float
    cfg: _Cfg
    state: str

    @property
    def name(self) -> str:
        return self.qualified_name.removeprefix(f"{self.tenant}/")

    def health(self) -> tuple[str, str]:
        return self.state, ""


class RemoteGeneration:
    """A request the core runs: :meth:`responses` (gRPC) or :meth:`chunks` (HTTP) as :class:`.Generation`'s."""

    def __init__(self, fe: FrontendService, stream: int, request_id: str, release: Callable[[], None]) -> None:
        self.fe = fe
        self.stream = stream
        self.request_id = request_id
        self.queue = TokenBox(fe.pacer)  # the core's events for it, paced as the core paces its own streams
        self._release = release
        self.done = False
        self.generated = 0
        self.prompt_tokens = 0

    async def responses(self) -> AsyncIterator[router_pb2.GenerateResponse]:
        """The request's chunks (those that piled up merged) until the last; raises the core's domain error."""
        try:
            while not self.done:
                evs = await self.queue.take()
                for ev in evs:
                    if ev.error_code:
                        self.done = True  # the core has dropped it already
                        raise domain_error(ev)
                    if ev.prompt_tokens:
                        self.prompt_tokens = ev.prompt_tokens
                resp = merged([ev.chunk for ev in evs])
                self.generated += len(resp.token_ids)
                self.done = bool(resp.finish_reason)
                yield resp
        finally:
            self.close()

    async def chunks(self) -> AsyncIterator[Chunk]:
        async for r in self.responses():
            yield chunk_of(r)

    def close(self) -> None:
        """Give back the stream slot; drop the request in the core if it has not finished."""
        self._release()
        if self.fe.streams.pop(self.stream, None) is not None and not self.done:
            self.fe.cancel(self.stream)


class FrontendService(Service[RouterConfig]):
    """A front end: public ports, auth, overload; Generate over the link, the rest forwarded to the core."""

    name = "router-frontend"
    clock_dormancy = False  # serves HTTP, which the clock's gRPC interceptors do not see

    def __init__(self, config: RouterConfig, link_path: str, secret: str, index: int, core: str) -> None:
        super().__init__(config)
        self.auth = self.broker_auth()
        self.overload = Overload(config.max_streams, config.max_loop_lag_s, config.overload_retry_after_s,
                                 accept_target_s=config.accept_target_s)
        self.accept_probe = accept_probe(config, self.overload)
        # (Its clock starts after the core's unless clock_epoch is set: the "behind" hold may then start late,
        # never early; the message budget does not depend on it.)
        self.pacer = Pacer(self.clock, lambda: self.overload.open, config.stream_messages_per_s,
                           config.stream_max_hold_s, config.coalesce_lag_s, config.coalesce_hold_s,
                           final=lambda ev: bool(ev.error_code or ev.chunk.finish_reason),
                           time_of=lambda ev: float(ev.chunk.time_s))
        self.link_path, self.secret, self.index = link_path, secret, index
        self.core_channel = open_channel(core)
        self.core = router_pb2_grpc.RouterServiceStub(self.core_channel)
        self.reconciled = asyncio.Event()
        self.deployments: dict[str, RemoteDeployment] = {}
        self.streams: dict[int, RemoteGeneration] = {}
        self._next = 0
        self._out: Outbox | None = None
        self.http: OpenAIServer | None = None

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        router_pb2_grpc.add_RouterServiceServicer_to_server(FrontendServicer(self), server)
        return [router_pb2.DESCRIPTOR.services_by_name["RouterService"].full_name]

    def server_options(self) -> list[tuple[str, Any]]:
        n = self.config.grpc_max_pending_calls
        return [("grpc.so_reuseport", 1), ("grpc.server.max_pending_requests", n),
                ("grpc.server.max_pending_requests_hard_limit", n)]

    async def start(self) -> None:
        await super().start()
        await set_router_health(self, health_pb2.HealthCheckResponse.NOT_SERVING)  # until the core says it serves
        reader, writer = await asyncio.open_unix_connection(self.link_path)
        self._out = Outbox(writer, lambda calls: frontend_pb2.LinkUp(calls=calls).SerializeToString())
        self._out.write(frontend_pb2.LinkUp(secret=self.secret, frontend=self.index).SerializeToString())
        self.spawn(self._read(reader), "link")
        self.spawn(self.overload.watch(), "loop-lag")
        if self.accept_probe is not None:
            self.spawn(self.accept_probe.run(), "accept-probe")
        if self.config.http_port >= 0:
            self.http = OpenAIServer(self)
            await self.http.start(self.config.host, self.config.http_port, reuse_port=True)

    async def stop(self) -> None:
        if self.http is not None:
            await self.http.stop()
        await super().stop()
        await self.auth.close()
        await self.core_channel.close()

    async def _read(self, reader: asyncio.StreamReader) -> None:
        """The core's frames, until the link closes; then this front end stops (the core starts another)."""
        while (raw := await read_frame(reader)) is not None:
            down = frontend_pb2.LinkDown.FromString(raw)
            for ev in down.events:
                gen = self.streams.get(ev.stream)
                if gen is not None:
                    gen.queue.put_nowait(ev)
            if down.has_state:
                await self._state(down)
        log.error("router core link closed; stopping this front end", frontend=self.index, open=len(self.streams))
        await self._unlinked()
        os.kill(os.getpid(), signal.SIGTERM)

    async def _unlinked(self) -> None:
        """The core is gone (killed or restarting): no token of an open request will come. End each at once with
        UNAVAILABLE (retryable), refuse new ones the same way, and stop listening for HTTP, so that no client waits
        on this process while it stops (a gRPC call's grace, an HTTP handler's shutdown timeout: minutes)."""
        self._out = None  # generate() refuses from now on
        await set_router_health(self, health_pb2.HealthCheckResponse.NOT_SERVING)
        for stream, gen in list(self.streams.items()):
            gen.queue.put_nowait(frontend_pb2.LinkEvent(
                stream=stream, error_code=Unavailable.code, error_reason="ROUTER_RESTARTING",
                error_message="the router's core went away before this request finished; retry it"))
        if self.http is not None:
            await self.http.close_listener()

    async def _state(self, down: frontend_pb2.LinkDown) -> None:
        self.deployments = {DeploymentStore.key(d.tenant, d.deployment_id): RemoteDeployment(
            d.tenant, d.deployment_id, d.qualified_name, d.created_s, _Cfg(_Arch(d.seq_len)), d.state)
            for d in down.deployments}
        if down.reconciled and not self.reconciled.is_set():
            self.reconciled.set()
            await set_router_health(self, health_pb2.HealthCheckResponse.SERVING)

    def cancel(self, stream: int) -> None:
        if self._out is not None:
            self._out.push(frontend_pb2.LinkCall(stream=stream, cancel=True))

    def visible(self, p: Principal, name: str) -> RemoteDeployment:
        return find_visible(self.deployments, p, name)

    def owned_by(self, p: Principal) -> list[RemoteDeployment]:
        return [d for d in self.deployments.values() if p.privileged or d.tenant == p.tenant]

    def generate(self, p: Principal, model: str, *, text: str | None = None, token_ids: Sequence[int] | None = None,
                 max_tokens: int | None = None, priority: int = 0, request_id: str = "",
                 stop: Sequence[str] = (), ignore_eos: bool = False, open_to_context: bool = False) -> RemoteGeneration:
        """Refuse at once when this front end is overloaded; else send the request to the core."""
        if self._out is None:
            raise Unavailable("this router front end has no link to the router's core (starting, or the core "
                              "restarted); retry")
        if token_ids is not None and any(not 0 <= int(t) < 2**32 for t in token_ids):
            raise InvalidArgument("token_ids", "ids must be integers in [0, the model's vocab)")
        release = self.overload.admit()  # before any work on the prompt
        rid = request_id or uuid.uuid4().hex[:16]
        req = generate_request(model, text, token_ids, rid, stop, ignore_eos)  # the core checks the ids' vocab
        call = frontend_pb2.LinkCall(
            principal_kind=p.kind, principal_tenant=p.tenant, request=req, open_to_context=open_to_context,
            priority=max(-INT64, min(INT64, int(priority))))
        if max_tokens is not None:
            call.max_tokens = max(-INT64, min(INT64, int(max_tokens)))
        self._next += 1
        call.stream = self._next
        gen = self.streams[self._next] = RemoteGeneration(self, self._next, rid, release)
        self._out.push(call)
        return gen


def _forwarded(name: str) -> Callable[[FrontendServicer, Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    """The servicer method of unary RPC ``name``: :meth:`FrontendServicer._forward` to the core."""

    async def rpc(self: FrontendServicer, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._forward(name, request, context)

    rpc.__name__ = rpc.__qualname__ = name
    return rpc


@grpc_errors(router_pb2_grpc.RouterServiceServicer)
class FrontendServicer(router_pb2_grpc.RouterServiceServicer):
    """Generate through the link; the other calls forwarded to the core with the caller's metadata."""

    def __init__(self, fe: FrontendService) -> None:
        self.fe = fe

    async def _forward(self, name: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Authenticate first, here too; then the core's answer (or its status, trailers included) unchanged."""
        await self.fe.auth.principal(context)
        try:
            return await getattr(self.fe.core, name)(request, metadata=tuple(context.invocation_metadata() or ()),
                                                     timeout=context.time_remaining())
        except grpc.aio.AioRpcError as err:
            await context.abort(err.code(), err.details() or "", tuple(err.trailing_metadata() or ()))

    # The unary calls, forwarded as they are (the core's servicer types them).
    DeployModel = _forwarded("DeployModel")
    GetDeployment = _forwarded("GetDeployment")
    ListDeployments = _forwarded("ListDeployments")
    DeleteDeployment = _forwarded("DeleteDeployment")
    GetStats = _forwarded("GetStats")

    async def Generate(self, request: router_pb2.GenerateRequest,  # type: ignore[override]
                       context: grpc.aio.ServicerContext) -> AsyncIterator[router_pb2.GenerateResponse]:
        p = await self.fe.auth.principal(context)
        gen = self.fe.generate(p, request.model, **generate_args(request))
        async for r in gen.responses():
            yield r


async def run(settings: dict[str, Any]) -> None:
    """Serve one front end until SIGTERM (or until the core's link closes)."""
    config = RouterConfig(**settings["config"])
    await serve(FrontendService(config, settings["link"], settings["secret"], int(settings["index"]),
                                settings["core"]))


def main() -> None:
    settings = json.loads(os.environ.pop(FRONTEND_ENV))
    # SIGTERM when the core dies, even by SIGKILL (Linux PR_SET_PDEATHSIG), as stack.py's launcher does for the
    # services; the closed link stops a front end too, this also covers one stuck before it linked.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    if os.getppid() != int(settings["core_pid"]):
        return  # the core is gone already
    configure("router-frontend", fmt=settings["config"]["log_format"], level=settings["config"]["log_level"])
    with contextlib.suppress(KeyboardInterrupt):
        # uvloop unless GIGACLUSTER_EVENT_LOOP says otherwise (runtime/eventloop.py, docs/performance.md)
        eventloop.run(run(settings), prefer="uvloop")


if __name__ == "__main__":
    main()
