"""MosaicML llm-foundry's MPT training benchmarks, A100 and H100, 2023 (docs/validation.md 1b).

Source: mosaicml/llm-foundry ``scripts/train/benchmarking/README.md`` at commit
061f2c7ce64e655100286584a7629e2a09f827ba, tables "A100 80GB with 1600 Gbps node-node interconnect (RoCE)", "A100 40GB
with 1600 Gbps node-node interconnect (RoCE)" and "H100 80GB BF16": tokens per second per GPU (``Throughput
(T/s/GPU)``) of MPT models trained with Composer's PyTorch FSDP (``FULL_SHARD``) on 8 to 128 GPUs, with the microbatch
the run settled on (``collect_results.py`` reads the last ``trainer/device_train_microbatch_size`` the run logged), its
gradient accumulation, activation checkpointing on or off and the FSDP mixed-precision mode (``PURE``: gradients reduced
in bf16; ``DEFAULT``: in fp32). Every row of the three tables is here; the H100 FP8 table is not (Transformer Engine's
FP8 of 2023 with ``amp_fp8``: no layout of its casts is published).

Models (llm-foundry ``scripts/train/yamls/pretrain/mpt-*.yaml``): GPT blocks with a GELU MLP of 4 d_model, multi-head
attention, vocabulary 50,368 (tied embeddings and learned positions, as the table's NumParams counts to the parameter),
``attn_impl: triton`` (flash-attn's Triton FlashAttention of 2022-2023: ``attention_impl: flash_triton``); Composer's
``ComposerMPTCausalLM`` defaults ``loss_fn`` to ``fused_crossentropy`` (flash-attn's xentropy kernel on the 16-bit
logits: ``loss_impl: fused``). Activation checkpointing is Composer's ``checkpoint_wrapper`` around every ``MPTBlock``
(``recompute: full``). The A100 interconnect is the catalog's (8 x 200 Gb/s per node, as the tables state).

Nothing here set a constant of the model. Rows outside 10% are strict xfails pinned within 3 points of their error,
each with its cause (``CAUSES``).
"""

from __future__ import annotations

import functools
import statistics
from typing import Any

import pytest

from gigacluster.fabric.comm_model import FabricCommModel
from gigacluster.model import DoesNotFitError
from gigacluster.model.roofline import EfficiencyParams
from gigacluster.model.step import demand_times_s, plan_step
from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train

# MPT sizes: (d_model, n_heads, n_layers), llm-foundry scripts/train/yamls/pretrain/mpt-<size>.yaml.
MPT = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24), "1b": (2048, 16, 24),
       "3b": (2560, 20, 32), "7b": (4096, 32, 32), "13b": (5120, 40, 40), "30b": (7168, 56, 48),
       "70b": (8192, 64, 80)}

CAUSES = {
    "ceiling": "published HFU of 64-79% of the A100's peak (llm-foundry's own count: 8N a token with checkpointing, 6N "
               "without, plus attention) is at or above the model's in-step GEMM rate (matmul_peak_fraction 0.80 x "
               "sustained_fraction 0.80 = 0.64 of peak); the model charges the whole forward that checkpoint_wrapper "
               "re-runs per MPTBlock, and no published figure lets a 2023 A100 run its GEMMs faster in a step",
    "small_model": "125m only (d_model 768, 12 layers): every row runs 11-23% slower than modelled, at 512 tokens "
                   "as at 32,768, where the 350m rows at the same head dim 64 and kernel land within 8%; the share "
                   "that grows with the GPU count (+12% on 8 A100 40GB, +23% on 128) is not traced",
    "triton": "attention is most of this step; the Triton kernel's rate is the FlashAttention-2 paper's bound (FA2 at "
              "most 1.3x faster on A100), and the row runs as if the gap were wider",
    "table": "the row disagrees with its own table: 30b at 8,192 tokens runs 29% (A100 80GB) and 23% (H100) below its "
             "4,096 row, where attention's share costs 7-10%; 760m at 1,024 and 512 tokens on A100 80GB below its "
             "2,048 row (the 40GB card ran both 12-19% faster); 1b on 32 A100 40GB at 15,555 where 16, 64 and 128 "
             "GPUs ran 18,647-19,085; 70b on 64 A100 40GB at 276 where 128 ran 376",
    "hopper": "H100 with 2023 software (at 2,048 tokens 760m-13b reach 35-46% MFU, 57-64% on A100 80GB): the "
              "model's H100 GEMM rate is 2024-25 cuBLAS's (0.76 of peak) and no published 2023 Hopper GEMM rate was "
              "found",
}

