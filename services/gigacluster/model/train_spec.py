"""A training job's spec: parsing and validation of the user's mapping into :class:`TrainSpec`.

The spec is the input of the step model (:mod:`gigacluster.model.step`); both are re-exported by
:mod:`gigacluster.model.training`, which composes them into :func:`estimate_train`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from gigacluster.hw.catalog import CatalogError, Chip, default_system, facility, get_chip, get_system
from gigacluster.model import SpecError
from gigacluster.model.arch import (
    ALL_ARCH_KEYS,
    ARCH_FIELDS,
    ARCH_TEXT_FIELDS,
    MOE_ARCH_FIELDS,
    ModelArch,
    arch_from_dict,
    divisors,
)
from gigacluster.model.network_spec import NetworkSpec

RECOMPUTE = ("none", "selective", "op", "full")
"""Activation recomputation: ``selective`` (Megatron-LM: norms and the MLP activation re-run, their inputs
kept), ``op`` (torchtitan's op-level selective checkpointing: every second matmul of a layer's forward is
re-run in backward, the attention output and the other matmuls kept), ``full`` (the whole forward of the
layers re-run from each layer's input; ``recompute_layers`` of them per pipeline rank, all by default)."""
SCHEDULES = ("1f1b", "dualpipe")
TRAIN_PRECISIONS = ("fp16", "bf16", "fp8", "mxfp6", "mxfp4", "nvfp4")
"""Formats the layers' GEMMs may run in; attention, norms and the optimizer stay in bf16/fp32.
A chip runs only the formats its catalog entry lists (``Chip.precisions``)."""
GRAD_DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}
_TOP_KEYS = ("name", "model", "batch", "parallelism", "hardware", "precision", "tokens", "steps", "pue", "cost",
             "network")
_PAR_KEYS = (
    "tp", "pp", "dp", "cp", "microbatch_size", "recompute", "virtual_stages", "tp_comm_overlap",
    "cp_comm_overlap", "pp_comm_overlap", "distributed_optimizer", "grad_reduce_dtype", "ep", "capacity_factor",
    "moe_overlap", "pipeline_schedule", "sequence_parallel", "dp_comm_overlap", "fsdp", "fsdp_shard",
    "fsdp_reshard_after_forward", "recompute_layers", "dp_bucket_params",
)

ATTENTION_IMPLS = ("flash", "materialized", "flash_triton")
"""How the attention core runs: ``flash`` (default: fused, causal blocks skipped, nothing s x s in HBM;
FlashAttention-2/3, every 2023+ stack), ``materialized`` (the 2021-2022 Megatron-LM path: full
s x s score and context batched GEMMs, fused scale-mask-softmax and dropout reading and writing
the s x s tensors in HBM) or ``flash_triton`` (the FlashAttention of 2022-2023 written in Triton,
``flash_attn_triton.py``, MPT's ``attn_impl: triton``: the same fused causal algorithm at the lower
rate of catalog ``efficiency.flash_triton_fraction``)."""
LOSS_IMPLS = ("fp32", "fused")
"""How the output layer's cross-entropy holds its logits: ``fp32`` (default: the logits upcast to fp32 and
their softmax kept for backward, PyTorch's and Megatron-LM's vocab-parallel cross-entropy, 8 bytes a logit)
or ``fused`` (one kernel on the 16-bit logits that keeps them and their log-sum-exp and writes a 16-bit
gradient: flash-attn's / apex's xentropy, llm-foundry's default ``fused_crossentropy``, 4 bytes a logit)."""
_IMPL_KEYS = ("attention_impl", "loss_impl")  # top-level keys of the kernels a step runs (issue 15)


# Largest integer a spec field may hold: exact as a float, far above any real job (tokens ~1e13),
# so arithmetic on a spec never overflows or loses precision. Services bound tighter in config.
MAX_SPEC_INT = 2**53


