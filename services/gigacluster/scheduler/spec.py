"""Training specs between YAML/dicts (what ``estimate train`` reads) and ``TrainingSpec`` protos.

A job file is a training spec plus job fields (``name``, ``queue``, ``priority``,
``checkpoint_interval_steps``, ``max_restarts``); :func:`split_job_file` separates them so the
offline estimate and the live scheduler read the very same spec.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from gigacluster.common.v1 import common_pb2
from gigacluster.errors import InvalidArgument
from gigacluster.model.arch import ARCH_FIELDS, ARCH_TEXT_FIELDS, MOE_ARCH_FIELDS
from gigacluster.model.train_spec import TRAIN_PRECISIONS
from gigacluster.runtime.convert import PRECISION_ENUMS, precision_name
from gigacluster.scheduler.v1 import scheduler_pb2

JOB_FIELDS = ("name", "queue", "priority", "checkpoint_interval_steps", "max_restarts")
# What a TrainingSpec message carries, per section: a job file may hold nothing else.
SPEC_KEYS: dict[str, tuple[str, ...]] = {
    "": ("model", "batch", "parallelism", "hardware", "precision", "tokens", "steps", "pue", "attention_impl",
         "loss_impl"),
    "model": ("preset", *ARCH_FIELDS, *MOE_ARCH_FIELDS, *ARCH_TEXT_FIELDS),
    "batch": ("global_batch", "global_batch_tokens"),
    "parallelism": ("tp", "pp", "dp", "cp", "microbatch_size", "recompute", "virtual_stages", "tp_comm_overlap",
                    "cp_comm_overlap", "pp_comm_overlap", "distributed_optimizer", "grad_reduce_dtype", "ep",
                    "capacity_factor", "moe_overlap", "pipeline_schedule", "sequence_parallel", "fsdp", "fsdp_shard",
                    "fsdp_reshard_after_forward", "recompute_layers"),
    "hardware": ("chip", "count", "system"),
}
# Fields TrainSpec.from_dict reads (offline estimates) that the TrainingSpec message has no room for.
ESTIMATE_ONLY: dict[str, tuple[str, ...]] = {
    "": ("cost", "network"),  # network: a live job runs on the cluster's own fabric (set by `up`)
    "model": ("name",),
    # how the data-parallel reduction overlaps: a live job runs Megatron's defaults (overlapped, default buckets)
    "parallelism": ("dp_comm_overlap", "dp_bucket_params"),
}
OVERLAPS = ("tp_comm_overlap", "cp_comm_overlap", "pp_comm_overlap", "moe_overlap")
PAR_INTS = ("tp", "pp", "dp", "cp", "microbatch_size", "virtual_stages", "ep", "fsdp_shard", "recompute_layers")
# Optional in the message: unset means the model's default.
PAR_BOOLS = ("distributed_optimizer", "sequence_parallel", "fsdp", "fsdp_reshard_after_forward")
PAR_TEXTS = ("recompute", "grad_reduce_dtype", "pipeline_schedule")
UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
QUEUE_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def show(v: Any) -> str:
    """A value for an error message: at most a short prefix of what the caller sent."""
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _key(k: Any) -> str:
    s = str(k)
    return s if len(s) <= 40 else s[:37] + "..."


def _strict(section: Any, where: str) -> dict[str, Any]:
    """``section`` as a mapping with only the keys a TrainingSpec carries there (unknown keys named)."""
    field = f"spec.{where}" if where else "spec"
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise InvalidArgument(field, f"must be a mapping, got {show(section)}")
    allowed = SPEC_KEYS[where]
    extra = sorted(_key(k) for k in section if k not in allowed)
    if extra:
        hint = ("a field of `estimate train` specs that a scheduler job does not carry; remove it to submit"
                if extra[0] in ESTIMATE_ONLY.get(where, ()) else "unknown field")
        names = ", ".join(allowed)
        names = names if len(names) <= 100 else names[:names.rfind(",", 0, 100)] + ", ... (see `estimate train`)"
        raise InvalidArgument(f"{field}.{extra[0]}", f"{hint}; allowed here: {names}")
    return section


def _text(d: dict[str, Any], key: str, field: str, max_chars: int = 64) -> str:
    v = d.get(key, "")
    if v is None:
        return ""
    if not isinstance(v, str) or len(v) > max_chars:
        raise InvalidArgument(field, f"must be a string of at most {max_chars} characters, got {show(v)}")
    return v


def split_job_file(data: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(training spec, job fields) of a job file's mapping."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise InvalidArgument("spec", f"a job file must be a YAML mapping (model, batch, hardware, ...); it is {kind}")
    spec = {k: v for k, v in data.items() if k not in JOB_FIELDS}
    job = {k: v for k, v in data.items() if k in JOB_FIELDS}
    return spec, job


def _int(d: dict[str, Any], key: str, field: str, maximum: int = UINT64_MAX, minimum: int = 0) -> int:
    v = d.get(key, 0)
    if v is None:
        return 0
    if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or int(v) != v
            or not minimum <= v <= maximum):
        raise InvalidArgument(field, f"must be an integer in [{minimum}, {maximum}], got {show(v)}")
    return int(v)


def job_fields(job: dict[str, Any]) -> dict[str, Any]:
    """A job file's job fields, type-checked for the SubmitJobRequest (the scheduler bounds values)."""
    return {
        "name": _text(job, "name", "name", 200),
        "queue": _text(job, "queue", "queue", 63),
        "priority": _int(job, "priority", "priority", 2**31 - 1, -(2**31)),
        "checkpoint_interval_steps": _int(job, "checkpoint_interval_steps", "checkpoint_interval_steps"),
        "max_restarts": _int(job, "max_restarts", "max_restarts", UINT32_MAX),
        **({"request_id": _text(job, "request_id", "request_id", 128)} if "request_id" in job else {}),
    }