A100_80GB = """
70b 2048 64 8 4 2048 410 T P -0.148 ceiling
70b 2048 32 2 16 1024 373 T P
30b 8192 8 1 21 168 574 T D +0.147 table
30b 4096 8 1 21 168 814 T D -0.137 ceiling
30b 2048 8 3 21 504 916 T D -0.190 ceiling
30b 1024 8 6 21 1008 946 T D -0.199 ceiling
30b 512 8 12 21 2016 967 T D -0.208 ceiling
13b 32768 8 1 3 24 1016 T D
13b 16384 8 3 3 72 1431 T D -0.149 ceiling
13b 8192 8 5 3 120 1795 T D -0.188 ceiling
13b 4096 8 10 3 240 2060 T D -0.216 ceiling
13b 2048 8 2 3 48 2262 F D
13b 1024 8 40 3 960 2330 T D -0.245 ceiling
7b 65536 8 1 2 16 1013 T D
7b 32768 8 2 2 32 1672 T D
7b 16384 8 4 2 64 2453 T D -0.113 ceiling
7b 8192 8 8 2 128 3206 T D -0.165 ceiling
7b 4096 8 16 2 256 3684 T D -0.178 ceiling
7b 2048 8 6 2 96 4641 F D
7b 1024 8 64 2 1024 4357 T D -0.229 ceiling
3b 65536 8 1 2 16 1767 T D
3b 32768 8 3 6 144 3029 T D
3b 16384 8 1 6 48 5529 F D
3b 8192 8 3 6 144 7695 F D
3b 4096 8 5 6 240 9457 F D
3b 2048 8 10 2 160 10811 F D
3b 1024 8 20 6 960 11580 F D
3b 512 8 40 6 1920 12127 F D -0.109 ceiling
1b 65536 8 1 2 16 3044 T D
1b 32768 8 1 4 32 6275 F D
1b 16384 8 2 4 64 9956 F D
1b 8192 8 3 4 96 13814 F D
1b 4096 8 7 4 224 17807 F D
1b 2048 8 14 4 448 20513 F D
1b 1024 8 18 4 576 22112 F D
1b 512 8 56 4 1792 23148 F D
760m 65536 8 1 2 16 4143 T D
760m 32768 8 1 2 16 8802 F D +0.107 triton
760m 16384 8 3 2 48 14274 F D
760m 8192 8 6 2 96 20933 F D
760m 4096 8 12 2 192 27351 F D
760m 2048 8 24 2 384 32434 F D
760m 1024 8 48 2 768 29765 F D +0.146 table
760m 512 8 96 2 1536 29446 F D +0.205 table
350m 65536 8 1 2 16 7524 F D
350m 32768 8 2 2 32 13652 F D
350m 16384 8 4 2 64 23559 F D
350m 8192 8 8 2 128 36569 F D
350m 4096 8 16 2 256 49555 F D
350m 2048 8 32 2 512 58782 F D
350m 1024 8 64 2 1024 64813 F D
350m 512 8 128 2 2048 69330 F D
125m 65536 8 1 2 16 20368 F D
125m 32768 8 2 2 32 36407 F D
125m 16384 8 4 2 64 60040 F D
125m 8192 8 8 2 128 90392 F D
125m 4096 8 16 2 256 118396 F D +0.124 small_model
125m 2048 8 40 2 640 142830 F D +0.129 small_model
125m 2048 8 32 2 512 141737 F D +0.134 small_model
125m 1024 8 64 2 1024 156468 F D +0.147 small_model
125m 512 8 128 2 2048 165681 F D +0.150 small_model
"""
A100_40GB = """
70b 2048 128 4 1 512 376 T P
70b 2048 64 2 1 128 276 T P +0.234 table
30b 2048 128 6 1 768 865 T P -0.142 ceiling
30b 2048 32 4 1 128 857 T P -0.142 ceiling
13b 8192 8 1 16 128 1407 T P
13b 4096 8 2 16 256 1603 T P
13b 2048 128 16 1 2048 1972 T P -0.141 ceiling
13b 2048 64 16 1 1024 1976 T P -0.143 ceiling
13b 2048 32 14 1 448 1998 T P -0.152 ceiling
13b 2048 16 10 1 160 1993 T P -0.155 ceiling
13b 2048 8 4 16 512 1668 T P
13b 1024 8 8 16 1024 1727 T P
13b 512 8 16 16 2048 1763 T P
7b 16384 8 1 4 32 2249 T P
7b 8192 8 3 4 96 2887 T P
7b 4096 8 6 4 192 3366 T P -0.111 ceiling
7b 2048 128 18 1 2304 3623 T P -0.118 ceiling
7b 2048 64 18 1 1152 3665 T P -0.128 ceiling
7b 2048 32 18 1 576 3725 T P -0.142 ceiling
7b 2048 16 16 1 256 3645 T P -0.123 ceiling
7b 2048 8 12 4 384 3679 T P -0.131 ceiling
7b 1024 8 24 4 768 3854 T P -0.141 ceiling
7b 512 8 48 4 1536 3895 T P -0.134 ceiling
3b 32768 8 1 4 32 2955 T P
3b 16384 8 2 8 128 4465 T P
3b 8192 8 1 8 64 7149 F P
3b 4096 8 2 8 128 8777 F P
3b 2048 128 6 1 768 9538 F P
3b 2048 64 6 1 384 9736 F P
3b 2048 32 6 1 192 9914 F P
3b 2048 16 5 1 80 9750 F P
3b 2048 8 5 8 320 10065 F P
3b 1024 8 10 8 640 10731 F P
3b 512 8 20 8 1280 11324 F P
1b 32768 8 1 4 32 5095 T P
1b 16384 8 1 8 64 9715 F P
1b 8192 8 2 8 128 13474 F P
1b 4096 8 4 8 256 16856 F P
1b 2048 128 10 1 1280 18647 F P
1b 2048 64 10 1 640 19001 F P
1b 2048 32 10 1 320 15555 F P +0.207 table
1b 2048 16 8 1 128 19085 F P
1b 2048 8 8 8 512 19271 F P
1b 1024 8 16 8 1024 20959 F P
1b 512 8 32 8 2048 21782 F P
760m 32768 8 1 4 32 7183 T P
760m 16384 8 1 4 32 13914 F P
760m 8192 8 3 4 96 20106 F P
760m 4096 8 6 4 192 25863 F P
760m 2048 128 12 1 1536 28940 F P
760m 2048 64 12 1 768 29344 F P
760m 2048 32 12 1 384 29648 F P
760m 2048 16 12 1 192 29607 F P
760m 2048 8 12 4 384 30173 F P
760m 1024 8 24 4 768 33422 F P
760m 512 8 48 4 1536 34938 F P
350m 32768 8 1 4 32 13416 F P
350m 16384 8 2 4 64 22896 F P
350m 8192 8 4 4 128 34933 F P
350m 4096 8 8 4 256 46833 F P
350m 2048 128 18 1 2304 51934 F P
350m 2048 64 18 1 1152 52689 F P
350m 2048 32 18 1 576 53811 F P
350m 2048 16 18 1 288 55413 F P
350m 2048 8 16 4 512 55995 F P
350m 1024 8 32 4 1024 62523 F P
350m 512 8 64 4 2048 66284 F P
125m 32768 8 1 4 32 32651 F P +0.179 small_model
125m 16384 8 2 3 48 55484 F P +0.153 small_model
125m 8192 8 5 3 120 86858 F P +0.108 small_model
125m 4096 8 13 3 312 115162 F P +0.110 small_model
125m 2048 128 26 1 3328 123936 F P +0.226 small_model
125m 2048 64 26 1 1664 125234 F P +0.218 small_model
125m 2048 32 26 1 832 127122 F P +0.202 small_model
125m 2048 16 26 1 416 130535 F P +0.172 small_model
125m 2048 8 26 3 624 136334 F P +0.124 small_model
125m 1024 8 52 3 1248 148289 F P +0.147 small_model
125m 512 8 104 3 2496 156735 F P +0.149 small_model
"""
H100_BF16 = """
70b 2048 64 8 4 2048 1039 T D
70b 2048 32 2 16 1024 882 T D
30b 8192 8 1 21 168 1384 T D +0.279 table
30b 4096 8 1 21 168 1802 T D
30b 2048 32 14 3 1344 2308 T D
30b 2048 16 10 3 480 2263 T D
30b 2048 8 3 21 504 2002 T D
30b 1024 8 6 21 1008 2084 T D
13b 32768 8 1 3 24 1976 T D
13b 16384 8 3 3 72 2985 T D
13b 4096 8 10 3 240 4717 T D
13b 2048 64 2 1 128 4800 F D +0.222 hopper
13b 2048 32 2 1 64 4811 F D +0.220 hopper
13b 2048 16 2 1 32 4767 F D +0.229 hopper
13b 2048 8 2 1 16 4792 F D +0.214 hopper
13b 1024 8 40 3 960 5502 T D
7b 65536 8 1 2 16 1956 T D
7b 32768 8 2 2 32 3318 T D
7b 8192 8 8 2 128 6935 T D
7b 4096 8 16 2 256 8611 T D
7b 2048 8 6 1 48 10643 F D
7b 1024 8 64 2 1024 10203 T D
3b 65536 8 1 2 16 3262 T D +0.122 hopper
3b 32768 8 3 6 144 5873 T D
3b 16384 8 1 6 48 11152 F D +0.161 hopper
3b 8192 8 3 6 144 16578 F D +0.107 hopper
3b 4096 8 5 6 240 20964 F D
3b 2048 64 6 3 1152 22525 F D +0.143 hopper
3b 2048 32 6 3 576 23021 F D +0.123 hopper
3b 2048 16 10 3 480 24142 F D
3b 1024 8 20 6 960 27046 F D
3b 512 8 40 6 1920 27965 F D
1b 65536 8 1 2 16 5506 T D +0.135 hopper
1b 32768 8 1 4 32 12025 F D +0.183 hopper
1b 16384 8 2 4 64 19649 F D +0.177 hopper
1b 8192 8 3 4 96 29157 F D +0.151 hopper
1b 4096 8 7 4 224 38535 F D +0.122 hopper
1b 2048 64 20 1 1280 44402 F D +0.143 hopper
1b 2048 32 20 1 640 45130 F D +0.126 hopper
1b 2048 16 20 1 320 46037 F D +0.105 hopper
1b 2048 8 14 1 112 45455 F D +0.107 hopper
1b 1024 8 18 4 576 48910 F D +0.115 hopper
1b 512 8 56 4 1792 52275 F D +0.102 hopper
760m 32768 8 1 2 16 16291 F D +0.217 hopper
760m 16384 8 3 2 48 27815 F D +0.197 hopper
760m 8192 8 6 2 96 41825 F D +0.201 hopper
760m 4096 8 12 2 192 55459 F D +0.207 hopper
760m 2048 32 24 1 768 67971 F D +0.178 hopper
760m 2048 16 24 1 384 68551 F D +0.169 hopper
760m 2048 8 24 2 384 63147 F D +0.270 hopper
760m 1024 8 48 2 768 78581 F D +0.133 hopper
760m 512 8 96 2 1536 83749 F D +0.125 hopper
"""

