"""The OpenAI-compatible HTTP endpoint of the router (aiohttp, on the router's own event loop).

A thin adapter: it authenticates ``Authorization: Bearer <api key>`` through the router's own
``BrokerAuth`` and calls :meth:`RouterService.generate` in-process, the same code path gRPC
Generate takes (no loopback: one process, one event loop, no second serialisation, and the
admission decision and its retry-after come back as the same domain error). With front ends
(``frontends`` > 0) the same server runs in every front-end process on the shared port, and its
``generate`` is :meth:`.frontend.FrontendService.generate`: the core's answers, errors included,
come back over the link unchanged. Routes:

* ``GET /health`` and ``GET``/``POST /ping`` (as vLLM): 200 with an empty body once the router
  serves, 503 while it restores its deployments; no key, nothing said;
* ``GET /v1/models``: the caller's ready deployments (``id`` = deployment id, ``created`` = when
  it was created); ``GET /v1/models/{id}``: one of them;
* ``POST /v1/completions``: ``prompt`` as a string or token ids (or a list of one of either);
* ``POST /v1/chat/completions``: ``messages`` rendered to text by :func:`render_chat`.

Both POST routes take ``model``, ``max_tokens`` (chat: or ``max_completion_tokens``), ``stream``
(server-sent events, ``data: {...}`` then ``data: [DONE]``), ``stream_options`` (``include_usage``,
vLLM's ``continuous_usage_stats``), ``stop`` and the extensions ``priority`` (as vLLM),
``request_id`` and ``ignore_eos`` (as vLLM). Sampling parameters (:data:`NO_EFFECT`) are accepted
and change nothing (the text is deterministic); what the emulator cannot do (:data:`OFF_ONLY`:
``logprobs``, ``n`` > 1, ``best_of``, tools ...) and unknown fields are refused with a 400 naming
them (the body's parsing and these tables: :mod:`.openai_body`). Responses carry the usual
``usage`` (plus ``energy_j``) and a ``gigacluster`` object with the virtual timings (TTFT, queue,
end-to-end, KV transfer).

``max_tokens`` left out or ``null``: the output ends at an end-of-sequence drawn from a trace's
output lengths (:mod:`gigacluster.inference.outputs`), capped by ``default_max_tokens`` (16,
OpenAI's default for completions) or, for chat, by the context left (as vLLM). Otherwise it must
be an integer in ``[1, max_tokens_limit]`` and the request runs to it unless a ``stop`` string ends
it first (``finish_reason`` "stop").

Errors are OpenAI-style JSON ``{"error": {"message", "type", "param", "code"}}``, never a bare
500 (``type``: :func:`error_type`): 400 for a bad field, an undecodable body, JSON nested deeper
than ``http_max_json_depth`` or a non-finite number (``NaN``, ``Infinity``); 401; 404 for an
unknown model (or another tenant's) or path; 405 with ``Allow``; 413 for a body over
``http_max_body_bytes``; 429 with ``Retry-After`` (whole seconds, rounded up) and
``retry-after-ms`` when the deployment or the router itself is saturated (.overload) or the tenant's
rate limit is spent; 503
(retry) while its chips restart. A request shed from the queue before its first token still
gets its 429: the response starts only once the first token exists.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web

from gigacluster.errors import DomainError, InvalidArgument, NotFound, ResourceExhausted
from gigacluster.model import ModelError
from gigacluster.router.openai_body import (  # noqa: F401  (check_fields, json_depth: part of this API)
    check_fields,
    int_field,
    json_depth,
    parse_json_body,
    render_chat,
    stop_strings,
)
from gigacluster.runtime import clock

if TYPE_CHECKING:
    from gigacluster.router.deployment import LiveDeployment
    from gigacluster.router.frontend import FrontendService, RemoteDeployment, RemoteGeneration
    from gigacluster.router.generation import Chunk, Generation
    from gigacluster.router.service import RouterService

log = structlog.get_logger()
_quote: Callable[[str], str] = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]
UNAVAILABLE_RETRY_S = 1.0  # Retry-After of a 503 (replicas heal, or the router restores, in about a second)
STATUS = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403,
          "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "RESOURCE_EXHAUSTED": 429, "UNAVAILABLE": 503}
# OpenAI's error types: a client's mistake (4xx) is an invalid_request_error, except a 429 (rate_limit_error, which
# clients and dashboards key retries on); anything of ours (5xx) is a server_error.
RATE_LIMIT_TYPE = "rate_limit_error"


def error_type(status: int) -> str:
    """OpenAI's ``error.type`` for an HTTP status."""
    if status == 429:
        return RATE_LIMIT_TYPE
    return "invalid_request_error" if 400 <= status < 500 else "server_error"


