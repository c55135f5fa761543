"""The router's stream pacing (router/pacing.py): a TokenBox per stream, a router-wide message budget."""

from __future__ import annotations

import asyncio

import pytest

from gigacluster.inference.engine import TokenEvent
from gigacluster.router.deployment import ReplicaFailed
from gigacluster.router.pacing import Pacer, TokenBox
from gigacluster.runtime.clock import VirtualClock
from gigacluster.runtime.config import ConfigError, RouterConfig


def _tok(i: int, t_s: float = 0.0, last: bool = False) -> TokenEvent:
    return TokenEvent("r", i, 300 + i, t_s, finished=last, finish_reason="length" if last else "")


def _pacer(open_streams: int, per_s: float = 1000.0, max_hold_s: float = 0.05, behind_hold_s: float = 0.0) -> Pacer:
    clock = VirtualClock.starting_now()
    return Pacer(clock, lambda: open_streams, per_s, max_hold_s, 0.005, behind_hold_s)


def test_hold_grows_with_open_streams_up_to_the_cap() -> None:
    """The hold is open streams / budget, capped by stream_max_hold_s; 0 without a budget."""
    assert _pacer(10).hold_s([_tok(1)]) == pytest.approx(0.01)
    assert _pacer(1000).hold_s([_tok(1)]) == pytest.approx(0.05)
    assert _pacer(1000, per_s=0.0).hold_s([_tok(1)]) == 0.0


def test_the_last_token_and_errors_are_never_held() -> None:
    """A pending last token or error makes the hold 0, however loaded the router."""
    p = _pacer(1000)
    assert p.hold_s([_tok(1), _tok(2, last=True)]) == 0.0
    assert p.hold_s([_tok(1), ReplicaFailed("gone")]) == 0.0


def test_a_stream_behind_its_virtual_time_holds_at_least_the_behind_hold() -> None:
    """Tokens more than lag_s behind their virtual time are held behind_hold_s (coalesce_hold_s) even when idle."""
    p = _pacer(0, behind_hold_s=0.01)
    now = p.clock.now()
    assert p.hold_s([_tok(1, now - 0.5)]) == pytest.approx(0.01)
    assert p.hold_s([_tok(1, now + 0.5)]) == 0.0


def test_the_first_message_is_never_held() -> None:
    """Before any message was taken the delay is 0 (TTFT is never held); after one it is the pacer's hold."""
    box = TokenBox(_pacer(20))  # hold 20 ms
    box.put_nowait(_tok(0))
    assert box.delay_s(100.0) == 0.0
    box.sent, box._last_s = 1, 100.0
    assert box.delay_s(100.005) == pytest.approx(0.015)
    assert box.delay_s(100.5) < 0
    assert TokenBox().delay_s(0.0) == float("inf")  # nothing pending: wait


async def test_take_returns_everything_pending_as_one_message() -> None:
    """Tokens put while the writer waits out the hold leave together in one take; the last wakes it at once."""
    box = TokenBox(_pacer(1000, max_hold_s=1.0))  # a hold far longer than the test
    box.put_nowait(_tok(0))
    assert [e.index for e in await box.take()] == [0]  # type: ignore[union-attr]
    waiter = asyncio.ensure_future(box.take())
    await asyncio.sleep(0)
    box.put_nowait(_tok(1))
    box.put_nowait(_tok(2))
    await asyncio.sleep(0)
    assert not waiter.done()  # held for more tokens
    box.put_nowait(_tok(3, last=True))
    got = await asyncio.wait_for(waiter, 5)
    assert [e.index for e in got] == [1, 2, 3]  # type: ignore[union-attr]
    assert box.sent == 2 and box.empty() and box._timer is None


async def test_a_held_message_goes_out_when_its_hold_is_over() -> None:
    """Without a last token, the timer wakes the writer once the hold has passed: no token waits for ever."""
    box = TokenBox(_pacer(1, per_s=1000.0))  # hold 1 ms
    box.put_nowait(_tok(0))
    await box.take()
    box.put_nowait(_tok(1))
    got = await asyncio.wait_for(box.take(), 5)
    assert [e.index for e in got] == [1]  # type: ignore[union-attr]


async def test_without_a_pacer_every_take_wakes_at_once() -> None:
    """A box without a pacer (the link's sink, tests) hands each event over as soon as it comes."""
    box = TokenBox()
    waiter = asyncio.ensure_future(box.take())
    await asyncio.sleep(0)
    box.put_nowait(_tok(0))
    box.put_nowait(_tok(1))
    assert [e.index for e in await asyncio.wait_for(waiter, 5)] == [0, 1]  # type: ignore[union-attr]
    with pytest.raises(asyncio.QueueEmpty):
        box.get_nowait()


