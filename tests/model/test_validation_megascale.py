"""Megatron-LM on A100 at 256 to 12,288 GPUs (2023 software): MegaScale (Jiang et al., NSDI 2024, arXiv
2402.15627), Table 2 and Figure 9, the Megatron-LM baseline rows.

GPT 175B (96 layers, hidden 12,288, 128 heads, Table 1), sequence 2,048, vocabulary 64,000, TP 8 x PP 8
with 6 interleaved stages (section 6.1), global batch 768 on 256-1,024 GPUs and 6,144 on 3,072-12,288,
on "NVIDIA Ampere GPUs" (section 6; the 80 GB A100 assumed) with Megatron-LM at commit 285068c8 and the
paper's network optimisations on. Published: throughput in tokens/s.

MegaScale lists data-parallel overlap among its own additions over that Megatron-LM (section 3.2,
"Overlapping in data parallelism"; Table 3 row 5, +1.5 MFU points), so the baseline runs its gradient
reduce-scatter and parameter all-gather exposed (``dp_comm_overlap: false``); tensor- and
pipeline-parallel overlap are MegaScale's too, so none is set. Not stated, assumed: micro-batch 1,
selective recomputation, flash attention, sequence parallelism, bf16, Megatron's distributed optimizer
(micro-batch 2 or no recomputation move every row by under 1.5 points).

Figure 9 (weak scaling, 530B: 105 layers, hidden 20,480, 160 heads, TP 8 x PP 35 with 3 interleaved
stages, batch = GPUs) prints Megatron-LM's MFU at 2,240, 4,480 and 11,200 GPUs. MFU is turned into tokens/s
with the FLOPs per token Table 2 implies (its MFU over its tokens/s: 6N + 12 L s h, checked below).
"""

from __future__ import annotations

import statistics

import pytest

from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train

# (GPUs, global batch, published tokens/s, published MFU)
TABLE2_MEGATRON = [
    (256, 768, 39.3e3, 0.530), (512, 768, 74.1e3, 0.499), (768, 768, 103.8e3, 0.467), (1024, 768, 132.7e3, 0.447),
    (3072, 6144, 433.6e3, 0.487), (6144, 6144, 851.6e3, 0.478), (8192, 6144, 1027.9e3, 0.433),
    (12288, 6144, 1466.8e3, 0.412),
]

# Figure 9, Megatron-LM on the 530B model: (GPUs, MFU printed in the figure); batch = GPUs.
FIGURE9_MEGATRON = [(2240, 0.492), (4480, 0.488), (11200, 0.482)]
SEQ, VOCAB, A100_PEAK = 2048, 64000, 312e12
GPT_175B = (96, 12288, 128, 8, 6)  # layers, hidden, heads, PP, virtual stages (TP 8)
GPT_530B = (105, 20480, 160, 35, 3)


def flops_per_token(layers: int, hidden: int) -> float:
    """MegaScale's model FLOPs per token: 6 x (12 L h^2 + V h) + 12 L s h (full, non-causal attention)."""
    return 6.0 * (12 * layers * hidden**2 + VOCAB * hidden) + 12.0 * layers * SEQ * hidden


def megascale_spec(gpus: int, gbs: int, model: tuple[int, ...] = GPT_175B, **par: object) -> TrainSpec:
    """A Megatron-LM row of Table 2 (or Figure 9 with ``GPT_530B``) as a training spec (module docstring)."""
    layers, hidden, heads, pp, v = model
    return TrainSpec.from_dict({
        "model": {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": heads, "ffn_hidden": 4 * hidden,
                  "vocab": VOCAB, "seq_len": SEQ, "mlp": "gelu"},
        "batch": {"global_batch": gbs},
        "parallelism": {"tp": 8, "pp": pp, "virtual_stages": v, "microbatch_size": 1, "recompute": "selective",
                        "dp_comm_overlap": False, **par},
        "hardware": {"chip": "a100-80gb", "count": gpus}, "precision": "bf16",
    })


def megascale_error(row: tuple, **par: object) -> float:
    gpus, gbs, tokens_s, _ = row
    return estimate_train(megascale_spec(gpus, gbs, **par)).tokens_per_s / tokens_s - 1.0


def figure9_error(row: tuple) -> float:
    gpus, mfu = row
    published = mfu * gpus * A100_PEAK / flops_per_token(*GPT_530B[:2])
    return estimate_train(megascale_spec(gpus, gpus, GPT_530B)).tokens_per_s / published - 1.0


@pytest.mark.parametrize("row", TABLE2_MEGATRON, ids=[f"175b-{r[0]}gpu" for r in TABLE2_MEGATRON])
def test_megascale_table2_megatron_row_within_10_percent(row: tuple) -> None:
    """MegaScale (NSDI 2024) Table 2, Megatron-LM 175B on A100: tokens/s within 10%, 256 to 12,288 GPUs."""
    assert abs(megascale_error(row)) <= 0.10


@pytest.mark.parametrize("row", FIGURE9_MEGATRON, ids=[f"530b-{r[0]}gpu" for r in FIGURE9_MEGATRON])
def test_megascale_figure9_megatron_row_within_10_percent(row: tuple) -> None:
    """MegaScale Figure 9, Megatron-LM 530B weak scaling on A100 (2,240 to 11,200 GPUs): within 10%."""
    assert abs(figure9_error(row)) <= 0.10


def test_megascale_mfu_counts_6n_plus_full_attention() -> None:
    """Table 2's MFU is its tokens/s x (6N + 12 L s h) over the GPUs' 312 TFLOP/s on every row (to its 3
    digits), the count Figure 9's MFU is turned into tokens/s with."""
    per_token = flops_per_token(*GPT_175B[:2])
    for gpus, _, tokens_s, mfu in TABLE2_MEGATRON:
        assert tokens_s * per_token / (gpus * A100_PEAK) == pytest.approx(mfu, abs=0.001)


def test_megascale_family_median_and_max() -> None:
    """The 11 rows: median |error| 5% or less and max 10% or less (issue 15 targets; 3.0% and 7.0%)."""
    errs = [abs(megascale_error(r)) for r in TABLE2_MEGATRON] + [abs(figure9_error(r)) for r in FIGURE9_MEGATRON]
    assert statistics.median(errs) <= 0.05
    assert max(errs) <= 0.10


def test_exposed_dp_traffic_is_what_the_largest_row_needs() -> None:
    """At 12,288 GPUs (DP 192, 32 micro-batches) with the DP collectives hidden, as Megatron-LM does only
    with --overlap-grad-reduce/--overlap-param-gather, the row comes out over 10% fast (+12.6%); exposed,
    as MegaScale's baseline ran, +6.4%: DP traffic is a fixed 0.7 s a step while the step shrinks."""
    row = TABLE2_MEGATRON[-1]
    assert megascale_error(row, dp_comm_overlap=True) > 0.10
    assert abs(megascale_error(row)) < 0.08
