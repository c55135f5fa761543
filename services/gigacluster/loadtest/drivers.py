"""One request of each kind, timed from its *intended* send time (loop clock, seconds)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from typing import Any

import aiohttp
import grpc

from gigacluster.client import Client


@dataclasses.dataclass
class Result:
    """What one arrival produced. Latencies are wall seconds from the intended send time; NaN if none."""

    stream: int
    intended_s: float  # from the start of the run
    status: str = "OK"  # OK, a gRPC status name, HTTP_<code>, DROPPED, TIMEOUT
    send_lag_s: float = 0.0  # how late the send actually went out (a busy client shows here)
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    tokens: int = 0
    itl_s: list[float] = dataclasses.field(default_factory=list)  # per token, from chunk gaps
    virtual_ttft_s: float = math.nan  # the server's own (virtual-clock) TTFT
    virtual_e2e_s: float = math.nan  # the server's own (virtual-clock) end-to-end latency
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "OK"


class _Tokens:
    """Chunk arrivals -> TTFT and per-token inter-token latencies."""

    def __init__(self, result: Result, intended: float, loop: asyncio.AbstractEventLoop) -> None:
        self.r, self.t0, self.loop, self.last = result, intended, loop, math.nan

    def chunk(self, n_tokens: int) -> None:
        now = self.loop.time()
        if n_tokens <= 0:
            return
        if math.isnan(self.last):
            self.r.ttft_s = now - self.t0
            # Tokens delivered together in the first chunk arrived at the same instant.
            self.r.itl_s.extend([0.0] * (n_tokens - 1))
        else:
            self.r.itl_s.extend([(now - self.last) / n_tokens] * n_tokens)
        self.last = now
        self.r.tokens += n_tokens

    def done(self) -> None:
        self.r.e2e_s = self.loop.time() - self.t0


async def generate(client: Client, result: Result, intended: float, *, model: str, prompt: list[int],
                   max_tokens: int, priority: int = 0) -> Result:
    """gRPC Generate, streamed."""
    loop = asyncio.get_running_loop()
    result.send_lag_s = loop.time() - intended
    tok = _Tokens(result, intended, loop)
    try:
        async for chunk in client.generate(model, prompt, max_tokens=max_tokens, priority=priority):
            tok.chunk(len(chunk.token_ids))
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
                          priority: int = 0) -> Result:
    """``POST /v1/completions`` with ``stream: true`` (OpenAI server-sent events), as an OpenAI client sends it."""
    loop = asyncio.get_running_loop()
    result.send_lag_s = loop.time() - intended
    tok = _Tokens(result, intended, loop)
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "priority": priority}
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.post(base_url.rstrip("/") + "/v1/completions", json=body, headers=headers) as resp:
            if resp.status != 200:
                result.status = f"HTTP_{resp.status}"
                result.detail = (await resp.text())[:200]
                return result
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
                    tok.chunk(int(extra.get("tokens", 1)))
                usage = event.get("usage") or {}
                if usage.get("completion_tokens"):
                    result.tokens = int(usage["completion_tokens"])
                if extra.get("ttft_s"):
                    result.virtual_ttft_s = float(extra["ttft_s"])
                    result.virtual_e2e_s = float(extra.get("e2e_s") or math.nan)
        tok.done()
    except (aiohttp.ClientError, json.JSONDecodeError) as exc:
        result.status = "HTTP_ERROR"
        result.detail = str(exc)[:200]
    return result


async def submit_job(client: Client, result: Result, intended: float, *, spec: dict[str, Any],
                     job: dict[str, Any]) -> tuple[Result, str]:
    """SubmitJob (unary); returns the result and the job's name (empty on error)."""
    loop = asyncio.get_running_loop()
    result.send_lag_s = loop.time() - intended
    try:
        j = await client.submit_job(spec, **job)
    except grpc.aio.AioRpcError as exc:
        result.status = exc.code().name
        result.detail = exc.details() or ""
        return result, ""
    result.e2e_s = loop.time() - intended
    return result, str(j.name)
