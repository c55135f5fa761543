"""Map every domain error to a gRPC status, in one place.

``grpc_errors`` wraps each RPC method of a servicer class: a :class:`gigacluster.errors.DomainError`
(the one tree: the model and security packages' errors are part of it) becomes its canonical status
code with a ``google.rpc.ErrorInfo`` (reason, domain, metadata) in the status details; anything
else, and a domain error whose code is INTERNAL (e.g. a fabric model error: ours, not the
caller's), is logged with its traceback and answered INTERNAL, so no request crashes the process.
"""

from __future__ import annotations

import collections
import functools
import inspect
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

import grpc
import structlog
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from gigacluster import errors as E

log = structlog.get_logger()
DOMAIN = "gigacluster.dev"
# Longest message and ErrorInfo metadata value sent back: an error that echoed a whole hostile field
# (1 MB) overflowed the metadata limit. Call sites quote a short prefix; this is the backstop.
MAX_MESSAGE_CHARS = 400
MAX_METADATA_CHARS = 200
C = TypeVar("C", bound=type)


def preview(text: str, limit: int = MAX_METADATA_CHARS) -> str:
    """``text`` cut to ``limit`` characters, with an ellipsis and the full length when cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} chars)"


def classify(exc: BaseException) -> tuple[str, str, str, dict[str, str]]:
    """(status code name, reason, message, metadata) for an exception."""
    if isinstance(exc, E.DomainError) and exc.code != "INTERNAL":
        return exc.code, exc.reason, exc.message, exc.metadata
    return "INTERNAL", "INTERNAL", f"internal error ({type(exc).__name__}); see the service log", {}


#: gRPC's server-pushback trailer (gRFC A6, "gRPC Retry Design"): milliseconds before a retry, negative for none.
RETRY_PUSHBACK = "grpc-retry-pushback-ms"


class _Status(collections.namedtuple("_Status", ("code", "details", "trailing_metadata")), grpc.Status):
    """A grpc.Status carrying extra trailing metadata (e.g. ``retry-after-s``)."""


def to_status(exc: BaseException) -> grpc.Status:
    """The status for ``exc``: code, message, ErrorInfo details, and ``retry-after-s`` when known."""
    code, reason, message, metadata = classify(exc)
    message = preview(message, MAX_MESSAGE_CHARS)
    metadata = {preview(k, 64): preview(v) for k, v in metadata.items()}
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=metadata)
    detail = any_pb2.Any()
    detail.Pack(info)
    status = rpc_status.to_status(status_pb2.Status(code=getattr(code_pb2, code), message=message, details=[detail]))
    trailing = tuple(status.trailing_metadata)
    if "retry_after_s" in metadata:
        # A trailer clients can read without decoding the details (as HTTP's Retry-After), and gRPC's own
        # server pushback (gRFC A6), which a channel with a retry policy obeys without any code of ours.
        ms = str(max(1, math.ceil(1000 * float(metadata["retry_after_s"]))))
        trailing += (("retry-after-s", metadata["retry_after_s"]), ("retry-after-ms", ms),
                     (RETRY_PUSHBACK, ms))
    elif code == "RESOURCE_EXHAUSTED":
        trailing += ((RETRY_PUSHBACK, "-1"),)  # gRFC A6: a negative pushback asks a retrying client not to retry
    return _Status(status.code, status.details, trailing)


async def _abort(context: grpc.aio.ServicerContext, exc: BaseException, method: str) -> None:
    status = to_status(exc)
    if status.code == grpc.StatusCode.INTERNAL:
        log.error("rpc failed", method=method, exc_info=exc)
    elif getattr(exc, "reason", "") in ("RPC_RATE_LIMITED", "ROUTER_SATURATED"):
        # A flooding tenant, or an overloaded router, would otherwise cost a log line per refused call.
        log.debug("rpc rejected", method=method, code=status.code.name, error=status.details)
    else:
        log.info("rpc rejected", method=method, code=status.code.name, error=status.details)
    await context.abort_with_status(status)


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(fn):

        @functools.wraps(fn)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in fn(self, request, context):
                    yield item
            except (grpc.aio.AbortError, GeneratorExit):
                raise
            except Exception as exc:  # noqa: BLE001 - mapped to a status; never crashes the server
                await _abort(context, exc, name)

        return stream

    @functools.wraps(fn)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # noqa: BLE001 - mapped to a status; never crashes the server
            await _abort(context, exc, name)

    return unary


def grpc_errors(base: type) -> Callable[[C], C]:
    """Class decorator: wrap every RPC of generated servicer ``base`` implemented by the class."""
    rpcs = {n for n, v in vars(base).items() if callable(v) and not n.startswith("_")}

    def deco(cls: C) -> C:
        for name in rpcs:
            fn = cls.__dict__.get(name)
            if fn is not None:
                setattr(cls, name, _wrap(f"{base.__name__}.{name}", fn))
        return cls

    return deco


def error_info(err: grpc.aio.AioRpcError) -> error_details_pb2.ErrorInfo | None:
    """The ErrorInfo a gigacluster service attached to a failed call, if any (client side)."""
    for key, value in err.trailing_metadata() or ():
        if key == "grpc-status-details-bin":
            status = status_pb2.Status.FromString(value)
            for d in status.details:
                info = error_details_pb2.ErrorInfo()
                if d.Unpack(info):
                    return info
    return None