TABLES = {"a100-80gb": A100_80GB, "a100-40gb": A100_40GB, "h100-sxm": H100_BF16}
Row = tuple[str, str, int, int, int, int, int, bool, str, float | None, str | None]


def _rows() -> list[Row]:
    out: list[Row] = []
    for chip, text in TABLES.items():
        for line in text.strip().splitlines():
            f = line.split()
            miss = (float(f[9]), f[10]) if len(f) > 9 else (None, None)
            out.append((chip, f[0], int(f[1]), int(f[2]), int(f[3]), int(f[4]), int(f[6]), f[7] == "T", f[8], *miss))
    return out


ROWS = _rows()


def row_id(r: Row) -> str:
    """chip-model-sequence-GPUs-microbatch (unique in the tables)."""
    return f"{r[0]}-{r[1]}-s{r[2]}-g{r[3]}-mb{r[4]}"


def mpt_spec(chip: str, size: str, seq: int, gpus: int, mbs: int, accum: int, ckpt: bool, mp: str,
             **top: Any) -> TrainSpec:
    """One published layout as our spec says it."""
    d, heads, layers = MPT[size]
    return TrainSpec.from_dict({
        "model": {"layers": layers, "hidden": d, "heads": heads, "kv_heads": heads, "ffn_hidden": 4 * d,
                  "vocab": 50368, "seq_len": seq, "mlp": "gelu"},
        "batch": {"global_batch": gpus * mbs * accum}, "hardware": {"chip": chip, "count": gpus},
        "parallelism": {"fsdp": True, "microbatch_size": mbs, "recompute": "full" if ckpt else "none",
                        "grad_reduce_dtype": "bf16" if mp == "P" else "fp32"},
        "precision": "bf16", "attention_impl": "flash_triton", "loss_impl": "fused", **top,
    })