@dataclasses.dataclass(frozen=True)
class SpecBounds:
    """Configured upper bounds on every field of a submission that sizes work (SchedulerConfig)."""

    max_chips: int = 1 << 20
    max_global_batch: int = 1 << 24
    max_steps: int = 100_000_000
    max_tokens: int = 10**15
    max_arch: int = 1 << 24  # layers, hidden, heads, ffn_hidden, vocab, seq_len
    max_parallel: int = 1 << 20  # tp, pp, dp, cp, microbatch_size
    max_priority: int = 1000
    max_restarts: int = 1000
    max_name_chars: int = 200
    max_pue: float = 10.0


def check_bounds(msg: scheduler_pb2.SubmitJobRequest, b: SpecBounds) -> None:
    """Refuse a submission any of whose sizing fields is out of its configured range, naming the field.

    Runs on the proto before any conversion or model work, so a hostile value costs nothing.
    """
    s = msg.spec

    def cap(field: str, v: float, hi: float, lo: float = 0) -> None:
        if not (lo <= v <= hi):  # also refuses NaN
            raise InvalidArgument(field, f"must be in [{lo:g}, {hi:g}], got {show(v)}")

    cap("priority", msg.priority, b.max_priority, -b.max_priority)
    cap("max_restarts", msg.max_restarts, b.max_restarts)
    cap("checkpoint_interval_steps", msg.checkpoint_interval_steps, b.max_steps)
    if len(msg.display_name) > b.max_name_chars:
        raise InvalidArgument("display_name", f"at most {b.max_name_chars} characters, got {len(msg.display_name)}")
    if msg.queue and not QUEUE_RE.match(msg.queue):
        raise InvalidArgument("queue", f"lowercase letters, digits and '-', at most 63; got {show(msg.queue)}")
    if len(msg.request_id) > 128:
        raise InvalidArgument("request_id", f"at most 128 characters, got {len(msg.request_id)}")
    for k in (*ARCH_FIELDS, *MOE_ARCH_FIELDS):
        cap(f"spec.model.{k}", getattr(s.model, k), b.max_arch)
    texts = [("spec.model.preset", s.model.preset), ("spec.hardware.chip", s.hardware.chip),
             ("spec.hardware.system", s.hardware.system), ("spec.attention_impl", s.attention_impl),
             ("spec.loss_impl", s.loss_impl)]
    texts += [(f"spec.model.{k}", getattr(s.model, k)) for k in ARCH_TEXT_FIELDS]
    texts += [(f"spec.parallelism.{k}", getattr(s.parallelism, k)) for k in PAR_TEXTS]
    for k, text in texts:
        if len(text) > 64:
            raise InvalidArgument(k, f"at most 64 characters, got {show(text)}")
    cap("spec.batch.global_batch", s.batch.global_batch, b.max_global_batch)
    cap("spec.batch.global_batch_tokens", s.batch.global_batch_tokens, b.max_global_batch * b.max_arch)
    for k in PAR_INTS:
        cap(f"spec.parallelism.{k}", getattr(s.parallelism, k), b.max_parallel)
    for k in OVERLAPS:
        cap(f"spec.parallelism.{k}", getattr(s.parallelism, k), 1.0)
    cap("spec.parallelism.capacity_factor", s.parallelism.capacity_factor, b.max_parallel)
    cap("spec.hardware.count", s.hardware.count, b.max_chips)
    cap("spec.steps", s.steps, b.max_steps)
    cap("spec.tokens", s.tokens, b.max_tokens)
    if s.pue and not (1.0 <= s.pue <= b.max_pue):
        raise InvalidArgument("spec.pue", f"must be a finite number in [1, {b.max_pue:g}], got {show(s.pue)}")


