"""The link between the router's front-end processes and its core (``frontends`` > 0).

One Unix-socket stream per front end carries every request it forwards: length-prefixed
``LinkUp`` frames (front end -> core: new Generate calls, cancellations) and ``LinkDown`` frames
(core -> front end: token chunks and errors of many requests, and the deployments' state). Each
side gathers what it has to send during one event-loop pass and writes it as one frame, so the
cost per token is a share of one write, never a write (or an RPC) of its own.

This module holds the framing and the conversions shared by both ends; the core's side is
:class:`CoreLink`, the front end's is :mod:`.frontend`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import struct
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from gigacluster.errors import (
    AlreadyExists,
    DomainError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from gigacluster.router.generation import Generation
from gigacluster.router.messages import generate_args, generate_response
from gigacluster.router.pacing import TokenBox
from gigacluster.router.v1 import frontend_pb2
from gigacluster.runtime.auth import Principal

log = structlog.get_logger()
_LEN = struct.Struct("!I")
MAX_FRAME_BYTES = 256 * 1024 * 1024  # far above FRAME_ITEMS prompts of max_prompt_bytes (128 KiB by default)
FRAME_ITEMS = 256
DOMAIN_ERRORS: dict[str, type[DomainError]] = {c.code: c for c in (
    InvalidArgument, NotFound, AlreadyExists, PermissionDenied, Unauthenticated, ResourceExhausted, FailedPrecondition,
    Unavailable)}


async def read_frame(reader: asyncio.StreamReader) -> bytes | None:
    """The next frame, or None at the end of the stream."""
    try:
        head = await reader.readexactly(_LEN.size)
        (n,) = _LEN.unpack(head)
        if n > MAX_FRAME_BYTES:
            raise ValueError(f"link frame of {n} bytes")
        return await reader.readexactly(n)
    except (asyncio.IncompleteReadError, ConnectionError):
        return None


class _Frames:
    """A link's writing end: length-prefixed frames, a flush scheduled once per event-loop pass."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self._scheduled = False

    def write(self, body: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(_LEN.pack(len(body)) + body)

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        raise NotImplementedError


class Outbox(_Frames):
    """Messages gathered during one event-loop pass, written as one frame at its end (``frame`` serialises a
    list of them)."""

    def __init__(self, writer: asyncio.StreamWriter, frame: Callable[[list[Any]], bytes]) -> None:
        super().__init__(writer)
        self.frame = frame
        self.items: list[Any] = []

    def push(self, item: Any) -> None:
        self.items.append(item)
        self._schedule()

    def flush(self) -> None:
        self._scheduled = False
        items, self.items = self.items, []
        for i in range(0, len(items), FRAME_ITEMS):  # bounded frames: at most FRAME_ITEMS prompts or chunks
            self.write(self.frame(items[i:i + FRAME_ITEMS]))


class EventOutbox(_Frames):
    """The core's outbox: each event is built in place in the next ``LinkDown`` frame (:meth:`event`), so no
    message is copied between the replica's tokens and the bytes on the link."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        super().__init__(writer)
        self._down = frontend_pb2.LinkDown()
        self._n = 0

    def event(self, stream: int) -> frontend_pb2.LinkEvent:
        """A new event of ``stream`` in the next frame, for the caller to fill now."""
        if self._n >= FRAME_ITEMS:  # bounded frames: at most FRAME_ITEMS chunks
            self._write_down()
        ev = self._down.events.add()
        ev.stream = stream
        self._n += 1
        self._schedule()
        return ev

    def push(self, item: frontend_pb2.LinkEvent) -> None:
        """A whole event (an error) into the next frame."""
        self.event(item.stream).CopyFrom(item)

    def _write_down(self) -> None:
        if self._n:
            self.write(self._down.SerializeToString())
            self._down, self._n = frontend_pb2.LinkDown(), 0

    def flush(self) -> None:
        self._scheduled = False
        self._write_down()


def error_event(stream: int, exc: DomainError) -> frontend_pb2.LinkEvent:
    """A request's domain error as the front end needs it to answer exactly as the core would."""
    ev = frontend_pb2.LinkEvent(stream=stream, error_code=exc.code, error_message=exc.message,
                                error_reason=exc.reason, error_field=getattr(exc, "field", "") or "",
                                error_metadata=exc.metadata)
    retry = getattr(exc, "retry_after_s", None)
    if retry is not None:
        ev.retry_after_s = retry
    return ev


def domain_error(ev: frontend_pb2.LinkEvent) -> DomainError:
    """The domain error an error event carries (its class by code; message, reason and metadata as sent)."""
    cls = DOMAIN_ERRORS.get(ev.error_code, DomainError)
    exc = cls.__new__(cls)
    DomainError.__init__(exc, ev.error_message, reason=ev.error_reason or None)
    exc.metadata = dict(ev.error_metadata)
    if ev.error_field:
        exc.field = ev.error_field  # type: ignore[attr-defined]
    if isinstance(exc, ResourceExhausted):
        exc.retry_after_s = ev.retry_after_s if ev.HasField("retry_after_s") else None
    return exc


class _Sink(TokenBox):
    """Takes the place of a request's stream queue in the core: the replica's events go straight to the link's
    next frame (:meth:`_Served.flush`), with no task per request and no wake-up per token."""

    def __init__(self, served: _Served, stream: int) -> None:
        super().__init__()
        self.served, self.stream = served, stream

    def put_nowait(self, item: Any) -> None:
        self.served.event(self.stream, item)


class _Served:
    """One front end's requests in the core: their events gathered per pass, sent as one frame."""

    def __init__(self, out: EventOutbox) -> None:
        self.out = out
        self.gens: dict[int, Generation] = {}
        self._pending: dict[int, list[Any]] = {}
        self._scheduled = False

    def add(self, stream: int, gen: Generation) -> None:
        """Serve ``gen``: events already queued for it (e.g. shed at admission) and every later one."""
        old = gen.stream.queue
        self.gens[stream] = gen
        gen.stream.queue = _Sink(self, stream)
        while not old.empty():
            self.event(stream, old.get_nowait())

    def event(self, stream: int, ev: Any) -> None:
        self._pending.setdefault(stream, []).append(ev)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Each request's events of this pass as one chunk (or its error), all in the link's next frame."""
        self._scheduled = False
        pending, self._pending = self._pending, {}
        for stream, batch in pending.items():
            gen = self.gens.get(stream)
            if gen is None:
                continue  # cancelled meanwhile
            first = not gen.generated
            try:
                chunk = gen.take(batch)
            except DomainError as exc:
                self.drop(stream)
                self.out.push(error_event(stream, exc))
                continue
            except Exception as exc:  # a bug: the client still gets an answer (INTERNAL), never a stream left open
                log.exception("router link: request failed", stream=stream)
                self.drop(stream)
                self.out.push(error_event(stream, DomainError(f"internal error ({type(exc).__name__}); "
                                                              "see the router log")))
                continue
            ev = self.out.event(stream)
            generate_response(chunk, into=ev.chunk)
            if first:
                ev.prompt_tokens = gen.prompt_tokens
            if gen.done:
                self.drop(stream)
        self.out.flush()

    def drop(self, stream: int) -> None:
        """Stop serving ``stream`` (finished, failed, or its client went away: then it is cancelled)."""
        gen = self.gens.pop(stream, None)
        if gen is not None:
            gen.close()

    def close(self) -> None:
        for stream in list(self.gens):
            self.drop(stream)


class CoreLink:
    """The core's side of the links: admits each front end's calls, streams their chunks back.

    ``generate`` is :meth:`Admission.generate` (bounds, routing and admission stay in the core);
    ``state`` gives the ``LinkDown`` the front ends need besides tokens (readiness, deployments),
    sent to each link when it connects and whenever it changes.
    """

    def __init__(self, secret: str, generate: Callable[..., Generation],
                 state: Callable[[], frontend_pb2.LinkDown]) -> None:
        self.secret = secret
        self.generate = generate
        self.state = state
        self._last_state = b""
        self.links: set[EventOutbox] = set()
        self.calls = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One front end's link, until it closes: every request it still has open is dropped then."""
        hello_raw = await read_frame(reader)
        hello = frontend_pb2.LinkUp.FromString(hello_raw) if hello_raw is not None else None
        if hello is None or not hmac.compare_digest(hello.secret.encode(), self.secret.encode()):
            log.warning("router link refused: wrong secret")
            writer.close()
            return
        out = EventOutbox(writer)
        served = _Served(out)
        self.links.add(out)
        out.write(self.state().SerializeToString())
        log.info("front end linked", frontend=hello.frontend)
        try:
            self._calls(served, hello.calls)
            while (raw := await read_frame(reader)) is not None:
                self._calls(served, frontend_pb2.LinkUp.FromString(raw).calls)
        finally:
            self.links.discard(out)
            log.info("front end unlinked", frontend=hello.frontend, dropped=len(served.gens))
            served.close()
            writer.close()

    def _calls(self, served: _Served, calls: Iterable[Any]) -> None:
        for call in calls:
            if call.cancel:
                served.drop(call.stream)
                continue
            self.calls += 1
            args = {**generate_args(call.request), "priority": call.priority, "open_to_context": call.open_to_context,
                    "max_tokens": call.max_tokens if call.HasField("max_tokens") else None}
            try:
                gen = self.generate(Principal(call.principal_kind, call.principal_tenant), call.request.model, **args)
            except DomainError as exc:
                served.out.push(error_event(call.stream, exc))
                continue
            except Exception as exc:  # a bug: answer INTERNAL, keep the link (and the other requests) going
                log.exception("router link: admission failed", stream=call.stream)
                served.out.push(error_event(call.stream, DomainError(f"internal error ({type(exc).__name__})")))
                continue
            served.add(call.stream, gen)

    def publish_state(self) -> None:
        """Send the state to every link if it changed since the last time."""
        raw = self.state().SerializeToString()
        if raw != self._last_state:
            self._last_state = raw
            for out in list(self.links):
                out.write(raw)

    async def watch_state(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            with contextlib.suppress(ConnectionError):
                self.publish_state()
