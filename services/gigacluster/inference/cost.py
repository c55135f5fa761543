"""The roofline cost of a replica engine's work: one batch iteration's work, time and energy, and the
time the work queued ahead of a new arrival will take (its retry-after).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from gigacluster.fabric.estimate import collective_estimate_s
from gigacluster.hw.catalog import Chip, _raw, default_system, get_system
from gigacluster.inference.config import ReplicaConfig
from gigacluster.inference.moe_work import half_batch, two_batch_s
from gigacluster.inference.request import Iteration
from gigacluster.inference.work import ShardShape, allreduce_bytes, batch_work
from gigacluster.model.comm import AlphaBetaCommModel, GroupLayout
from gigacluster.model.power import host_overhead_w, link_energy_j, works_energy_above_idle_j
from gigacluster.model.roofline import Work, works_time_s


@functools.cache
def api_request_s() -> float:
    """The API server's serial seconds per request beside its prompt's (catalog ``serving.api_request_s``)."""
    return _serving_s("api_request_s")


@functools.cache
def api_prompt_token_s() -> float:
    """The API server's serial seconds per prompt token (catalog ``serving.api_prompt_token_s``): tokenisation and
    the rest of a request's intake, which grow with its prompt."""
    return _serving_s("api_prompt_token_s")


def api_intake_s(prompt_tokens: Sequence[int] | np.ndarray, *, v0: bool) -> np.ndarray:
    """Seconds a replica's API server takes to hand each request (its prompt's length in ``prompt_tokens``) to the
    engine: the HTTP server, tokenisation and the hop to the engine. vLLM v0.6 (``v0``: no chunked prefill)
    tokenised on the server's event loop, so the intake grows with the prompt (``api_prompt_token_s``); from
    vllm-project/vllm PR 10635 (2024-11) tokenising runs off the loop and v1's path takes ``api_request_s``."""
    n = np.asarray(prompt_tokens, dtype=float)
    return api_prompt_token_s() * n if v0 else np.full(n.shape, api_request_s())


def _serving_s(key: str, below_s: float = 1.0, bound: str = "1) s") -> float:
    """Catalog ``serving.<key>`` (seconds, 0 when absent), checked to lie in [0, ``below_s``)."""
    v = float((_raw().get("serving") or {}).get(key, 0.0))
    if not 0.0 <= v < below_s:
        raise ValueError(f"catalog serving.{key} must be in [0, {bound}, got {v!r}")
    return v


def iteration_overhead_s() -> float:
    """Fixed host seconds of every engine iteration (catalog ``serving.iteration_overhead_s``):
    scheduling, input preparation, sampling and kernel launch, on top of the kernels' time."""
    return _serving_s("iteration_overhead_s")


@functools.cache
def v0_schedule_seq_s() -> float:
    """Host seconds per running sequence of one vLLM v0 scheduler invocation (catalog
    ``serving.v0_schedule_seq_s``): scheduling, input preparation, sampling and output processing
    between two engine steps, which multi-step scheduling pays once per group of steps."""
    return _serving_s("v0_schedule_seq_s", 0.01, "10 ms)")


def iteration_host_s(cfg: ReplicaConfig, seqs: int, scheduler_call: bool) -> float:
    """Host seconds of one iteration of ``seqs`` sequences: the fixed ``iteration_overhead_s``, plus v0's
    per-sequence work between two steps when the engine runs vLLM v0's path (no chunked prefill) and this
    iteration is a scheduler call: every iteration with one scheduler step; with multi-step a group's first
    step or a prefill step, so multi-step pays that work once per group."""
    if cfg.chunked_prefill or not scheduler_call:
        return iteration_overhead_s()
    # Each data-parallel attention group runs its own scheduler (vLLM's DP engines), in parallel.
    return iteration_overhead_s() + v0_schedule_seq_s() * math.ceil(seqs / cfg.shard.dp_attn)


def decode_host_s(cfg: ReplicaConfig, batch: int) -> float:
    """Mean host seconds of one decode iteration of ``batch`` sequences (:func:`iteration_host_s` averaged
    over a multi-step group), for estimates that do not step the engine."""
    per_call = iteration_host_s(cfg, batch, True) - iteration_overhead_s()
    return iteration_overhead_s() + per_call / cfg.num_scheduler_steps