def error_response(status: int, message: str, *, param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    body = {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def _retry_headers(retry_after_s: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(retry_after_s))),
            "retry-after-ms": str(max(1, math.ceil(retry_after_s * 1000)))}


def domain_error_response(exc: DomainError) -> web.Response:
    """The one place mapping the error tree to HTTP (as runtime/errors.py does for gRPC).

    A model error (``SpecError``, ``DoesNotFitError``, the security ``InvalidArgument``) is a bad
    request spec: 400 ``invalid_value``. Any other error answers the status of its code, with
    ``Retry-After`` when a ``ResourceExhausted`` (the per-tenant ``RateLimited`` included) says
    when, or for a 503.
    """
    if isinstance(exc, ModelError):
        return error_response(400, str(exc), param=getattr(exc, "field", None), code="invalid_value")
    headers = None
    status = STATUS.get(exc.code, 500)
    if isinstance(exc, ResourceExhausted) and exc.retry_after_s is not None:
        headers = _retry_headers(exc.retry_after_s)
    elif status == 503:  # chips restarting or the router restoring: worth retrying soon
        headers = _retry_headers(UNAVAILABLE_RETRY_S)
    code = {404: "model_not_found", 429: "rate_limit_exceeded", 401: "invalid_api_key"}.get(status, exc.reason.lower())
    return error_response(status, exc.message, param=getattr(exc, "field", None), code=code, headers=headers)


class _Headers:
    """Quacks like a grpc ServicerContext for BrokerAuth: only the metadata it reads."""

    def __init__(self, authorization: str | None) -> None:
        self._md = (("authorization", authorization),) if authorization else ()

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._md


