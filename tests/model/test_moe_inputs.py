"""Bad MoE training inputs are refused with what to change: the EP degrees that would divide the experts, and
ep among the knobs when an MoE stage does not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from gigacluster.cli.estimate_train import load_spec
from gigacluster.model import DoesNotFitError, SpecError
from gigacluster.planning import estimate_train

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_ep_larger_than_the_experts_lists_the_divisors() -> None:
    """Mixtral's 8 experts over EP 16 are refused listing the EP degrees that divide 8 and the experts per rank."""
    with pytest.raises(SpecError) as err:
        load_spec(EXAMPLES / "train-mixtral-8x7b-h100.yaml").with_(ep=16)
    assert err.value.field == "parallelism.ep"
    assert "1, 2, 4, 8" in err.value.message and "0.50 experts per rank" in err.value.message


def test_an_moe_stage_that_does_not_fit_suggests_raising_ep() -> None:
    """Mixtral with EP 1 and TP 1 on 8 H100 needs ~353 GiB per chip: refused with the breakdown and 'raise ep'."""
    spec = load_spec(EXAMPLES / "train-mixtral-8x7b-h100.yaml").with_(ep=1, tp=1, count=8, dp=8, global_batch=8)
    with pytest.raises(DoesNotFitError) as err:
        estimate_train(spec)
    assert "raise ep/tp/pp/cp" in str(err.value) and "weights" in str(err.value)
