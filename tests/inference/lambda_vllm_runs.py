"""Published vLLM serving runs on one H100 SXM or A100 80GB, replayable request by request (issue 15 item 5).

Source: github.com/LambdaLabsML/vllm-benchmark, ``results/prompt_{N}/1xH100-80GB-SXM/
Meta-Llama-3-8B-Instruct_tp1_len2048.json`` for N = 10, 40, 160, 320, and ``results/prompt_160/
1xA100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2000.json`` (2024-09-07, the ``vllm/vllm-openai`` v0.6
image, ``--max-model-len`` 2,048 or 2,000, so the v0 engine with prefill-first scheduling and a prefill
budget of that many tokens; multi-step scheduling with 10 steps, as the files' chunks of 10 tokens
between inter-token gaps show; the asynchronous output processor, on by default in v0.6, so each step's
outputs reach the client when the next step ends). vLLM's ``benchmark_serving.py`` sent N ShareGPT
prompts at once (``request_rate: inf``); each file lists every request's prompt and output length
and the run's percentiles, which the replay below computes the same way (numpy's linear-interpolated
percentiles; TPOT over requests with more than one output token; a request that streamed no text,
output length 0, counts with TTFT 0).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from gigacluster.inference.cost import api_intake_s
from gigacluster.inference.engine import ReplicaConfig, ReplicaEngine, Request
from gigacluster.inference.sim import simulate
from gigacluster.model.arch import preset


@dataclasses.dataclass(frozen=True)
class LambdaRun:
    """One published run: the requests' lengths and the published figures (ms)."""

    prompts: tuple[int, ...]
    outputs: tuple[int, ...]
    published_ms: dict[str, float]
    chip: str = "h100-sxm"
    budget: int = 2048  # --max-model-len, which v0 takes as max_num_batched_tokens


def _published(ttft: tuple[float, float], tpot: tuple[float, float], e2e: tuple[float, float]) -> dict[str, float]:
    return {"ttft_p50": ttft[0], "ttft_p99": ttft[1], "tpot_p50": tpot[0], "tpot_p99": tpot[1],
            "e2e_p50": e2e[0], "e2e_p99": e2e[1]}


_IN_320 = (
    13, 25, 27, 10, 329, 29, 399, 328, 4, 205, 16, 372, 403, 9, 12, 770, 227, 8, 14, 390, 659, 59, 76, 744, 619,
    279, 344, 9, 10, 45, 11, 4, 80, 768, 317, 40, 619, 8, 298, 16, 17, 696, 575, 11, 7, 281, 12, 147, 481, 770, 336,
    6, 331, 9, 45, 222, 802, 481, 93, 641, 22, 15, 16, 77, 32, 689, 178, 9, 628, 480, 42, 336, 24, 515, 761, 112,
    113, 348, 82, 467, 245, 11, 24, 343, 13, 387, 258, 32, 28, 225, 248, 35, 133, 98, 27, 23, 58, 363, 203, 140,
    140, 230, 310, 521, 768, 317, 298, 336, 491, 19, 10, 59, 48, 20, 20, 54, 107, 53, 72, 18, 10, 768, 7, 933, 239,
    277, 26, 35, 462, 386, 25, 23, 17, 20, 44, 661, 631, 349, 53, 71, 37, 10, 21, 37, 496, 8, 9, 353, 10, 595, 5,
    49, 286, 305, 56, 43, 52, 310, 35, 7, 7, 238, 10, 143, 660, 191, 72, 39, 258, 312, 49, 9, 15, 561, 76, 561, 501,
    8, 66, 15, 303, 19, 455, 27, 143, 688, 9, 31, 361, 21, 117, 8, 12, 775, 338, 176, 349, 166, 419, 401, 307, 169,
    647, 21, 9, 34, 12, 37, 45, 154, 8, 10, 18, 253, 486, 611, 96, 19, 62, 529, 15, 30, 10, 445, 680, 762, 441, 77,
    12, 276, 178, 22, 159, 95, 366, 4, 7, 770, 8, 45, 480, 90, 32, 329, 768, 72, 86, 53, 83, 419, 44, 14, 56, 28,
    707, 235, 27, 668, 17, 427, 44, 370, 8, 674, 455, 185, 68, 19, 132, 304, 9, 34, 39, 54, 768, 661, 404, 240, 25,
    95, 60, 24, 12, 85, 66, 62, 462, 22, 241, 25, 32, 13, 175, 31, 342, 43, 339, 144, 233, 16, 10, 11, 269, 587, 8,
    233, 10, 48, 9, 335, 22, 61, 29, 692, 7, 332, 512, 13, 128, 24,
)
# Every run drew the same ShareGPT prompts in the same order: a smaller run's prompts are the first N.
_IN_10, _IN_40, _IN_160 = _IN_320[:10], _IN_320[:40], _IN_320[:160]