class OpenAIServer:
    def __init__(self, svc: RouterService | FrontendService) -> None:
        self.svc = svc
        self.runner: web.AppRunner | None = None
        self.port: int | None = None

    def app(self) -> web.Application:
        cfg = self.svc.config
        # aiohttp's parser answers an over-long header with a plain-text 400 before any middleware runs; read
        # headers up to the configured bound so that real clients' long tokens get an OpenAI-shaped answer.
        limits = {"max_line_size": cfg.http_max_header_bytes, "max_field_size": cfg.http_max_header_bytes}
        app = web.Application(client_max_size=cfg.http_max_body_bytes, middlewares=[self._clock, self._errors],
                              handler_args=limits)
        app.router.add_get("/health", self.health)
        app.router.add_get("/ping", self.health)
        app.router.add_post("/ping", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/v1/models/{model:.+}", self.model)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def start(self, host: str, port: int, *, reuse_port: bool = False) -> int:
        """Listen on ``host:port`` (``reuse_port``: beside the router's other front ends, SO_REUSEPORT)."""
        self.runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port, reuse_port=reuse_port or None)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else port
        return self.port

    async def close_listener(self) -> None:
        """Stop accepting connections (new ones go to another front end sharing the port, or are refused); the
        requests in progress go on until :meth:`stop`."""
        if self.runner is not None:
            for site in list(self.runner.sites):
                await site.stop()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    @web.middleware
    async def _clock(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        """In event-clock mode a request is a call of the mesh (runtime/clock.py ``serving``)."""
        cfg = self.svc.config
        with clock.serving(request.headers.get(clock.VT_KEY), request.headers.get(clock.VT_MAC_KEY),
                           (cfg.admin_key, cfg.service_key)):
            return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        structlog.contextvars.clear_contextvars()
        try:
            return await handler(request)
        except DomainError as exc:  # the one tree: model and security errors included
            return domain_error_response(exc)
        except web.HTTPRequestEntityTooLarge as exc:
            return error_response(413, f"request body exceeds {self.svc.config.http_max_body_bytes:,} bytes "
                                       f"(router http_max_body_bytes): {exc.reason}", code="body_too_large")
        except web.HTTPException as exc:  # aiohttp's own: 404 (no such route), 405 (with its Allow header) ...
            allow = exc.headers.get("Allow")
            return error_response(exc.status, f"{exc.reason or 'error'}: {request.method} {request.path[:100]}",
                                  headers={"Allow": allow} if allow else None)
        except Exception:  # a bug, but never a bare text 500
            log.exception("http handler failed", path=request.path[:100])
            return error_response(500, "internal error (logged by the router)")

    async def _principal(self, request: web.Request) -> Any:
        return await self.svc.auth.principal(_Headers(request.headers.get("Authorization")))

    async def _body(self, request: web.Request) -> dict[str, Any]:
        return parse_json_body(await request.read(), self.svc.config.http_max_json_depth)

    async def health(self, request: web.Request) -> web.StreamResponse:
        """vLLM's ``/health`` (and SageMaker's ``/ping``): 200 while the router serves, 503 while it restores.

        No authentication (as vLLM), so it says nothing but the status: an empty body.
        """
        return web.Response(status=200 if self.svc.reconciled.is_set() else 503)

    @staticmethod
    def _model_obj(d: LiveDeployment | RemoteDeployment) -> dict[str, Any]:
        return {"id": d.deployment_id, "object": "model", "created": int(d.created_s), "owned_by": d.tenant,
                "max_model_len": d.cfg.arch.seq_len}

    async def models(self, request: web.Request) -> web.StreamResponse:
        p = await self._principal(request)
        data = [self._model_obj(d) for d in self.svc.owned_by(p) if d.health()[0] in ("ready", "degraded")]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.StreamResponse:
        """One model of ``GET /v1/models`` (404 for another tenant's, or one not serving)."""
        p = await self._principal(request)
        d = self.svc.visible(p, request.match_info["model"])
        if d.health()[0] not in ("ready", "degraded"):
            raise NotFound(f"{d.name} is not serving ({d.health()[0]})")
        return web.json_response(self._model_obj(d))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        p = await self._principal(request)
        body = await self._body(request)
        check_fields(body, "text_completion")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        text: str | None = None
        ids: list[int] | None = None
        if isinstance(prompt, str):
            text = prompt
        elif isinstance(prompt, list) and 4 * len(prompt) > self.svc.config.max_prompt_bytes:
            raise InvalidArgument("prompt", f"{len(prompt):,} token ids exceed the router's max_prompt_bytes "
                                            f"({self.svc.config.max_prompt_bytes:,} at 4 bytes an id)")
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = prompt
        else:
            raise InvalidArgument("prompt", "must be a string or a list of token ids (one prompt per request)")
        return await self._run(request, p, body, "text_completion", text=text, token_ids=ids,
                               max_tokens=int_field(body, "max_tokens"))

    async def chat(self, request: web.Request) -> web.StreamResponse:
        p = await self._principal(request)
        body = await self._body(request)
        check_fields(body, "chat.completion")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidArgument("messages", "must be a non-empty list of {role, content}")
        max_tokens = int_field(body, "max_completion_tokens", "max_tokens")
        return await self._run(request, p, body, "chat.completion", text=render_chat(messages), token_ids=None,
                               max_tokens=max_tokens, open_to_context=True)

    async def _run(self, request: web.Request, p: Any, body: dict[str, Any], kind: str, *, text: str | None,
                   token_ids: list[int] | None, max_tokens: Any, open_to_context: bool = False) -> web.StreamResponse:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise InvalidArgument("model", "required: a deployment id from GET /v1/models")
        priority = int_field(body, "priority") or 0
        rid = body.get("request_id") or ""
        if not isinstance(rid, str):
            raise InvalidArgument("request_id", "must be a string")
        ignore_eos = body.get("ignore_eos")
        if ignore_eos is not None and not isinstance(ignore_eos, bool):
            raise InvalidArgument("ignore_eos", "must be a boolean")
        gen = self.svc.generate(p, model, text=text, token_ids=token_ids, max_tokens=max_tokens, priority=priority,
                                request_id=rid, stop=stop_strings(body), ignore_eos=bool(ignore_eos),
                                open_to_context=open_to_context)
        fmt = _Format(kind, gen, model)
        chunks = gen.chunks().__aiter__()
        try:
            first = await chunks.__anext__()  # a shed request still gets its 429 here
        except BaseException:
            gen.close()
            raise
        try:
            if not body.get("stream"):
                got = [first]
                if not first.finish_reason:
                    got.extend([c async for c in chunks])
                return web.json_response(fmt.whole(got))
            return await self._stream(request, body, fmt, first, chunks)
        finally:
            gen.close()  # a no-op once finished; drops the request if the client went away

    async def _stream(self, request: web.Request, body: dict[str, Any], fmt: _Format, first: Chunk,
                      chunks: Any) -> web.StreamResponse:
        opts = body.get("stream_options") or {}
        include_usage = bool(opts.get("include_usage"))
        fmt.continuous = bool(opts.get("continuous_usage_stats"))  # vLLM's: usage so far on every chunk
        resp = EventStream(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                    "X-Request-Id": fmt.gen.request_id})
        await resp.prepare(request)
        # Events produced together go out in one write: the chat role with the first chunk, the last chunk
        # with the usage event, [DONE] and the end of the chunked body; tokens that piled up while the client was
        # behind are already one chunk (Generation.chunks merges them).
        head = fmt.sse(fmt.chat_role()) if fmt.kind == "chat.completion" else b""
        try:
            c = first
            while not c.finish_reason:
                await resp.write(head + fmt.chunk_sse(c))
                head = b""
                c = await chunks.__anext__()
            out = head + fmt.chunk_sse(c)
            if include_usage:
                out += fmt.sse(fmt.usage_chunk(c))
            await resp.write_eof(out + b"data: [DONE]\n\n")  # one write with the chunked body's terminator
        except DomainError as exc:  # after the headers went out: an error event, then close
            err = json.loads(domain_error_response(exc).text or "{}")
            await resp.write_eof(head + fmt.sse(err))
        return resp