@functools.cache
def error(r: Row) -> float:
    """Predicted / published tokens per second per GPU - 1."""
    chip, size, seq, gpus, mbs, accum, published, ckpt, mp = r[:9]
    return estimate_train(mpt_spec(chip, size, seq, gpus, mbs, accum, ckpt, mp)).tokens_per_s / gpus / published - 1


def _param(r: Row) -> Any:
    if r[9] is None:
        return pytest.param(r, id=row_id(r))
    return pytest.param(r, id=row_id(r), marks=pytest.mark.xfail(strict=True, reason=CAUSES[str(r[10])]))


@pytest.mark.parametrize("row", [_param(r) for r in ROWS])
def test_llmfoundry_row_within_10_percent(row: Row) -> None:
    """Each llm-foundry MPT row within 10% of its published tokens/s per GPU (strict xfail where missed)."""
    assert abs(error(row)) < 0.10


@pytest.mark.parametrize("row", [pytest.param(r, id=row_id(r)) for r in ROWS if r[9] is not None])
def test_llmfoundry_missed_row_at_its_documented_error(row: Row) -> None:
    """A missed row stays within 3 points of the error its cause was written for."""
    assert error(row) == pytest.approx(row[9], abs=0.03)


# (rows, met within 10%, median |error|, max |error|) per table, as docs/validation.md 1b states them.
FIGURES = {"a100-80gb": (61, 38, 0.083, 0.245), "a100-40gb": (78, 51, 0.045, 0.234), "h100-sxm": (52, 22, 0.111, 0.279)}