_OUT_320 = (
    120, 613, 233, 194, 101, 741, 9, 3, 6, 31, 392, 84, 396, 45, 291, 9, 173, 277, 334, 37, 587, 372, 36, 135, 26,
    45, 450, 118, 226, 4, 5, 146, 59, 11, 567, 192, 476, 130, 13, 223, 188, 16, 35, 276, 202, 492, 239, 129, 26, 79,
    17, 204, 11, 207, 78, 340, 17, 9, 123, 6, 559, 5, 316, 26, 417, 206, 151, 42, 25, 18, 159, 0, 25, 267, 19, 12,
    768, 67, 628, 11, 218, 296, 382, 49, 125, 0, 26, 237, 350, 13, 490, 408, 58, 29, 512, 413, 526, 16, 416, 434,
    451, 17, 573, 0, 7, 8, 11, 22, 0, 249, 281, 392, 611, 572, 23, 256, 31, 39, 300, 355, 340, 9, 172, 458, 147,
    240, 154, 768, 0, 141, 42, 26, 780, 334, 125, 4, 4, 721, 63, 24, 331, 482, 110, 216, 184, 99, 285, 22, 355, 40,
    150, 46, 0, 0, 574, 572, 214, 0, 419, 163, 162, 77, 482, 170, 510, 53, 16, 384, 57, 9, 170, 356, 173, 19, 390,
    339, 77, 17, 520, 8, 8, 198, 510, 478, 304, 398, 16, 475, 91, 54, 509, 608, 36, 425, 15, 25, 12, 363, 0, 0, 44,
    43, 267, 474, 334, 31, 261, 402, 346, 176, 22, 22, 159, 203, 8, 16, 16, 216, 86, 0, 234, 258, 247, 23, 47, 16,
    447, 221, 702, 0, 44, 142, 740, 18, 76, 299, 250, 24, 300, 178, 5, 373, 25, 23, 76, 322, 87, 389, 21, 7, 527,
    485, 339, 394, 11, 27, 254, 313, 392, 111, 365, 0, 79, 11, 275, 22, 99, 373, 38, 0, 657, 283, 503, 250, 16, 407,
    0, 7, 261, 322, 322, 91, 56, 365, 342, 316, 25, 441, 646, 241, 222, 4, 27, 290, 7, 21, 336, 16, 360, 199, 381,
    297, 18, 338, 301, 189, 373, 478, 394, 23, 230, 455, 283, 0, 201, 0, 20, 308, 30, 295,
)


def _patched(outputs: tuple[int, ...], changes: dict[int, int]) -> tuple[int, ...]:
    """``outputs`` with the entries at ``changes``' indices replaced (sampling differs a little from run to run)."""
    return tuple(changes.get(i, o) for i, o in enumerate(outputs))


# The output lengths of the other runs, as their differences from the 320-prompt run's first N.
_OUT_10 = _patched(_OUT_320[:10], {1: 429})
_OUT_40 = _patched(_OUT_320[:40], {1: 393, 36: 478})
_OUT_160 = _patched(_OUT_320[:160], {1: 425, 21: 335, 36: 478, 155: 574})
_OUT_160_A100 = _patched(_OUT_320[:160], {1: 554, 9: 38, 21: 340, 36: 478, 49: 74, 56: 21, 80: 48, 82: 453, 90: 468,
                                           125: 20, 148: 322, 155: 483})