def iteration_work(shape: ShardShape, computed: np.ndarray, length: np.ndarray,
                   new: np.ndarray) -> tuple[tuple[Work, ...], int, int]:
    """Per-shard work of one iteration over slots with ``computed`` of ``length`` tokens and ``new`` to run;
    also its prefill tokens and decode sequences."""
    c = computed
    is_pre = new > 1
    pre_n, pre_c = new[is_pre], c[is_pre]
    dec_c = c[~is_pre]
    logits = int(((c + new) == length).sum())
    prefill_tokens = int(pre_n.sum())
    decode_seqs = int(dec_c.size)
    if not shape.classic:
        return (shape.moe.batch_work(tokens=prefill_tokens + decode_seqs, pre_c=pre_c, pre_n=pre_n, dec_c=dec_c,
                                     logits=logits), prefill_tokens, decode_seqs)
    work = batch_work(
        shape,
        prefill_tokens=prefill_tokens,
        prefill_pairs=float((pre_n * pre_c).sum() + (pre_n * (pre_n + 1)).sum() / 2.0),
        prefill_kv_tokens=float((pre_c + pre_n).sum()),
        prefill_seqs=int(pre_n.size),
        decode_seqs=decode_seqs,
        decode_kv_tokens=float((dec_c + 1).sum()),
        logits=logits,
    )
    return work, prefill_tokens, decode_seqs


def iteration_time_s(chip: Chip, shape: ShardShape, tp: int, work: tuple[Work, ...],
                     tokens: int) -> tuple[float, float, float]:
    """(compute seconds, all-reduce seconds, all-reduce bytes) of one iteration over ``tokens`` tokens.

    A dense replica's two all-reduces per layer are each priced as the fabric prices one collective
    over ``tp`` chips of the chip's system (the library's algorithm and protocol for the size, with
    NCCL's per-call and per-step costs): small decode all-reduces are latency-bound, large prefill
    ones run at the links' collective bandwidth."""
    compute_s = works_time_s(chip, work)
    ar = allreduce_bytes(shape, tokens)
    if not shape.classic:
        return compute_s, moe_comm_s(chip, shape, tokens, work=work, compute_s=compute_s), ar
    calls = 2 * shape.arch.layers
    comm_s = calls * collective_estimate_s("all_reduce", ar / calls, chip.name, tp) if tp > 1 and ar else 0.0
    return compute_s, comm_s, ar


_COMM = AlphaBetaCommModel()


