"""Strict, bounded specs: unknown keys named and refused, non-finite numbers refused, every sizing
field bounded, and error messages that quote at most a short prefix of what was sent."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gigacluster.errors import InvalidArgument
from gigacluster.model import SpecError
from gigacluster.model.training import TrainSpec
from gigacluster.scheduler.spec import SpecBounds, check_bounds, job_fields, spec_to_proto, split_job_file
from gigacluster.scheduler.v1 import scheduler_pb2

SPEC: dict[str, Any] = {
    "model": {"preset": "llama3-8b", "seq_len": 2048}, "batch": {"global_batch": 64},
    "parallelism": {"tp": 8}, "hardware": {"chip": "h100-sxm", "count": 32}, "precision": "bf16", "steps": 30,
}


def with_(path: str, value: Any) -> dict[str, Any]:
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in SPEC.items()}
    *outer, last = path.split(".")
    cur = d
    for k in outer:
        cur = cur[k]
    cur[last] = value
    return d


@pytest.mark.parametrize(("path", "value", "field"), [
    ("bogus", 1, "spec.bogus"),
    ("model.bogus", 1, "spec.model.bogus"),
    ("batch.micro", 1, "spec.batch.micro"),
    ("hardware.count", -8, "spec.hardware.count"),
    ("hardware.count", 8.5, "spec.hardware.count"),
    ("hardware.count", "eight", "spec.hardware.count"),
    ("hardware.count", float("inf"), "spec.hardware.count"),
    ("batch.global_batch", 2**64, "spec.batch.global_batch"),
    ("pue", float("nan"), "spec.pue"),
    ("pue", float("inf"), "spec.pue"),
    ("model", "llama3-8b", "spec.model"),
    ("hardware.chip", "x" * 1_000_000, "spec.hardware.chip"),
    ("precision", ["bf16"], "spec.precision"),
])
def test_spec_to_proto_refuses_naming_the_field(path: str, value: Any, field: str) -> None:
    """Each bad value is INVALID_ARGUMENT naming its field, in a message of bounded length."""
    with pytest.raises(InvalidArgument) as err:
        spec_to_proto(with_(path, value))
    assert err.value.field == field
    assert len(str(err.value)) < 200


def test_unknown_key_of_any_type_or_length_is_named_briefly() -> None:
    """A 1 MB key, or a non-string key, is named by a short prefix."""
    with pytest.raises(InvalidArgument) as err:
        spec_to_proto({**SPEC, "k" * 1_000_000: 1})
    assert err.value.field.startswith("spec.kkk") and len(err.value.field) < 60
    with pytest.raises(InvalidArgument) as err2:
        spec_to_proto({**SPEC, 7: 1})
    assert err2.value.field == "spec.7"


@pytest.mark.parametrize(("job", "field"), [
    ({"priority": 10**30}, "priority"), ({"priority": "high"}, "priority"), ({"priority": 1.5}, "priority"),
    ({"queue": "q" * 1_000_000}, "queue"), ({"max_restarts": -1}, "max_restarts"),
    ({"checkpoint_interval_steps": float("nan")}, "checkpoint_interval_steps"), ({"name": ["x"]}, "name"),
])
def test_job_fields_are_type_checked(job: dict[str, Any], field: str) -> None:
    """Job fields of a file are checked before a request is built."""
    with pytest.raises(InvalidArgument) as err:
        job_fields(job)
    assert err.value.field == field and len(str(err.value)) < 200


@pytest.mark.parametrize("data", [None, [], "text", 3])
def test_a_job_file_must_be_a_mapping(data: Any) -> None:
    """Empty files, lists and scalars are refused as the spec, not with a TypeError."""
    with pytest.raises(InvalidArgument) as err:
        split_job_file(data)
    assert err.value.field == "spec"


def request(**kw: Any) -> scheduler_pb2.SubmitJobRequest:
    req = scheduler_pb2.SubmitJobRequest(spec=spec_to_proto(SPEC), queue="default")
    for k, v in kw.items():
        target, _, name = k.rpartition("__")
        obj = req
        for part in target.split("__") if target else []:
            obj = getattr(obj, part)
        setattr(obj, name, v)
    return req


@pytest.mark.parametrize(("kw", "field"), [
    ({"spec__batch__global_batch": 2**63}, "spec.batch.global_batch"),
    ({"spec__hardware__count": 2**40}, "spec.hardware.count"),
    ({"spec__steps": 10**12}, "spec.steps"),
    ({"spec__pue": math.nan}, "spec.pue"),
    ({"spec__pue": math.inf}, "spec.pue"),
    ({"spec__model__hidden": 2**31}, "spec.model.hidden"),
    ({"spec__parallelism__tp": 2**31}, "spec.parallelism.tp"),
    ({"priority": 2**31 - 1}, "priority"),
    ({"queue": "q" * 1_000_000}, "queue"),
    ({"queue": "Bad Name"}, "queue"),
    ({"display_name": "n" * 201}, "display_name"),
    ({"max_restarts": 2**32 - 1}, "max_restarts"),
    ({"spec__hardware__chip": "c" * 100_000}, "spec.hardware.chip"),
])
def test_server_bounds_every_sizing_field(kw: dict[str, Any], field: str) -> None:
    """check_bounds refuses each out-of-range field of a SubmitJobRequest by name, quoting briefly."""
    with pytest.raises(InvalidArgument) as err:
        check_bounds(request(**kw), SpecBounds())
    assert err.value.field == field
    assert len(str(err.value)) < 200


def test_server_bounds_accept_a_normal_job() -> None:
    """The demo job is within every default bound."""
    check_bounds(request(priority=5, max_restarts=3, checkpoint_interval_steps=10), SpecBounds())


@pytest.mark.parametrize(("d", "field"), [
    ({**SPEC, "pue": float("nan")}, "pue"),
    ({**SPEC, "hardware": {"chip": "h100-sxm", "count": float("inf")}}, "hardware.count"),
    ({**SPEC, "batch": {"global_batch": 2**63}}, "batch.global_batch"),
    ({**SPEC, "batch": {"global_batch": 64, "extra": 1}}, "batch.extra"),
    ({**SPEC, "cost": {"energy_price_usd_per_kwh": float("nan")}}, "cost.energy_price_usd_per_kwh"),
    ({**SPEC, "model": {"preset": "p" * 100_000}}, "model.preset"),
    ({**SPEC, "model": {"preset": "llama3-8b", "hidden": 2**60}}, "model.hidden"),
    ({**SPEC, 5: 1}, "5"),
])
def test_train_spec_refuses_non_finite_and_huge_values(d: dict[str, Any], field: str) -> None:
    """The model's own parser (estimate train, the scheduler) refuses NaN, inf and absurd sizes by field."""
    with pytest.raises(SpecError) as err:
        TrainSpec.from_dict(d)
    assert err.value.field == field
    assert len(str(err.value)) < 300


