"""NVIDIA NeMo pre-training throughput tables, H100 / B200 / GB200, 8 to 1,024 GPUs (2024-2025 software).

Sources (tokens per second per GPU, the published layouts):
* NeMo Framework 24.12 user guide, "Performance Benchmarks", pre-training at FP8 on DGX-H100
  (docs.nvidia.com/nemo-framework/user-guide/24.12/nemotoolkit/performance/performance_summary.html);
* NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, "25.11 NeMo Container", FP8-CS rows of
  DGX-H100, DGX-B200, DGX-GB200 and DGX-GB300 (the GB300 rows without FSDP; two misses, below);
* NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md, "26.02 NeMo Container" (FP8 rows
  without FSDP) and "25.09 NeMo Container" (the FP8 rows without FSDP; the parenthesised MXFP8
  variants are not used).
Neither table states activation recomputation: ``selective`` is assumed (the layouts do not fit in
HBM without it in our memory model). Communication overlap is what the NeMo / Megatron-Bridge
performance recipes switch on for these layouts (``TP_OVERLAP``, ``PP_OVERLAP`` below).
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train

GPT3 = {"preset": "gpt3-175b", "vocab": 51200}
LLAMA2_7B = {"preset": "llama2-7b"}
LLAMA2_13B = {"preset": "llama2-13b"}
LLAMA2_70B = {"preset": "llama2-70b"}
L3 = {"preset": "llama3-8b"}
L70 = {"preset": "llama3-70b"}
L405 = {"preset": "llama3-405b"}

# Tensor-parallel overlap (userbuffers): the performance recipes set tp_comm_overlap with per-layer
# configs (Megatron-Bridge comm_overlap.py, userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192 and its
# siblings): ring-exchange or bulk overlap for 8 of the 10 sequence-parallel collectives of a layer
# (forward and backward all-gathers, backward reduce-scatters), pipelined GEMM + reduce-scatter in 4
# splits for the proj and fc2 forward, whose last split's reduce-scatter has no GEMM left to hide
# behind: 2 x 1/4 of 10 collectives exposed, so 0.95 hidden.
TP_OVERLAP = 1.0 - 2 * (1 / 4) / 10
# Pipeline overlap: NeMo's MegatronCommOverlapCallback and Megatron-Bridge set overlap_p2p_comm=True
# (batch_p2p_comm=False) whenever virtual pipeline stages are used, so the send/recv of one
# microbatch runs under the next one's compute.
PP_OVERLAP = 1.0

# (id, model, chip, GPUs, GBS, MBS, parallelism, published tokens/s/GPU, documented error or None if within 10%)
ROWS: list[tuple[str, dict[str, Any], str, int, int, int, dict[str, int], float, float | None]] = [
    ("24.12-gpt3-175b-h100-128", GPT3, "h100-sxm", 128, 256, 1, {"tp": 4, "pp": 8, "virtual_stages": 6}, 716, None),
    ("24.12-gpt3-175b-h100-512", GPT3, "h100-sxm", 512, 2048, 2, {"tp": 4, "pp": 8, "virtual_stages": 6}, 825, None),
    ("24.12-llama2-7b-h100-8", LLAMA2_7B, "h100-sxm", 8, 128, 1, {}, 16934, None),
    ("24.12-llama2-13b-h100-16", LLAMA2_13B, "h100-sxm", 16, 128, 1, {"pp": 4, "virtual_stages": 10}, 8715, None),
    ("24.12-llama2-70b-h100-64", LLAMA2_70B, "h100-sxm", 64, 128, 1, {"tp": 4, "pp": 4, "virtual_stages": 20}, 1728,
     None),
    ("24.12-llama3-70b-h100-64", L70, "h100-sxm", 64, 128, 1, {"tp": 4, "pp": 4, "cp": 2, "virtual_stages": 5}, 1524,
     None),
    ("25.11-llama3-70b-h100-64", L70, "h100-sxm", 64, 128, 1, {"tp": 4, "pp": 8, "virtual_stages": 5}, 1602, None),
    ("25.11-llama31-405b-h100-1024", L405, "h100-sxm", 1024, 512, 1,
     {"tp": 8, "pp": 8, "cp": 2, "virtual_stages": 8}, 292, None),
    ("25.11-llama3-8b-b200-8", L3, "b200", 8, 128, 2, {}, 30624, None),
    ("25.11-llama31-405b-b200-128", L405, "b200", 128, 64, 1, {"tp": 4, "pp": 8, "cp": 2, "virtual_stages": 8}, 661,
     None),
    ("25.11-llama3-8b-gb200-8", L3, "gb200", 8, 128, 2, {}, 31508, None),
    ("25.11-llama31-405b-gb200-256", L405, "gb200", 256, 1536, 1, {"tp": 4, "pp": 16, "virtual_stages": 4}, 813,
     None),
    ("26.02-llama3-70b-h100-64", L70, "h100-sxm", 64, 256, 1, {"tp": 4, "pp": 8, "virtual_stages": 5}, 1621, None),
    ("26.02-llama31-405b-gb200-256", L405, "gb200", 256, 1536, 1, {"tp": 4, "pp": 16, "virtual_stages": 4}, 793,
     None),
    ("26.02-llama31-405b-h100-1024", L405, "h100-sxm", 1024, 1536, 1,
     {"tp": 8, "pp": 8, "cp": 2, "virtual_stages": 8}, 311, None),
    ("25.09-llama3-8b-gb200-8", L3, "gb200", 8, 128, 2, {}, 31357, None),
    ("25.09-llama3-8b-b200-8", L3, "b200", 8, 128, 2, {}, 29994, None),
    ("25.09-llama31-405b-b200-128", L405, "b200", 128, 64, 1, {"tp": 4, "pp": 8, "cp": 2, "virtual_stages": 8}, 664,
     None),
    ("25.09-llama3-70b-h100-64", L70, "h100-sxm", 64, 128, 1, {"tp": 4, "pp": 8, "virtual_stages": 5}, 1619, None),
    ("25.09-llama31-405b-h100-1024", L405, "h100-sxm", 1024, 512, 1,
     {"tp": 8, "pp": 8, "cp": 2, "virtual_stages": 8}, 302, None),
    # DGX-GB300 (25.11): the model has GB300 at GB200's FP8 tensor peak (the GB300 NVL72 datasheet) with its doubled
    # exponent rate in attention: 4% of what made these runs 19% (8B) faster than GB200's at one layout (test below)
    ("25.11-llama3-8b-gb300-8", L3, "gb300", 8, 128, 2, {}, 37556, -0.109),
    ("25.11-llama31-405b-gb300-256", L405, "gb300", 256, 1536, 1, {"tp": 2, "pp": 8, "cp": 2, "virtual_stages": 4},
     999, -0.178),
]


# NeMo's own performance script as run outside NVIDIA, one precision at a time on the same node:
# vuiseng9/nemo-perf-nvfp4 README.md (2025-10-24; NeMo 25.09 with Transformer Engine 2.8, whose NVFP4 recipe the run
# enabled;
# `python -m scripts.performance.llm.pretrain_llama3_8b -g b200 --compute_dtype fp8 --fp8_recipe ds|mxfp8|nvfp4`):
# Llama 3 8B on 8 B200, GBS 128, MBS 2, sequence 8,192, TP = PP = CP = 1, tokens/s/GPU = GBS x 8,192 /
# train_step_timing / 8. Its FP8 and MXFP8 figures are within 5% of NVIDIA's NeMo 25.07 table, as the README checks.
# MXFP8 runs as the model's `fp8` (block or MX scaling).
# (id, precision, published tokens/s/GPU, documented error or None)
REPRO_ROWS: list[tuple[str, str, float, float | None]] = [
    ("repro-25.09-llama3-8b-b200-8-bf16", "bf16", 21618, None),
    ("repro-25.09-llama3-8b-b200-8-fp8-ds", "fp8", 29567, None),
    ("repro-25.09-llama3-8b-b200-8-mxfp8", "fp8", 28432, None),
    # NVFP4 saves 17% of the FP8 step here (MLPerf v5.1's runs: 16%); the model, its 4-bit GEMMs at their measured
    # rate (catalog fp4_matmul_factor), saves 26%: the recipe's random Hadamard transforms, 2D weight scaling and
    # stochastic rounding are not priced beyond the casts' bytes (docs/validation.md 1c)
    ("repro-25.09-llama3-8b-b200-8-nvfp4", "nvfp4", 35578, 0.118),
]


def repro_error(row: tuple) -> float:
    """Predicted / published tokens/s/GPU - 1 for a REPRO_ROWS row (the NeMo recipe's layout, selective recompute as
    the rows above)."""
    _, precision, published, _ = row
    spec = TrainSpec.from_dict({
        "model": {**L3, "seq_len": 8192}, "batch": {"global_batch": 128},
        "parallelism": {"microbatch_size": 2, "recompute": "selective"},
        "hardware": {"chip": "b200", "count": 8}, "precision": precision,
    })
    return estimate_train(spec).tokens_per_s / 8 / published - 1.0


def _error(row: tuple) -> float:
    _, model, chip, gpus, gbs, mbs, par, published, _ = row
    seq = {"seq_len": 8192} if model.get("preset", "").startswith("llama3") else {}
    overlap = {}
    if par.get("tp", 1) > 1:
        overlap["tp_comm_overlap"] = TP_OVERLAP
    if par.get("virtual_stages", 1) > 1:
        overlap["pp_comm_overlap"] = PP_OVERLAP
    spec = TrainSpec.from_dict({
        "model": {**model, **seq}, "batch": {"global_batch": gbs},
        "parallelism": {"microbatch_size": mbs, "recompute": "selective", **par, **overlap},
        "hardware": {"chip": chip, "count": gpus}, "precision": "fp8",
    })
    return estimate_train(spec).tokens_per_s / gpus / published - 1.0


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_nemo_dense_row(row: tuple) -> None:
    """NeMo 24.12 / Megatron-Bridge 25.11 tokens/s/GPU (module docstring): within 10%, or at the error
    docs/validation.md documents for a row the model misses (none at present)."""
    err = _error(row)
    if row[-1] is None:
        assert abs(err) <= 0.10
    else:
        assert err == pytest.approx(row[-1], abs=0.03)


def test_nemo_dense_family_median() -> None:
    """Over the 20 rows of H100, B200 and GB200 the median |error| is at most 5% and the max at most 10% (the
    issue's training targets; 2.4% and 7.8%); with the two GB300 rows the family's max is 18% (docs/validation.md
    1b)."""
    errs = [abs(_error(r)) for r in ROWS if r[2] != "gb300"]
    assert len(errs) == 20
    assert statistics.median(errs) <= 0.05
    assert max(errs) <= 0.10
    every = [abs(_error(r)) for r in ROWS]
    assert max(every) == pytest.approx(0.178, abs=0.03)


def test_gb300_ran_19_percent_faster_than_gb200_at_the_same_layout_where_the_model_gives_4() -> None:
    """Megatron-Bridge 25.11, Llama 3 8B on 8 GPUs, FP8-CS, batch 128 x 2: 37,556 tokens/s/GPU on DGX-GB300 against
    31,508 on DGX-GB200, 19% more (MLPerf v5.1's two NVL72 racks: 13%, tests/model/test_validation_mlperf.py). GB300
    has GB200's FP8 tensor peak (the GB300 NVL72 datasheet: 360 PF dense FP8 per rack) and twice its attention
    exponent rate, 1,400 W against 1,200; the model prices the exponent rate in attention and gives the GB300 3.9%
    more, so its GB300 rows are 11-18% slow where its GB200 rows of this family are within 3%. The same gap the
    MLPerf pair shows, from the other side: what is left of it has no term in the model."""
    gb200 = next(r for r in ROWS if r[0] == "25.11-llama3-8b-gb200-8")
    gb300 = next(r for r in ROWS if r[0] == "25.11-llama3-8b-gb300-8")
    assert gb300[7] / gb200[7] - 1.0 == pytest.approx(0.192, abs=0.005)
    model_ratio = (1.0 + _error(gb300)) * gb300[7] / ((1.0 + _error(gb200)) * gb200[7])
    assert model_ratio - 1.0 == pytest.approx(0.039, abs=0.005)
    assert abs(_error(gb200)) < 0.03 and _error(gb300) < -0.10


_NVFP4_MISS = ("NVFP4 saves 17% of the FP8 step on these 8 B200 where the model saves 26%: the recipe beyond its "
               "GEMMs is not priced (docs/validation.md 1c)")


@pytest.mark.parametrize("row", [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=_NVFP4_MISS))
                                 if r[3] is not None else r for r in REPRO_ROWS], ids=[r[0] for r in REPRO_ROWS])
def test_nemo_script_reproduced_on_b200_row_within_10_percent(row: tuple) -> None:
    """NeMo's Llama 3 8B performance script on one 8-B200 node in BF16, FP8, MXFP8 and NVFP4 (REPRO_ROWS), each
    within 10% (strict xfail where missed)."""
    assert abs(repro_error(row)) <= 0.10


@pytest.mark.parametrize("row", REPRO_ROWS, ids=[r[0] for r in REPRO_ROWS])
def test_nemo_script_reproduced_on_b200_row_at_its_error(row: tuple) -> None:
    """Each reproduction row sits within 3 points of the error docs/validation.md gives it (BF16 +0.2%, FP8 -0.1%,
    MXFP8 +3.9%, NVFP4 +11.8%), so a change that moves one shows."""
    documented = {"bf16": 0.002, "fp8-ds": -0.001, "mxfp8": 0.039, "nvfp4": 0.118}[row[0].rsplit("-8-", 1)[1]]
    assert repro_error(row) == pytest.approx(documented, abs=0.03)


def test_nvfp4_over_fp8_on_one_b200_node_is_1_2x_in_two_sources() -> None:
    """NVFP4 over FP8 throughput on 8 B200 for Llama 3.1 8B: 1.203x in the NeMo reproduction (35,578 / 29,567) and
    1.19-1.20x in MLPerf v5.1 (0.5389 s FP8 against 0.4488-0.4527 s NVFP4, tests/model/test_validation_mlperf.py).
    The model gives 1.35x: its 4-bit GEMMs run 2.87x BF16 (vLLM's measured NVFP4 GEMM) and what the recipe adds
    beyond the GEMMs and their casts is not priced."""
    fp8 = next(r for r in REPRO_ROWS if r[0].endswith("fp8-ds"))
    fp4 = next(r for r in REPRO_ROWS if r[0].endswith("nvfp4"))
    assert fp4[2] / fp8[2] == pytest.approx(1.203, abs=0.005)
    model = (1 + repro_error(fp4)) * fp4[2] / ((1 + repro_error(fp8)) * fp8[2])
    assert model == pytest.approx(1.347, abs=0.02)