class EventStream(web.StreamResponse):
    """A server-sent-event response whose headers go out with its first event, in one write.

    aiohttp sends a streamed response's headers as soon as it is prepared; its ``Response`` instead buffers them into
    the first body write, through the class attribute below. The router prepares a stream only once its first chunk
    is there, so nothing waits for the headers, and a request costs one ``sendmsg`` fewer (of about six at 16 tokens).
    Should aiohttp drop the attribute, the headers simply go out first again (tests/inference/test_router_api.py
    counts the writes)."""

    _send_headers_immediately = False


class _Format:
    """OpenAI response objects for completions and chat completions."""

    def __init__(self, kind: str, gen: Generation | RemoteGeneration, model: str) -> None:
        self.kind = kind
        self.gen = gen
        self.model = model
        self.id = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + gen.request_id
        self.created = int(time.time())
        self.continuous = False
        self._pre: tuple[str, str] | None = None  # chunk_sse's text around a chunk's fields

    @staticmethod
    def sse(obj: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def usage(self, c: Chunk) -> dict[str, Any]:
        s = c.summary
        if s is None:
            return {}
        # energy_j: an extra field (clients keep unknown usage fields), the request's modelled IT energy.
        return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.output_tokens,
                "total_tokens": s.prompt_tokens + s.output_tokens,
                "prompt_tokens_details": {"cached_tokens": s.cached_tokens}, "energy_j": s.energy_j}

    def extra(self, c: Chunk) -> dict[str, Any]:
        s = c.summary
        out: dict[str, Any] = {"replica": c.replica, "time_s": c.time_s}
        if c.token_times_s:
            out["token_times_s"] = list(c.token_times_s)
        if s is not None:
            out.update(ttft_s=s.ttft_s, queue_s=s.queue_s, e2e_s=s.e2e_s, tpot_s=s.tpot_s,
                       kv_transfer_s=s.kv_transfer_s, kv_transfer_bytes=c.kv_transfer_bytes,
                       prefill_replica=c.prefill_replica)
        return out

    def chat_role(self) -> dict[str, Any]:
        return {**self._head("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}

    def chunk(self, c: Chunk) -> dict[str, Any]:
        fin = c.finish_reason or None
        if self.kind == "chat.completion":
            out = {**self._head("chat.completion.chunk"),
                   "choices": [{"index": 0, "delta": {"content": c.text}, "finish_reason": fin}]}
        else:
            out = {**self._head("text_completion"),
                   "choices": [{"index": 0, "text": c.text, "logprobs": None, "finish_reason": fin}]}
        out["gigacluster"] = {**self.extra(c), "tokens": len(c.token_ids)}  # several when the client was behind
        if self.continuous:
            done = self.gen.generated
            out["usage"] = (self.usage(c) if c.summary is not None else
                            {"prompt_tokens": self.gen.prompt_tokens, "completion_tokens": done,
                             "total_tokens": self.gen.prompt_tokens + done})
        return out

    def chunk_sse(self, c: Chunk) -> bytes:
        """``sse(chunk(c))``; a chunk that is not the last (no usage, no finish) from a pre-rendered head and
        tail around its text, replica, time and token count: the same bytes without building the object."""
        if (c.summary is not None or c.finish_reason or self.continuous or c.token_times_s
                or not math.isfinite(c.time_s)):
            return self.sse(self.chunk(c))
        if self._pre is None:
            obj = "chat.completion.chunk" if self.kind == "chat.completion" else "text_completion"
            head = json.dumps(self._head(obj), separators=(",", ":"))[:-1]
            if self.kind == "chat.completion":
                self._pre = (f'data: {head},"choices":[{{"index":0,"delta":{{"content":',
                             '},"finish_reason":null}],"gigacluster":{"replica":')
            else:
                self._pre = (f'data: {head},"choices":[{{"index":0,"text":',
                             ',"logprobs":null,"finish_reason":null}],"gigacluster":{"replica":')
        a, b = self._pre
        q = _quote  # json.dumps's own string encoder; a finite float is its repr there too
        return f'{a}{q(c.text)}{b}{q(c.replica)},"time_s":{c.time_s!r},"tokens":{len(c.token_ids)}}}}}\n\n'.encode()

    def usage_chunk(self, last: Chunk) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.kind == "chat.completion" else "text_completion"
        return {**self._head(obj), "choices": [], "usage": self.usage(last)}

    def whole(self, chunks: list[Chunk]) -> dict[str, Any]:
        last = chunks[-1]
        text = "".join(c.text for c in chunks)
        if self.kind == "chat.completion":
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": last.finish_reason, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": last.finish_reason}
        return {**self._head(self.kind), "choices": [choice], "usage": self.usage(last),
                "gigacluster": self.extra(last)}
