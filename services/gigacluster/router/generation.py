"""A request's way in and out: bounds and admission of one prompt, then its token chunks as they come."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

import numpy as np
import structlog

from gigacluster.errors import InvalidArgument, ResourceExhausted, Unavailable
from gigacluster.inference.engine import Request, RequestSummary, TokenEvent
from gigacluster.inference.errors import AdmissionError
from gigacluster.inference.outputs import MAX_STOP_SEQUENCES, eos_after, find_stop
from gigacluster.inference.tokenizer import Tokenizer
from gigacluster.model.arch import ModelArch
from gigacluster.router.deployment import LiveDeployment, ReplicaFailed, Stream
from gigacluster.router.overload import Overload
from gigacluster.router.pacing import Pacer
from gigacluster.runtime.auth import Principal
from gigacluster.runtime.clock import EventClock, VirtualClock
from gigacluster.runtime.config import RouterConfig


@dataclasses.dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs twice as much, per chunk
class Chunk:
    """Tokens of one request produced together (one GenerateResponse, one SSE event)."""

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    time_s: float
    replica: str
    finish_reason: str = ""
    summary: RequestSummary | None = None
    prefill_replica: str = ""
    kv_transfer_bytes: float = 0.0
    # Each token's virtual time when they differ (the event clock's later messages); empty: all at time_s.
    token_times_s: tuple[float, ...] = ()


class Generation:
    """A routed request: iterate :meth:`chunks` for its tokens. Used by gRPC Generate and the HTTP API.

    ``stop_chars`` (when a stop string ends the output) cuts the text there: the tokens that make
    up the stop string are generated and counted, their text is not returned (as OpenAI's).
    """

    def __init__(self, dep: LiveDeployment, stream: Stream, tok: Tokenizer, prompt_tokens: int,
                 stop_chars: int | None = None, release: Callable[[], None] = lambda: None,
                 pacer: Pacer | None = None) -> None:
        self.dep = dep
        stream.queue.pacer = pacer
        self.stamped = pacer is not None and pacer.stamped  # the event clock: each token's time on the wire
        self._release = release  # gives back the router-wide stream slot (idempotent)
        self.stream = stream
        self.tok = tok
        self.request_id = stream.req.id
        self.prompt_tokens = prompt_tokens
        self.stop_chars = stop_chars
        self.done = False
        self._chars = 0  # characters of text returned so far
        self.generated = 0  # tokens returned so far

    async def chunks(self) -> AsyncIterator[Chunk]:
        """Token chunks until the last; raises ResourceExhausted (shed) or Unavailable (chips failed)."""
        st = self.stream
        try:
            while not self.done:
                yield self.take(await st.queue.take())  # everything pending, paced (router/pacing.py)
        finally:
            self._release()
            if not self.done:
                st.close()

    def take(self, batch: Sequence[TokenEvent | Exception]) -> Chunk:
        """The chunk of events of this request taken together (tokens, or the error that ended it, raised as a
        domain error: ResourceExhausted when shed, Unavailable when its chips failed)."""
        st, dep = self.stream, self.dep
        errs = [e for e in batch if isinstance(e, Exception)]
        if errs:
            if isinstance(errs[0], AdmissionError):
                raise ResourceExhausted(f"shed by a higher-priority request: {errs[0]}",
                                        retry_after_s=errs[0].retry_after_s)
            raise Unavailable(str(errs[0]))
        toks = [e for e in batch if not isinstance(e, Exception)]
        last = toks[-1]
        done = self.done = last.finished
        ids = [t.token_id for t in toks]
        text = self.tok.decode(ids)
        times = tuple(t.time_s for t in toks) if self.stamped and toks[0].time_s != last.time_s else ()
        if self.stop_chars is not None:
            text = text[: max(0, self.stop_chars - self._chars)]
        self._chars += len(text)
        self.generated += len(ids)
        return Chunk(
            request_id=self.request_id, index=toks[0].index, token_ids=ids, text=text,
            time_s=last.time_s, replica=f"{dep.name}/replicas/{st.owner.index}",
            finish_reason=(last.finish_reason or "length") if done else "",
            summary=last.summary if done else None,
            prefill_replica=f"{dep.name}/replicas/{st.prefill_replica}" if st.prefill_replica >= 0 else "",
            kv_transfer_bytes=st.kv_transfer_bytes, token_times_s=times)

    def close(self) -> None:
        """Drop the request if it has not finished (the client went away)."""
        self._release()
        if not self.done:
            self.stream.close()



class Admission:
    """Bounds, validates, routes and admits requests to the deployments ``find`` names (gRPC and HTTP alike)."""

    def __init__(self, config: RouterConfig, clock: VirtualClock,
                 find: Callable[[Principal, str], LiveDeployment]) -> None:
        self.config = config
        self.overload = Overload(config.max_streams, config.max_loop_lag_s, config.overload_retry_after_s,
                                 accept_target_s=config.accept_target_s)
        # Pacing is off on the event clock: its clients read each token's virtual time, not the wire's.
        self.pacer = Pacer(clock, lambda: self.overload.open,
                           0.0 if isinstance(clock, EventClock) else config.stream_messages_per_s,
                           config.stream_max_hold_s, config.coalesce_lag_s, config.coalesce_hold_s,
                           stamped=isinstance(clock, EventClock))
        self.clock = clock
        self.find = find
        self._tokenizers: dict[int, Tokenizer] = {}

    def tokenizer(self, vocab: int) -> Tokenizer:
        if vocab not in self._tokenizers:
            self._tokenizers[vocab] = Tokenizer(vocab)
        return self._tokenizers[vocab]

    def _check_prompt(self, arch: ModelArch, text: str | None, token_ids: Sequence[int] | None) -> None:
        """The prompt's size, before it is tokenised (or its ids scanned)."""
        c = self.config
        if text is not None:
            # len(text) <= bytes <= 4 * len(text): the exact count only when it can matter.
            n_bytes = len(text) if len(text) > c.max_prompt_bytes else len(text.encode("utf-8", "surrogatepass"))
            if n_bytes > c.max_prompt_bytes:
                raise InvalidArgument("prompt", f"{n_bytes:,}+ bytes exceeds the router's max_prompt_bytes "
                                                f"({c.max_prompt_bytes:,})", limit="max_prompt_bytes")
            if not text:
                raise InvalidArgument("text", "must not be empty")
        elif token_ids is not None:
            if 4 * len(token_ids) > c.max_prompt_bytes or len(token_ids) > arch.seq_len:
                raise InvalidArgument("token_ids", f"{len(token_ids):,} ids exceed the model's context "
                                                   f"({arch.seq_len}) or max_prompt_bytes ({c.max_prompt_bytes:,} "
                                                   "at 4 bytes an id)", limit="max_prompt_bytes")
            if not token_ids:
                raise InvalidArgument("token_ids", "must hold at least one token")
        else:
            raise InvalidArgument("prompt", "give text or token_ids")

    def _check_options(self, max_tokens: int | None, priority: int, request_id: str, stop: Sequence[str]) -> str:
        """``max_tokens``, ``priority``, the request id (drawn when empty) and ``stop``; returns the id."""
        c = self.config
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 0 < max_tokens <= c.max_tokens_limit:
            raise InvalidArgument("max_tokens", f"must be an integer in [1, {c.max_tokens_limit}], "
                                                f"got {str(max_tokens)[:32]}")
        if abs(priority) > 1000:
            raise InvalidArgument("priority", f"must be in [-1000, 1000], got {priority}")
        rid = request_id or uuid.uuid4().hex[:16]
        if len(rid) > 128:
            raise InvalidArgument("request_id", "at most 128 characters")
        if len(stop) > MAX_STOP_SEQUENCES or not all(isinstance(x, str) and x for x in stop):
            raise InvalidArgument("stop", f"must be up to {MAX_STOP_SEQUENCES} non-empty strings")
        return rid

    @staticmethod
    def _encode(tok: Tokenizer, arch: ModelArch, text: str | None, token_ids: Sequence[int] | None) -> np.ndarray:
        if text is not None:
            return np.asarray(tok.encode(text), dtype=np.int64)
        try:
            prompt = np.asarray(token_ids, dtype=np.int64)
        except (OverflowError, TypeError, ValueError) as exc:
            raise InvalidArgument("token_ids", f"ids must be integers in [0, {arch.vocab}) (the vocab)") from exc
        bad = (prompt < 0) | (prompt >= arch.vocab)
        if bad.any():
            raise InvalidArgument("token_ids", f"ids must be in [0, {arch.vocab}) (the vocab), "
                                               f"got {int(prompt[bad][0])}")
        return prompt

    def generate(self, p: Principal, model: str, *, text: str | None = None, token_ids: Sequence[int] | None = None,
                 max_tokens: int | None = None, priority: int = 0, request_id: str = "",
                 stop: Sequence[str] = (), ignore_eos: bool = False, open_to_context: bool = False) -> Generation:
        """Bound, validate, route and admit one request (raises domain errors); the caller iterates its chunks.

        Every size is checked before any work: the prompt's bytes before it is tokenised (or its ids
        scanned), ``max_tokens`` against ``max_tokens_limit``. ``max_tokens`` None means the client
        set no limit: the output ends at an end-of-sequence drawn by :func:`outputs.eos_after`
        (unless ``ignore_eos``), capped by ``default_max_tokens`` or, with ``open_to_context``
        (chat, as vLLM), by the context left after the prompt (at most ``max_tokens_limit``).
        A ``stop`` string found in the output's text ends it there (finish_reason "stop").
        """
        dep = self.find(p, model)
        release = self.overload.admit()  # before any work on the prompt
        try:
            return self._generate(p, dep, text=text, token_ids=token_ids, max_tokens=max_tokens, priority=priority,
                                  request_id=request_id, stop=stop, ignore_eos=ignore_eos,
                                  open_to_context=open_to_context, release=release)
        except BaseException:
            release()
            raise

    def _generate(self, p: Principal, dep: LiveDeployment, *, text: str | None, token_ids: Sequence[int] | None,
                  max_tokens: int | None, priority: int, request_id: str, stop: Sequence[str], ignore_eos: bool,
                  open_to_context: bool, release: Callable[[], None]) -> Generation:
        c = self.config
        state, reason = dep.health()
        if state not in ("ready", "degraded"):
            raise Unavailable(f"{dep.name} is {state}{': ' + reason if reason else ''}; retry")
        arch = dep.cfg.arch
        self._check_prompt(arch, text, token_ids)
        open_ended = max_tokens is None
        if max_tokens is None:
            max_tokens = c.default_max_tokens
        rid = self._check_options(max_tokens, priority, request_id, stop)
        tok = self.tokenizer(arch.vocab)
        prompt = self._encode(tok, arch, text, token_ids)
        if open_ended and open_to_context:
            max_tokens = max(1, min(c.max_tokens_limit, arch.seq_len - len(prompt)))
        if len(prompt) + max_tokens > arch.seq_len:
            raise InvalidArgument("max_tokens", f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) "
                                                f"exceeds the model's context of {arch.seq_len}")
        structlog.contextvars.bind_contextvars(request_id=rid)
        now = self.clock.now()
        # The prefix cache is salted with the CALLER, not the owner: the admin (or a service)
        # sending a tenant's prompt to its deployment never hits the tenant's cached blocks.
        salt = p.tenant if p.kind == "tenant" else f"principal:{p.kind}"
        eos = eos_after(rid) if open_ended and not ignore_eos else 0
        cut = find_stop(tok, rid, min(max_tokens, eos or max_tokens), stop)
        if cut is not None:
            eos = cut.tokens
        req = Request(id=rid, prompt_tokens=prompt, max_tokens=int(max_tokens), priority=int(priority),
                      arrival_s=now, tenant=dep.tenant, cache_salt=salt, eos_after=eos)
        try:
            _, stream = dep.route(req, now)
        except AdmissionError as exc:
            raise ResourceExhausted(f"{dep.name} is saturated: {exc}", retry_after_s=exc.retry_after_s) from exc
        except ReplicaFailed as exc:
            raise Unavailable(str(exc)) from exc
        return Generation(dep, stream, tok, len(prompt), cut.chars if cut is not None else None, release,
                          self.pacer)
