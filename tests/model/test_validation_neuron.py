"""AWS Trainium (Trn1) pre-training throughput with published layouts (2025 software).

Source: aws-neuron/aws-neuron-sdk ``about-neuron/benchmarks/trn1/training_data_decoder.csv`` (the Neuron
docs page "Trn1/Trn1n Training Performance", Neuron 2.24, NeuronX Distributed): sequences per second on
32 trn1.32xlarge/trn1n.32xlarge instances (512 Trainium chips, 1,024 NeuronCore-v2), BF16 autocast with an
FP32 optimizer, micro-batch 1, global batch 1,024, sequence 8,192.

Neuron's ranks are NeuronCores, two per Trainium chip; the catalog's ``trainium1`` is the chip, so a
published TP of 32 cores is TP 16 chips (one microbatch still spans one instance) and PP and DP are
unchanged. The tutorials the rows cite (training_llama_tp_zero1, training_llama_tp_pp) run sequence
parallelism and selective checkpointing; ZeRO-1 is the distributed optimizer. The rows name both
instance types, trn1.32xlarge (384 GiB/s NeuronLink-v2 per chip, system ``trn1``) and trn1n.32xlarge
(768 GiB/s, system ``trn1n``), so each row runs on both.
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
    ("neuron-2.24-llama31-8b-512", {"preset": "llama3-8b"}, {"tp": 16, "pp": 1}, 47.95),
    ("neuron-2.24-llama31-70b-512", {"preset": "llama3-70b"}, {"tp": 16, "pp": 8}, 7.94),
]
# (row, system, error today; None when within 10%)
CASES: list[tuple[tuple, str, float | None]] = [
    (ROWS[0], "trn1", 0.496), (ROWS[0], "trn1n", 0.512), (ROWS[1], "trn1", 0.285), (ROWS[1], "trn1n", 0.285),
]
MISSED = ("too fast on the compute side: with Trainium1's sourced GEMM rate (NKI matmul tutorial on trn1.32xlarge, "
          "0.83 of peak) the model's compute alone (8B on trn1: 9.7 s) is under half the published 21.4 s step; "
          "Neuron's two ranks per chip (one per NeuronCore) now replicate KV heads per rank and bound the TP "
          "collectives by HBM (Neuron docs: ring RS 2R1W, AG 1R1W per rank per chunk), which makes trn1n as slow "
          "as trn1, but no published figure says where the rest of the step goes (docs/validation.md 1b)")
PUBLISHED_STEP_8B_S = GBS / ROWS[0][3]  # 21.36 s: 1,024 sequences at 47.95 per second


def trn1_spec(model: dict[str, Any], par: dict[str, int], system: str = "trn1") -> TrainSpec:
    """The published row as a training spec on 512 Trainium chips in ``system`` instances."""
    return TrainSpec.from_dict({
        "model": {**model, "seq_len": SEQ}, "batch": {"global_batch": GBS},
        "parallelism": {"microbatch_size": 1, "recompute": "selective", **par},
        "hardware": {"chip": "trainium1", "count": CHIPS, "system": system}, "precision": "bf16",
    })


def trn1_error(row: tuple, system: str = "trn1") -> float:
    _, model, par, seqs = row
    est = estimate_train(trn1_spec(model, par, system))
    return est.tokens_per_s / (seqs * SEQ) - 1.0


def _case_id(case: tuple) -> str:
    return f"{case[0][0]}-{case[1]}"


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=MISSED)) if c[2] is not None else c
             for c in CASES], ids=[_case_id(c) for c in CASES])
def test_neuron_trn1_row_within_10_percent(case: tuple) -> None:
    """Neuron 2.24 Trn1 pre-training rows (module docstring) on each instance type: tokens/s within 10%
    of the published rate (strict xfail where missed, ``MISSED``)."""
    row, system, _ = case
    assert abs(trn1_error(row, system)) <= 0.10


@pytest.mark.parametrize("case", [c for c in CASES if c[2] is not None], ids=_case_id)
def test_neuron_trn1_row_at_its_documented_error(case: tuple) -> None:
    """The missed Trn1 cases sit at their documented error (docs/validation.md 1b), +- 4 points, so a change
    that moves them shows."""
    row, system, err = case
    assert trn1_error(row, system) == pytest.approx(err, abs=0.04)


def test_the_8b_row_misses_on_compute_not_on_the_torus() -> None:
    """The 8B row on trn1: the model's compute alone is under 60% of the published step, and the exposed TP
    traffic on Neuron's four torus rings is under a third of the step; so the remaining miss is not the link
    rate the table leaves open (trn1 or trn1n) but the compute side (``MISSED``)."""
    est = estimate_train(trn1_spec(ROWS[0][1], ROWS[0][2], "trn1"))
    bd = est.to_dict()["breakdown"]
    assert bd["compute_s"] < 0.6 * PUBLISHED_STEP_8B_S
    assert est.to_dict()["comm_s"]["tp"] < bd["step_time_s"] / 3


def test_trn1n_is_no_faster_than_trn1_once_tp_is_hbm_bound() -> None:
    """With two ranks per chip a TP ring moves each chunk through HBM twice per chip (Neuron docs: 4 accesses
    per all-gather chunk, 6 per reduce-scatter chunk), so trn1n's doubled NeuronLink does not speed up the 8B
    row's TP traffic past HBM: within 5% of trn1's (it was 1.8x faster on links alone)."""
    tp = {s: estimate_train(trn1_spec(ROWS[0][1], ROWS[0][2], s)).to_dict()["comm_s"]["tp"] for s in ("trn1", "trn1n")}
    assert tp["trn1n"] == pytest.approx(tp["trn1"], rel=0.05)


def test_neuron_ranks_keep_a_kv_head_each() -> None:
    """Neuron's TP 32 NeuronCores on 16 Trainium1 chips: NxD's kv_replicator gives every core one of Llama
    3.1 8B's 8 KV heads (tp_zero1_llama3_8B_hf_pretrain.sh: --kv_replicator 4), so a chip holds 2 heads."""
    from gigacluster.model.step_memory import _dims
    _, _, kv_t, _, hd = _dims(trn1_spec(ROWS[0][1], ROWS[0][2]))
    assert kv_t == 2 * hd


def test_trainium1_chip_is_the_published_part() -> None:
    """The catalog's Trainium (Trn1) chip: 190 BF16 TFLOP/s, 32 GiB at 820 GiB/s, 16 to a 4x4 NeuronLink torus."""
    spec = trn1_spec({"preset": "llama3-8b"}, {"tp": 16})
    chip = spec.chip_spec()
    assert chip.peak_flops("bf16") == pytest.approx(190e12)
    assert chip.hbm_bytes == 32 * 2**30
    assert chip.hbm_Bps == pytest.approx(820 * 2**30)
    assert spec.system == "trn1"
