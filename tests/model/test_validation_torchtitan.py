"""torchtitan (PyTorch-native FSDP2) pre-training throughput on 64 A100 80GB, 2024 (docs/validation.md 1b).

Source: pytorch/torchtitan ``docs/performance.md`` at commit 041336434916bdc0f88c1f89fda176fd3c2092e4 ("Llama 3
performance numbers" and "Llama 2 performance numbers"): words (tokens) per second per GPU of FSDP2 (1D
parallelism) on 64 A100 80GB, bf16, local batch 1 (Llama 3 at sequence 8,192, global batch 64) or 2 (Llama 2 at
4,096, global batch 128; its 70B with selective op AC at local batch 1), with torchtitan's activation
checkpointing modes: ``selective op`` (every second matmul re-run: ``recompute: op``), ``selective layer``
(torchtitan's default layer frequency 2, every second block re-run: ``recompute: full`` with half the layers
as ``recompute_layers``), ``full`` and ``no``. The interconnect is not stated; the catalog's HGX A100 is used
(FSDP's traffic hides behind compute on every row here, so it does not move them). Nothing here was used to set
a constant of the model: every row is a prediction.
"""

from __future__ import annotations

import statistics
from typing import Any

import pytest

from gigacluster.model.training import TrainSpec
from gigacluster.planning import estimate_train

LLAMA2_13B = {"preset": "llama2-13b"}
LLAMA2_70B = {"preset": "llama2-70b"}
L3_8B = {"preset": "llama3-8b"}
L3_70B = {"preset": "llama3-70b"}

# (id, model, local batch, activation checkpointing as our spec says it, published tokens/s per GPU)
ROWS: list[tuple[str, dict[str, Any], int, dict[str, Any], float]] = [
    ("llama3-8b-selective-op", L3_8B, 1, {"recompute": "op"}, 2973),
    ("llama3-8b-selective-layer", L3_8B, 1, {"recompute": "full", "recompute_layers": 16}, 2904),
    ("llama3-70b-full", L3_70B, 1, {"recompute": "full"}, 331),
    ("llama2-13b-no-ac", LLAMA2_13B, 2, {"recompute": "none"}, 2162),
    ("llama2-13b-selective-layer", LLAMA2_13B, 2, {"recompute": "full", "recompute_layers": 20}, 1914),
    ("llama2-13b-selective-op", LLAMA2_13B, 2, {"recompute": "op"}, 1904),
    ("llama2-70b-selective-op", LLAMA2_70B, 1, {"recompute": "op"}, 355),
    ("llama2-70b-full", LLAMA2_70B, 2, {"recompute": "full"}, 353),
]
GPUS = 64


def predicted(model: dict[str, Any], local_batch: int, ac: dict[str, Any]) -> float:
    """Tokens per second per GPU the model gives for one published layout."""
    spec = TrainSpec.from_dict({
        "model": model, "batch": {"global_batch": local_batch * GPUS},
        "hardware": {"chip": "a100-80gb", "count": GPUS},
        "parallelism": {"fsdp": True, "microbatch_size": local_batch, **ac}, "precision": "bf16",
    })
    return estimate_train(spec).tokens_per_s / GPUS


def error(row: tuple[str, dict[str, Any], int, dict[str, Any], float]) -> float:
    _, model, lb, ac, published = row
    return predicted(model, lb, ac) / published - 1


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_torchtitan_a100_row_within_10_percent(row: tuple[str, dict[str, Any], int, dict[str, Any], float]) -> None:
    """Each torchtitan FSDP2 row on 64 A100 80GB (pytorch/torchtitan docs/performance.md) within 10%."""
    assert abs(error(row)) < 0.10


def test_torchtitan_family_meets_the_issue_targets() -> None:
    """Median |error| <= 5% and max <= 10% over the eight rows (issue 15's training targets)."""
    errs = [abs(error(r)) for r in ROWS]
    assert statistics.median(errs) <= 0.05
    assert max(errs) <= 0.10


def test_checkpointing_modes_rank_as_published() -> None:
    """The published ordering of the 13B modes: no AC fastest, then selective layer and selective op within 1% of
    each other (1,914 and 1,904), about 12% below it."""
    none, layer, op = (predicted(LLAMA2_13B, 2, ac) for ac in (
        {"recompute": "none"}, {"recompute": "full", "recompute_layers": 20}, {"recompute": "op"}))
    assert none > layer and none > op
    assert abs(layer / op - 1) < 0.02
    assert 0.08 < 1 - op / none < 0.16
