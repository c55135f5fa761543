"""AWS Trainium (Trn1) pre-training throughput with published layouts (2025 software).

Source: aws-neuron/aws-neuron-sdk ``about-neuron/benchmarks/trn1/training_data_decoder.csv`` (the Neuron
docs page "Trn1/Trn1n Training Performance", Neuron 2.24, NeuronX Distributed): sequences per second on
32 trn1.32xlarge/trn1n.32xlarge instances (512 Trainium chips, 1,024 NeuronCore-v2), BF16 autocast with an
FP32 optimizer, micro-batch 1, global batch 1,024, sequence 8,192.

Neuron's ranks are NeuronCores, two per Trainium chip; the catalog's ``trainium1`` is the chip, so a
published TP of 32 cores is TP 16 chips (one microbatch still spans one instance) and PP and DP are
unchanged. The tutorials the rows cite (training_llama_tp_zero1, training_llama_tp_pp) run sequence
parallelism and selective checkpointing; ZeRO-1 is the distributed optimizer. The instance is
trn1.32xlarge (384 GiB/s NeuronLink-v2 per chip, 800 Gb/s EFA per instance), the slower of the two the
rows name.
"""

from __future__ import annotations

from typing import Any

import pytest

from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train

CHIPS = 512
GBS, SEQ = 1024, 8192
# (id, model, chip-level parallelism, published sequences per second over the 32 instances)
ROWS: list[tuple[str, dict[str, Any], dict[str, int], float]] = [
    ("neuron-2.24-llama31-8b-trn1-512", {"preset": "llama3-8b"}, {"tp": 16, "pp": 1}, 47.95),
    ("neuron-2.24-llama31-70b-trn1-512", {"preset": "llama3-70b"}, {"tp": 16, "pp": 8}, 7.94),
]
MISSED = ("the model is 19-24% slow: 60% of its step is exposed TP-16 all-gather/reduce-scatter on the 4x4 "
          "NeuronLink-v2 torus, whose ring the fabric runs over one of a chip's four links (about 41 GB/s "
          "bus bandwidth); without it the compute alone would be 2.1x the published rate. Neither the "
          "collective algorithm Neuron runs on the torus nor Trainium1's GEMM efficiency (assumed as "
          "Trainium2, 0.70) is sourced yet, so which of the two is off is open (docs/validation.md 1b)")


def trn1_spec(model: dict[str, Any], par: dict[str, int]) -> TrainSpec:
    """The published row as a training spec on 512 Trainium chips."""
    return TrainSpec.from_dict({
        "model": {**model, "seq_len": SEQ}, "batch": {"global_batch": GBS},
        "parallelism": {"microbatch_size": 1, "recompute": "selective", **par},
        "hardware": {"chip": "trainium1", "count": CHIPS}, "precision": "bf16",
    })


def trn1_error(row: tuple) -> float:
    _, model, par, seqs = row
    est = estimate_train(trn1_spec(model, par))
    return est.tokens_per_s / (seqs * SEQ) - 1.0


@pytest.mark.xfail(strict=True, reason=MISSED)
@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_neuron_trn1_row_within_10_percent(row: tuple) -> None:
    """Neuron 2.24 Trn1 pre-training rows (module docstring): tokens/s within 10% of the published rate."""
    assert abs(trn1_error(row)) <= 0.10


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_neuron_trn1_row_at_its_documented_error(row: tuple) -> None:
    """The Trn1 rows come out 19% (8B) and 24% (70B) slow, the exposed torus TP traffic being most of the
    gap (``MISSED``); held at -22% +- 6% so a change that moves them shows."""
    assert trn1_error(row) == pytest.approx(-0.22, abs=0.06)


def test_trainium1_chip_is_the_published_part() -> None:
    """The catalog's Trainium (Trn1) chip: 190 BF16 TFLOP/s, 32 GiB at 820 GiB/s, 16 to a 4x4 NeuronLink torus."""
    spec = trn1_spec({"preset": "llama3-8b"}, {"tp": 16})
    chip = spec.chip_spec()
    assert chip.peak_flops("bf16") == pytest.approx(190e12)
    assert chip.hbm_bytes == 32 * 2**30
    assert chip.hbm_Bps == pytest.approx(820 * 2**30)
    assert spec.system == "trn1"
