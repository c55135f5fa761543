"""The router's front-end link without processes: frames, errors across it, merged chunks, the core's side."""

from __future__ import annotations

import asyncio
import socket
import types
from typing import Any

import pytest

from gigacluster.errors import DomainError, InvalidArgument, NotFound, ResourceExhausted
from gigacluster.inference.errors import AdmissionError
from gigacluster.inference.request import TokenEvent
from gigacluster.inference.tokenizer import Tokenizer
from gigacluster.router.frontends import reserve_port
from gigacluster.router.generation import Generation
from gigacluster.router.link import CoreLink, Outbox, domain_error, error_event, read_frame
from gigacluster.router.messages import chunk_of, merged
from gigacluster.router.pacing import TokenBox
from gigacluster.router.v1 import frontend_pb2, router_pb2
from gigacluster.runtime.config import ConfigError, RouterConfig


def test_domain_errors_cross_the_link_unchanged() -> None:
    """Class, message, field, reason, retry-after and metadata of a core error reach the front end as raised."""
    for exc in (ResourceExhausted("saturated", retry_after_s=0.25, reason="ROUTER_SATURATED"),
                InvalidArgument("max_tokens", "must be an integer in [1, 8192], got 0"),
                NotFound("deployments/x"), DomainError("internal error (ValueError)")):
        back = domain_error(frontend_pb2.LinkEvent.FromString(error_event(7, exc).SerializeToString()))
        assert type(back) is type(exc)
        assert (back.code, back.message, back.reason, back.metadata) == (exc.code, exc.message, exc.reason,
                                                                         exc.metadata)
        assert getattr(back, "field", None) == getattr(exc, "field", None)
        assert getattr(back, "retry_after_s", None) == getattr(exc, "retry_after_s", None)


def test_merged_chunks_keep_every_token_and_the_last_usage() -> None:
    """Chunks that piled up become one message: all ids and text, the first index, the last time and usage."""
    a = router_pb2.GenerateResponse(request_id="r", index=0, token_ids=[1, 2], text="ab", time_s=1.0, replica="x")
    b = router_pb2.GenerateResponse(request_id="r", index=2, token_ids=[3], text="c", time_s=2.0, replica="x",
                                    finish_reason="length", usage=router_pb2.GenerateUsage(completion_tokens=3))
    m = merged([a, b])
    assert list(m.token_ids) == [1, 2, 3] and m.text == "abc" and m.index == 0
    assert m.time_s == 2.0 and m.finish_reason == "length" and m.usage.completion_tokens == 3
    assert merged([a]) is a


def test_chunk_of_a_response_has_the_usage_timings() -> None:
    """The HTTP API's Chunk from a GenerateResponse: the summary's derived timings equal the usage's."""
    r = router_pb2.GenerateResponse(request_id="r", index=3, token_ids=[4, 5], text="de", time_s=2.0, replica="x",
                                    finish_reason="stop", usage=router_pb2.GenerateUsage(
                                        prompt_tokens=7, completion_tokens=5, cached_prompt_tokens=2, queue_s=0.1,
                                        ttft_s=0.5, e2e_s=1.3, energy_j=9.0, kv_transfer_bytes=64.0))
    c = chunk_of(r)
    assert c.token_ids == [4, 5] and c.text == "de" and c.finish_reason == "stop" and c.kv_transfer_bytes == 64.0
    s = c.summary
    assert s is not None
    assert (s.queue_s, s.ttft_s, s.e2e_s, s.prompt_tokens, s.cached_tokens) == (0.1, 0.5, 1.3, 7, 2)
    assert s.tpot_s == pytest.approx(0.2)
    assert chunk_of(router_pb2.GenerateResponse(token_ids=[1])).summary is None


class _Stream:
    """A replica stream's surface for Generation: the queue the replica fills, and close (client gone)."""

    def __init__(self, rid: str) -> None:
        self.queue = TokenBox()
        self.req = types.SimpleNamespace(id=rid)
        self.owner = types.SimpleNamespace(index=0)
        self.prefill_replica = -1
        self.kv_transfer_bytes = 0.0
        self.closed = False

    def close(self) -> None:
        self.closed = True


