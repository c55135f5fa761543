"""One request of each kind, timed from its *intended* send time on the run's :class:`Timebase`: the
event loop's clock (wall seconds), or in event-clock mode the mesh's virtual time (a token reaches
the client at the virtual time the router produced it: the mesh has no virtual network delay)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
from collections.abc import Iterator, Sequence
from typing import Any

import aiohttp
import grpc

from gigacluster.client import Client
from gigacluster.runtime.clock import VT_KEY, VT_MAC_KEY, EventClock, vt_mac


@dataclasses.dataclass(frozen=True)
class Timebase:
    """Where a run reads and waits for time: the loop's wall clock, or an event clock the load generator
    takes part in (``runtime/participant.py``), whose waits are events of the mesh."""

    clock: EventClock | None = None
    key: str = ""  # the admin key the participant joined with: it proves the time it stamps on HTTP calls

    @property
    def virtual(self) -> bool:
        return self.clock is not None

    def now(self) -> float:
        return self.clock.now() if self.clock is not None else asyncio.get_running_loop().time()

    async def until(self, t_s: float) -> None:
        """Wait until ``t_s`` (at once if it has passed)."""
        if self.clock is not None:
            await self.clock.sleep_until(t_s)
        else:
            delay = t_s - self.now()
            if delay > 0:
                await asyncio.sleep(delay)

    def seen(self, produced_s: float) -> float:
        """When a chunk the router stamped ``produced_s`` (its virtual time) reached this client."""
        return produced_s if self.clock is not None and produced_s > 0 else self.now()

    @contextlib.contextmanager
    def http_call(self, headers: dict[str, str]) -> Iterator[None]:
        """An HTTP request to the mesh, counted open (and stamped with the time) like a gRPC call of the mesh,
        so virtual time never moves while it is in transit to the router."""
        if self.clock is None:
            yield
            return
        headers[VT_KEY] = vt = repr(self.clock.now())
        headers[VT_MAC_KEY] = vt_mac(self.key, vt)
        self.clock.call_started(inbound=False)
        try:
            yield
        finally:
            self.clock.call_ended(inbound=False)


@dataclasses.dataclass
class Result:
    """What one arrival produced. Latencies are seconds of the run's timebase from the intended send time; NaN
    if none."""

    stream: int
    intended_s: float  # from the start of the run
    status: str = "OK"  # OK, a gRPC status name, HTTP_<code>, DROPPED, TIMEOUT
    send_lag_s: float = 0.0  # how late the send actually went out (a busy client shows here)
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    tokens: int = 0
    chunks: int = 0  # stream messages (gRPC responses, SSE token events) the tokens came in
    itl_s: list[float] = dataclasses.field(default_factory=list)  # per token, from chunk gaps
    virtual_ttft_s: float = math.nan  # the server's own (virtual-clock) TTFT
    virtual_e2e_s: float = math.nan  # the server's own (virtual-clock) end-to-end latency
    virtual_itl_s: list[float] = dataclasses.field(default_factory=list)  # per token, from the chunks' virtual times
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "OK"


class _Tokens:
    """Chunk arrivals -> TTFT and per-token inter-token latencies."""

    def __init__(self, result: Result, intended: float, tb: Timebase) -> None:
        self.r, self.t0, self.tb, self.last, self.last_produced = result, intended, tb, math.nan, math.nan

    def chunk(self, n_tokens: int, produced_s: float = 0.0, token_times_s: Sequence[float] = ()) -> None:
        """A stream message of ``n_tokens`` tokens, the last produced at ``produced_s`` (virtual; 0: unknown) or,
        when the router stamps each (``token_times_s``, the event clock), each token at its own time: the
        same figures as one message per distinct time."""
        if n_tokens <= 0:
            return
        if len(token_times_s) == n_tokens and n_tokens > 1:
            for t, same in itertools.groupby(token_times_s):
                self._tokens(sum(1 for _ in same), float(t))
        else:
            self._tokens(n_tokens, produced_s)
        self.r.chunks += 1

    def _tokens(self, n_tokens: int, produced_s: float) -> None:
        now = self.tb.seen(produced_s)
        if produced_s > 0:
            gap = 0.0 if math.isnan(self.last_produced) else (produced_s - self.last_produced) / n_tokens
            self.r.virtual_itl_s.extend([gap] * (n_tokens - 1 if math.isnan(self.last_produced) else n_tokens))
            self.last_produced = produced_s
        if math.isnan(self.last):
            self.r.ttft_s = now - self.t0
            # Tokens delivered together in the first chunk arrived at the same instant.
            self.r.itl_s.extend([0.0] * (n_tokens - 1))
        else:
            self.r.itl_s.extend([(now - self.last) / n_tokens] * n_tokens)
        self.last = now
        self.r.tokens += n_tokens

    def done(self) -> None:
        self.r.e2e_s = (self.last if self.tb.virtual and not math.isnan(self.last) else self.tb.now()) - self.t0


async def generate(client: Client, result: Result, intended: float, *, model: str, prompt: list[int],
                   max_tokens: int, priority: int = 0, tb: Timebase = Timebase()) -> Result:
    """gRPC Generate, streamed."""
    result.send_lag_s = tb.now() - intended
    tok = _Tokens(result, intended, tb)
    try:
        async for chunk in client.generate(model, prompt, max_tokens=max_tokens, priority=priority):
            tok.chunk(len(chunk.token_ids), chunk.time_s, chunk.token_times_s)
            if chunk.HasField("usage") and chunk.usage.ttft_s > 0:
                result.virtual_ttft_s = chunk.usage.ttft_s
                result.virtual_e2e_s = chunk.usage.e2e_s
        tok.done()
    except grpc.aio.AioRpcError as exc:
        result.status = exc.code().name
        result.detail = exc.details() or ""
    return result


async def http_completion(session: aiohttp.ClientSession, base_url: str, api_key: str | None, result: Result,
                          intended: float, *, model: str, prompt: list[int], max_tokens: int,
                          priority: int = 0, tb: Timebase = Timebase()) -> Result:
    """``POST /v1/completions`` with ``stream: true`` (OpenAI server-sent events), as an OpenAI client sends it."""
    result.send_lag_s = tb.now() - intended
    tok = _Tokens(result, intended, tb)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "priority": priority}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with tb.http_call(headers):
            await _sse(session, base_url, body, headers, result, tok)
    except (aiohttp.ClientError, json.JSONDecodeError) as exc:
        result.status = "HTTP_ERROR"
        result.detail = str(exc)[:200]
    return result


async def _sse(session: aiohttp.ClientSession, base_url: str, body: dict[str, Any], headers: dict[str, str],
               result: Result, tok: _Tokens) -> None:
    """One streamed completion's events into ``result``."""
    async with session.post(base_url.rstrip("/") + "/v1/completions", json=body, headers=headers) as resp:
        if resp.status != 200:
            result.status = f"HTTP_{resp.status}"
            result.detail = (await resp.text())[:200]
            return
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            event: dict[str, Any] = json.loads(data)
            extra = event.get("gigacluster") or {}
            if event.get("choices"):
                # One event per chunk of the router's stream, with the number of tokens it holds (the usage
                # event corrects the total for a server that does not say).
                tok.chunk(int(extra.get("tokens", 1)), float(extra.get("time_s") or 0.0),
                          [float(t) for t in extra.get("token_times_s") or ()])
            usage = event.get("usage") or {}
            if usage.get("completion_tokens"):
                result.tokens = int(usage["completion_tokens"])
            if extra.get("ttft_s"):
                result.virtual_ttft_s = float(extra["ttft_s"])
                result.virtual_e2e_s = float(extra.get("e2e_s") or math.nan)
    tok.done()


async def submit_job(client: Client, result: Result, intended: float, *, spec: dict[str, Any],
                     job: dict[str, Any], tb: Timebase = Timebase()) -> tuple[Result, str]:
    """SubmitJob (unary); returns the result and the job's name (empty on error)."""
    result.send_lag_s = tb.now() - intended
    try:
        j = await client.submit_job(spec, **job)
    except grpc.aio.AioRpcError as exc:
        result.status = exc.code().name
        result.detail = exc.details() or ""
        return result, ""
    result.e2e_s = tb.now() - intended
    return result, str(j.name)