async def test_a_cancelled_writer_leaves_no_timer() -> None:
    """A client going away while its message is held cancels the hold's timer with it."""
    box = TokenBox(_pacer(1000, max_hold_s=1.0))
    box.put_nowait(_tok(0))
    await box.take()
    box.put_nowait(_tok(1))
    waiter = asyncio.ensure_future(box.take())
    await asyncio.sleep(0)
    assert box._timer is not None
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert box._timer is None and box._waiter is None


def test_pacing_bounds_are_checked() -> None:
    """A negative budget or a hold cap outside [0, 1] s is a config error."""
    with pytest.raises(ConfigError):
        RouterConfig(stream_messages_per_s=-1)
    with pytest.raises(ConfigError):
        RouterConfig(stream_max_hold_s=2.0)


async def test_reports_wait_out_the_interval_so_iterations_batch() -> None:
    """With report_interval_s, iterations added while a report is in flight or its interval runs go in one
    next call: a busy replica books a few calls a second, not one per round trip."""
    from tests.inference.test_router_units import _iterations, _replica

    rep, chip = await _replica(None)
    rep.lease.token = "new"
    rep.reporter.interval_s = 0.02
    its = _iterations(5)
    rep.reporter.add(*its[0])
    await asyncio.sleep(0)  # the first call goes out at once
    for it, start in its[1:]:
        rep.reporter.add(it, start)
    await rep.reporter.drain()
    assert chip.calls == [1, 4] and rep.reporter.error is None
    await rep.channel.close()


@pytest.mark.parametrize("kind", ["text_completion", "chat.completion"])
def test_pre_rendered_sse_chunks_are_the_same_bytes(kind: str) -> None:
    """A middle chunk's pre-rendered server-sent event is byte for byte the event built from its object."""
    from types import SimpleNamespace

    from gigacluster.router.generation import Chunk
    from gigacluster.router.http import _Format

    fmt = _Format(kind, SimpleNamespace(request_id="r\\1", generated=3, prompt_tokens=7), 'm"é')  # type: ignore[arg-type]
    for c in (Chunk("r", 1, [5, 6], 'a"b\\né✓', 0.1 + 0.2, "d/replicas/0"), Chunk("r", 2, [7], "", 1e-7, "x")):
        assert fmt.chunk_sse(c) == fmt.sse(fmt.chunk(c))
    fmt.continuous = True  # usage on every chunk: built from the object
    c = Chunk("r", 1, [5], "t", 0.5, "d/replicas/0")
    assert fmt.chunk_sse(c) == fmt.sse(fmt.chunk(c))


def test_a_front_end_paces_the_cores_link_events_alike() -> None:
    """A front end's pacer reads LinkEvents: an error or a finished chunk is never held, a middle chunk is."""
    from gigacluster.router.v1 import frontend_pb2, router_pb2

    clock = VirtualClock.starting_now()
    p = Pacer(clock, lambda: 20, 1000.0, 0.05, 0.005, 0.0,
              final=lambda ev: bool(ev.error_code or ev.chunk.finish_reason), time_of=lambda ev: float(ev.chunk.time_s))
    mid = frontend_pb2.LinkEvent(stream=1, chunk=router_pb2.GenerateResponse(token_ids=[5], time_s=clock.now()))
    last = frontend_pb2.LinkEvent(stream=1, chunk=router_pb2.GenerateResponse(token_ids=[6], finish_reason="length"))
    err = frontend_pb2.LinkEvent(stream=1, error_code="UNAVAILABLE")
    assert p.hold_s([mid]) == pytest.approx(0.02)
    assert p.hold_s([mid, last]) == 0.0 and p.hold_s([mid, err]) == 0.0


async def test_the_load_client_counts_the_messages_tokens_came_in() -> None:
    """The load client's result says how many stream messages carried its tokens (tokens per message)."""
    from gigacluster.loadtest.drivers import Result, Timebase, _Tokens

    r = Result(0, 0.0)
    tok = _Tokens(r, 0.0, Timebase())
    tok.chunk(1, 0.5)
    tok.chunk(3, 0.6)
    tok.chunk(0, 0.7)  # an event without tokens (usage) is no token message
    assert (r.tokens, r.chunks) == (4, 2)


def test_a_body_with_few_brackets_skips_the_depth_scan_and_a_deep_one_is_refused() -> None:
    """Bracket counting bounds the depth: a shallow body parses, one nested past the bound is still refused."""
    from gigacluster.errors import InvalidArgument
    from gigacluster.router.openai_body import parse_json_body

    assert parse_json_body(b'{"prompt": [1, 2, 3]}', 2)["prompt"] == [1, 2, 3]  # 2 openers: no scan
    assert parse_json_body(b'{"prompt": [1, 2, 3], "s": "[[[[["}', 2)["s"] == "[[[[["  # scanned: strings skipped
    with pytest.raises(InvalidArgument):
        parse_json_body(b'{"a": [[[1]]]}', 3)


