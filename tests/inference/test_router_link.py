"""The router's front-end link without processes: frames, errors across it, merged chunks, the core's side."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from gigacluster.errors import DomainError, InvalidArgument, NotFound, ResourceExhausted
from gigacluster.router.frontend import chunk_of, merged
from gigacluster.router.generation import Chunk
from gigacluster.router.link import CoreLink, Outbox, domain_error, error_event, read_frame
from gigacluster.router.v1 import frontend_pb2, router_pb2


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


class _Gen:
    """A Generation's surface for CoreLink: two chunks, or an error after the first."""

    def __init__(self, fail: bool) -> None:
        self.prompt_tokens = 3
        self.fail = fail
        self.closed = False

    async def chunks(self) -> Any:
        yield Chunk("r", 0, [1], "a", 1.0, "deployments/x/replicas/0")
        if self.fail:
            raise ResourceExhausted("shed by a higher-priority request", retry_after_s=0.5)
        yield Chunk("r", 1, [2], "b", 2.0, "deployments/x/replicas/0", finish_reason="length")

    def close(self) -> None:
        self.closed = True


async def test_core_link_refuses_a_wrong_secret_and_streams_chunks_and_errors() -> None:
    """A front end without the secret gets nothing; one with it gets its state, then each request's chunks
    (the first with the prompt's size) or its error, many per frame."""
    gens: list[_Gen] = []

    def generate(p: Any, model: str, **kw: Any) -> _Gen:
        if model == "none":
            raise NotFound("deployments/none")
        gens.append(_Gen(fail=model == "shed"))
        return gens[-1]

    link = CoreLink("s3cret", generate, lambda: frontend_pb2.LinkDown(has_state=True, reconciled=True))

    async def connect(secret: str) -> tuple[asyncio.StreamReader, Outbox, asyncio.Task[None]]:
        a_r, a_w = await _pipe()
        b_r, b_w = await _pipe()
        task = asyncio.ensure_future(link.serve(a_r, b_w))
        out = Outbox(a_w, lambda calls: frontend_pb2.LinkUp(calls=calls).SerializeToString())
        out.write(frontend_pb2.LinkUp(secret=secret).SerializeToString())
        return b_r, out, task

    r, _, task = await connect("wrong")
    await task
    assert await read_frame(r) is None
    r, out, task = await connect("s3cret")
    assert frontend_pb2.LinkDown.FromString(await read_frame(r) or b"").reconciled
    for i, model in enumerate(("ok", "none", "shed"), 1):
        out.push(frontend_pb2.LinkCall(stream=i, principal_kind="tenant", principal_tenant="tenants/a",
                                       request=router_pb2.GenerateRequest(model=model, text="hi")))
    events: list[Any] = []
    while len([e for e in events if e.error_code or e.chunk.finish_reason]) < 3:
        events += frontend_pb2.LinkDown.FromString(await read_frame(r) or b"").events
    by = {s: [e for e in events if e.stream == s] for s in (1, 2, 3)}
    assert [list(e.chunk.token_ids) for e in by[1]] == [[1], [2]] and by[1][0].prompt_tokens == 3
    assert [e.error_code for e in by[2]] == ["NOT_FOUND"]
    assert by[3][-1].error_code == "RESOURCE_EXHAUSTED" and by[3][-1].retry_after_s == 0.5
    assert all(g.closed for g in gens)
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
