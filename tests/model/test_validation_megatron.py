"""Megatron-LM on A100 (2021): Narayanan et al., "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (SC'21, arXiv 2104.04473), Table 1, every row, 32 to 3,072 GPUs.

Each row runs the paper's configuration (examples/sc21/run_table_1.sh of NVIDIA/Megatron-LM: TP, PP,
micro-batch, interleaving, full recomputation; for the 1T row the interleaving the paper states, see
``TABLE1``) the way 2021 software ran it: fp16, attention that
writes the s x s scores, softmax and dropout to HBM (``attention_impl: materialized``), no sequence
parallelism, plain data-parallel all-reduce. The published figure is the paper's equation (3) FLOPs
over the measured iteration time, so the prediction is equation (3) over the predicted step.
"""

from __future__ import annotations

import statistics

import pytest
import yaml

from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train

from .test_calibration import EXAMPLE

SEQ, VOCAB = 2048, 51200
# (params B, heads, hidden, layers, TP, PP, GPUs, batch, published TFLOP/s per GPU, micro-batch, virtual stages)
# Virtual stages from run_table_1.sh (--num-layers-per-virtual-pipeline-stage), except the 1T row: the
# script gives it none, but the paper (section 5.1) states that Table 1 ran "the interleaved pipeline
# schedule with the scatter/gather optimization enabled", and 128 layers on 64 stages leave one way to
# interleave, 2 chunks of 1 layer. The script's non-interleaved layout is kept as SC21_1T_SCRIPT_V.
TABLE1 = [
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, 16, 1),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, 16, 1),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, 16, 1),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, 8, 1),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, 4, 1),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, 2, 3),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, 2, 2),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, 1, 2),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, 1, 3),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, 1, 2),
]
SC21_1T_SCRIPT_V = 1


def eq3_flops(batch: int, layers: int, hidden: int, seq: int = SEQ, vocab: int = VOCAB) -> float:
    """Narayanan et al. 2021, equation (3): FLOPs of one iteration with activation recomputation."""
    return 96.0 * batch * seq * layers * hidden**2 * (1 + seq / (6 * hidden) + vocab / (16 * layers * hidden))


def table1_spec(heads: int, hidden: int, layers: int, tp: int, pp: int, gpus: int, batch: int, mbs: int,
                v: int) -> TrainSpec:
    """The Table 1 row as a training spec (GPT: GELU MLP of 4h, vocab 51,200, sequence 2,048).

    Data parallelism as run_table_1.sh runs it: ``DDP=torch`` for the rows without pipelining (PyTorch DDP's
    bucketed all-reduce overlaps the backward), ``DDP=local`` for the others (2021 Megatron-LM's LocalDDP
    all-reduces the gradients after the last backward, before the optimizer: exposed). Gradients reduce in
    fp16, the precision of the run (Megatron-LM's ``--accumulate-allreduce-grads-in-fp32`` is opt-in and the
    script does not set it).
    """
    return TrainSpec.from_dict({
        "model": {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": heads, "ffn_hidden": 4 * hidden,
                  "vocab": VOCAB, "seq_len": SEQ, "mlp": "gelu"},
        "batch": {"global_batch": batch},
        "parallelism": {"tp": tp, "pp": pp, "microbatch_size": mbs, "recompute": "full", "virtual_stages": v,
                        "sequence_parallel": False, "distributed_optimizer": False, "grad_reduce_dtype": "fp16",
                        "dp_comm_overlap": pp == 1},
        "hardware": {"chip": "a100-80gb", "count": gpus}, "precision": "fp16", "attention_impl": "materialized",
    })


def table1_error(row: tuple) -> float:
    _, heads, hidden, layers, tp, pp, gpus, batch, published, mbs, v = row
    est = estimate_train(table1_spec(heads, hidden, layers, tp, pp, gpus, batch, mbs, v))
    predicted = eq3_flops(batch, layers, hidden) / est.step_time_s / gpus / 1e12
    return predicted / published - 1.0


@pytest.mark.parametrize("row", TABLE1, ids=[f"{r[0]}B-{r[6]}gpu" for r in TABLE1])
def test_megatron_sc21_table1_row_within_10_percent(row: tuple) -> None:
    """Narayanan et al. 2021 (arXiv 2104.04473) Table 1: achieved TFLOP/s per A100, each row within 10%."""
    assert abs(table1_error(row)) <= 0.10


def test_megatron_sc21_table1_1t_row_interleaved_as_the_paper_states() -> None:
    """The 1T row (3,072 A100, PP 64, 512 micro-batches) with the interleaving section 5.1 states (2 chunks
    of 1 layer): within 6% (-5.5%). The bubble is 63/1,024 of the other ranks' slots."""
    assert abs(table1_error(TABLE1[-1])) <= 0.06


def test_megatron_sc21_1t_script_layout_needs_an_implausible_rate() -> None:
    """run_table_1.sh's 1T layout (no interleaving: a 1F1B bubble of 63/512) comes out about 10% slow
    (-9.9%): reaching 163 TFLOP/s with it would take 182 TFLOP/s outside the bubble, 7.4% more than the
    530B row needs (169), where the model's larger GEMMs and smaller TP share gain 2% (interleaved: 172.5,
    +1.9%; docs/validation.md 1b). Held at -10% +- 3% so a change that moves it shows."""
    row = (*TABLE1[-1][:-1], SC21_1T_SCRIPT_V)
    assert table1_error(row) == pytest.approx(-0.10, abs=0.03)


def test_megatron_sc21_table1_family_median_within_5_percent() -> None:
    """The 10 rows of Table 1: median |error| 5% or less and max 10% or less (issue 15 targets)."""
    errs = [abs(table1_error(r)) for r in TABLE1]
    assert statistics.median(errs) <= 0.05
    assert max(errs) <= 0.10


def test_small_hidden_rows_are_not_30_percent_fast_with_2021_attention() -> None:
    """Issue 15 item 3: GPT 1.7B (hidden 2,304) on 32 A100 came out ~30% fast with flash attention, the
    s x s round trips of 2021's attention are the cause; with them the row is within 5%."""
    row = TABLE1[0]
    _, heads, hidden, layers, tp, pp, gpus, batch, published, mbs, v = row
    flash = table1_spec(heads, hidden, layers, tp, pp, gpus, batch, mbs, v).with_(attention_impl="flash")
    fast = eq3_flops(batch, layers, hidden) / estimate_train(flash).step_time_s / gpus / 1e12 / published - 1
    assert fast > 0.25
    assert abs(table1_error(row)) <= 0.05


def test_gpt3_175b_1024_a100_training_time_estimate() -> None:
    """GPT-3 175B on 1,024 A100 with batch 1,536: 140 TFLOP/s per GPU (Narayanan et al. 2021, section 5.1,
    "Training Time Estimates": a figure in the text, not a row of Table 1); TP 8 x PP 16 is the example's
    assumption. Within 5% by equation (3)."""
    spec = TrainSpec.from_dict(yaml.safe_load((EXAMPLE.parent / "train-gpt3-175b-a100.yaml").read_text()))
    assert (spec.tp, spec.pp, spec.dp, spec.attention_impl, spec.sequence_parallel) == (8, 16, 8, "materialized",
                                                                                         False)
    est = estimate_train(spec)
    a = spec.arch
    tflops = eq3_flops(spec.global_batch, a.layers, a.hidden, a.seq_len, a.vocab) / est.step_time_s / 1024 / 1e12
    assert tflops == pytest.approx(140.0, rel=0.05)