def moe_comm_s(chip: Chip, shape: ShardShape, tokens: int, *, work: tuple[Work, ...] = (),
               compute_s: float = 0.0) -> float:
    """TP all-reduces plus, with ``ep > 1``, each MoE layer's dispatch and combine all-to-all over the
    ``ep`` GPUs (spanning scale-up domains when ``ep`` exceeds one), by the training model's comm model;
    under ``moe_overlap: two_batch`` (given the iteration's ``work`` and ``compute_s``) only the part of
    the all-to-all two overlapped micro-batches leave exposed (``moe_work.two_batch_s``)."""
    system = default_system(chip.name)
    ar = shape.moe.allreduce_bytes(tokens) / (2 * shape.arch.layers)
    t = 0.0
    if ar:
        lay = GroupLayout(shape.tp, min(shape.tp, get_system(system).chips), shape.dp_attn)
        t += 2 * shape.arch.layers * _COMM.collective_time_s(chip, system, "all_reduce", ar, lay)
    a2a = moe_a2a_s(chip, shape, tokens)
    if a2a and work and tokens > 1 and shape.moe.overlap == "two_batch":
        half_c = works_time_s(chip, half_batch(work, shape.precision))
        both = two_batch_s(half_c, moe_a2a_s(chip, shape, tokens // 2), shape.arch.moe_layers)
        return t + max(0.0, both - compute_s)
    return t + a2a


def moe_a2a_s(chip: Chip, shape: ShardShape, tokens: int) -> float:
    """Seconds of one iteration's expert-parallel all-to-alls (dispatch and combine, every MoE layer)."""
    dispatch, combine = shape.moe.a2a_bytes(tokens)
    if not dispatch:
        return 0.0
    system = default_system(chip.name)
    lay = GroupLayout(shape.ep, min(shape.ep, get_system(system).chips))
    return shape.arch.moe_layers * sum(_COMM.collective_time_s(chip, system, "all_to_all", b, lay)
                                       for b in (dispatch, combine))


def iteration_energy_j(chip: Chip, tp: int, it: Iteration, *, duration_s: float | None = None,
                       above_idle_j: float | None = None) -> float:
    """IT energy of one batch iteration on a replica's ``tp`` chips, joules.

    The terms of a training step's (``scheduler.runner.step_energy_it_j``): every chip at idle
    power plus its host share for the iteration's duration, the energy its work draws above
    idle (:mod:`gigacluster.model.power`), and the scale-up link energy of the tensor-parallel
    all-reduces (a ring moves ``2 (tp - 1)`` times the per-shard bytes over the links). Offline
    the duration is ``predicted_s`` and the work runs at full clock; the live router passes
    what the chip service measured (``duration_s``, ``above_idle_j`` for all ``tp`` chips).
    """
    dur = it.predicted_s if duration_s is None else duration_s
    # ``tp`` is the replica's chip count (max(tp, ep) for an expert-parallel replica).
    above = tp * works_energy_above_idle_j(chip, it.work) if above_idle_j is None else above_idle_j
    return (tp * (chip.idle_w + host_overhead_w()) * dur + above
            + link_energy_j(2.0 * (tp - 1) * it.allreduce_bytes, 0.0))


def queue_wait_s(chip: Chip, shape: ShardShape, cfg: ReplicaConfig, queued_prompt: int, out: int, ctx: float,
                 n: int) -> float:
    """Seconds to serve ``n`` sequences owing ``out`` output tokens at mean context ``ctx``, after prefilling
    ``queued_prompt`` tokens: prefill at the token budget, then decode in waves of ``max_batch``."""
    chunk = max(1, min(cfg.max_prefill_tokens, queued_prompt))
    prefill_s = 0.0
    if not shape.classic:
        return _queue_wait_general_s(chip, shape, cfg, queued_prompt, out, ctx, n)
    if queued_prompt:
        per_chunk = works_time_s(chip, batch_work(
            shape, prefill_tokens=chunk, prefill_pairs=chunk * (chunk + 1) / 2.0,
            prefill_kv_tokens=chunk, logits=1))
        prefill_s = (per_chunk + iteration_overhead_s()) * queued_prompt / chunk
    batch = min(cfg.max_batch, n)
    step_s = works_time_s(chip, batch_work(
        shape, decode_seqs=batch, decode_kv_tokens=batch * ctx, logits=batch)) + decode_host_s(cfg, batch)
    waves = math.ceil(n / cfg.max_batch)
    return max(1e-3, prefill_s + waves * (out / n) * step_s)


def _queue_wait_general_s(chip: Chip, shape: ShardShape, cfg: ReplicaConfig, queued_prompt: int, out: int,
                          ctx: float, n: int) -> float:
    """:func:`queue_wait_s` for the per-GPU model (MoE, MLA, windows): the same prefill-then-waves sum."""
    none = np.zeros(0, dtype=np.int64)
    chunk = max(1, min(cfg.max_prefill_tokens, queued_prompt))
    prefill_s = 0.0
    if queued_prompt:
        w = shape.moe.batch_work(tokens=chunk, pre_c=np.zeros(1, dtype=np.int64),
                                 pre_n=np.full(1, chunk, dtype=np.int64), dec_c=none, logits=1)
        prefill_s = (works_time_s(chip, w) + moe_comm_s(chip, shape, chunk) + iteration_overhead_s()) \
            * queued_prompt / chunk
    batch = min(cfg.max_batch, n)
    w = shape.moe.batch_work(tokens=batch, pre_c=none, pre_n=none,
                             dec_c=np.full(batch, max(0, round(ctx)), dtype=np.int64), logits=batch)
    step_s = works_time_s(chip, w) + moe_comm_s(chip, shape, batch) + decode_host_s(cfg, batch)
    waves = math.ceil(n / cfg.max_batch)
    return max(1e-3, prefill_s + waves * (out / n) * step_s)
