"""What goes into a replica engine and what comes out: the request, its handoff between replicas,
its summary, the tokens and iterations the engine produces, the engine's statistics, and the
per-request state (:class:`Seq`) that survives preemption.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from gigacluster.inference.hashing import block_hashes, stable_u64
from gigacluster.model import SpecError
from gigacluster.model.roofline import Work


@dataclasses.dataclass(frozen=True)
class Handoff:
    """What a decode replica receives with a request whose prompt was computed elsewhere.

    The prompt's KV cache arrived at ``first_token_s`` (the end of its transfer), with the first
    output token ``first_token_id``; the other fields carry the prefill side's timings into the
    request's summary.
    """

    first_token_id: int
    first_scheduled_s: float
    first_token_s: float
    cached_tokens: int = 0
    kv_transfer_s: float = 0.0
    energy_j: float = 0.0  # the prefill side's share of its batch iterations


@dataclasses.dataclass(eq=False)
class Request:
    """A generation request. ``prompt_tokens`` are token ids (a list or an int numpy array).

    ``handoff`` is set on requests sent to a ``decode`` replica (see :class:`Handoff`).
    """

    id: str
    prompt_tokens: Sequence[int] | np.ndarray
    max_tokens: int
    priority: int = 0
    arrival_s: float = 0.0
    tenant: str = ""
    handoff: Handoff | None = None
    # Prefix-cache salt (vLLM's cache_salt): blocks are shared only between requests with equal salts.
    # Empty = the tenant. The router salts with the caller, so not even the admin can probe a tenant's cache.
    cache_salt: str = ""
    # The output ends with an end-of-sequence after this many tokens (finish_reason "stop") unless
    # max_tokens ends it first ("length"); 0 = no end-of-sequence (every request runs to max_tokens).
    eos_after: int = 0
    _hash_cache: dict[int, list[int]] = dataclasses.field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise SpecError("id", "must be a non-empty string")
        if len(self.prompt_tokens) < 1:
            raise SpecError("prompt_tokens", "must hold at least one token")
        if not isinstance(self.max_tokens, int | np.integer) or self.max_tokens < 1:
            raise SpecError("max_tokens", f"must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.priority, int | np.integer):
            raise SpecError("priority", f"must be an integer, got {self.priority!r}")
        if not isinstance(self.eos_after, int | np.integer) or self.eos_after < 0:
            raise SpecError("eos_after", f"must be an integer >= 0, got {self.eos_after!r}")

    def block_hashes(self, block_size: int) -> list[int]:
        """Chained hashes of the full prompt blocks, salted by tenant (computed once per size)."""
        h = self._hash_cache.get(block_size)
        if h is None:
            h = block_hashes(self.prompt_tokens, block_size, salt=self.cache_salt or self.tenant)
            self._hash_cache[block_size] = h
        return h


@dataclasses.dataclass(frozen=True)
class RequestSummary:
    """Timings and counts of a finished request (carried by its last TokenEvent)."""

    request_id: str
    tenant: str
    priority: int
    arrival_s: float
    first_scheduled_s: float
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int
    preemptions: int
    finish_reason: str
    kv_transfer_s: float = 0.0
    # IT energy of the request's share of every batch iteration it took part in (see iteration_energy_j).
    energy_j: float = 0.0

    @property
    def queue_s(self) -> float:
        return self.first_scheduled_s - self.arrival_s

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 for one-token outputs)."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


@dataclasses.dataclass(frozen=True, slots=True)
class TokenEvent:
    """One generated token. ``index`` counts from 0; the last event has ``finished`` and a summary."""

    request_id: str
    index: int
    token_id: int
    time_s: float
    finished: bool
    finish_reason: str = ""
    summary: RequestSummary | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class Iteration:
    """One scheduled batch. ``work`` is per shard; every chip of the replica runs it.

    ``predicted_s = compute_s + comm_s + host_s``: ``compute_s`` is ``works_time_s(chip, work)``;
    ``comm_s`` the ring all-reduce of ``allreduce_bytes`` over the scale-up link (0 when tp = 1);
    ``host_s`` the engine's fixed host time per iteration (scheduling, sampling, launch; catalog
    ``serving.iteration_overhead_s``).
    """

    seq: int
    start_s: float
    work: tuple[Work, ...]
    predicted_s: float
    compute_s: float
    comm_s: float
    allreduce_bytes: float
    prefill_tokens: int
    decode_tokens: int
    request_ids: tuple[str, ...]
    slots: np.ndarray
    new_tokens: np.ndarray
    epochs: np.ndarray
    host_s: float = 0.0


@dataclasses.dataclass(frozen=True, eq=False)
class CompletionBatch:
    """The tokens of one completed iteration, as arrays (the simulator's fast path)."""

    time_s: float
    request_ids: tuple[str, ...]
    indices: np.ndarray
    token_ids: np.ndarray
    finished: np.ndarray
    itl_s: np.ndarray  # gap since the request's previous token; NaN for a first token
    summaries: tuple[RequestSummary, ...]

    def events(self) -> list[TokenEvent]:
        by_id = {s.request_id: s for s in self.summaries}
        out = []
        for rid, idx, tok, fin in zip(
            self.request_ids, self.indices.tolist(), self.token_ids.tolist(), self.finished.tolist(), strict=True
        ):
            summ = by_id.get(rid) if fin else None
            out.append(TokenEvent(rid, idx, tok, self.time_s, fin, summ.finish_reason if summ else "", summ))
        return out


@dataclasses.dataclass(frozen=True)
class ReplicaStats:
    """What a replica reports to the router and to metrics."""

    queue_depth: int
    running: int
    kv_used_frac: float
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_cached: int
    prefix_hit_tokens: int
    prefix_lookup_tokens: int
    outstanding_requests: int
    outstanding_tokens: int
    preemptions: int
    rejected: int
    shed: int
    finished: int
    iterations: int

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_lookup_tokens if self.prefix_lookup_tokens else 0.0


class Seq:
    """Per-request state that survives preemption."""

    __slots__ = ("cached", "energy_j", "first_sched_s", "first_tok_s", "gen", "hashes", "held", "kv_ready",
                 "last_tok_s", "matched", "max_out", "order", "preemptions", "prompt_len", "registered", "req",
                 "seed")

    def __init__(self, req: Request, order: int, *, max_out: int) -> None:
        self.req = req
        self.order = order
        self.prompt_len = len(req.prompt_tokens)
        self.max_out = max_out
        self.gen = 0
        self.hashes: list[int] | None = None
        self.held: list[int] = []
        self.matched = 0
        self.registered = False
        self.cached = 0
        self.preemptions = 0
        self.first_sched_s = math.nan
        self.first_tok_s = math.nan
        self.last_tok_s = math.nan
        self.seed = stable_u64(req.id)
        self.energy_j = 0.0
        h = req.handoff
        # A handed-off sequence arrives with its prompt's KV and its first token.
        self.kv_ready = h is not None
        if h is not None:
            self.gen = 1
            self.cached = h.cached_tokens
            self.first_sched_s = h.first_scheduled_s
            self.first_tok_s = self.last_tok_s = h.first_token_s
            self.energy_j = h.energy_j

    def prefill_tokens(self) -> int:
        """Tokens to (re)compute when started: the prompt plus any output before a preemption."""
        return 0 if self.kv_ready else self.prompt_len + self.gen

    def out_tokens(self) -> int:
        return self.max_out - self.gen

    def summary(self, end_s: float, finish_reason: str) -> RequestSummary:
        """The finished request's summary, as it ended at ``end_s`` for ``finish_reason``."""
        req = self.req
        return RequestSummary(
            request_id=req.id, tenant=req.tenant, priority=int(req.priority),
            arrival_s=float(req.arrival_s), first_scheduled_s=self.first_sched_s,
            first_token_s=self.first_tok_s, finish_s=end_s, prompt_tokens=self.prompt_len,
            output_tokens=self.gen, cached_tokens=self.cached, preemptions=self.preemptions,
            finish_reason=finish_reason,
            kv_transfer_s=req.handoff.kv_transfer_s if req.handoff is not None else 0.0,
            energy_j=self.energy_j,
        )