def spec_to_proto(spec: dict[str, Any]) -> scheduler_pb2.TrainingSpec:
    """A spec mapping as a TrainingSpec message (structure only; the model validates values)."""
    spec = _strict(spec, "")
    model = _strict(spec.get("model"), "model")
    arch = common_pb2.ModelArchitecture(preset=_text(model, "preset", "spec.model.preset"))
    for k in (*ARCH_FIELDS, *MOE_ARCH_FIELDS):
        setattr(arch, k, _int(model, k, f"spec.model.{k}", UINT32_MAX))
    for k in ARCH_TEXT_FIELDS:
        setattr(arch, k, _text(model, k, f"spec.model.{k}"))
    batch = _strict(spec.get("batch"), "batch")
    par = _strict(spec.get("parallelism"), "parallelism")
    hw = _strict(spec.get("hardware"), "hardware")
    precision = spec.get("precision", "bf16")
    if not isinstance(precision, str) or precision not in PRECISION_ENUMS:
        raise InvalidArgument("spec.precision", f"allowed: {', '.join(TRAIN_PRECISIONS)}; got {show(precision)}")
    pue = spec.get("pue", 0.0) or 0.0
    if isinstance(pue, bool) or not isinstance(pue, int | float) or not math.isfinite(pue):
        raise InvalidArgument("spec.pue", f"must be a finite number >= 1, got {show(pue)}")
    return scheduler_pb2.TrainingSpec(
        model=arch,
        batch=scheduler_pb2.BatchSpec(global_batch=_int(batch, "global_batch", "spec.batch.global_batch"),
                                      global_batch_tokens=_int(batch, "global_batch_tokens",
                                                               "spec.batch.global_batch_tokens")),
        parallelism=_parallelism_msg(par),
        hardware=scheduler_pb2.HardwareSpec(chip=_text(hw, "chip", "spec.hardware.chip"),
                                            count=_int(hw, "count", "spec.hardware.count"),
                                            system=_text(hw, "system", "spec.hardware.system")),
        precision=PRECISION_ENUMS[precision],  # type: ignore[arg-type]  # protobuf enums are int NewTypes
        tokens=_int(spec, "tokens", "spec.tokens"),
        steps=_int(spec, "steps", "spec.steps"),
        pue=float(pue),
        attention_impl=_text(spec, "attention_impl", "spec.attention_impl"),
        loss_impl=_text(spec, "loss_impl", "spec.loss_impl"),
    )


def _parallelism_msg(par: dict[str, Any]) -> scheduler_pb2.ParallelismSpec:
    """The parallelism section as a message (structure and types only; the model checks the values)."""
    msg = scheduler_pb2.ParallelismSpec()
    for k in PAR_INTS:
        setattr(msg, k, _int(par, k, f"spec.parallelism.{k}", UINT32_MAX))
    for k in PAR_TEXTS:
        setattr(msg, k, _text(par, k, f"spec.parallelism.{k}"))
    if "capacity_factor" in par:
        v = par["capacity_factor"]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 1.0:
            raise InvalidArgument("spec.parallelism.capacity_factor", f"must be a finite number >= 1, got {show(v)}")
        msg.capacity_factor = float(v)
    for k in OVERLAPS:
        v = par.get(k, 0.0)
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
            raise InvalidArgument(f"spec.parallelism.{k}", f"must be a fraction in [0, 1], got {show(v)}")
        setattr(msg, k, float(v))
    for k in PAR_BOOLS:
        if k in par:
            v = par[k]
            if not isinstance(v, bool):
                raise InvalidArgument(f"spec.parallelism.{k}", f"must be true or false, got {show(v)}")
            setattr(msg, k, v)
    return msg


def proto_to_spec(msg: scheduler_pb2.TrainingSpec) -> dict[str, Any]:
    """The mapping ``TrainSpec.from_dict`` reads; zero fields are left out (model defaults)."""
    model: dict[str, Any] = {}
    if msg.model.preset:
        model["preset"] = msg.model.preset
    for k in (*ARCH_FIELDS, *MOE_ARCH_FIELDS):
        v = getattr(msg.model, k)
        if v:
            model[k] = int(v)
    for k in ARCH_TEXT_FIELDS:
        if getattr(msg.model, k):
            model[k] = getattr(msg.model, k)
    out: dict[str, Any] = {"model": model}
    batch = {k: int(getattr(msg.batch, k)) for k in ("global_batch", "global_batch_tokens") if getattr(msg.batch, k)}
    if batch:
        out["batch"] = batch
    p = msg.parallelism
    par: dict[str, Any] = {k: int(getattr(p, k)) for k in PAR_INTS if getattr(p, k)}
    par.update({k: float(getattr(p, k)) for k in (*OVERLAPS, "capacity_factor") if getattr(p, k)})
    for k in PAR_TEXTS:
        if getattr(p, k):
            par[k] = getattr(p, k)
    for k in PAR_BOOLS:
        if p.HasField(k):
            par[k] = bool(getattr(p, k))
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
    if msg.attention_impl:
        out["attention_impl"] = msg.attention_impl
    if msg.loss_impl:
        out["loss_impl"] = msg.loss_impl
    return out