def test_estimate_only_fields_are_refused_with_a_hint() -> None:
    """A field `estimate train` reads but a job cannot carry (it was silently dropped, so the job ran a
    different spec than the estimate) is refused and named, with what to do."""
    with pytest.raises(InvalidArgument) as err:
        spec_to_proto({**SPEC, "cost": {"energy_price_usd_per_kwh": 0.1}})
    assert err.value.field == "spec.cost" and "remove it to submit" in str(err.value)
    with pytest.raises(InvalidArgument) as err:  # a live job runs on the cluster's own fabric
        spec_to_proto({**SPEC, "network": {"routing": "spray"}})
    assert err.value.field == "spec.network" and "remove it to submit" in str(err.value)
    for key, value in (("dp_bucket_params", 768_000_000), ("dp_comm_overlap", False)):  # a live job: Megatron's own
        with pytest.raises(InvalidArgument) as err:
            spec_to_proto({**SPEC, "parallelism": {**SPEC.get("parallelism", {}), key: value}})
        assert err.value.field == f"spec.parallelism.{key}" and "remove it to submit" in str(err.value)


def test_a_job_carries_every_parallelism_field_of_the_estimate() -> None:
    """Interleaving, overlaps, the distributed optimizer and the gradient dtype travel in the job, so the live
    job runs the very spec `estimate train` read (Llama 3 405B's published setup uses 4 virtual stages)."""
    from gigacluster.scheduler.spec import proto_to_spec

    par = {"tp": 8, "pp": 4, "virtual_stages": 2, "tp_comm_overlap": 0.5, "cp_comm_overlap": 0.25,
           "pp_comm_overlap": 1.0, "distributed_optimizer": False, "grad_reduce_dtype": "bf16"}
    back = proto_to_spec(spec_to_proto({**SPEC, "parallelism": par}))
    assert back["parallelism"] == par
    assert TrainSpec.from_dict(back) == TrainSpec.from_dict({**SPEC, "parallelism": par})
    assert "distributed_optimizer" not in proto_to_spec(spec_to_proto(SPEC))["parallelism"]  # unset: the default