@pytest.mark.parametrize("chip", list(FIGURES))
def test_llmfoundry_family_figures(chip: str) -> None:
    """Per table: the rows, how many are met, median and max |error| as documented (issue 15's targets are missed)."""
    errs = [abs(error(r)) for r in ROWS if r[0] == chip]
    n, met, median, worst = FIGURES[chip]
    assert len(errs) == n
    assert sum(e < 0.10 for e in errs) == met
    assert statistics.median(errs) == pytest.approx(median, abs=0.005)
    assert max(errs) == pytest.approx(worst, abs=0.005)


def published_hfu(r: Row) -> float:
    """Hardware FLOP/s over the A100's 312 TFLOP/s the published rate implies: llm-foundry's count (README: 8N a token
    with checkpointing, 6N without) with attention counted causal (half the README's 4 L d s^2 a sequence per pass)."""
    size, seq, _, _, _, published, ckpt = r[1:8]
    d, _, layers = MPT[size]
    n = 12 * layers * d * d + 13 * layers * d + 2 * d + (50368 + seq) * d  # NumParams, to the parameter
    passes = 8 if ckpt else 6
    return published * passes * (n + layers * d * seq) / 312e12


def test_the_a100_rows_that_run_above_the_models_ceiling_all_miss_low() -> None:
    """Every A100 row whose published rate implies 64% HFU or more misses low for ``ceiling`` (the model's in-step GEMM
    rate is 0.64 of peak at best); the met rows imply at most 64%; the other ``ceiling`` rows imply 55% or more."""
    a100 = [r for r in ROWS if r[0] != "h100-sxm"]
    assert all(r[10] == "ceiling" for r in a100 if published_hfu(r) >= 0.64)
    assert max(published_hfu(r) for r in a100 if r[9] is None) < 0.64
    assert min(published_hfu(r) for r in a100 if r[10] == "ceiling") > 0.55