def _show(v: Any) -> str:
    """A value for an error message: at most a short prefix of whatever the caller sent."""
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _int(d: Mapping[str, Any], key: str, field: str, default: int | None) -> int | None:
    v = d.get(key, default)
    if v is None:
        return None
    if (isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or int(v) != v or v < 1
            or v > MAX_SPEC_INT):
        raise SpecError(field, f"must be a positive integer <= 2^53, got {_show(v)}")
    return int(v)


def _int0(d: Mapping[str, Any], key: str, field: str) -> int:
    """A count where 0 means "the default" (all ranks, all layers)."""
    if d.get(key, 0) == 0 and not isinstance(d.get(key, 0), bool):
        return 0
    v = _int(d, key, field, None)
    assert v is not None
    return v


def _first(keys: Any) -> str:
    """The first unknown key, as a short string (keys may be any YAML scalar, of any length)."""
    k = sorted(str(x) for x in keys)[0]
    return k if len(k) <= 40 else k[:37] + "..."


def _finite(v: Any, field: str, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise SpecError(field, f"must be {what}, got {_show(v)}")
    return float(v)


def _frac(d: Mapping[str, Any], key: str, field: str, default: float) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v <= 1.0:
        raise SpecError(field, f"must be a number in [0, 1], got {_show(v)}")
    return float(v)


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """A training job: model, batch, parallelism, hardware and length. Validates itself."""

    arch: ModelArch
    chip: str
    count: int
    system: str
    precision: str = "bf16"
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    microbatch_size: int = 1
    recompute: str = "none"
    global_batch: int = 1  # sequences per step
    virtual_stages: int = 1  # interleaved 1F1B chunks per pipeline rank
    tp_comm_overlap: float = 0.0  # fraction of TP collective time hidden behind GEMMs
    cp_comm_overlap: float = 0.0
    pp_comm_overlap: float = 0.0
    distributed_optimizer: bool = True
    grad_reduce_dtype: str = "fp32"
    # Data-parallel gradient reduction / parameter gather overlapped with the last backward and first forward
    # (Megatron --overlap-grad-reduce/--overlap-param-gather, torch DDP buckets, NeMo recipes); False: they
    # run after the pipeline flush, exposed (Megatron LocalDDP 2021, Megatron-LM as MegaScale's baseline).
    dp_comm_overlap: bool = True
    ep: int = 1  # expert parallelism: ranks taken from DP (as Megatron-LM), each holding experts / ep
    capacity_factor: float = 1.0  # tokens on the most loaded EP rank / the mean (1.0: balanced routing)
    moe_overlap: float = 0.0  # fraction of the expert all-to-all hidden behind compute (DualPipe-style)
    pipeline_schedule: str = "1f1b"  # or "dualpipe" (DeepSeek-V3: bidirectional, two parameter copies)
    sequence_parallel: bool = True  # Megatron sequence parallelism with TP (norms/dropout sharded); False: 2021 style
    attention_impl: str = "flash"  # see ATTENTION_IMPLS
    loss_impl: str = "fp32"  # see LOSS_IMPLS
    # Fully sharded data parallelism (PyTorch FSDP FULL_SHARD / FSDP2 fully_shard, ZeRO-3, Megatron-FSDP):
    # parameters, gradients and optimizer state sharded over ``fsdp_shard`` data-parallel ranks; every layer's
    # parameters all-gathered before its forward (and again before its backward when
    # ``fsdp_reshard_after_forward``), its gradients reduce-scattered after its backward, each microbatch, the
    # next layer's gather prefetched behind the current layer's compute.
    fsdp: bool = False
    fsdp_shard: int = 0  # ranks a parameter is sharded over; 0: all dp x cp ranks; fewer: HSDP (replicas all-reduce)
    fsdp_reshard_after_forward: bool = True  # False: gathered parameters kept to the backward (no second gather)
    recompute_layers: int = 0  # with recompute full: layers per pipeline rank re-run (0: all of them)
    # Parameters per bucket of the overlapped data-parallel reduction (Megatron DDP ``bucket_size``); 0: Megatron
    # core's default, max(40M, 1M x the data-parallel x context-parallel size). The last gradient bucket (and the
    # first parameter bucket) have no compute left to hide behind.
    dp_bucket_params: int = 0
    steps: int | None = None
    tokens: int | None = None
    pue: float = 1.1
    energy_price_usd_per_kwh: float | None = None
    price_per_chip_hour_usd: float | None = None
    name: str = "train"
    network: NetworkSpec = dataclasses.field(default_factory=NetworkSpec)  # scale-out network (offline estimates)

    def __post_init__(self) -> None:
        try:
            chip = get_chip(self.chip)
            sysd = get_system(self.system)
        except CatalogError as exc:
            field = "hardware.chip" if "chip" in str(exc) else "hardware.system"
            raise SpecError(field, str(exc)) from exc
        if chip.name not in sysd.chip_types:
            raise SpecError(
                "hardware.system", f"system {self.system} holds {', '.join(sysd.chip_types)}, not {self.chip}"
            )
        if self.precision not in TRAIN_PRECISIONS:
            raise SpecError("precision", f"allowed: {', '.join(TRAIN_PRECISIONS)}; got {_show(self.precision)}")
        if self.precision not in chip.peak_tflops:
            have = ", ".join(p for p in chip.precisions() if p in TRAIN_PRECISIONS)
            raise SpecError("precision", f"{chip.name} has no {self.precision} units; it supports: {have}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise SpecError("attention_impl",
                            f"allowed: {', '.join(ATTENTION_IMPLS)}; got {_show(self.attention_impl)}")
        if self.loss_impl not in LOSS_IMPLS:
            raise SpecError("loss_impl", f"allowed: {', '.join(LOSS_IMPLS)}; got {_show(self.loss_impl)}")
        if self.attention_impl == "materialized" and self.arch.attention == "mla":
            raise SpecError("attention_impl", "materialized is modelled for gqa attention only; use flash with mla")
        if self.recompute not in RECOMPUTE:
            raise SpecError("parallelism.recompute", f"allowed: {', '.join(RECOMPUTE)}; got {_show(self.recompute)}")
        if self.recompute_layers < 0 or (self.recompute_layers and self.recompute != "full"):
            raise SpecError("parallelism.recompute_layers",
                            f"needs recompute: full (the layers per pipeline rank re-run, 0 for all); got "
                            f"{self.recompute_layers} with recompute {self.recompute}")
        if self.grad_reduce_dtype not in GRAD_DTYPES:
            raise SpecError("parallelism.grad_reduce_dtype", f"allowed: {', '.join(GRAD_DTYPES)}")
        a = self.arch
        if self.tp * self.pp * self.dp * self.cp != self.count:
            raise SpecError(
                "hardware.count",
                f"must equal tp x pp x dp x cp = {self.tp}x{self.pp}x{self.dp}x{self.cp}"
                f" = {self.tp * self.pp * self.dp * self.cp}, got {self.count}",
            )
        if a.heads % self.tp:
            raise SpecError("parallelism.tp", f"must divide model.heads ({a.heads}); got {self.tp}")
        if a.kv_heads % self.tp and self.tp % a.kv_heads:
            raise SpecError("parallelism.tp", f"must divide or be a multiple of kv_heads ({a.kv_heads})")
        if a.ffn_hidden % self.tp and a.moe_layers < a.layers:
            raise SpecError("parallelism.tp", f"must divide model.ffn_hidden ({a.ffn_hidden})")
        self._check_moe()
        self._check_fsdp()
        if a.seq_len % (2 * self.cp) and self.cp > 1:
            raise SpecError("parallelism.cp", f"2 x cp must divide model.seq_len ({a.seq_len}); got {self.cp}")
        if a.layers < self.pp * self.virtual_stages:
            raise SpecError(
                "parallelism.pp", f"pp x virtual_stages ({self.pp}x{self.virtual_stages}) exceeds layers ({a.layers})"
            )
        if a.is_moe and (self.recompute == "op" or self.recompute_layers):
            raise SpecError("parallelism.recompute", "op and recompute_layers are modelled for dense models only; use "
                            "selective or full with a mixture of experts")
        if self.recompute_layers > a.layers:
            raise SpecError("parallelism.recompute_layers",
                            f"must be at most model.layers ({a.layers}); got {self.recompute_layers}")
        if self.pipeline_schedule not in SCHEDULES:
            raise SpecError("parallelism.pipeline_schedule",
                            f"allowed: {', '.join(SCHEDULES)}; got {_show(self.pipeline_schedule)}")
        if self.pipeline_schedule == "dualpipe" and (self.pp < 2 or self.pp % 2 or self.virtual_stages != 1):
            raise SpecError("parallelism.pipeline_schedule",
                            f"dualpipe needs an even pp >= 2 and virtual_stages 1; got pp {self.pp},"
                            f" virtual_stages {self.virtual_stages}")
        if self.virtual_stages > 1 and self.pp == 1:
            raise SpecError("parallelism.virtual_stages", "needs pp > 1")
        if self.global_batch % (self.dp * self.microbatch_size):
            raise SpecError(
                "batch.global_batch",
                f"must be a multiple of dp x microbatch_size = {self.dp * self.microbatch_size};"
                f" got {self.global_batch}",
            )
        if self.steps is not None and self.tokens is not None:
            raise SpecError("steps", "give either steps or tokens, not both")
        if self.pue < 1.0:
            raise SpecError("pue", f"must be >= 1.0, got {self.pue!r}")
        for f in ("energy_price_usd_per_kwh", "price_per_chip_hour_usd"):
            v = getattr(self, f)
            if v is not None and v < 0:
                raise SpecError(f"cost.{f}", f"must be >= 0, got {v!r}")

    def _check_moe(self) -> None:
        """Expert parallelism and load balance: EP divides the experts and DP, the model has experts."""
        a = self.arch
        if not a.is_moe:
            if self.ep != 1:
                raise SpecError("parallelism.ep",
                                f"needs a mixture-of-experts model (model.experts > 0); got {self.ep}")
            return
        if a.experts % self.ep:
            divs = divisors(a.experts)
            raise SpecError("parallelism.ep", f"must divide model.experts ({a.experts}, e.g. "
                            f"{', '.join(map(str, divs[-6:]))}); got {self.ep} ({a.experts} / {self.ep} = "
                            f"{a.experts / self.ep:.2f} experts per rank)")
        if self.dp % self.ep:
            raise SpecError("parallelism.ep", f"must divide dp ({self.dp}): EP ranks are taken from the data-parallel"
                            f" ranks; got {self.ep}")
        if a.expert_ffn_hidden % self.tp:
            raise SpecError("parallelism.tp", f"must divide model.expert_ffn_hidden ({a.expert_ffn_hidden})")
        if not 1.0 <= self.capacity_factor <= self.ep:
            raise SpecError("parallelism.capacity_factor",
                            f"must be in [1, ep={self.ep}] (the busiest EP rank's share over the mean);"
                            f" got {self.capacity_factor!r}")
        if not 0.0 <= self.moe_overlap <= 1.0:
            raise SpecError("parallelism.moe_overlap", f"must be in [0, 1], got {self.moe_overlap!r}")

    def _check_fsdp(self) -> None:
        """The shard group divides the data-parallel ranks; FSDP is not combined with what it does not model."""
        if self.fsdp_shard < 0 or (self.fsdp_shard and not self.fsdp):
            raise SpecError("parallelism.fsdp_shard",
                            f"needs fsdp: true (0: every dp x cp rank); got {self.fsdp_shard}")
        if not self.fsdp:
            return
        group = self.dp * self.cp
        if self.fsdp_shard and group % self.fsdp_shard:
            raise SpecError("parallelism.fsdp_shard",
                            f"must divide dp x cp = {group} (the ranks split into replicas of the shard group); got "
                            f"{self.fsdp_shard}")
        if self.ep > 1:
            raise SpecError("parallelism.fsdp", "FSDP with expert parallelism is not modelled; use ep 1 or the "
                            "distributed optimizer")
        if self.pipeline_schedule == "dualpipe":
            raise SpecError("parallelism.fsdp", "FSDP with dualpipe is not modelled (dualpipe keeps two parameter "
                            "copies); use pipeline_schedule 1f1b")

    @property
    def shard_group(self) -> int:
        """Ranks the optimizer state (and with FSDP the parameters and gradients) is sharded over."""
        if self.fsdp:
            return self.fsdp_shard or self.dp * self.cp
        return self.dp * self.cp if self.distributed_optimizer else 1

    # --- derived ---------------------------------------------------------------------------
    @property
    def microbatches(self) -> int:
        """Microbatches per pipeline per step."""
        return self.global_batch // (self.dp * self.microbatch_size)

    @property
    def tokens_per_step(self) -> int:
        """Tokens in one global batch."""
        return self.global_batch * self.arch.seq_len

    def total_steps(self) -> int | None:
        """Steps of the job (from ``steps`` or ``tokens``), or None when neither is given."""
        if self.steps is not None:
            return self.steps
        if self.tokens is not None:
            return math.ceil(self.tokens / self.tokens_per_step)
        return None

    def chip_spec(self) -> Chip:
        """The catalog chip, with the spec's price override."""
        chip = get_chip(self.chip)
        return chip.with_price(self.price_per_chip_hour_usd) if self.price_per_chip_hour_usd is not None else chip

    def with_(self, **changes: Any) -> TrainSpec:
        """A validated copy with fields replaced."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrainSpec:
        """Build from the YAML layout of ``gigacluster estimate train``; raises SpecError naming the field."""
        if not isinstance(d, Mapping):
            raise SpecError("spec", "must be a mapping with model, batch, parallelism, hardware")
        extra = set(d) - set(_TOP_KEYS) - set(_IMPL_KEYS)
        if extra:
            raise SpecError(_first(extra), f"unknown field; allowed: {', '.join(_TOP_KEYS + _IMPL_KEYS)}")
        for req in ("model", "batch", "hardware"):
            if req not in d:
                raise SpecError(req, "required")
        arch = _parse_model(d["model"])
        chip, system = _parse_hardware(d["hardware"])
        par = d.get("parallelism", {}) or {}
        tp, pp, cp, dp, count = _parse_degrees(par, d["hardware"])
        gb = _parse_batch(d["batch"], arch)
        precision = str(d.get("precision", "bf16")).lower()
        rec = str(par.get("recompute", "none")).lower()
        gdt = str(par.get("grad_reduce_dtype", "fp32")).lower()
        cost, pue, dist = _parse_costs(d, par)
        return cls(
            arch=arch,
            chip=chip,
            count=count,
            system=system,
            precision=precision,
            tp=tp,
            pp=pp,
            dp=dp,
            cp=cp,
            microbatch_size=_int(par, "microbatch_size", "parallelism.microbatch_size", 1) or 1,
            recompute=rec,
            global_batch=gb or 1,
            virtual_stages=_int(par, "virtual_stages", "parallelism.virtual_stages", 1) or 1,
            tp_comm_overlap=_frac(par, "tp_comm_overlap", "parallelism.tp_comm_overlap", 0.0),
            cp_comm_overlap=_frac(par, "cp_comm_overlap", "parallelism.cp_comm_overlap", 0.0),
            pp_comm_overlap=_frac(par, "pp_comm_overlap", "parallelism.pp_comm_overlap", 0.0),
            distributed_optimizer=dist,
            grad_reduce_dtype=gdt,
            dp_comm_overlap=_bool(par, "dp_comm_overlap", "parallelism.dp_comm_overlap", True),
            ep=_int(par, "ep", "parallelism.ep", 1) or 1,
            capacity_factor=_finite(par.get("capacity_factor", 1.0), "parallelism.capacity_factor", "a number >= 1"),
            moe_overlap=_frac(par, "moe_overlap", "parallelism.moe_overlap", 0.0),
            pipeline_schedule=str(par.get("pipeline_schedule", "1f1b")).lower(),
            sequence_parallel=_bool(par, "sequence_parallel", "parallelism.sequence_parallel", True),
            attention_impl=str(d.get("attention_impl", "flash")).lower(),
            loss_impl=str(d.get("loss_impl", "fp32")).lower(),
            fsdp=_bool(par, "fsdp", "parallelism.fsdp", False),
            fsdp_shard=_int0(par, "fsdp_shard", "parallelism.fsdp_shard"),
            fsdp_reshard_after_forward=_bool(par, "fsdp_reshard_after_forward",
                                             "parallelism.fsdp_reshard_after_forward", True),
            recompute_layers=_int0(par, "recompute_layers", "parallelism.recompute_layers"),
            dp_bucket_params=_int0(par, "dp_bucket_params", "parallelism.dp_bucket_params"),
            steps=_int(d, "steps", "steps", None),
            tokens=_int(d, "tokens", "tokens", None),
            pue=pue,
            energy_price_usd_per_kwh=cost.get("energy_price_usd_per_kwh"),
            price_per_chip_hour_usd=cost.get("price_per_chip_hour_usd"),
            name=str(d.get("name", "train")),
            network=NetworkSpec.from_dict(d.get("network")),
        )


def _parse_model(model: Any) -> ModelArch:
    """The ``model`` section: a preset name or a mapping of architecture fields."""
    if isinstance(model, Mapping):
        for k in set(model) & {"preset", "name", *ARCH_TEXT_FIELDS}:
            if not isinstance(model[k], str) or len(model[k]) > 64:
                raise SpecError(f"model.{k}", f"must be a short string, got {_show(model[k])}")
        for k in set(model) & set(ARCH_FIELDS):
            _int(model, k, f"model.{k}", None)
        for k in set(model) & set(MOE_ARCH_FIELDS):
            v = model[k]
            if v != 0:
                _int(model, k, f"model.{k}", None)
        extra = {str(k) for k in model} - set(ALL_ARCH_KEYS)
        if extra:
            raise SpecError(f"model.{_first(extra)}", f"unknown field; allowed: {', '.join(ALL_ARCH_KEYS)}")
        model = {k: (str(v).lower() if k in ARCH_TEXT_FIELDS else v) for k, v in model.items()}
        model = {k: (int(v) if k in MOE_ARCH_FIELDS or k in ARCH_FIELDS else v) for k, v in model.items()}
    return arch_from_dict(dict(model) if isinstance(model, Mapping) else model)


def _parse_hardware(hw: Any) -> tuple[str, str]:
    """(chip, system) of the ``hardware`` section."""
    if not isinstance(hw, Mapping) or "chip" not in hw:
        raise SpecError("hardware.chip", "required (a catalog chip name)")
    hw_extra = set(hw) - {"chip", "count", "system"}
    if hw_extra:
        raise SpecError(f"hardware.{_first(hw_extra)}", "unknown field; allowed: chip, count, system")
    for k in ("chip", "system"):
        v = hw.get(k)
        if v is not None and (not isinstance(v, str) or len(v) > 64):
            raise SpecError(f"hardware.{k}", f"must be a catalog name (a short string), got {_show(v)}")
    chip = str(hw["chip"])
    try:
        get_chip(chip)
        system = str(hw.get("system") or default_system(chip))
    except CatalogError as exc:
        raise SpecError("hardware.chip", str(exc)) from exc
    return chip, system


def _parse_degrees(par: Any, hw: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    """(tp, pp, cp, dp, count): parallel degrees, dp inferred from ``hardware.count`` when absent."""
    if not isinstance(par, Mapping):
        raise SpecError("parallelism", "must be a mapping")
    p_extra = set(par) - set(_PAR_KEYS)
    if p_extra:
        raise SpecError(f"parallelism.{_first(p_extra)}", f"unknown field; allowed: {', '.join(_PAR_KEYS)}")
    tp = _int(par, "tp", "parallelism.tp", 1)
    pp = _int(par, "pp", "parallelism.pp", 1)
    cp = _int(par, "cp", "parallelism.cp", 1)
    dp = _int(par, "dp", "parallelism.dp", None)
    count = _int(hw, "count", "hardware.count", None)
    assert tp is not None and pp is not None and cp is not None
    if dp is None:
        if count is None:
            dp = 1
        elif count % (tp * pp * cp):
            raise SpecError("hardware.count", f"must be a multiple of tp x pp x cp = {tp * pp * cp}; got {count}")
        else:
            dp = count // (tp * pp * cp)
    if count is None:
        count = tp * pp * dp * cp
    return tp, pp, cp, dp, count


def _parse_batch(batch: Any, arch: ModelArch) -> int | None:
    """Global batch in sequences, from ``global_batch`` or ``global_batch_tokens``."""
    if not isinstance(batch, Mapping):
        raise SpecError("batch", "must be a mapping with global_batch or global_batch_tokens")
    b_extra = {str(k) for k in batch} - {"global_batch", "global_batch_tokens"}
    if b_extra:
        raise SpecError(f"batch.{_first(b_extra)}", "unknown field; allowed: global_batch, global_batch_tokens")
    if ("global_batch" in batch) == ("global_batch_tokens" in batch):
        raise SpecError("batch.global_batch", "give exactly one of global_batch (sequences) or global_batch_tokens")
    if "global_batch" in batch:
        gb = _int(batch, "global_batch", "batch.global_batch", None)
    else:
        gbt = _int(batch, "global_batch_tokens", "batch.global_batch_tokens", None)
        assert gbt is not None
        if gbt % arch.seq_len:
            raise SpecError("batch.global_batch_tokens", f"must be a multiple of model.seq_len ({arch.seq_len})")
        gb = gbt // arch.seq_len
    return gb


def _parse_costs(d: Mapping[str, Any], par: Mapping[str, Any]) -> tuple[Mapping[str, Any], float, bool]:
    """(cost section, pue, distributed_optimizer), with the string fields' types checked."""
    cost = d.get("cost", {}) or {}
    if not isinstance(cost, Mapping) or set(cost) - {"energy_price_usd_per_kwh", "price_per_chip_hour_usd"}:
        raise SpecError("cost", "allowed fields: energy_price_usd_per_kwh, price_per_chip_hour_usd")
    pue = _finite(d.get("pue", facility().pue_default), "pue", "a finite number >= 1.0")
    for k in ("energy_price_usd_per_kwh", "price_per_chip_hour_usd"):
        if cost.get(k) is not None:
            _finite(cost[k], f"cost.{k}", "a finite number >= 0")
    for k in ("precision", "name", "attention_impl", "loss_impl"):
        if k in d and not isinstance(d[k], str):
            raise SpecError(k, f"must be a string, got {_show(d[k])}")
    for k in ("recompute", "grad_reduce_dtype", "pipeline_schedule"):
        if k in par and not isinstance(par[k], str):
            raise SpecError(f"parallelism.{k}", f"must be a string, got {_show(par[k])}")
    return cost, pue, _bool(par, "distributed_optimizer", "parallelism.distributed_optimizer", True)


def _bool(d: Mapping[str, Any], key: str, field: str, default: bool) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise SpecError(field, "must be true or false")
    return v
