"""gRPC server plumbing shared by the five services.

A service is a :class:`Service` subclass: it adds its servicers to the server, may run
background tasks, and stops cleanly. ``create_server`` wires the standard health service and
server reflection (v1 and v1alpha, runtime/reflection.py); ``serve`` runs until SIGTERM/SIGINT and
stops with a grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from gigacluster.errors import InvalidArgument
from gigacluster.runtime import clock
from gigacluster.runtime.accept_probe import AcceptProbe
from gigacluster.runtime.auth import BrokerAuth, rate_limiter
from gigacluster.runtime.channels import add_port
from gigacluster.runtime.clock import EventClock, VirtualClock
from gigacluster.runtime.clock_wire import ClockServerInterceptor
from gigacluster.runtime.config import CommonConfig
from gigacluster.runtime.coordinator_client import ClockAgent
from gigacluster.runtime.errors import preview, to_status
from gigacluster.runtime.metrics import serve_metrics
from gigacluster.runtime.reflection import enable as enable_reflection
from gigacluster.runtime.telemetry import Telemetry
from gigacluster.security import RateLimited
from gigacluster.security.ratelimit import CALLER_KEY, PREPAID, TenantRateLimiter

CfgT = TypeVar("CfgT", bound=CommonConfig)
log = structlog.get_logger()

MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class RequestIdInterceptor(grpc.aio.ServerInterceptor):
    """Binds ``request_id`` (from ``x-request-id`` metadata, or a fresh one) into every log line."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        rid = None
        for k, v in handler_call_details.invocation_metadata or ():
            if k == "x-request-id":
                rid = v
        structlog.contextvars.bind_contextvars(
            request_id=rid or uuid.uuid4().hex[:12], method=handler_call_details.method
        )
        return await continuation(handler_call_details)


class _Undecodable:
    """Stands in for a request body the method's deserializer rejected."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserializer`` that returns an :class:`_Undecodable` instead of raising."""
    if deserializer is None:
        return None

    def deserialize(raw: bytes) -> Any:
        try:
            return deserializer(raw)
        except Exception as exc:  # noqa: BLE001 - any decode failure is the caller's bad body
            return _Undecodable(exc)

    return deserialize


async def _reject_undecodable(context: grpc.aio.ServicerContext, method: str, bad: _Undecodable) -> None:
    log.info("rpc rejected", method=method, code="INVALID_ARGUMENT", error="undecodable request body")
    err = InvalidArgument("request", f"the body is not a valid {method.rsplit('/', 1)[-1]} request message "
                                     f"({preview(str(bad.error), 80)})")
    err.reason = "UNDECODABLE_REQUEST"
    await context.abort_with_status(to_status(err))