def test_fused_cross_entropy_is_what_lets_the_760m_layout_fit() -> None:
    """The 760m layout that ran on A100 80GB (24 x 2,048 tokens, no checkpointing) fits only with the fused loss's
    16-bit logits (4 bytes a logit); with fp32 logits and their softmax (8 bytes) the memory model refuses it."""
    args = ("a100-80gb", "760m", 2048, 8, 24, 2, False, "D")
    plan_step(mpt_spec(*args))
    with pytest.raises(DoesNotFitError):
        plan_step(mpt_spec(*args, loss_impl="fp32"))


def test_flash_triton_runs_attention_at_its_own_rate() -> None:
    """The Triton kernel's ceiling is FA2's over 1.3 on A100 (FlashAttention-2 paper) and FA2's 35% of peak over 1.3
    on H100 (FlashAttention-3 paper); only attention changes, the GEMMs do not."""
    a100, h100 = EfficiencyParams.for_chip("a100-80gb"), EfficiencyParams.for_chip("h100-sxm")
    assert a100.attention_peak_fraction / a100.flash_triton_fraction == pytest.approx(1.3, abs=0.01)
    assert h100.flash_triton_fraction == pytest.approx(0.35 / 1.3, abs=0.005)
    args = ("a100-80gb", "1b", 8192, 8, 3, 4, False, "D")
    flash = plan_step(mpt_spec(*args, attention_impl="flash")).compute
    triton = plan_step(mpt_spec(*args)).compute
    assert [w for w in flash if w.kind == "matmul"] == [w for w in triton if w.kind == "matmul"]
    assert {w.kind for w in triton} >= {"attention_triton"} and "attention" not in {w.kind for w in triton}


# The microbatch sweep llm-foundry ran beside the README's tables: ``scripts/train/benchmarking/larger_mb_1.md`` at
# commit beb8dee6922c5e31d27a24a713a1315b4013185d (the runs of ``act_ckpt_optimize.sh``: Composer FSDP FULL_SHARD,
# DEFAULT mixed precision, gradient accumulation 2, no activation checkpointing, sequence 2,048, 8 GPUs, image
# mosaicml/pytorch:2.0.1_cu118). (chip, size, microbatch, published tokens/s per GPU, error the model gives, cause).
# Its two further rows (3b on A100 80GB with checkpointing and activation CPU offload) are not here: the model has no
# activation offload. Not used to set anything.
MICROBATCH_SWEEP = [
    ("a100-80gb", "13b", 2, 2228, -0.021, None),
    ("a100-80gb", "13b", 1, 1867, +0.116, "microbatch"),
    ("a100-80gb", "7b", 6, 4715, -0.106, "microbatch"),
    ("a100-80gb", "7b", 4, 4513, -0.068, None),
    ("a100-80gb", "7b", 2, 4044, +0.006, None),
    ("a100-80gb", "7b", 1, 3366, +0.150, "microbatch"),
    ("a100-40gb", "3b", 1, 7076, +0.262, "microbatch"),
]
SWEEP_CAUSE = ("the sweep's step is a fixed cost per microbatch plus a rate per sequence (7b: 0.212 s + 0.400 s a "
               "sequence, residuals under 1%); the fixed cost is the whole of the microbatch's FSDP collectives "
               "(the model's own time for them: 0.208 s), which the model hides behind compute, and the rate is 19% "
               "above the model's: at one sequence the model is fast, at six slow")


