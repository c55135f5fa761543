"""Chips compared the way InferenceMAX does: throughput per GPU against interactivity.

For one model and one sequence shape (``isl`` prompt tokens, ``osl`` output tokens), every
replica layout that fits on a chip (TP in powers of two up to its scale-up domain; for a mixture of
experts also EP in powers of two times TP that divide the experts, up to ``max_ep``) is run at
concurrencies 1, 2, 4, ... up to what its KV cache holds. Each point is the steady state of a
closed loop of ``B`` users (a user sends its next request when the last one finishes, as
InferenceMAX's fixed-concurrency runs do), from the engine's own iteration costs
(:func:`gigacluster.inference.cost.iteration_work` / ``iteration_time_s``):

* one cycle is ``osl`` decode steps of batch ``B`` at the mean context ``isl + osl / 2`` plus
  ``B`` prefills of ``isl`` tokens (chunks of ``max_prefill_tokens``), which stall the decodes
  (no chunked-prefill overlap);
* output throughput per GPU = ``B osl / cycle / chips``; interactivity (tokens/s per user) =
  ``osl / (cycle - own prefill)``, the inverse of the mean time per output token a user sees.

The frontier keeps the points no other point beats on both axes. Cost per million output tokens is
the chip's catalog price per hour over its output tokens per hour; the caller adds tokens/s per
provisioned MW (facility power is a planning concern).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np

from gigacluster.hw.catalog import chip_names, default_system, get_chip, get_system
from gigacluster.inference.config import ReplicaConfig
from gigacluster.inference.cost import iteration_overhead_s, iteration_time_s, iteration_work
from gigacluster.model import DoesNotFitError, SpecError
from gigacluster.model.arch import ModelArch


@dataclasses.dataclass(frozen=True)
class ServePoint:
    """One layout at one concurrency (throughput per GPU in output tokens; ``total`` adds the prompts)."""

    chip: str
    tp: int
    ep: int
    chips: int
    tpot_s: float
    concurrency: int
    prefill_s: float  # one prompt's prefill, without queueing
    interactivity_tok_s_user: float
    output_tok_s_per_gpu: float
    tokens_per_output: float  # (isl + osl) / osl
    cost_usd_per_million_output: float

    def to_dict(self) -> dict[str, Any]:
        """JSON form, with total (prompt + output) tokens/s per GPU as InferenceMAX also charts."""
        return {**dataclasses.asdict(self), "total_tok_s_per_gpu": self.output_tok_s_per_gpu * self.tokens_per_output}


# Largest concurrency tried per layout (InferenceMAX sweeps 4 to 64 per GPU; wide-EP replicas go further).
MAX_CONCURRENCY = 4096


def _step_s(cfg: ReplicaConfig, computed: np.ndarray, new: np.ndarray, length: np.ndarray) -> float:
    """Seconds of one engine iteration (compute plus collectives), as the engine prices it."""
    work, pre, dec = iteration_work(cfg.shard, computed, length, new)
    compute_s, comm_s, _ = iteration_time_s(cfg.chip_spec, cfg.shard, cfg.tp, work, pre + dec)
    return compute_s + comm_s + iteration_overhead_s()


def decode_step_s(cfg: ReplicaConfig, batch: int, context: int) -> float:
    """One decode iteration of ``batch`` sequences at ``context`` tokens each."""
    c = np.full(batch, context, dtype=np.int64)
    return _step_s(cfg, c, np.ones(batch, dtype=np.int64), c + 2)


def prefill_s(cfg: ReplicaConfig, isl: int) -> float:
    """Prefill of one ``isl``-token prompt in chunks of ``max_prefill_tokens``."""
    t, done = 0.0, 0
    while done < isl:
        n = min(cfg.max_prefill_tokens, isl - done)
        t += _step_s(cfg, np.array([done]), np.array([n]), np.array([isl + 1]))
        done += n
    return t


def serve_point(cfg: ReplicaConfig, concurrency: int, isl: int, osl: int) -> ServePoint:
    """Steady state of ``concurrency`` closed-loop users on one replica (see the module docstring)."""
    t_dec = decode_step_s(cfg, concurrency, isl + osl // 2)
    t_pre = prefill_s(cfg, isl)
    cycle = osl * t_dec + concurrency * t_pre
    out_per_gpu = concurrency * osl / cycle / cfg.chips
    chip = cfg.chip_spec
    return ServePoint(
        chip=cfg.chip, tp=cfg.tp, ep=cfg.ep, chips=cfg.chips, concurrency=concurrency,
        tpot_s=(cycle - t_pre) / osl, prefill_s=t_pre, interactivity_tok_s_user=osl / (cycle - t_pre),
        output_tok_s_per_gpu=out_per_gpu, tokens_per_output=(isl + osl) / osl,
        cost_usd_per_million_output=chip.price_per_hour_usd / (out_per_gpu * 3600.0) * 1e6,
    )


def layouts(arch: ModelArch, chip: str, *, max_ep: int = 0) -> Iterator[tuple[int, int]]:
    """(tp, ep) candidates: TP in powers of two within the scale-up domain dividing the heads; for a
    mixture of experts EP 1 and TP times powers of two that divide the experts, up to ``max_ep``
    (default the domain: wide EP across domains is asked for explicitly)."""
    dom = get_system(default_system(chip)).chips
    cap = max_ep or dom
    tp = 1
    while tp <= dom:
        if arch.heads % tp == 0:
            yield tp, 1
            ep = tp * 2 if tp == 1 else tp
            while arch.is_moe and ep <= cap and arch.experts % ep == 0:
                yield tp, ep
                ep *= 2
        tp *= 2


def chip_points(arch: ModelArch, chip: str, isl: int, osl: int, precision: str, *,
                max_ep: int = 0) -> list[ServePoint]:
    """Every fitting layout of ``chip`` at concurrencies 1, 2, 4, ... (what its KV cache holds)."""
    pts = []
    for tp, ep in layouts(arch, chip, max_ep=max_ep):
        b = 1
        while b <= MAX_CONCURRENCY:
            try:
                cfg = ReplicaConfig(arch, chip, tp=tp, ep=ep, precision=precision, max_batch=b)
            except DoesNotFitError:
                break
            if cfg.max_batch_fit(isl + osl) < b:
                break
            pts.append(serve_point(cfg, b, isl, osl))
            b *= 2
    return pts


def pareto(points: list[ServePoint]) -> list[ServePoint]:
    """Points no other beats on both interactivity and output throughput per GPU, by falling
    interactivity (so throughput rises along the list)."""
    out: list[ServePoint] = []
    best = -1.0
    for p in sorted(points, key=lambda p: (-p.interactivity_tok_s_user, -p.output_tok_s_per_gpu)):
        if p.output_tok_s_per_gpu > best:
            out.append(p)
            best = p.output_tok_s_per_gpu
    return out


def frontier(arch: ModelArch, chips: list[str], *, isl: int, osl: int, precision: str,
             max_ep: int = 0) -> dict[str, list[ServePoint]]:
    """Each chip's frontier; a chip without ``precision`` is refused with the list it has."""
    if not chips:
        raise SpecError("chips", "give at least one chip")
    for f, v in (("isl", isl), ("osl", osl)):
        if not 1 <= v <= 131072:
            raise SpecError(f, f"must be in [1, 131072], got {v}")
    for c in chips:
        if c not in chip_names():
            raise SpecError("chips", f"unknown chip {c[:64]!r}; allowed: {', '.join(chip_names())}")
        have = get_chip(c).precisions()
        if precision not in have:
            raise SpecError("precision", f"{c} has no {precision} units; it supports: {', '.join(have)}")
    out = {}
    for c in chips:
        pts = chip_points(arch, c, isl, osl, precision, max_ep=max_ep)
        if not pts:
            raise DoesNotFitError(f"{arch.name} at {precision} fits no layout of {c} (tp up to its scale-up domain"
                                  f"{', ep up to ' + str(max_ep) if max_ep else ''})", need_bytes=0.0,
                                  have_bytes=float(get_chip(c).hbm_bytes))
        out[c] = pareto(pts)
    return out