RUNS: dict[int | str, LambdaRun] = {
    10: LambdaRun(_IN_10, _OUT_10, {"ttft_p50": 62.19, "ttft_p99": 63.36, "tpot_p50": 7.56, "e2e_p50": 874.29,
                                    "e2e_p99": 5167.98}),
    40: LambdaRun(_IN_40, _OUT_40, _published((254.68, 330.08), (8.78, 86.45), (1407.04, 5526.91))),
    160: LambdaRun(_IN_160, _OUT_160, _published((972.96, 1451.23), (13.07, 297.69), (2924.38, 8100.92))),
    320: LambdaRun(_IN_320, _OUT_320, _published((1731.37, 2550.91), (20.03, 389.44), (5057.49, 10544.93))),
    "a100-160": LambdaRun(_IN_160, _OUT_160_A100, _published((1849.42, 2963.65), (26.13, 524.64),
                                                             (5613.51, 14780.55)), chip="a100-80gb", budget=2000),
}


# The decode rate with the whole burst running: the files' ``itls`` of request 0 (each a chunk of 10 tokens, as
# multi-step scheduling streams them), its 5th to 9th chunks (after the burst's prefills, before the first
# request finishes past a few tokens), mean seconds per chunk. Read from the same five files.
STEADY_CHUNKS = slice(4, 9)
STEADY_CHUNK_S: dict[int | str, float] = {
    40: float(np.mean([0.07959, 0.07983, 0.07918, 0.07949, 0.07963])),
    160: float(np.mean([0.09875, 0.09537, 0.09580, 0.09663, 0.09718])),
    320: float(np.mean([0.13115, 0.13389, 0.13310, 0.13089, 0.12768])),
    "a100-160": float(np.mean([0.18539, 0.18627, 0.18420, 0.18516, 0.18443])),
}


def run_requests(run: LambdaRun) -> list[Request]:
    """The run's requests, all sent at 0 (prompt tokens drawn from a fixed seed; at least one output token)."""
    rng = np.random.default_rng(0)
    return [Request(f"r{i}", rng.integers(256, 128000, size=p, dtype=np.int32), max(o, 1), arrival_s=0.0)
            for i, (p, o) in enumerate(zip(run.prompts, run.outputs, strict=True))]


def run_config(run: LambdaRun) -> ReplicaConfig:
    """vLLM 0.6's engine as the run used it: v0 (no chunked prefill), the prefill budget, 10 scheduler steps and
    the asynchronous output processor (on by default in v0.6: outputs seen when the next step ends)."""
    return ReplicaConfig(preset("llama3-8b"), run.chip, chunked_prefill=False, max_prefill_tokens=run.budget,
                         num_scheduler_steps=10, async_output=True)


@functools.cache
def chunk_gaps_s(n: int | str, request: int = 0) -> tuple[float, ...]:
    """The replay's inter-chunk gaps of one request (s), as the files' ``itls``: from its first token to its
    11th, then every 10 tokens (one engine, the burst released when the API server has taken it, as
    :func:`simulate` runs it)."""
    run = RUNS[n]
    eng = ReplicaEngine(run_config(run), model_energy=False)
    now = float(api_intake_s(np.asarray(run.prompts), v0=not run_config(run).chunked_prefill).sum())
    for r in run_requests(run):
        eng.admit(r, now)
    rid, times = f"r{request}", []
    while (it := eng.next_iteration(now)) is not None:
        now += it.predicted_s
        batch = eng.complete_batch(it, now)
        times.extend(now for x in batch.request_ids if x == rid)
    return tuple(times[k] - times[k - 10 if k > 10 else 0] for k in range(10, len(times), 10))


@functools.cache
def replay_ms(n: int | str) -> dict[str, float]:
    """Run ``n`` (its prompt count, or ``"a100-160"``) through the offline simulator, measured as
    benchmark_serving measures it (ms)."""
    run = RUNS[n]
    done = {s.request_id: s for s in simulate(run_config(run), run_requests(run), keep_requests=True).requests}
    ttft, tpot, e2e = [], [], []
    for i, out in enumerate(run.outputs):
        s = done[f"r{i}"]
        first, lat = s.first_token_s - s.arrival_s, s.finish_s - s.arrival_s
        ttft.append(first if out > 0 else 0.0)
        e2e.append(lat)
        if out > 1:
            tpot.append((lat - first) / (out - 1))
    out_ms: dict[str, float] = {}
    for name, vals in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)):
        for p in (50, 99):
            out_ms[f"{name}_p{p}"] = float(np.percentile(vals, p)) * 1e3
    return out_ms