def sweep_spec(r: tuple) -> TrainSpec:
    chip, size, mbs = r[:3]
    return mpt_spec(chip, size, 2048, 8, mbs, 2, False, "D")


def sweep_error(r: tuple) -> float:
    """Predicted / published tokens per second per GPU - 1 for one sweep row."""
    return estimate_train(sweep_spec(r)).tokens_per_s / 8 / r[3] - 1


def sweep_id(r: tuple) -> str:
    return f"mb-sweep-{r[0]}-{r[1]}-mb{r[2]}"


def _sweep_param(r: tuple) -> Any:
    if r[5] is None:
        return pytest.param(r, id=sweep_id(r))
    return pytest.param(r, id=sweep_id(r), marks=pytest.mark.xfail(strict=True, reason=SWEEP_CAUSE))


@pytest.mark.parametrize("row", [_sweep_param(r) for r in MICROBATCH_SWEEP])
def test_llmfoundry_microbatch_sweep_row_within_10_percent(row: tuple) -> None:
    """Each row of llm-foundry's microbatch sweep within 10% (strict xfail where missed, ``SWEEP_CAUSE``)."""
    assert abs(sweep_error(row)) < 0.10


@pytest.mark.parametrize("row", [pytest.param(r, id=sweep_id(r)) for r in MICROBATCH_SWEEP])
def test_llmfoundry_microbatch_sweep_row_at_its_documented_error(row: tuple) -> None:
    assert sweep_error(row) == pytest.approx(row[4], abs=0.03)


def _per_microbatch_line(points: list[tuple[int, float]]) -> tuple[float, float, float]:
    """Least-squares ``t = t0 + mbs x t1`` through (microbatch, seconds per microbatch); (t0, t1, worst residual)."""
    t1, t0 = statistics.linear_regression([m for m, _ in points], [t for _, t in points])
    return t0, t1, max(abs(t0 + t1 * m - t) / t for m, t in points)


def _sweep_rows(size: str) -> list[tuple]:
    return [r for r in MICROBATCH_SWEEP if r[1] == size]


def _seven_b() -> list[tuple]:
    return _sweep_rows("7b")


def _model_fsdp_s_per_microbatch(r: tuple) -> float:
    """The model's seconds of FSDP collectives (forward and backward gathers, gradient reduce-scatter) a microbatch."""
    spec = sweep_spec(r)
    plan = plan_step(spec)
    times = demand_times_s(spec, plan, FabricCommModel(**spec.network.topology_kw()))
    return sum(times[d.name] for d in plan.collectives if d.name.startswith("fsdp")) / plan.microbatches


def test_the_published_sweep_is_a_fixed_cost_per_microbatch_plus_a_rate() -> None:
    """Published (larger_mb_1.md): 7b's seconds per microbatch (2,048 x microbatch tokens per GPU) at microbatch 1, 2,
    4 and 6 lie on one line within 1%, 0.212 s + 0.400 s a sequence, and the fixed 0.212 s is the model's own time for
    the microbatch's FSDP collectives (0.208 s at NCCL's A100 cap) within 5%. 13b's two rows give 0.356 s, 0.90 of its
    collectives' 0.396 s. Nothing else the model charges per microbatch comes near that size."""
    pts = [(r[2], r[2] * 2048 / r[3]) for r in _seven_b()]
    t0, t1, worst = _per_microbatch_line(pts)
    assert worst < 0.01
    assert t0 == pytest.approx(0.212, abs=0.005) and t1 == pytest.approx(0.400, abs=0.005)
    assert t0 == pytest.approx(_model_fsdp_s_per_microbatch(_seven_b()[0]), rel=0.05)
    thirteen = _sweep_rows("13b")
    t0_13 = _per_microbatch_line([(r[2], r[2] * 2048 / r[3]) for r in thirteen])[0]
    assert t0_13 / _model_fsdp_s_per_microbatch(thirteen[0]) == pytest.approx(0.90, abs=0.02)