@pytest.mark.parametrize(("key", "value"), [("tp_comm_overlap", 1.5), ("pp_comm_overlap", float("nan")),
                                            ("cp_comm_overlap", "half"), ("distributed_optimizer", 1)])
def test_bad_overlaps_and_flags_are_refused_by_field(key: str, value: Any) -> None:
    """Overlaps are fractions in [0, 1] (NaN refused), the optimizer flag a boolean: named in the error."""
    with pytest.raises(InvalidArgument) as err:
        spec_to_proto(with_(f"parallelism.{key}", value))
    assert err.value.field == f"spec.parallelism.{key}"


def test_out_of_range_overlap_on_the_wire_is_refused_before_any_work() -> None:
    """A raw SubmitJob whose overlap is NaN or above 1 fails check_bounds, naming the field."""
    req = scheduler_pb2.SubmitJobRequest(spec=spec_to_proto(SPEC))
    req.spec.parallelism.tp_comm_overlap = float("nan")
    with pytest.raises(InvalidArgument, match=r"spec\.parallelism\.tp_comm_overlap"):
        check_bounds(req, SpecBounds())


def test_job_names_in_errors_are_short() -> None:
    """GetJob/CancelJob/WatchJob with a 100 kB name: INVALID_ARGUMENT quoting a short prefix only."""
    from gigacluster.runtime.auth import Principal
    from gigacluster.runtime.config import SchedulerConfig
    from gigacluster.scheduler.service import SchedulerService

    svc = SchedulerService(SchedulerConfig())
    p = Principal(kind="tenant", tenant="tenants/a")
    for name in ("jobs/" + "x" * 100_000, "y" * 100_000):
        with pytest.raises(InvalidArgument) as err:
            svc.book.visible(p, name)
        assert len(str(err.value)) < 120


def test_an_moe_job_file_round_trips_through_the_proto() -> None:
    """The DeepSeek-V3 example (ep, capacity factor, all-to-all overlap, DualPipe, fp8) and a custom MoE/MLA model
    travel in a job unchanged, so the spec `estimate train` reads can be submitted as is."""
    from pathlib import Path

    from gigacluster import safeyaml
    from gigacluster.scheduler.spec import proto_to_spec

    path = Path(__file__).resolve().parents[2] / "examples" / "train-deepseek-v3-h800.yaml"
    spec, _ = split_job_file(safeyaml.load_file(path))
    back = proto_to_spec(spec_to_proto(spec))
    assert TrainSpec.from_dict(back) == TrainSpec.from_dict(spec)
    custom = {**SPEC, "model": {"layers": 4, "hidden": 1024, "heads": 8, "ffn_hidden": 4096, "vocab": 32000,
                                "seq_len": 1024, "attention": "mla", "kv_lora_rank": 128, "qk_rope_head_dim": 32,
                                "v_head_dim": 64, "head_dim": 64, "experts": 16, "experts_per_token": 2,
                                "shared_experts": 1, "expert_ffn_hidden": 512, "first_dense_layers": 1,
                                "mtp_layers": 1, "mlp": "swiglu"},
              "parallelism": {"ep": 2}, "precision": "fp16"}
    back = proto_to_spec(spec_to_proto(custom))
    assert back["model"] == custom["model"] and back["precision"] == "fp16"
    assert TrainSpec.from_dict(back) == TrainSpec.from_dict(custom)


@pytest.mark.parametrize(("key", "value", "field"), [
    ("parallelism.capacity_factor", 0.5, "spec.parallelism.capacity_factor"),
    ("parallelism.moe_overlap", 2.0, "spec.parallelism.moe_overlap"),
    ("parallelism.ep", -1, "spec.parallelism.ep"),
    ("precision", "fp4", "spec.precision"),
])
def test_bad_moe_job_fields_are_refused_by_field(key: str, value: Any, field: str) -> None:
    """EP, the capacity factor, the overlap and the precision are checked at the edge, naming the field."""
    with pytest.raises(InvalidArgument) as err:
        spec_to_proto(with_(key, value))
    assert err.value.field == field
