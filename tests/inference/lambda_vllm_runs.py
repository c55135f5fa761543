"""Published vLLM serving runs on H100 SXM and A100 80GB, replayable request by request (issue 15 item 5).

Source: github.com/LambdaLabsML/vllm-benchmark, ``results/prompt_{N}/1xH100-80GB-SXM/
Meta-Llama-3-8B-Instruct_tp1_len2048.json`` for N = 10, 40, 160, 320, and ``results/prompt_160/
1xA100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2000.json``, and with tensor parallelism Llama 3 70B on four
H100s or four A100s and Mixtral 8x7B on two H100s (below) (2024-09-07, the ``vllm/vllm-openai`` v0.6
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
    model: str = "llama3-8b"
    tp: int = 1  # --tensor-parallel-size: the run's GPU count


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


# Llama 3 70B Instruct (BF16) with tensor parallelism, the same 2024-09-07 campaign and prompts (issue 15 item 5,
# this round): ``results/prompt_{N}/4xH100-80GB-SXM/Meta-Llama-3-70B-Instruct_tp4_len2048.json`` and
# ``results/prompt_{N}/4xA100-80GB-SXM/Meta-Llama-3-70B-Instruct_tp4_len2000.json``, N = 10, 40, 160 and 320 on the
# H100s and 10 and 160 on the A100s (each file's total output tokens match the lists below). The model
# stops earlier than the 8B on many prompts (ShareGPT's completion length is only the cap), and on 37 of the 160
# it streamed no text at all (output length 0: its first token was the end of sequence).
_OUT_320_70B = (
    120, 604, 233, 194, 101, 741, 0, 0, 6, 35, 392, 30, 396, 45, 291, 9, 173, 277, 334, 0, 587, 372, 14, 90, 0, 0,
    450, 118, 219, 4, 5, 146, 21, 11, 0, 192, 230, 130, 0, 223, 188, 0, 0, 276, 202, 492, 239, 120, 0, 31, 17, 204,
    11, 207, 78, 311, 9, 0, 0, 6, 559, 5, 316, 0, 417, 207, 151, 42, 25, 0, 159, 0, 25, 133, 0, 12, 768, 67, 628, 0,
    48, 296, 501, 0, 125, 0, 0, 227, 350, 0, 490, 408, 0, 29, 512, 413, 394, 0, 90, 434, 417, 17, 110, 0, 7, 0, 11, 0,
    0, 249, 281, 392, 587, 572, 23, 256, 31, 39, 300, 355, 340, 9, 172, 294, 0, 0, 154, 768, 0, 127, 42, 26, 564, 274,
    125, 4, 0, 159, 63, 24, 331, 431, 110, 216, 0, 99, 285, 0, 134, 40, 150, 0, 0, 0, 574, 528, 214, 0, 419, 163, 162,
    77, 428, 170, 510, 0, 11, 384, 0, 0, 170, 356, 173, 19, 302, 0, 42, 17, 520, 8, 8, 198, 408, 434, 304, 0, 16, 475,
    0, 54, 509, 608, 36, 425, 0, 0, 0, 363, 0, 0, 0, 0, 267, 304, 334, 31, 261, 402, 308, 0, 20, 22, 159, 203, 0, 0,
    16, 216, 86, 0, 234, 258, 247, 0, 47, 0, 0, 221, 702, 0, 44, 142, 740, 18, 0, 292, 250, 24, 300, 178, 0, 373, 25,
    0, 76, 322, 87, 331, 0, 0, 527, 485, 287, 394, 0, 27, 254, 313, 392, 111, 365, 0, 79, 11, 0, 22, 99, 373, 0, 0,
    657, 283, 503, 235, 16, 1, 0, 0, 261, 373, 322, 91, 56, 365, 343, 316, 0, 444, 302, 241, 222, 4, 145, 290, 0, 15,
    319, 0, 360, 199, 335, 297, 0, 338, 143, 80, 373, 478, 394, 0, 230, 455, 275, 0, 201, 0, 11, 308, 0, 295,
)
_OUT_160_70B_H100 = _patched(_OUT_320_70B[:160], {1: 676, 23: 89, 28: 226, 32: 45, 96: 389, 111: 391, 112: 611,
                                                  116: 29, 130: 41, 132: 556, 133: 334, 137: 564, 141: 482, 148: 355,
                                                  155: 570})
_OUT_160_70B_A100 = _patched(_OUT_160_70B_H100, {1: 723, 47: 89, 80: 23, 96: 395, 98: 87, 111: 392, 112: 513,
                                                 116: 31, 123: 275, 132: 406, 133: 274, 137: 160, 148: 168})
RUNS.update({
    "70b-h100x4-10": LambdaRun(_IN_10, (120, 661, 233, 194, 101, 741, 0, 0, 6, 35),
                               _published((140.56, 141.44), (18.12, 33.98), (2101.49, 12961.92)),
                               model="llama3-70b", tp=4),
    "70b-h100x4-40": LambdaRun(_IN_40, _OUT_160_70B_A100[:40],
                               _published((528.80, 774.17), (20.66, 103.88), (3172.03, 14190.37)),
                               model="llama3-70b", tp=4),
    "70b-h100x4-160": LambdaRun(_IN_160, _OUT_160_70B_H100, _published((2688.95, 4363.80), (28.18, 421.41),
                                                                       (7024.03, 19470.91)), model="llama3-70b", tp=4),
    "70b-h100x4-320": LambdaRun(_IN_320, _OUT_320_70B, _published((2753.86, 5936.66), (39.05, 805.26),
                                                                  (9528.67, 22460.26)), model="llama3-70b", tp=4),
    "70b-a100x4-10": LambdaRun(_IN_10, (120, 579, 233, 194, 101, 741, 0, 0, 6, 35),
                               _published((356.07, 357.14), (29.55, 59.80), (3618.05, 21010.65)),
                               chip="a100-80gb", budget=2000, model="llama3-70b", tp=4),
    "70b-a100x4-160": LambdaRun(_IN_160, _OUT_160_70B_A100, _published((3526.72, 7207.32), (55.25, 1021.57),
                                                                       (12080.89, 33990.30)),
                                chip="a100-80gb", budget=2000, model="llama3-70b", tp=4),
})

# Mixtral 8x7B Instruct (BF16) on two H100 SXM, TP 2: ``results/prompt_{N}/2xH100-80GB-SXM/
# Mixtral-8x7B-Instruct-v0.1_tp2_len2048.json``. Its tokenizer differs from Llama 3's, so the same ShareGPT prompts
# have other lengths.
_IN_160_MIXTRAL = (
    14, 30, 28, 12, 375, 29, 487, 369, 5, 236, 4, 18, 494, 518, 10, 14, 277, 8, 17, 493, 776, 64, 87, 879, 776, 341,
    455, 9, 12, 48, 12, 5, 88, 865, 386, 42, 716, 9, 323, 18, 19, 837, 725, 13, 10, 312, 13, 153, 569, 921, 431, 7,
    391, 9, 53, 300, 958, 577, 99, 759, 22, 16, 18, 84, 33, 196, 11, 722, 559, 46, 391, 24, 569, 838, 123, 121, 457,
    91, 588, 299, 12, 28, 404, 24, 445, 295, 33, 30, 253, 260, 37, 153, 122, 30, 23, 72, 414, 228, 148, 150, 252,
    373, 589, 884, 379, 327, 379, 582, 20, 12, 71, 52, 21, 20, 58, 131, 61, 75, 19, 10, 964, 8, 287, 349, 26, 37,
    572, 429, 25, 25, 23, 20, 45, 881, 779, 374, 59, 85, 45, 11, 22, 39, 645, 8, 9, 393, 11, 768, 5, 56, 365, 344,
    63, 46, 55, 348, 38, 8, 7, 278,
)
_OUT_160_MIXTRAL = (
    129, 496, 273, 207, 118, 928, 0, 26, 9, 48, 10, 494, 95, 493, 49, 344, 31, 301, 409, 0, 749, 306, 168, 99, 0, 0,
    571, 132, 245, 7, 8, 169, 63, 14, 814, 231, 20, 135, 0, 215, 219, 0, 0, 314, 225, 567, 281, 102, 28, 0, 19, 233,
    11, 224, 92, 402, 6, 0, 143, 0, 367, 5, 248, 28, 332, 173, 46, 26, 0, 183, 0, 27, 41, 0, 14, 935, 76, 792, 13,
    0, 144, 232, 16, 153, 0, 27, 267, 392, 14, 433, 364, 65, 34, 459, 486, 601, 17, 472, 477, 520, 18, 650, 0, 10, 0,
    0, 0, 0, 281, 340, 454, 542, 674, 24, 206, 30, 41, 326, 382, 371, 10, 190, 0, 0, 196, 838, 0, 129, 45, 30, 497,
    408, 136, 6, 0, 862, 65, 44, 374, 594, 120, 238, 153, 102, 345, 25, 403, 46, 166, 50, 0, 20, 632, 949, 264, 0,
    487, 178, 183, 6,
)
RUNS.update({
    "mixtral-h100x2-10": LambdaRun(_IN_160_MIXTRAL[:10], _patched(_OUT_160_MIXTRAL[:10], {1: 971}),
                                   _published((1846.13, 1847.13), (16.93, 21.09), (3930.89, 13091.92)),
                                   model="mixtral-8x7b", tp=2),
    "mixtral-h100x2-160": LambdaRun(_IN_160_MIXTRAL, _OUT_160_MIXTRAL,
                                    _published((7946.83, 8659.73), (25.39, 437.88), (11299.61, 25799.65)),
                                    model="mixtral-8x7b", tp=2),
})

# The same campaign's other tensor-parallel files (issue 15 item 5, a later round): Llama 3 70B on two H100s
# (``results/prompt_{10,40}/2xH100-80GB-SXM/Meta-Llama-3-70B-Instruct_tp2_len2048.json``), on eight H100s
# (``results/prompt_{10,160}/8xH100-80GB-SXM/Meta-Llama-3-70B-Instruct_tp8_len2048.json``) and on eight A100s
# (``results/prompt_{10,160}/8xA100-80GB-SXM/Meta-Llama-3-70B-Instruct_tp8_len2000.json``); Llama 3 8B on two and
# eight H100s (``results/prompt_160/2xH100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp2_len2048.json``,
# ``results/prompt_{10,160}/8xH100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp8_len2048.json``); Mixtral 8x7B on four H100s
# (``results/prompt_160/4xH100-80GB-SXM/Mixtral-8x7B-Instruct-v0.1_tp4_len2048.json``). Each file's total input and
# output tokens match the lists below (test_lambda_runs_match_the_files_totals). Not rows: the 70B's 160-prompt run on
# two H100s, which failed (the file counts 18 of 160 requests completed, none with an output token; the others end in a
# client payload error after 3.4 s, its ``errors``), and Mixtral's 10-prompt run on four H100s, as cold as its
# 160-prompt one (first tokens at 1.75 s).
RUNS.update({
    "70b-h100x2-10": LambdaRun(_IN_10, _patched(_OUT_160_70B_A100[:10], {1: 661}),
                               _published((218.92, 219.87), (29.54, 56.51), (3408.56, 21199.67)),
                               model="llama3-70b", tp=2),
    "70b-h100x2-40": LambdaRun(_IN_40, _patched(_OUT_160_70B_A100[:40], {1: 741, 32: 59}),
                               _published((796.96, 1322.19), (33.52, 183.64), (5099.66, 23406.29)),
                               model="llama3-70b", tp=2),
    "70b-h100x8-10": LambdaRun(_IN_10, _patched(_OUT_160_70B_A100[:10], {1: 624}),
                               _published((122.28, 123.12), (12.18, 25.25), (1450.96, 8503.90)),
                               model="llama3-70b", tp=8),
    "70b-h100x8-160": LambdaRun(_IN_160, _patched(_OUT_160_70B_H100, {1: 742, 55: 340, 80: 23, 96: 394, 100: 425,
                                                                      111: 392, 112: 578, 116: 31, 132: 518, 137: 526,
                                                                      148: 253, 155: 599}),
                                _published((1077.94, 2279.51), (20.96, 348.48), (4268.33, 13204.25)),
                                model="llama3-70b", tp=8),
    "70b-a100x8-10": LambdaRun(_IN_10, _patched(_OUT_160_70B_A100[:10], {1: 659}),
                               _published((222.73, 224.01), (19.99, 41.85), (2465.12, 13446.02)),
                               chip="a100-80gb", budget=2000, model="llama3-70b", tp=8),
    "70b-a100x8-160": LambdaRun(_IN_160, _patched(_OUT_160_70B_A100, {1: 743, 26: 403, 32: 44, 47: 120, 55: 0, 73: 179,
                                                                      96: 394, 100: 409, 112: 611, 123: 209, 129: 130,
                                                                      132: 581, 133: 270, 137: 721, 141: 437,
                                                                      148: 253}),
                                _published((2329.73, 4989.45), (39.68, 751.30), (8536.00, 24216.47)),
                                chip="a100-80gb", budget=2000, model="llama3-70b", tp=8),
    "8b-h100x2-160": LambdaRun(_IN_160, _patched(_OUT_160, {1: 414, 9: 38, 21: 372, 48: 23, 82: 374, 83: 18, 125: 20,
                                                            132: 516, 155: 691}),
                               _published((860.03, 1140.16), (9.34, 187.84), (2214.47, 5822.57)), tp=2),
    "8b-h100x8-10": LambdaRun(_IN_10, _OUT_160[:10], _published((55.88, 57.13), (3.26, 4.76), (415.89, 2244.28)),
                              tp=8),
    "8b-h100x8-160": LambdaRun(_IN_160, _patched(_OUT_160, {1: 451, 21: 372, 49: 74, 56: 21, 82: 449, 100: 441,
                                                            132: 570, 148: 322, 155: 716}),
                               _published((808.44, 1007.55), (7.02, 128.20), (1862.14, 4333.60)), tp=8),
    "mixtral-h100x4-160": LambdaRun(_IN_160_MIXTRAL, _patched(_OUT_160_MIXTRAL, {
        1: 301, 11: 486, 17: 303, 21: 418, 28: 251, 39: 220, 47: 161, 60: 300, 62: 228, 64: 468, 65: 185, 75: 936,
        77: 819, 80: 309, 81: 175, 83: 154, 86: 268, 89: 536, 90: 402, 93: 504, 98: 422, 109: 326, 111: 560, 112: 610,
        114: 192, 118: 309, 127: 159, 130: 466, 142: 149, 153: 587, 158: 174}),
        _published((6413.75, 6929.53), (15.28, 190.35), (8695.03, 17002.09)), model="mixtral-8x7b", tp=4),
})

# Each file's ``total_input_tokens`` and ``total_output_tokens``, against which the lists above are checked.
FILE_TOTALS: dict[int | str, tuple[int, int]] = {
    "70b-h100x2-10": (1369, 2091), "70b-h100x2-40": (8595, 6974), "70b-h100x8-10": (1369, 2054),
    "70b-h100x8-160": (34050, 28293), "70b-a100x8-10": (1369, 2089), "70b-a100x8-160": (34050, 28004),
    "8b-h100x2-160": (34050, 31738), "8b-h100x8-10": (1369, 1863), "8b-h100x8-160": (34050, 32132),
    "mixtral-h100x4-160": (37741, 32679),
}

# The order in which vLLM 0.6's API server handed each burst to the engine, as the files show it: the requests sorted
# by their published first-token time (``ttfts``; a request that streamed no text, TTFT 0, placed after the request
# before it). The server did not forward a burst in send order: the 320-prompt 70B burst's first tokens are for
# requests 216-282, then 0-215, then 283-319. Not a prediction input: a diagnostic of what the order decides
# (``replay_ms(n, ordered=True)``; docs/validation.md 2f).
FORWARD_ORDER: dict[int | str, tuple[int, ...]] = {
    "70b-h100x4-160": (
        90, 102, 103, 0, 1, 2, 3, 110, 106, 107, 108, 104, 105, 101, 99, 113, 120, 119, 118, 117, 116, 115, 114, 109,
        100, 122, 123, 124, 125, 121, 112, 111, 133, 134, 132, 131, 129, 127, 128, 126, 130, 143, 144, 138, 137, 5, 6,
        7, 4, 16, 12, 11, 10, 9, 8, 22, 17, 18, 19, 15, 14, 13, 23, 24, 25, 20, 35, 33, 34, 31, 28, 27, 26, 29, 21, 39,
        37, 38, 36, 32, 30, 49, 47, 48, 46, 45, 43, 44, 40, 41, 42, 54, 55, 53, 52, 50, 51, 60, 59, 56, 57, 58, 73, 74,
        70, 71, 66, 65, 64, 62, 63, 75, 72, 68, 69, 67, 61, 88, 89, 87, 84, 85, 86, 81, 82, 83, 80, 78, 79, 77, 76,
        148, 146, 147, 145, 140, 139, 142, 141, 98, 95, 96, 97, 94, 93, 91, 92, 156, 157, 150, 151, 152, 153, 149, 135,
        136, 159, 158, 155, 154,
    ),
    "70b-h100x4-320": (
        222, 223, 221, 220, 218, 219, 216, 236, 235, 233, 234, 232, 231, 230, 224, 225, 226, 242, 243, 241, 238, 237,
        239, 240, 256, 255, 253, 254, 251, 250, 246, 228, 229, 227, 257, 252, 247, 248, 249, 263, 264, 262, 260, 261,
        258, 244, 245, 274, 273, 271, 267, 268, 269, 265, 266, 282, 281, 280, 279, 278, 275, 276, 277, 270, 5, 6, 7, 4,
        3, 2, 1, 0, 13, 12, 11, 10, 8, 9, 18, 19, 17, 16, 15, 14, 22, 21, 20, 31, 32, 30, 29, 26, 28, 27, 23, 24, 25,
        40, 41, 42, 39, 36, 35, 33, 34, 51, 46, 44, 43, 37, 38, 55, 54, 53, 52, 50, 49, 56, 57, 58, 47, 48, 45, 64, 62,
        63, 61, 60, 59, 70, 71, 68, 69, 67, 66, 65, 78, 79, 77, 76, 75, 73, 74, 72, 90, 88, 89, 87, 84, 85, 86, 81, 80,
        101, 100, 96, 97, 98, 95, 94, 93, 91, 92, 82, 83, 109, 104, 105, 102, 103, 99, 117, 115, 114, 113, 112, 110,
        106, 107, 108, 122, 121, 116, 134, 132, 127, 128, 126, 123, 124, 125, 120, 119, 118, 111, 135, 136, 137, 133,
        131, 129, 130, 148, 145, 146, 147, 141, 143, 144, 140, 142, 138, 139, 163, 161, 160, 159, 158, 156, 157, 154,
        150, 151, 152, 153, 149, 174, 175, 173, 171, 172, 170, 167, 168, 169, 164, 165, 166, 162, 155, 184, 185, 183,
        182, 177, 176, 192, 191, 190, 189, 187, 188, 181, 178, 193, 194, 195, 196, 186, 212, 208, 209, 204, 207, 203,
        202, 205, 206, 197, 198, 199, 200, 201, 180, 179, 289, 290, 287, 288, 285, 286, 283, 272, 217, 213, 214, 215,
        211, 210, 301, 302, 300, 299, 296, 297, 298, 295, 291, 284, 259, 305, 307, 304, 306, 303, 293, 294, 292, 319,
        317, 318, 316, 311, 308, 309, 314, 315, 310, 312, 313,
    ),
    "70b-a100x4-160": (
        111, 109, 106, 107, 108, 122, 119, 113, 116, 115, 114, 110, 112, 104, 105, 102, 103, 127, 128, 126, 123, 124,
        125, 117, 135, 136, 134, 129, 133, 132, 131, 130, 121, 118, 120, 137, 4, 3, 2, 1, 0, 13, 14, 12, 11, 9, 8, 10,
        5, 6, 7, 22, 21, 20, 16, 17, 15, 23, 24, 25, 18, 19, 35, 33, 34, 32, 30, 31, 29, 28, 27, 26, 40, 41, 42, 39,
        37, 38, 36, 54, 55, 51, 52, 53, 50, 47, 48, 45, 44, 46, 43, 56, 57, 58, 49, 67, 66, 64, 62, 63, 60, 59, 70, 71,
        68, 69, 65, 61, 77, 76, 75, 73, 74, 72, 84, 85, 86, 82, 83, 80, 78, 79, 100, 98, 99, 95, 96, 97, 93, 90, 88,
        89, 87, 81, 150, 151, 152, 153, 148, 146, 147, 143, 144, 145, 142, 141, 140, 138, 139, 101, 94, 91, 92, 159,
        158, 155, 156, 157, 154, 149,
    ),
    # The 70B on eight H100s (a later round; ``ttfts`` read to 0.1 ms, ties in send order): requests 99-153 first.
    "70b-h100x8-160": (
        117, 119, 115, 114, 116, 111, 112, 109, 110, 113, 99, 131, 127, 128, 122, 121, 123, 124, 125, 120, 118,
        135, 136, 133, 130, 126, 150, 151, 152, 153, 145, 146, 147, 140, 137, 141, 138, 139, 134, 129, 132, 3,
        2, 1, 0, 13, 11, 9, 10, 8, 5, 6, 7, 4, 22, 21, 18, 19, 16, 17, 14, 15, 12, 26, 27, 28, 23, 24, 25, 33,
        34, 32, 30, 29, 20, 40, 41, 42, 39, 37, 38, 36, 35, 31, 49, 51, 46, 47, 48, 44, 45, 43, 54, 55, 53, 50,
        52, 70, 71, 67, 64, 60, 61, 59, 62, 63, 56, 57, 58, 75, 66, 65, 84, 85, 86, 81, 80, 77, 78, 79, 76, 73,
        74, 72, 68, 69, 100, 98, 96, 97, 94, 95, 91, 92, 93, 90, 88, 89, 87, 82, 83, 104, 105, 102, 103, 101,
        143, 144, 106, 107, 108, 158, 159, 156, 157, 154, 155, 149, 148, 142,
    ),
    "a100-160": (
        121, 119, 114, 120, 117, 116, 115, 118, 113, 112, 111, 109, 106, 97, 95, 3, 2, 1, 0, 12, 11, 7, 8, 5, 6, 4, 22,
        16, 20, 18, 17, 15, 14, 13, 9, 10, 27, 26, 25, 23, 19, 35, 33, 32, 28, 29, 30, 24, 21, 46, 44, 39, 41, 36, 40,
        38, 34, 37, 31, 50, 51, 47, 48, 45, 43, 42, 58, 55, 54, 52, 53, 49, 66, 64, 61, 59, 56, 76, 75, 69, 70, 71, 67,
        65, 63, 62, 60, 84, 85, 79, 78, 77, 72, 68, 88, 87, 80, 74, 73, 100, 99, 98, 94, 96, 92, 90, 91, 93, 89, 86,
        83, 81, 82, 110, 107, 108, 105, 104, 102, 103, 101, 123, 139, 133, 131, 129, 127, 128, 125, 126, 122, 124, 146,
        140, 137, 136, 135, 134, 154, 147, 151, 152, 153, 150, 148, 149, 145, 144, 143, 142, 141, 138, 132, 130, 159,
        156, 157, 158, 155, 57,
    ),
}

# The decode rate with the whole burst running: the files' ``itls`` of request 0 (each a chunk of 10 tokens, as
# multi-step scheduling streams them), its 5th to 9th chunks (after the burst's prefills, before the first
# request finishes past a few tokens), mean seconds per chunk. Read from the same files as the runs.
STEADY_CHUNKS = slice(4, 9)
STEADY_CHUNK_S: dict[int | str, float] = {
    40: float(np.mean([0.07959, 0.07983, 0.07918, 0.07949, 0.07963])),
    160: float(np.mean([0.09875, 0.09537, 0.09580, 0.09663, 0.09718])),
    320: float(np.mean([0.13115, 0.13389, 0.13310, 0.13089, 0.12768])),
    "a100-160": float(np.mean([0.18539, 0.18627, 0.18420, 0.18516, 0.18443])),
    # The tensor-parallel files of a later round, the same chunks of request 0 (after each burst's last prefill).
    "8b-h100x2-160": float(np.mean([0.07475, 0.07565, 0.07457, 0.07384, 0.07245])),
    "8b-h100x8-160": float(np.mean([0.06050, 0.05931, 0.06022, 0.05419, 0.05401])),
    "70b-h100x8-160": float(np.mean([0.16367, 0.16528, 0.16623, 0.16819, 0.16888])),
    "70b-a100x8-160": float(np.mean([0.34729, 0.31954, 0.30584, 0.31186, 0.31341])),
}


def run_requests(run: LambdaRun, order: tuple[int, ...] | None = None) -> list[Request]:
    """The run's requests, all sent at 0 (prompt tokens drawn from a fixed seed; at least one output token), in
    send order or, given ``order``, in that order (the same requests)."""
    rng = np.random.default_rng(0)
    reqs = [Request(f"r{i}", rng.integers(256, 128000, size=p, dtype=np.int32), max(o, 1), arrival_s=0.0)
            for i, (p, o) in enumerate(zip(run.prompts, run.outputs, strict=True))]
    return reqs if order is None else [reqs[i] for i in order]


def run_config(run: LambdaRun) -> ReplicaConfig:
    """vLLM 0.6's engine as the run used it: v0 (no chunked prefill), the prefill budget, 10 scheduler steps and
    the asynchronous output processor (on by default in v0.6: outputs seen when the next step ends)."""
    return ReplicaConfig(preset(run.model), run.chip, tp=run.tp, chunked_prefill=False,
                         max_prefill_tokens=run.budget, num_scheduler_steps=10, async_output=True)


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
def replay_ms(n: int | str, *, ordered: bool = False) -> dict[str, float]:
    """Run ``n`` (a key of :data:`RUNS`) through the offline simulator, measured as benchmark_serving measures it
    (ms); ``ordered`` hands the burst to the API server in the order the published run's server forwarded it
    (:data:`FORWARD_ORDER`) instead of send order."""
    run = RUNS[n]
    reqs = run_requests(run, FORWARD_ORDER[n] if ordered else None)
    done = {s.request_id: s for s in simulate(run_config(run), reqs, keep_requests=True).requests}
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
