"""A job carries issue 15's step-shaping switches (attention_impl, sequence_parallel, FSDP) to the live job."""

from __future__ import annotations

from typing import Any

import pytest

from gigacluster.errors import InvalidArgument
from gigacluster.model.training import TrainSpec
from gigacluster.scheduler.spec import proto_to_spec, spec_to_proto

SPEC: dict[str, Any] = {
    "model": {"preset": "llama3-8b", "seq_len": 2048}, "batch": {"global_batch": 64},
    "parallelism": {"tp": 8, "sequence_parallel": False}, "hardware": {"chip": "h100-sxm", "count": 32},
    "precision": "fp16", "steps": 30, "attention_impl": "materialized",
}


def test_attention_impl_and_sequence_parallel_round_trip_through_the_job_message() -> None:
    """spec -> TrainingSpec -> spec keeps attention_impl and sequence_parallel; the model reads them."""
    back = proto_to_spec(spec_to_proto(SPEC))
    assert back["attention_impl"] == "materialized" and back["parallelism"]["sequence_parallel"] is False
    spec = TrainSpec.from_dict(back)
    assert (spec.attention_impl, spec.sequence_parallel, spec.precision) == ("materialized", False, "fp16")
    plain = proto_to_spec(spec_to_proto({k: v for k, v in SPEC.items() if k != "attention_impl"}
                                        | {"parallelism": {"tp": 8}}))
    assert "attention_impl" not in plain and "sequence_parallel" not in plain["parallelism"]
    assert TrainSpec.from_dict(plain).sequence_parallel and TrainSpec.from_dict(plain).attention_impl == "flash"


def test_sequence_parallel_must_be_a_boolean() -> None:
    """A non-boolean sequence_parallel is refused naming the field, before any model work."""
    with pytest.raises(InvalidArgument) as err:
        spec_to_proto({**SPEC, "parallelism": {"tp": 8, "sequence_parallel": "yes"}})
    assert err.value.field == "spec.parallelism.sequence_parallel"


def test_fsdp_fields_round_trip_through_the_job_message() -> None:
    """spec -> TrainingSpec -> spec keeps the FSDP fields and the recompute options; unset ones stay defaults."""
    fsdp = {**SPEC, "parallelism": {"fsdp": True, "fsdp_shard": 8, "fsdp_reshard_after_forward": False,
                                    "recompute": "full", "recompute_layers": 16}}
    back = proto_to_spec(spec_to_proto(fsdp))
    assert back["parallelism"] == fsdp["parallelism"]
    spec = TrainSpec.from_dict(back)
    assert (spec.fsdp, spec.shard_group, spec.fsdp_reshard_after_forward, spec.recompute_layers) == (True, 8, False, 16)
    plain = TrainSpec.from_dict(proto_to_spec(spec_to_proto({**SPEC, "parallelism": {"tp": 8}})))
    assert (plain.fsdp, plain.fsdp_reshard_after_forward, plain.recompute_layers) == (False, True, 0)


def test_fsdp_must_be_a_boolean() -> None:
    """A non-boolean fsdp is refused naming the field, before any model work."""
    with pytest.raises(InvalidArgument) as err:
        spec_to_proto({**SPEC, "parallelism": {"fsdp": 1}})
    assert err.value.field == "spec.parallelism.fsdp"


def test_flash_triton_and_fused_loss_round_trip_through_the_job_message() -> None:
    """The 2022-2023 Triton attention and the fused cross-entropy reach the live job as estimate train reads them."""
    back = proto_to_spec(spec_to_proto({**SPEC, "attention_impl": "flash_triton", "loss_impl": "fused"}))
    spec = TrainSpec.from_dict(back)
    assert (spec.attention_impl, spec.loss_impl) == ("flash_triton", "fused")
    assert TrainSpec.from_dict(proto_to_spec(spec_to_proto(SPEC))).loss_impl == "fp32"