async def test_core_link_refuses_a_wrong_secret_and_streams_chunks_and_errors() -> None:
    """A front end without the secret gets nothing; one with it gets its state, then each request's tokens
    (those of one pass as one chunk, the first with the prompt's size) or its error, many per frame; a
    cancelled request is dropped in the core."""
    gens: dict[str, Generation] = {}

    def generate(p: Any, model: str, **kw: Any) -> Generation:
        if model == "none":
            raise NotFound("deployments/none")
        stream = _Stream(model)
        if model == "shed":  # shed before the link took the stream: the queued error still goes out
            stream.queue.put_nowait(AdmissionError(0.5, reason="shed", detail="by priority 5"))
        gens[model] = Generation(types.SimpleNamespace(name="deployments/x"), stream,  # type: ignore[arg-type]
                                 Tokenizer(256), 3)
        return gens[model]

    link = CoreLink("s3cret", generate, lambda: frontend_pb2.LinkDown(has_state=True, reconciled=True))

    async def connect(secret: str) -> tuple[asyncio.StreamReader, Outbox, asyncio.Task[None]]:
        a_r, a_w = await _pipe()
        b_r, b_w = await _pipe()
        task = asyncio.ensure_future(link.serve(a_r, b_w))
        out = Outbox(a_w, lambda calls: frontend_pb2.LinkUp(calls=calls).SerializeToString())
        out.write(frontend_pb2.LinkUp(secret=secret).SerializeToString())
        return b_r, out, task

    async def events(r: asyncio.StreamReader, n: int) -> list[Any]:
        got: list[Any] = []
        while len(got) < n:
            got += frontend_pb2.LinkDown.FromString(await read_frame(r) or b"").events
        return got

    r, _, task = await connect("wrong")
    await task
    assert await read_frame(r) is None
    r, out, task = await connect("s3cret")
    assert frontend_pb2.LinkDown.FromString(await read_frame(r) or b"").reconciled
    for i, model in enumerate(("ok", "none", "shed", "gone"), 1):
        out.push(frontend_pb2.LinkCall(stream=i, principal_kind="tenant", principal_tenant="tenants/a",
                                       request=router_pb2.GenerateRequest(model=model, text="hi")))
    by = {e.stream: e for e in await events(r, 2)}
    assert by[2].error_code == "NOT_FOUND" and by[3].error_code == "RESOURCE_EXHAUSTED"
    assert by[3].retry_after_s == 0.5
    q = gens["ok"].stream.queue
    q.put_nowait(TokenEvent("ok", 0, 65, 1.0, False))
    q.put_nowait(TokenEvent("ok", 1, 66, 1.1, False))
    (ev,) = await events(r, 1)
    assert (ev.stream, list(ev.chunk.token_ids), ev.chunk.text, ev.prompt_tokens) == (1, [65, 66], "AB", 3)
    q.put_nowait(TokenEvent("ok", 2, 67, 1.2, True, "length"))
    (ev,) = await events(r, 1)
    assert ev.chunk.finish_reason == "length" and ev.prompt_tokens == 0 and gens["ok"].done
    out.push(frontend_pb2.LinkCall(stream=4, cancel=True))
    while not gens["gone"].stream.closed:  # type: ignore[attr-defined]
        await asyncio.sleep(0.001)
    assert not gens["ok"].stream.closed  # type: ignore[attr-defined]
    out.writer.close()
    await task
    _close_pipes()
    await asyncio.sleep(0)


_KEEP: list[asyncio.StreamWriter] = []  # the unused halves: a dropped StreamWriter closes its socket


async def _pipe() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A one-way (reader, writer) pair over a socketpair."""
    a, b = socket.socketpair()
    reader, wa = await asyncio.open_connection(sock=a)
    _rb, writer = await asyncio.open_connection(sock=b)
    _KEEP.extend([wa, writer])
    return reader, writer


def _close_pipes() -> None:
    for w in _KEEP:
        w.close()
    _KEEP.clear()


def test_reserved_port_takes_no_connection_and_lets_front_ends_listen() -> None:
    """The core's reservation fixes a free port; front ends listen on it beside each other (SO_REUSEPORT) and
    every connection goes to one of them, none to the reservation."""
    held = reserve_port("127.0.0.1", 0)
    port = held.getsockname()[1]
    fronts = []
    for _ in range(2):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("127.0.0.1", port))
        s.listen(64)
        s.settimeout(5)
        fronts.append(s)
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(16)]
    accepted = 0
    for f in fronts:
        f.setblocking(False)
        while True:
            try:
                conn, _ = f.accept()
            except BlockingIOError:
                break
            conn.close()
            accepted += 1
    assert accepted == 16
    for s in (*clients, *fronts, held):
        s.close()


def test_frontends_config_bounds() -> None:
    """``frontends`` is 0-64 and needs the wall clock (the event clock counts calls in flight in one process)."""
    assert RouterConfig(frontends=4).frontends == 4
    for bad in ({"frontends": -1}, {"frontends": 65},
                {"frontends": 2, "clock": "event", "clock_coordinator": "127.0.0.1:1"}):
        with pytest.raises(ConfigError):
            RouterConfig(**bad)  # type: ignore[arg-type]