async def test_on_the_event_clock_the_first_message_is_its_first_time_and_later_ones_take_all() -> None:
    """A stamped pacer (the event clock) sends the first virtual time's tokens alone (TTFT as any client reads
    it), then everything pending in one message however many virtual times it spans."""
    clock = VirtualClock.starting_now()
    box = TokenBox(Pacer(clock, lambda: 1, stamped=True))
    for i, t in enumerate((1.0, 1.0, 1.01, 1.02, 1.03)):
        box.put_nowait(_tok(i, t))
    first = await box.take()
    assert [e.index for e in first] == [0, 1]
    rest = await box.take()
    assert [e.time_s for e in rest] == [1.01, 1.02, 1.03] and box.empty()


def test_a_chunk_of_several_times_carries_each_tokens_time_to_grpc_and_http() -> None:
    """Generation.take stamps each token when a message's tokens differ in time; the GenerateResponse and the
    HTTP chunk carry the stamps, and a chunk rebuilt from the response (a front end's) keeps them."""
    from types import SimpleNamespace

    from gigacluster.router.generation import Generation
    from gigacluster.router.http import _Format
    from gigacluster.router.messages import chunk_of, generate_response

    gen = Generation.__new__(Generation)
    gen.stream = SimpleNamespace(owner=SimpleNamespace(index=2), prefill_replica=-1, kv_transfer_bytes=0.0)  # type: ignore[assignment]
    gen.dep = SimpleNamespace(name="deployments/d")  # type: ignore[assignment]
    gen.tok = SimpleNamespace(decode=lambda ids: "x" * len(ids))  # type: ignore[assignment]
    gen.request_id, gen.stop_chars, gen._chars, gen.generated, gen.done = "r", None, 0, 0, False
    gen.stamped = False  # the wall clock: a message's tokens are stamped with the last one's time only
    assert gen.take([_tok(0, 0.4), _tok(1, 0.45)]).token_times_s == ()
    gen.stamped = True
    one = gen.take([_tok(0, 0.5), _tok(1, 0.5)])
    assert one.token_times_s == () and generate_response(one).token_times_s == []
    many = gen.take([_tok(2, 0.51), _tok(3, 0.52), _tok(4, 0.53)])
    assert many.time_s == 0.53 and many.token_times_s == (0.51, 0.52, 0.53)
    resp = generate_response(many)
    assert list(resp.token_times_s) == [0.51, 0.52, 0.53]
    assert chunk_of(resp).token_times_s == (0.51, 0.52, 0.53)
    from gigacluster.router.messages import merged

    both = merged([generate_response(one), resp])  # a front end's chunks that piled up: every token's time
    assert list(both.token_times_s) == [0.5, 0.5, 0.51, 0.52, 0.53]
    assert list(both.token_ids) == [300, 301, 302, 303, 304]
    assert list(merged([generate_response(one), generate_response(one)]).token_times_s) == []
    fmt = _Format("text_completion", SimpleNamespace(request_id="r", generated=5, prompt_tokens=7), "m")  # type: ignore[arg-type]
    assert b'"token_times_s":[0.51,0.52,0.53]' in fmt.chunk_sse(many)
    assert b"token_times_s" not in fmt.chunk_sse(one)


async def test_the_load_client_reads_each_tokens_stamp_as_if_it_came_alone() -> None:
    """A message whose tokens carry their own virtual times gives the load client the TTFT and inter-token gaps
    of one message per distinct time (as the event clock sent them before), and counts as one message."""
    from gigacluster.loadtest.drivers import Result, Timebase, _Tokens

    tb = Timebase(clock=VirtualClock.starting_now())  # type: ignore[arg-type]  # any clock: seen() reads the stamp
    alone, together = Result(0, 0.0), Result(0, 0.0)
    a, b = _Tokens(alone, 0.2, tb), _Tokens(together, 0.2, tb)
    for n, t in ((1, 0.5), (1, 0.51), (2, 0.53), (1, 0.56)):
        a.chunk(n, t)
    b.chunk(1, 0.5)
    b.chunk(4, 0.56, [0.51, 0.53, 0.53, 0.56])
    assert together.ttft_s == alone.ttft_s == pytest.approx(0.3)
    assert together.virtual_itl_s == pytest.approx(alone.virtual_itl_s)
    assert together.virtual_itl_s == pytest.approx([0.01, 0.01, 0.01, 0.03])
    assert together.itl_s == pytest.approx(alone.itl_s)
    assert (together.tokens, together.chunks, alone.chunks) == (5, 2, 4)