def _model_line() -> tuple[float, float, float]:
    pts = []
    for r in _seven_b():
        est = estimate_train(sweep_spec(r))
        pts.append((r[2], r[2] * 2048 * 8 / est.tokens_per_s))
    return _per_microbatch_line(pts)


@pytest.mark.xfail(strict=True, reason=SWEEP_CAUSE)
def test_the_model_pays_the_sweeps_fixed_cost_per_microbatch() -> None:
    """The model's fixed cost per microbatch (its own line through the four 7b layouts) within 25% of the published
    0.212 s: it is 0.051 s, the first gather and the last reduction that have nothing to hide behind."""
    assert _model_line()[0] == pytest.approx(0.212, rel=0.25)


@pytest.mark.xfail(strict=True, reason=SWEEP_CAUSE)
def test_the_model_runs_a_sequence_at_the_sweeps_rate() -> None:
    """The model's seconds per 2,048-token 7b sequence within 10% of the published 0.400 s: it is 0.476 s (0.58 of the
    A100's peak on the 6N count, against the published 0.69)."""
    assert _model_line()[1] == pytest.approx(0.400, rel=0.10)


def test_the_models_sweep_line_is_as_documented() -> None:
    """The figures the two strict xfails above quote, pinned, so a change to either shows."""
    t0, t1, worst = _model_line()
    assert t0 == pytest.approx(0.051, abs=0.005) and t1 == pytest.approx(0.476, abs=0.005) and worst < 0.01


# Same layout with and without activation checkpointing, the same run batch: llm-foundry
# ``scripts/train/benchmarking/torch2.md`` (commit 985460c4a8015310a121c44cf1dc75366bdb3967; Composer FSDP, PURE mixed
# precision, 8 GPUs, 2,048 tokens, PyTorch 2.0). (chip, size, microbatch, accumulation, tokens/s/GPU with checkpointing,
# without). Only pairs whose two rows ran the same microbatch and accumulation are here; the file's rows with an MFU
# above 100% (13b at 4,096 and 8,192 tokens) and its 125m rows at microbatch 12 (11% MFU) are not measurements of a
# layout and are left out.
CHECKPOINT_PAIRS = [
    ("a100-80gb", "3b", 12, 8, 8622, 11018),
    ("a100-80gb", "3b", 8, 8, 8486, 10783),
    ("a100-80gb", "3b", 5, 8, 8060, 10242),
    ("a100-40gb", "1b", 8, 8, 15733, 19204),  # without: the mean of the two runs, 19,264 and 19,143
    ("a100-40gb", "760m", 12, 4, 24374, 29512),  # without: the mean of 29,381 and 29,642
]


def _pair_errors(p: tuple) -> tuple[float, float]:
    chip, size, mbs, accum, with_ckpt, without = p
    rate = [estimate_train(mpt_spec(chip, size, 2048, 8, mbs, accum, ckpt, "P")).tokens_per_s / 8
            for ckpt in (True, False)]
    return rate[0] / with_ckpt - 1, rate[1] / without - 1


def test_paired_rows_say_the_checkpointing_split_is_mostly_the_model_size() -> None:
    """Where the same layout ran with and without checkpointing, the model's error with it is 2-7 points below its
    error without it (it charges the recomputed forward a little too much), where the README's A100 checkpointing rows
    sit 13-18 points below its no-checkpointing rows (docs/validation.md 1b). Their tokens per microbatch are alike
    (medians 45,056 and 49,152 on the 80GB card, 24,576 and 24,576 on the 40GB), so the rest of that split is the
    model size the two sets run (checkpointing: 7B-70B; without: 125M-3B): the model's error falls with size, from
    +13% (125M) to -19% (13B, 30B) on the 80GB card."""
    gaps = [a - b for a, b in map(_pair_errors, CHECKPOINT_PAIRS)]
    assert all(-0.075 < g < -0.015 for g in gaps), gaps
