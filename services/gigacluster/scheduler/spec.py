"""Training specs between YAML/dicts (what ``estimate train`` reads) and ``TrainingSpec`` protos.

A job file is a training spec plus job fields (``name``, ``queue``, ``priority``,
``checkpoint_interval_steps``, ``max_restarts``); :func:`split_job_file` separates them so the
offline estimate and the live scheduler read the very same spec.
"""

from __future__ import annotations

from typing import Any

from gigacluster.common.v1 import common_pb2
from gigacluster.errors import InvalidArgument
from gigacluster.runtime.convert import PRECISION_ENUMS, precision_name
from gigacluster.scheduler.v1 import scheduler_pb2

JOB_FIELDS = ("name", "queue", "priority", "checkpoint_interval_steps", "max_restarts")
ARCH_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "seq_len")


def split_job_file(data: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(training spec, job fields) of a job file's mapping."""
    if not isinstance(data, dict):
        raise InvalidArgument("spec", "a job file must be a YAML mapping")
    spec = {k: v for k, v in data.items() if k not in JOB_FIELDS}
    job = {k: v for k, v in data.items() if k in JOB_FIELDS}
    return spec, job


def _int(d: dict[str, Any], key: str, field: str) -> int:
    v = d.get(key, 0)
    if v is None:
        return 0
    if isinstance(v, bool) or not isinstance(v, int | float) or int(v) != v or v < 0:
        raise InvalidArgument(field, f"must be a non-negative integer, got {v!r}")
    return int(v)


def spec_to_proto(spec: dict[str, Any]) -> scheduler_pb2.TrainingSpec:
    """A spec mapping as a TrainingSpec message (structure only; the model validates values)."""
    model = spec.get("model") or {}
    if not isinstance(model, dict):
        raise InvalidArgument("spec.model", "must be a mapping")
    arch = common_pb2.ModelArchitecture(preset=str(model.get("preset", "")),
                                        **{k: _int(model, k, f"spec.model.{k}") for k in ARCH_FIELDS})
    batch = spec.get("batch") or {}
    par = spec.get("parallelism") or {}
    hw = spec.get("hardware") or {}
    for name, section in (("batch", batch), ("parallelism", par), ("hardware", hw)):
        if not isinstance(section, dict):
            raise InvalidArgument(f"spec.{name}", "must be a mapping")
    precision = spec.get("precision", "bf16")
    if precision not in PRECISION_ENUMS:
        raise InvalidArgument("spec.precision", f"allowed: bf16, fp8; got {precision!r}")
    pue = spec.get("pue", 0.0) or 0.0
    if not isinstance(pue, int | float):
        raise InvalidArgument("spec.pue", f"must be a number, got {pue!r}")
    return scheduler_pb2.TrainingSpec(
        model=arch,
        batch=scheduler_pb2.BatchSpec(global_batch=_int(batch, "global_batch", "spec.batch.global_batch"),
                                      global_batch_tokens=_int(batch, "global_batch_tokens",
                                                               "spec.batch.global_batch_tokens")),
        parallelism=scheduler_pb2.ParallelismSpec(
            **{k: _int(par, k, f"spec.parallelism.{k}") for k in ("tp", "pp", "dp", "cp", "microbatch_size")},
            recompute=str(par.get("recompute", "") or ""),
        ),
        hardware=scheduler_pb2.HardwareSpec(chip=str(hw.get("chip", "")),
                                            count=_int(hw, "count", "spec.hardware.count"),
                                            system=str(hw.get("system", "") or "")),
        precision=PRECISION_ENUMS[precision],  # type: ignore[arg-type]  # protobuf enums are int NewTypes
        tokens=_int(spec, "tokens", "spec.tokens"),
        steps=_int(spec, "steps", "spec.steps"),
        pue=float(pue),
    )


def proto_to_spec(msg: scheduler_pb2.TrainingSpec) -> dict[str, Any]:
    """The mapping ``TrainSpec.from_dict`` reads; zero fields are left out (model defaults)."""
    model: dict[str, Any] = {}
    if msg.model.preset:
        model["preset"] = msg.model.preset
    for k in ARCH_FIELDS:
        v = getattr(msg.model, k)
        if v:
            model[k] = int(v)
    out: dict[str, Any] = {"model": model}
    batch = {k: int(getattr(msg.batch, k)) for k in ("global_batch", "global_batch_tokens") if getattr(msg.batch, k)}
    if batch:
        out["batch"] = batch
    par: dict[str, Any] = {k: int(getattr(msg.parallelism, k))
                           for k in ("tp", "pp", "dp", "cp", "microbatch_size") if getattr(msg.parallelism, k)}
    if msg.parallelism.recompute:
        par["recompute"] = msg.parallelism.recompute
    if par:
        out["parallelism"] = par
    hw: dict[str, Any] = {}
    if msg.hardware.chip:
        hw["chip"] = msg.hardware.chip
    if msg.hardware.count:
        hw["count"] = int(msg.hardware.count)
    if msg.hardware.system:
        hw["system"] = msg.hardware.system
    out["hardware"] = hw
    out["precision"] = precision_name(msg.precision, "spec.precision")
    if msg.tokens:
        out["tokens"] = int(msg.tokens)
    if msg.steps:
        out["steps"] = int(msg.steps)
    if msg.pue:
        out["pue"] = float(msg.pue)
    return out