class DecodeErrorInterceptor(grpc.aio.ServerInterceptor):
    """Answers an undecodable request body INVALID_ARGUMENT naming the method, for every RPC.

    Without it grpcio answers a body its deserializer rejects with UNKNOWN (or INTERNAL). The
    handler's deserializer is wrapped to return a sentinel, and the behaviour aborts on it.
    """

    def __init__(self) -> None:
        # method -> (the handler, its wrapped one): a method's handler is one object, so it is wrapped once, not
        # on every call (closures, a new handler and two inspections each time, on the router's hot path).
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        method = handler_call_details.method
        got = self._wrapped.get(method)
        if got is not None and got[0] is handler:
            return got[1]
        wrapped = self._wrap(method, handler)
        if len(self._wrapped) < 4096:  # methods are few; a flood of unknown names never gets here (handler None)
            self._wrapped[method] = (handler, wrapped)
        return wrapped

    @staticmethod
    def _wrap(method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        deserializer = _tolerant(handler.request_deserializer)
        if handler.unary_unary is not None:
            unary = handler.unary_unary

            async def unary_behaviour(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, _Undecodable):
                    await _reject_undecodable(context, method, request)
                return await unary(request, context)

            return grpc.unary_unary_rpc_method_handler(unary_behaviour, request_deserializer=deserializer,
                                                       response_serializer=handler.response_serializer)
        stream = handler.unary_stream
        if inspect.isasyncgenfunction(stream) or inspect.isasyncgenfunction(getattr(stream, "__func__", None)):

            async def stream_gen(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, _Undecodable):
                    await _reject_undecodable(context, method, request)
                async for item in stream(request, context):
                    yield item

            behaviour: Callable[..., Any] = stream_gen
        else:

            async def stream_coro(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, _Undecodable):
                    await _reject_undecodable(context, method, request)
                return await stream(request, context)

            behaviour = stream_coro
        return grpc.unary_stream_rpc_method_handler(behaviour, request_deserializer=deserializer,
                                                    response_serializer=handler.response_serializer)


CREDENTIAL_HEADERS = ("authorization", "x-gigacluster-capability")


def credential_key(metadata: Any) -> bytes | None:
    """A digest of the call's credentials (API key and capability), or None without any."""
    h = None
    for k, v in metadata or ():
        if k in CREDENTIAL_HEADERS:
            h = h or hashlib.blake2b(digest_size=16)
            h.update(k.encode())
            h.update(v.encode() if isinstance(v, str) else v)
    return h.digest() if h is not None else None


def _refusing(handler: grpc.RpcMethodHandler, exc: Exception) -> grpc.RpcMethodHandler:
    """``handler`` replaced by one that skips decoding and answers ``exc``'s status at once."""
    status = to_status(exc)

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort_with_status(status)

    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(refuse, request_deserializer=lambda raw: None,
                                                   response_serializer=handler.response_serializer)

    async def refuse_stream(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await context.abort_with_status(status)
        yield  # pragma: no cover - an async generator that never yields

    return grpc.unary_stream_rpc_method_handler(refuse_stream, request_deserializer=lambda raw: None,
                                                response_serializer=handler.response_serializer)


class FairShareInterceptor(grpc.aio.ServerInterceptor):
    """Enforces a tenant's RPC rate before its call is decoded or its credential verified.

    A credential the service has verified before is known by its digest (the limiter learns it
    when it charges the verified tenant). A call from a known tenant takes its token here: when
    the bucket is empty it waits for a token borrowed from the next ``max_wait_s`` (a flooding
    client is slowed to its rate, its calls parked at no CPU cost), and beyond that it is refused
    RESOURCE_EXHAUSTED without decoding (after ``max_wait_s``, see below). Unknown credentials go
    the normal way (verify, then charge), so a forged or foreign credential never spends a
    tenant's budget.
    """

    def __init__(self, limiter: TenantRateLimiter, max_wait_s: float) -> None:
        self.limiter = limiter
        self.max_wait_s = max_wait_s

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        key = credential_key(handler_call_details.invocation_metadata)
        CALLER_KEY.set(key)
        PREPAID.set(None)
        tenant = self.limiter.tenant_of(key) if key is not None else None
        if tenant is None:
            return await continuation(handler_call_details)
        try:
            wait_s = self.limiter.pace(tenant, time.monotonic(), self.max_wait_s)
        except RateLimited as exc:
            # Tarpit: the refusal comes after the longest wait a paced call may have, so a client
            # with many calls in flight is refused at most (calls in flight / max_wait_s) times a
            # second instead of as fast as the service can say no.
            await asyncio.sleep(self.max_wait_s)
            handler = await continuation(handler_call_details)
            return handler if handler is None or handler.request_streaming else _refusing(handler, exc)
        PREPAID.set(self.limiter)
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        return await continuation(handler_call_details)


class Service(Generic[CfgT]):
    """Base of every service process."""

    name = "service"
    #: On the event clock, may this process go dormant (clock/core.py)? Only if every call it handles or makes
    #: is a gRPC call through the clock interceptors; a service that also serves HTTP says False.
    clock_dormancy = True
    #: Set by a service that bounds its calls' wait in gRPC's core queue (the router): its interceptor goes first
    #: and the server also listens on its private address (runtime/accept_probe.py); the service runs it.
    accept_probe: AcceptProbe | None = None

    def __init__(self, config: CfgT) -> None:
        self.config = config
        epoch = config.clock_epoch
        self.clock_agent: ClockAgent | None = None
        if config.clock == "event":
            self.clock: VirtualClock = EventClock(sign_key=config.service_key,
                                                  wire_keys=(config.service_key, config.admin_key))
            clock.install(self.clock)
            self.clock_agent = ClockAgent(self.clock, config.clock_coordinator, self.name,
                                          connect_timeout_s=config.clock_connect_timeout_s,
                                          service_key=config.service_key, dormancy=self.clock_dormancy)
        else:
            self.clock = VirtualClock(epoch, config.speedup) if epoch > 0 else VirtualClock.starting_now(config.speedup)
        self.telemetry = Telemetry(
            cluster=config.cluster,
            service=self.name,
            endpoint=config.mqtt,
            username=config.mqtt_username,
            password=config.mqtt_password,
        )
        self._tasks: list[asyncio.Task[Any]] = []
        self.limiter: TenantRateLimiter | None = None  # set by broker_auth(), or by a service with its own
        self.registry = CollectorRegistry(auto_describe=False)
        self.metrics_port: int | None = None

    def rpc_limiter(self) -> TenantRateLimiter | None:
        """The per-tenant RPC limiter this service charges, paced and shed before decoding (None: no limit)."""
        return self.limiter

    def broker_auth(self) -> BrokerAuth:
        """The client that checks callers' keys and capabilities with the broker, charging each tenant's calls to
        the per-tenant RPC limiter this server paces (the chip, fabric, scheduler and router all use one)."""
        cfg = self.config
        auth = BrokerAuth(cfg.broker, cluster=cfg.cluster, service_key=cfg.service_key,
                          limiter=rate_limiter(cfg.rate_ops_per_s, cfg.rate_ops_burst))
        self.limiter = auth.limiter
        return auth

    def add_to_server(self, server: grpc.aio.Server) -> list[str]:
        """Register servicers; return their full service names (for health and reflection)."""
        raise NotImplementedError

    def server_options(self) -> list[tuple[str, Any]]:
        """Extra gRPC server options of this service (later ones override the common ones)."""
        return []

    def bind_address(self) -> str:
        """Where the gRPC server listens (``HOST:PORT``, or ``unix:PATH``)."""
        return self.config.address  # type: ignore[no-any-return]

    async def start(self) -> None:
        """Start background work (called after the server has bound its port)."""
        if self.clock_agent is not None:
            await self.clock_agent.connect()
            self.spawn(self.clock_agent.run(), "clock-sync")
        await self.telemetry.start()
        if self.config.metrics_port >= 0:
            self.metrics_port = serve_metrics(self.registry, self.config.host, self.config.metrics_port)
            log.info("metrics", address=f"http://{self.config.host}:{self.metrics_port}/metrics")

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        await self.telemetry.close()
        if self.clock_agent is not None:
            await self.clock_agent.close()

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.append(task)
        task.add_done_callback(_log_failure)
        return task

    def every(self, interval_wall_s: float, fn: Callable[[], Awaitable[None]], name: str) -> None:
        """Run ``fn`` every ``interval_wall_s`` wall seconds; errors are logged, never fatal."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval_wall_s)
                try:
                    await fn()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("periodic task failed", task=name)

        self.spawn(loop(), name)


def _log_failure(task: asyncio.Task[Any]) -> None:
    """Say when a background task ends with an error (else it is lost until the task is collected)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("background task failed", task=task.get_name(), error=f"{type(exc).__name__}: {exc}"[:300],
                  exc_info=exc)


async def create_server(service: Service[Any]) -> tuple[grpc.aio.Server, int]:
    cfg = service.config
    interceptors: list[grpc.aio.ServerInterceptor] = [RequestIdInterceptor()]
    if service.accept_probe is not None:
        interceptors.insert(0, service.accept_probe.interceptor())
    limiter = service.rpc_limiter()
    if limiter is not None:
        interceptors.append(FairShareInterceptor(limiter, cfg.rate_max_wait_s))
    interceptors.append(DecodeErrorInterceptor())
    if isinstance(service.clock, EventClock):
        interceptors.append(ClockServerInterceptor(service.clock))
    server = grpc.aio.server(
        interceptors=interceptors,
        # One value per option, the service's last (gRPC's core would keep the first of duplicates).
        options=list(dict([
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            *service.server_options(),
        ]).items()),
    )
    names = service.add_to_server(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for n in [*names, ""]:
        await health_servicer.set(n, health_pb2.HealthCheckResponse.SERVING)
    enable_reflection(names, server)
    port = add_port(server, service.bind_address())
    if port == 0:
        raise OSError(f"cannot bind {service.bind_address()}")
    if service.accept_probe is not None and not server.add_insecure_port(service.accept_probe.address):
        raise OSError(f"cannot bind the accept probe's {service.accept_probe.address}")
    service.health = health_servicer  # type: ignore[attr-defined]
    return server, port


async def serve(service: Service[Any], *, ready: Callable[[int], None] | None = None) -> None:
    """Run ``service`` until SIGTERM or SIGINT, then stop gracefully."""
    server, port = await create_server(service)
    await server.start()
    await service.start()
    log.info("serving", service=service.name, address=f"{service.config.host}:{port}",
             clock=service.config.clock, speedup=service.config.speedup, mqtt=service.config.mqtt or None)
    if ready:
        ready(port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping", service=service.name, grace_s=service.config.grace_s)
    await service.health.enter_graceful_shutdown()  # type: ignore[attr-defined]
    await server.stop(service.config.grace_s)
    await service.stop()
    log.info("stopped", service=service.name)
