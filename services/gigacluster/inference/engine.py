"""A replica engine: continuous batching over a paged KV cache, as vLLM schedules it.

One :class:`ReplicaEngine` is one model replica (``tp`` chips), driven from outside, in real time by the router
service or in virtual time by :mod:`.sim`:

1. :meth:`ReplicaEngine.admit` queues a :class:`Request` (bounded; may raise ``AdmissionError``);
2. :meth:`ReplicaEngine.next_iteration` picks the next batch and returns an :class:`Iteration`
   whose ``work`` (per shard) the caller runs, e.g. on the chip services, for ``predicted_s``;
3. :meth:`ReplicaEngine.complete` applies it and returns the tokens it produced.

Scheduling follows vLLM. Without chunked prefill (vLLM v0), a waiting request is started as soon as a batch slot and
KV blocks for its whole prompt are free, and prefill iterations take priority over decode. With chunked prefill
(Sarathi / vLLM v1), every iteration has a token budget of ``max_prefill_tokens``: running decodes first (one token
each), then the next chunks of prompts, then new prompts, each holding KV blocks for its scheduled tokens only (v1 has
no watermark and admits nobody in a step that preempted). A decode or chunk that needs a KV block when none is free
preempts the lowest-priority, most recently started sequence, which gives up its blocks and is recomputed later
(vLLM's recompute mode): a request preempted before its first token waits again. Prefix caching: full prompt blocks
are hashed (chained, salted by tenant) and reused while cached. ``num_scheduler_steps`` > 1 is v0's multi-step
scheduling, ``async_output`` v0.6's output lag (:mod:`.multistep`).

Disaggregated serving (NVIDIA Dynamo, vLLM's disaggregated prefill) splits the two phases across replicas by
``ReplicaConfig.role``: a ``prefill`` engine computes the prompt and samples the first token, then finishes the request
with ``finish_reason="prefilled"`` and HOLDS its KV blocks until the caller has sent them elsewhere
(:meth:`ReplicaEngine.release_kv`); a ``decode`` engine takes requests that carry a :class:`Handoff` (their KV cache
and first token arrived from a prefill replica) and only decodes them. A preempted handed-off sequence is recomputed
locally. The request types live in :mod:`.request`, the configuration in :mod:`.config`, the waiting queue in
:mod:`.waiting`.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from gigacluster.inference import cost
from gigacluster.inference.config import FIRST_WORD_TOKEN, ROLES, WATERMARK_FRAC, ReplicaConfig
from gigacluster.inference.cost import iteration_energy_j, iteration_time_s, iteration_work, queue_wait_s
from gigacluster.inference.errors import AdmissionError, EngineStateError
from gigacluster.inference.hashing import token_ids
from gigacluster.inference.kvcache import BlockPool
from gigacluster.inference.multistep import StepGroups
from gigacluster.inference.request import (
    CompletionBatch,
    Handoff,
    Iteration,
    ReplicaStats,
    Request,
    RequestSummary,
    Seq,
    TokenEvent,
)
from gigacluster.inference.waiting import WaitingQueue
from gigacluster.model import SpecError

__all__ = ["FIRST_WORD_TOKEN", "ROLES", "WATERMARK_FRAC", "CompletionBatch", "Handoff", "Iteration", "ReplicaConfig",
           "ReplicaEngine", "ReplicaStats", "Request", "RequestSummary", "TokenEvent"]


class ReplicaEngine:
    """Continuous batching for one replica (see the module docstring). Not thread-safe.

    ``model_energy=False`` books no energy to requests unless :meth:`complete` is given it (the
    offline simulator, which reports none, saves the power model's cost on every iteration).
    """

    def __init__(self, cfg: ReplicaConfig, *, model_energy: bool = True) -> None:
        self.cfg = cfg
        self.model_energy = model_energy
        self._chip = cfg.chip_spec
        self._shape = cfg.shard
        self._pool = BlockPool(cfg.kv_blocks)
        self._watermark = int(WATERMARK_FRAC * cfg.kv_blocks)
        n = cfg.max_batch
        self._seqs: list[Seq | None] = [None] * n
        self._free_slots = list(range(n - 1, -1, -1))
        self._active = np.zeros(n, dtype=bool)
        self._epoch = np.zeros(n, dtype=np.int64)
        self._computed = np.zeros(n, dtype=np.int64)
        self._length = np.zeros(n, dtype=np.int64)
        self._gen = np.zeros(n, dtype=np.int64)
        self._max = np.zeros(n, dtype=np.int64)
        self._blocks = np.zeros(n, dtype=np.int64)  # all blocks held (shared + private)
        self._private = np.zeros(n, dtype=np.int64)
        self._prio = np.zeros(n, dtype=np.int64)
        self._order = np.zeros(n, dtype=np.int64)
        self._seed = np.zeros(n, dtype=np.uint64)
        self._last_tok = np.zeros(n, dtype=np.float64)
        self._eos = np.zeros(n, dtype=np.int64)  # end-of-sequence output length (0 = none)
        self._energy = np.zeros(n, dtype=np.float64)  # joules booked to the slot's request so far
        self._queue = WaitingQueue()
        self._by_id: dict[str, Seq] = {}
        self._slot_of: dict[str, int] = {}
        # prefill role: KV blocks of finished prompts, held until sent (request id -> (shared, private))
        self._held_kv: dict[str, tuple[list[int], int]] = {}
        self._shed: deque[tuple[Request, AdmissionError]] = deque(maxlen=max(1, cfg.max_queue))
        self._inflight: Iteration | None = None
        self._iter_seq = self._order_seq = self._version = 0  # _version: bumped by every call that changes stats()
        self._stats: tuple[int, ReplicaStats] | None = None  # routing_stats() at a _version
        self._retry_cache: tuple[tuple[int, int, int] | None, float] = (None, 0.0)
        self._preemptions = self._rejected = self._shed_count = self._finished = 0
        self._tok_high = max(FIRST_WORD_TOKEN + 1, cfg.arch.vocab)
        self._groups = StepGroups(cfg.num_scheduler_steps, lag=cfg.async_output)

    # ----------------------------------------------------------------------------- admission
    def admit(self, req: Request, now_s: float) -> None:
        """Queue ``req``; raise ``AdmissionError`` with a retry-after estimate when the queue is full.

        A full queue sheds its lowest-priority, newest entry to make room for a higher-priority
        arrival; the shed request is returned by :meth:`drain_shed`. A handed-off request (its
        prefill is done, its KV is here) is never refused: the prefill side's bounded queues
        bound how many arrive.
        """
        cfg = self.cfg
        self._version += 1
        if req.id in self._by_id or req.id in self._held_kv:
            raise SpecError("id", f"request {req.id!r} is already on this replica")
        if (req.handoff is not None) != (cfg.role == "decode"):
            raise SpecError("handoff", f"a {cfg.role} replica takes "
                                       f"{'only' if cfg.role == 'decode' else 'no'} handed-off requests")
        p = len(req.prompt_tokens)
        if p + req.max_tokens > cfg.arch.seq_len:
            raise SpecError(
                "max_tokens",
                f"prompt ({p}) + max_tokens ({req.max_tokens}) exceeds the model's context of "
                f"{cfg.arch.seq_len} tokens",
            )
        if self._queue.count >= cfg.max_queue and req.handoff is None:
            victim = self._queue.shed_candidate(req.priority)
            if victim is None:
                self._rejected += 1
                raise AdmissionError(self.retry_after_s(), reason="queue_full",
                                     detail=f"queue holds {self._queue.count} of {cfg.max_queue}")
            self._queue.remove(victim)
            del self._by_id[victim.req.id]
            self._shed_count += 1
            self._shed.append((victim.req, AdmissionError(self.retry_after_s(), reason="shed",
                                                          detail=f"priority {victim.req.priority} shed")))
        seq = Seq(req, self._order_seq, max_out=1 if cfg.role == "prefill" else int(req.max_tokens))
        self._order_seq += 1
        self._by_id[req.id] = seq
        self._queue.push(seq, front=False)

    def drain_shed(self) -> list[tuple[Request, AdmissionError]]:
        """Requests evicted from the queue since the last call (bounded to ``max_queue``)."""
        out = list(self._shed)
        self._shed.clear()
        return out

    def retry_after_s(self) -> float:
        """Estimated seconds until the work ahead of a new arrival has been served.

        Model-based, from the same roofline as the iterations: prefill of the queued prompts at
        the token budget, plus decode of everything outstanding in waves of ``max_batch``
        sequences, each wave as long as the mean remaining output.
        """
        act = self._active
        running = self.cfg.max_batch - len(self._free_slots)
        n = self._queue.count + running
        if n == 0:
            return 0.0
        key = (self._iter_seq, self._queue.count, running)
        if self._retry_cache[0] == key:
            return self._retry_cache[1]  # unchanged state: a saturated replica rejects cheaply
        out = self._queue.out_tokens + int((self._max - self._gen)[act].sum())
        ctx = (self._queue.prompt_tokens + int(self._length[act].sum())) / n
        est = queue_wait_s(self._chip, self._shape, self.cfg, self._queue.prompt_tokens, out, ctx, n)
        self._retry_cache = (key, est)
        return est

    # ----------------------------------------------------------------------------- scheduling
    def ready_since_s(self) -> float:
        """Earliest virtual time the next iteration may start, given what is queued now.

        ``-inf`` when only running sequences are left (continuous batching starts the next iteration
        as the last one ends); with requests waiting, the latest of their arrivals (for a handed-off
        request, when its KV cache landed), so no request joins an iteration that began before it
        arrived; ``inf`` when idle. A live driver starts at ``max(end of the last iteration,
        min(now, ready_since_s()))``, so its own wake-up latency does not stretch virtual time.
        """
        t = self._queue.latest_ready_s()
        if t == -math.inf and not self._active.any():
            return math.inf
        return t

    def next_iteration(self, now_s: float) -> Iteration | None:
        """Schedule the next batch, or None when there is nothing to run."""
        if self._inflight is not None:
            raise EngineStateError("an iteration is already in flight; call complete() first")
        self._version += 1
        sched = self._schedule_chunked(now_s) if self.cfg.chunked_prefill else self._schedule_plain(now_s)
        if not sched:
            return None
        slots = np.fromiter(sched.keys(), dtype=np.int64, count=len(sched))
        new = np.fromiter(sched.values(), dtype=np.int64, count=len(sched))
        it = self._build(now_s, slots, new, scheduler_call=self._groups.at_boundary)
        self._groups.scheduled(decode_only=it.prefill_tokens == 0)
        self._inflight = it
        return it

    def _schedule_plain(self, now_s: float) -> dict[int, int]:
        started = (self._start_waiting(now_s, self.cfg.max_prefill_tokens, require_all_prompt=True)
                   if self._groups.at_boundary else {})
        if started and any(int(self._length[s] - self._computed[s]) > 1 for s in started):
            return started  # a prefill iteration (handed-off arrivals ride along as decodes)
        # All running sequences are fully prefilled: one decode token each.
        return self._grow_for_decode(dict.fromkeys(np.flatnonzero(self._active).tolist(), 1))

    def _schedule_chunked(self, now_s: float) -> dict[int, int]:
        budget = self.cfg.max_prefill_tokens
        act = np.flatnonzero(self._active)
        remaining = self._length[act] - self._computed[act]
        # Decodes first (remaining 1), then partial prefills in start order.
        order = np.lexsort((self._order[act], remaining > 1))
        plan: dict[int, int] = {}
        for i in order.tolist():
            if budget <= 0:
                break
            n = min(int(remaining[i]), budget)
            plan[int(act[i])] = n
            budget -= n
        before = self._preemptions
        plan = self._grow_for_decode(plan)
        budget = self.cfg.max_prefill_tokens - sum(plan.values())
        if budget > 0 and self._preemptions == before:  # vLLM v1: no admission in a step that preempted
            plan.update(self._start_waiting(now_s, budget, require_all_prompt=False))
        return plan

    def _grow_for_decode(self, plan: dict[int, int]) -> dict[int, int]:
        """Allocate the KV blocks the planned tokens need, preempting sequences when short."""
        if not plan:
            return plan
        bs = self.cfg.block_size
        while plan:
            slots = np.fromiter(plan.keys(), dtype=np.int64, count=len(plan))
            n = np.fromiter(plan.values(), dtype=np.int64, count=len(plan))
            need = np.maximum(0, -(-(self._computed[slots] + n) // bs) - self._blocks[slots])
            total = int(need.sum())
            if total <= self._pool.available:
                if total:
                    self._pool.allocate(total)
                    self._blocks[slots] += need
                    self._private[slots] += need
                return plan
            victim = self._victim()
            self._preempt(victim)
            plan.pop(victim, None)
        return plan

    def _victim(self) -> int:
        act = np.flatnonzero(self._active)
        # Lowest priority first, then the most recently started (largest order).
        key = np.lexsort((-self._order[act], self._prio[act]))
        return int(act[key[0]])

    def _preempt(self, slot: int) -> None:
        seq = self._seqs[slot]
        assert seq is not None
        self._release_slot(slot)
        seq.preemptions += 1
        seq.registered = False
        seq.kv_ready = False  # recomputed here from its prompt and output (vLLM's recompute mode)
        self._preemptions += 1
        self._queue.push(seq, front=True)

    def _start_waiting(self, now_s: float, budget: int, *, require_all_prompt: bool) -> dict[int, int]:
        """Move waiting requests into the batch while slots, blocks and the token budget allow."""
        out: dict[int, int] = {}
        pool, bs = self._pool, self.cfg.block_size
        while self._free_slots and budget > 0:
            seq = self._queue.peek()
            if seq is None:
                break
            if seq.kv_ready:
                slot = self._start_handed_off(seq)
                if slot is None:
                    break
                out[slot] = 1
                budget -= 1
                continue
            if seq.hashes is None:
                seq.hashes = seq.req.block_hashes(bs)
            total = seq.prompt_len + seq.gen
            max_match = min(len(seq.hashes), (total - 1) // bs)
            matched = pool.match(seq.hashes, max_match)
            new_tokens = total - matched * bs
            if require_all_prompt and new_tokens > budget and out:
                break
            # v0 reserves the whole prompt above a watermark; v1 (chunked) only the chunk's blocks.
            n = new_tokens if require_all_prompt else min(new_tokens, budget)
            n_blocks = -(-(total if require_all_prompt else matched * bs + n) // bs)
            n_private = n_blocks - matched
            reserve = self._watermark if self._active.any() and require_all_prompt else 0
            if pool.available - n_private < reserve or not pool.acquire(seq.hashes[:matched], n_private):
                break
            self._queue.pop()
            pool.lookup_tokens += seq.prompt_len
            pool.hit_tokens += matched * bs
            seq.matched = matched
            seq.held = list(seq.hashes[:matched])
            seq.cached = max(seq.cached, matched * bs)
            if math.isnan(seq.first_sched_s):
                seq.first_sched_s = now_s
            slot = self._seat(seq, computed=matched * bs, length=total, blocks=n_blocks, private=n_private)
            out[slot] = n
            budget -= n
        return out

    def _start_handed_off(self, seq: Seq) -> int | None:
        """Put a sequence whose prompt KV arrived from a prefill replica into the batch (decode only)."""
        bs = self.cfg.block_size
        total = seq.prompt_len + seq.gen
        n_blocks = -(-total // bs)
        reserve = self._watermark if self._active.any() else 0
        if self._pool.available - n_blocks < reserve or not self._pool.acquire([], n_blocks):
            return None
        self._queue.pop()
        seq.registered = True  # its blocks are not entered in this replica's prefix cache
        # The first token's K and V are computed by the next decode step.
        return self._seat(seq, computed=total - 1, length=total, blocks=n_blocks, private=n_blocks)

    def _seat(self, seq: Seq, *, computed: int, length: int, blocks: int, private: int) -> int:
        """Put ``seq`` in a free batch slot with ``computed`` of its ``length`` tokens' KV in place; the slot."""
        slot = self._free_slots.pop()
        self._seqs[slot] = seq
        self._slot_of[seq.req.id] = slot
        self._active[slot] = True
        self._epoch[slot] += 1
        self._computed[slot] = computed
        self._length[slot] = length
        self._gen[slot] = seq.gen
        self._max[slot] = seq.max_out
        self._blocks[slot] = blocks
        self._private[slot] = private
        self._prio[slot] = seq.req.priority
        self._order[slot] = self._order_seq
        self._order_seq += 1
        self._seed[slot] = seq.seed
        self._last_tok[slot] = seq.last_tok_s
        self._eos[slot] = seq.req.eos_after
        self._energy[slot] = seq.energy_j
        return slot

    def _release_slot(self, slot: int, *, keep_kv: bool = False) -> None:
        seq = self._seqs[slot]
        assert seq is not None
        if keep_kv:
            self._held_kv[seq.req.id] = (seq.held, int(self._private[slot]))
        else:
            self._pool.release(seq.held, int(self._private[slot]))
        seq.held = []
        seq.gen = int(self._gen[slot])
        seq.last_tok_s = float(self._last_tok[slot])
        seq.energy_j = float(self._energy[slot])
        self._energy[slot] = 0.0
        self._seqs[slot] = None
        del self._slot_of[seq.req.id]
        self._active[slot] = False
        self._epoch[slot] += 1
        self._blocks[slot] = 0
        self._private[slot] = 0
        self._free_slots.append(slot)

    def _build(self, now_s: float, slots: np.ndarray, new: np.ndarray, *, scheduler_call: bool = True) -> Iteration:
        c = self._computed[slots]
        work, prefill_tokens, decode_seqs = iteration_work(self._shape, c, self._length[slots], new)
        compute_s, comm_s, ar = iteration_time_s(self._chip, self._shape, self.cfg.tp, work,
                                                 prefill_tokens + decode_seqs)
        self._iter_seq, host_s = self._iter_seq + 1, cost.iteration_host_s(self.cfg, slots.size, scheduler_call)
        ids = tuple(self._seqs[s].req.id for s in slots.tolist())  # type: ignore[union-attr]
        return Iteration(
            seq=self._iter_seq, start_s=now_s, work=work, predicted_s=compute_s + comm_s + host_s,
            compute_s=compute_s, comm_s=comm_s, allreduce_bytes=ar, prefill_tokens=prefill_tokens,
            decode_tokens=decode_seqs, request_ids=ids, slots=slots, new_tokens=new,
            epochs=self._epoch[slots].copy(), host_s=host_s,
        )

    # ----------------------------------------------------------------------------- completion
    def iteration_energy_j(self, it: Iteration, *, duration_s: float | None = None,
                           above_idle_j: float | None = None) -> float:
        """IT energy of one batch iteration on the replica's chips, joules (:func:`.cost.iteration_energy_j`)."""
        return iteration_energy_j(self._chip, self.cfg.chips, it, duration_s=duration_s, above_idle_j=above_idle_j)

    def complete(self, it: Iteration, end_s: float, *, energy_j: float | None = None) -> list[TokenEvent]:
        """Apply a finished iteration; returns one TokenEvent per token produced."""
        return self.complete_batch(it, end_s, energy_j=energy_j).events()

    def complete_batch(self, it: Iteration, end_s: float, *, energy_j: float | None = None) -> CompletionBatch:
        """As :meth:`complete`, returning arrays (no per-token objects).

        The iteration's energy (``energy_j``, else :meth:`iteration_energy_j` of the model) is
        shared among its requests in proportion to the tokens each had computed in it.
        """
        if self._inflight is None or it is not self._inflight:
            raise EngineStateError("complete() must be given the iteration in flight")
        self._inflight, self._version = None, self._version + 1
        valid = self._epoch[it.slots] == it.epochs  # a cancelled or preempted slot is skipped
        slots, new = it.slots[valid], it.new_tokens[valid]
        total_new = int(it.new_tokens.sum())
        if energy_j is None and self.model_energy:
            energy_j = self.iteration_energy_j(it)
        if energy_j and total_new > 0 and slots.size:
            self._energy[slots] += energy_j * new / total_new
        self._computed[slots] += new
        emit = slots[self._computed[slots] == self._length[slots]]
        if emit.size == 0:
            done = self._groups.close(end_s, idle=not self._active.any(), queued=self._queue.count)
            return CompletionBatch(end_s, (), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, bool),
                                   np.empty(0), tuple(done))
        idx = self._gen[emit].copy()
        toks = token_ids(self._seed[emit], idx, low=FIRST_WORD_TOKEN, high=self._tok_high)
        itl = np.where(idx > 0, end_s - self._last_tok[emit], np.nan)
        self._gen[emit] += 1
        self._length[emit] += 1
        self._last_tok[emit] = end_s
        eos = self._eos[emit]
        eos_hit = (eos > 0) & (self._gen[emit] >= eos)
        finished = eos_hit | (self._gen[emit] >= self._max[emit]) | (self._length[emit] >= self.cfg.arch.seq_len)
        ids, bs = [], self.cfg.block_size
        for k, slot in enumerate(emit.tolist()):
            seq = self._seqs[slot]
            assert seq is not None
            ids.append(seq.req.id)
            if idx[k] == 0:
                self._groups.first_token(seq, end_s)
            if not seq.registered:
                # The prompt is now computed: its full blocks become reusable prefix-cache entries.
                assert seq.hashes is not None
                fresh = seq.hashes[seq.matched : seq.prompt_len // bs]
                if fresh:
                    self._pool.register(fresh)
                    self._private[slot] -= len(fresh)
                    seq.held.extend(fresh)
                seq.registered = True
            if finished[k]:
                seq.gen = int(self._gen[slot])
                handoff = self.cfg.role == "prefill" and seq.req.max_tokens > seq.gen and not eos_hit[k]
                self._release_slot(slot, keep_kv=handoff)
                del self._by_id[seq.req.id]
                self._finished += 1
                self._groups.finish(seq, "prefilled" if handoff else "stop" if eos_hit[k] else "length")
        done = self._groups.close(end_s, idle=not self._active.any(), queued=self._queue.count)
        return CompletionBatch(end_s, tuple(ids), idx, toks, finished, itl, tuple(done))

    # ----------------------------------------------------------------------------- control
    def release_kv(self, request_id: str) -> bool:
        """Free the KV blocks a prefill replica held for a finished prompt (sent or abandoned)."""
        held = self._held_kv.pop(request_id, None)
        if held is None:
            return False
        self._version += 1
        self._pool.release(*held)
        return True

    @property
    def held_kv_requests(self) -> int:
        """Finished prompts whose KV blocks wait to be sent (prefill role)."""
        return len(self._held_kv)

    def cancel(self, request_id: str) -> bool:
        """Drop a queued or running request; False when this replica does not hold it."""
        if self.release_kv(request_id):
            return True
        seq = self._by_id.pop(request_id, None)
        if seq is None:
            return False
        self._version += 1
        slot = self._slot_of.get(request_id)
        if slot is not None:
            self._release_slot(slot)
        else:
            self._queue.remove(seq)
        return True

    @property
    def kv_used_frac(self) -> float:
        """Share of KV blocks held by running sequences (cached-but-free blocks count as free)."""
        return self._pool.used / self._pool.total_blocks

    def routing_stats(self) -> ReplicaStats:
        """:meth:`stats`, cached until a call changes the engine: for the driving thread (not a metrics scrape)."""
        if self._stats is None or self._stats[0] != self._version:
            self._stats = (self._version, self.stats())
        return self._stats[1]

    def stats(self) -> ReplicaStats:
        act, running = self._active, self.cfg.max_batch - len(self._free_slots)
        out_tok = int(((self._length - self._computed) + (self._max - self._gen))[act].sum())
        pool = self._pool
        return ReplicaStats(
            queue_depth=self._queue.count, running=running, kv_used_frac=pool.used / pool.total_blocks,
            kv_blocks_total=pool.total_blocks, kv_blocks_used=pool.used, kv_blocks_cached=pool.cached,
            prefix_hit_tokens=pool.hit_tokens, prefix_lookup_tokens=pool.lookup_tokens,
            outstanding_requests=self._queue.count + running,
            outstanding_tokens=out_tok + self._queue.prompt_tokens + self._queue.out_tokens,
            preemptions=self._preemptions, rejected=self._rejected, shed=self._shed_count,
            finished=self._finished, iterations=self._iter_seq,
        )
