"""The training step model: work per rank, collectives per group, memory, step time.

One step is planned once (:func:`plan_step`) as the critical rank's list of :class:`Work` items
plus the collectives each parallel group runs, then composed (:func:`compose_step`) from the
compute seconds and the per-collective seconds. The live scheduler runs exactly that path on
the chip and fabric services; :func:`gigacluster.model.training.estimate_train` runs it offline.

Parallelism follows Megatron-LM: tensor parallelism with sequence parallelism (TP), 1F1B
pipeline parallelism with optional interleaving (PP, ``virtual_stages``), data parallelism with a
distributed optimizer (DP; gradient reduce-scatter overlapped with the last backward, parameter
all-gather with the first forward) and all-gather-based context parallelism (CP, as Llama 3).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

from gigacluster.hw.catalog import Chip, _raw, get_chip, get_system
from gigacluster.model import SpecError, moe
from gigacluster.model.arch import ModelArch
from gigacluster.model.attention import flash_core, materialized_works
from gigacluster.model.attention import gemm_work as _gemm
from gigacluster.model.comm import CommModel, GroupLayout, bus_factor
from gigacluster.model.roofline import BACKWARD_FLOPS_PER_SCORE, EfficiencyParams, Work, works_time_s
from gigacluster.model.step_memory import (
    RESERVED_FIXED_BYTES as RESERVED_FIXED_BYTES,
)
from gigacluster.model.step_memory import (
    RESERVED_FRACTION as RESERVED_FRACTION,
)
from gigacluster.model.step_memory import (
    MemoryBreakdown,
    _check_fits,
    _dims,
    _memory,
    _stage_kinds,
    _stage_layers,
    _stage_params,
    _stage_range,
    recompute_layer_count,
)
from gigacluster.model.train_spec import GRAD_DTYPES, TrainSpec

# --- the step plan -----------------------------------------------------------------------------


WINDOWS = ("inline", "grad", "param", "layer_fwd", "layer_bwd")
"""Where a step's collective runs (:class:`CollectiveDemand`); the live scheduler times all but grad and param
as inline calls spread over the pipelined window."""


@dataclasses.dataclass(frozen=True)
class CollectiveDemand:
    """One kind of collective a rank runs during a step (``count`` calls of ``bytes_`` each)."""

    name: str
    op: str
    bytes_: float
    layout: GroupLayout
    count: int
    hidden_fraction: float = 0.0  # inline collectives: share hidden behind compute
    # inline | grad (overlaps last backward) | param (overlaps first forward) | layer_fwd / layer_bwd (FSDP: one
    # call per layer and microbatch, the next layer's prefetched behind the current layer's forward / backward)
    window: str = "inline"
    hbm_touches: float = 0.0  # mean HBM accesses per rank per chunk of a ring step (0: no HBM floor)
    # grad / param windows: the buckets the reduction is split into (Megatron DDP); the last gradient bucket and the
    # first parameter bucket have nothing to hide behind (inf: no bucket exposed)
    buckets: float = math.inf

    def __post_init__(self) -> None:
        if self.count < 0 or self.bytes_ < 0:
            raise SpecError(f"collective.{self.name}", "count and bytes must be >= 0")
        if self.window not in WINDOWS:
            raise SpecError(f"collective.{self.name}.window", f"allowed: {', '.join(WINDOWS)}")


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """What one step asks of the critical rank and of each parallel group."""

    compute: tuple[Work, ...]
    collectives: tuple[CollectiveDemand, ...]
    microbatches: int
    pp: int
    virtual_stages: int
    pipelined_fraction: float  # share of compute time inside microbatch slots (rest: optimizer)
    fwd_fraction: float  # of one microbatch slot: forward
    bwd_fraction: float  # of one microbatch slot: backward (+ recompute)
    critical_stage: str
    layers_per_stage: tuple[int, ...]
    model_flops_per_step: float  # whole job, 6N-style incl. causal attention, no recompute
    critical_model_flops: float  # model FLOPs of the critical rank
    memory: MemoryBreakdown
    schedule: str = "1f1b"  # pipeline schedule: 1f1b (interleaved with virtual_stages) or dualpipe
    comm_compute_share: float = 0.0  # of compute units an overlapped collective (all-to-all, DP, FSDP) holds
    bubble_slot_ratio: float = 1.0  # mean slot time of the other pipeline ranks over the critical rank's
    dp_overlap: bool = True  # DP grad/param collectives hide in their windows; False: exposed after the flush
    fsdp_units: int = 1  # FSDP units (layers, embedding, output head) of the critical rank, one gather each

    @functools.cached_property
    def link_bytes(self) -> tuple[float, float]:
        """(scale-up, scale-out) bytes one step's collectives move, for link energy (computed once: a scheduler
        accounts every step of a window with it)."""
        up = out = 0.0
        for d in self.collectives:
            moved = d.count * d.bytes_ * max(bus_factor(d.op, d.layout.size), 1.0 if d.op == "send_recv" else 0.0)
            if d.layout.domains > 1:
                out += moved
            else:
                up += moved
        return up, out


@dataclasses.dataclass(frozen=True)
class StepBreakdown:
    """Step time and where it goes."""

    step_time_s: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float

    def to_dict(self) -> dict[str, float]:
        """JSON form."""
        return dataclasses.asdict(self)


def _scale(w: Work, times: int) -> Work:
    return dataclasses.replace(w, count=w.count * times)


@dataclasses.dataclass(frozen=True)
class _LayerWorks:
    fwd: tuple[Work, ...]
    bwd: tuple[Work, ...]
    recompute: tuple[Work, ...]
    model_flops: float  # per layer per microbatch, fwd + bwd, no recompute


def _layer_works(spec: TrainSpec, is_moe: bool = False, window: bool = False) -> _LayerWorks:
    """Works of one layer per microbatch: dense (the MLP of ``ffn_hidden``) or MoE, full or
    sliding-window attention, GQA or MLA projections."""
    a = spec.arch
    tp, prec = spec.tp, spec.precision
    T, q_t, kv_t, f_t, _ = _dims(spec)
    h = a.hidden
    mlp_in = 2 if a.mlp == "swiglu" else 1
    if a.attention == "mla":
        attn: list[moe.Gemm] = moe.attention_gemms(spec, T)
        q_t = (a.heads // tp) * a.qk_head_dim
        kv_t = (a.heads // tp) * (a.head_dim + a.v_head_dim) // 2
    else:
        attn = [(T, q_t + 2 * kv_t, h, 1), (T, h, q_t, 1)]
    if is_moe:
        mlp = moe.moe_gemms(spec, T)
        model_mlp = moe.moe_gemms(spec, T, balanced=True)
        ffn_tok = moe.ffn_token_width(spec, T)
    else:
        mlp = model_mlp = [(T, mlp_in * f_t, h, 1), (T, h, f_t, 1)]
        ffn_tok = T * f_t
    gemms = attn + mlp
    fwd: list[Work] = [_gemm(m, n, k, prec, c) for m, n, k, c in gemms]
    bwd: list[Work] = []
    for m, n, k, c in gemms:
        bwd.append(_gemm(m, k, n, prec, c))  # data gradient
        bwd.append(_gemm(k, n, m, prec, c))  # weight gradient
    attn_flops, attn_bytes, attn_shape = flash_core(spec, window)
    if spec.attention_impl == "materialized":
        mat_fwd, mat_bwd = materialized_works(spec, window)
        fwd += mat_fwd
        bwd += mat_bwd
    else:
        kind = "attention_triton" if spec.attention_impl == "flash_triton" else "attention"
        fwd.append(Work(attn_flops, attn_bytes, "bf16", kind, 1, attn_shape))
        # Flash backward runs 5 matmuls to the forward's 2 (it recomputes the scores): 10 x head_dim FLOPs a score.
        bwd.append(Work(2.5 * attn_flops, 2.5 * attn_bytes, "bf16", kind, 1, (*attn_shape, BACKWARD_FLOPS_PER_SCORE)))
    # Elementwise (bandwidth bound): 2 RMSNorms and 2 residual adds on SP-sharded tokens (every
    # token on every TP rank without sequence parallelism), RoPE on q and k, the MLP activation
    # (MoE: plus permuting tokens to their experts and back).
    t_sp = T / tp if spec.sequence_parallel else float(T)
    norm_b = 2 * (2.0 * t_sp * h * 2)
    resid_b = 2 * (3.0 * t_sp * h * 2)
    rope_b = 2.0 * T * (q_t + kv_t) * 2
    act_b = (mlp_in + 1.0) * ffn_tok * 2
    elem_b = norm_b + resid_b + rope_b + act_b
    if is_moe:
        elem_b += 2 * 2.0 * moe.routed_tokens(spec, T) * h * 2
    elem_f = 8.0 * (t_sp * h * 4 + T * (q_t + kv_t) + ffn_tok)
    fwd.append(Work(elem_f, elem_b, "bf16", "elementwise"))
    bwd.append(Work(2 * elem_f, 2 * elem_b, "bf16", "elementwise"))
    if moe.OPERAND_BYTES[prec] < 2:
        # Narrow GEMMs cast their operands online, dense (Transformer Engine) as MoE (DeepGEMM).
        fq, bq = moe.quantize_bytes(gemms)
        fwd.append(Work(fq / 3, fq, "bf16", "elementwise"))
        bwd.append(Work(bq / 3, bq, "bf16", "elementwise"))
    if spec.recompute == "full":
        rec: tuple[Work, ...] = tuple(fwd)
    elif spec.recompute == "op":
        # torchtitan's op-level SAC saves the attention output and every second matmul output of the layer and
        # re-runs the rest: half the forward GEMMs (its count of matmuls runs on across calls, so the odd and
        # even halves alternate) and every elementwise op.
        rec = tuple(dataclasses.replace(w, flops=w.flops / 2, bytes_=w.bytes_ / 2) for w in fwd[:len(gemms)])
        rec += (Work(elem_f, elem_b, "bf16", "elementwise"),)
    elif spec.recompute == "selective":
        rec = (Work(8.0 * (t_sp * h * 2 + ffn_tok), norm_b + act_b, "bf16", "elementwise"),)
        if spec.attention_impl == "materialized":  # Megatron's selective recompute: the s x s core again
            rec += tuple(materialized_works(spec, window)[0])
    else:
        rec = ()
    model = 3.0 * (sum(2.0 * m * n * k * c for m, n, k, c in attn + model_mlp) + attn_flops)
    return _LayerWorks(tuple(fwd), tuple(bwd), rec, model)


def _head_works(spec: TrainSpec, first: bool, last: bool) -> tuple[list[Work], list[Work], float]:
    """Embedding (first stage) and logits + loss (last stage) per microbatch: (fwd, bwd, model FLOPs)."""
    a = spec.arch
    T, _, _, _, _ = _dims(spec)
    v_t = -(-a.vocab // spec.tp)
    fwd: list[Work] = []
    bwd: list[Work] = []
    model = 0.0
    if first:
        fwd.append(Work(0.0, 2.0 * T * a.hidden * 2 / spec.tp, "bf16", "memory"))
        bwd.append(Work(float(T * a.hidden), 3.0 * T * a.hidden * 4 / spec.tp, "bf16", "elementwise"))
    if last:
        g = (T, v_t, a.hidden)
        fwd.append(_gemm(*g, spec.precision))
        bwd.append(_gemm(T, a.hidden, v_t, spec.precision))
        bwd.append(_gemm(a.hidden, v_t, T, spec.precision))
        # fp32 logits: softmax read/write, loss; fused: the 16-bit logits read once forward, read and their
        # gradient written once backward (flash-attn's xentropy kernel)
        ce_f, ce_b = (2.0 * T * v_t, 4.0 * T * v_t) if spec.loss_impl == "fused" else (12.0 * T * v_t,) * 2
        fwd.append(Work(5.0 * T * v_t, ce_f, "bf16", "elementwise"))
        bwd.append(Work(3.0 * T * v_t, ce_b, "bf16", "elementwise"))
        model = 3.0 * 2.0 * T * v_t * a.hidden
        if a.mtp_layers:
            # Multi-token prediction (DeepSeek-V3): per module a 2h -> h projection, one more layer
            # and one more pass through the shared output head and loss.
            lw = _layer_works(spec, is_moe=a.is_moe)
            proj = (T, a.hidden, 2 * a.hidden)
            mf = [_gemm(*proj, spec.precision), *lw.fwd, *fwd[-2:]]
            mb = [_gemm(T, 2 * a.hidden, a.hidden, spec.precision), _gemm(2 * a.hidden, a.hidden, T, spec.precision),
                  *lw.bwd, *bwd[-3:]]
            fwd += [_scale(w, a.mtp_layers) for w in mf]
            bwd += [_scale(w, a.mtp_layers) for w in mb]
            model += a.mtp_layers * (lw.model_flops + model + 3.0 * 2.0 * T * a.hidden * 2 * a.hidden)
    return fwd, bwd, model


def _weighted_stage_layers(spec: TrainSpec, layer_flops: float) -> tuple[int, ...]:
    """Layers per pipeline rank for MoE / MTP models, whose output head (and MTP modules) weigh
    several layers: the last rank counts them as layers of equal FLOPs and takes only what is left
    of an even share (Megatron-LM's account-for-loss pipeline split; DualPipe pairs the shallowest
    and deepest chunks on one rank for the same reason). The other ranks split the rest evenly."""
    a, pp = spec.arch, spec.pp
    if pp == 1:
        return (a.layers,)
    _, _, head = _head_works(spec, False, True)
    head_layers = head / layer_flops if layer_flops > 0 else 0.0
    last = max(0, min(a.layers - (pp - 1), round((a.layers + head_layers) / pp - head_layers)))
    base, extra = divmod(a.layers - last, pp - 1)
    return (*(base + (1 if i < extra else 0) for i in range(pp - 1)), last)


def _layout(spec: TrainSpec, size: int, stride: int) -> GroupLayout:
    """Layout of a group of ``size`` ranks spaced ``stride`` apart (Megatron order tp, cp, dp, pp)."""
    dom = get_system(spec.system).chips
    per_dom = max(1, min(size, dom // stride)) if stride <= dom else 1
    sharing = max(1, min(dom, spec.count) // per_dom)
    return GroupLayout(size, per_dom, sharing)


def model_flops_per_token(arch: ModelArch) -> float:
    """6N-style model FLOPs per token: 6 x (non-embedding params + logits) + causal attention."""
    if not (arch.is_moe or arch.mtp_layers or arch.sliding_window or arch.attention != "gqa"
            or arch.q_dim != arch.hidden):
        dense = 6.0 * (arch.layers * arch.params_per_layer + arch.vocab * arch.hidden)
        return dense + 6.0 * arch.layers * arch.seq_len * arch.hidden
    # Only the experts a token runs count (its top-k and the shared ones); attention per layer is
    # 3 x 2 x keys seen x heads x (qk + v width); MTP modules add their layer, projection and head.
    s = arch.seq_len

    def attn(i: int) -> float:
        keys = s / 2
        if arch.is_window_layer(i) and arch.sliding_window < s:
            keys = arch.sliding_window * (1 - arch.sliding_window / (2 * s))
        return 6.0 * keys * arch.heads * (arch.qk_head_dim + arch.v_dim_per_head)

    total = 6.0 * arch.active_params + sum(attn(i) for i in range(arch.layers))
    if arch.mtp_layers:
        layer = arch.moe_layer_active_params if arch.is_moe else arch.params_per_layer
        total += arch.mtp_layers * (6.0 * (2 * arch.hidden * arch.hidden + layer + arch.vocab * arch.hidden)
                                    + attn(arch.layers))
    return total


def _demands(spec: TrainSpec, L: int, params: float, moe_l: int = 0, experts: float = 0.0,
             units: int = 1) -> list[CollectiveDemand]:
    """The collectives of one step on the critical stage (``L`` layers of which ``moe_l`` MoE,
    ``params`` parameters replicated over EP, ``experts`` routed-expert parameters, ``units`` FSDP units)."""
    T, _, kv_t, _, _ = _dims(spec)
    a = spec.arch
    m, pp, v, tp, cp, dp = spec.microbatches, spec.pp, spec.virtual_stages, spec.tp, spec.cp, spec.dp
    rec_l = recompute_layer_count(spec, L, L)
    demands: list[CollectiveDemand] = []
    if tp > 1:
        # Sequence parallelism: per layer 2 all-gathers + 2 reduce-scatters forward, 4 + 2 backward
        # (re-gather of the sharded GEMM inputs), + 2 + 2 again for a layer that recomputes in full. RS and
        # AG cost the same bus volume, so they are one demand.
        # Without sequence parallelism (Megatron-LM 2021): 2 all-reduces forward, 2 backward, 2 more
        # under full recompute, each the bus volume of 2 all-gathers, and no re-gather in backward.
        calls = (4 + 6 if spec.sequence_parallel else 4 + 4) * L + 4 * rec_l
        touch = ring_hbm_touches()
        if spec.sequence_parallel:  # all-gathers: 2 forward, 4 backward, +2 full recompute; the rest reduce-scatters
            n_ag = 6 * L + 2 * rec_l
            touches = (n_ag * touch["all_gather"] + (calls - n_ag) * touch["reduce_scatter"]) / calls
        else:  # each all-reduce (a reduce-scatter and an all-gather) counts as 2 all-gathers here
            touches = (touch["all_gather"] + touch["reduce_scatter"]) / 2
        demands.append(
            CollectiveDemand(
                "tp", "all_gather", 2.0 * T * a.hidden, _layout(spec, tp, 1), calls * m,
                hidden_fraction=spec.tp_comm_overlap, hbm_touches=touches,
            )
        )
    if cp > 1:
        # All-gather of K and V forward; all-gather again and reduce-scatter of dK, dV backward.
        demands.append(
            CollectiveDemand(
                "cp", "all_gather", 2.0 * 2 * a.seq_len * spec.microbatch_size * kv_t, _layout(spec, cp, tp),
                (3 * L + rec_l) * m, hidden_fraction=spec.cp_comm_overlap,
            )
        )
    if pp > 1:
        demands.append(
            CollectiveDemand(
                "pp", "send_recv", 2.0 * T * a.hidden / tp, _layout(spec, 2, tp * cp * dp), 2 * m * v,
                hidden_fraction=spec.pp_comm_overlap,
            )
        )
    if spec.fsdp:
        demands += _fsdp_demands(spec, params, units)
    elif dp * cp > 1:
        demands += _grad_demands(spec, "dp", params, _layout(spec, dp * cp, tp))
    if moe_l:
        demands += _moe_demands(spec, moe_l, experts)
    return demands


def _moe_demands(spec: TrainSpec, moe_l: int, experts: float) -> list[CollectiveDemand]:
    """Token dispatch and combine (all-to-all over the EP group, per MoE layer and microbatch) and
    the expert gradients' reduce-scatter / parameter all-gather over the expert-DP group."""
    T, _, _, _, _ = _dims(spec)
    tp, cp, ep, dp = spec.tp, spec.cp, spec.ep, spec.dp
    demands: list[CollectiveDemand] = []
    if ep > 1:
        calls, _ = moe.a2a_calls(spec)
        demands.append(CollectiveDemand(
            "ep_a2a", "all_to_all", moe.a2a_bytes(spec, T), _layout(spec, ep, tp * cp),
            calls * moe_l * spec.microbatches, hidden_fraction=spec.moe_overlap,
        ))
    if dp // ep > 1:
        demands += _grad_demands(spec, "ep", experts, _layout(spec, dp // ep, tp * cp * ep))
    return demands


def dp_bucket_params(spec: TrainSpec) -> int:
    """Parameters per bucket of the overlapped data-parallel reduction: the spec's, else Megatron core's default
    (``DistributedDataParallelConfig.bucket_size``: "If unspecified, MCore uses a default value of max(40000000,
    1000000 * dp_size) parameters", dp_size being the data-parallel x context-parallel group)."""
    return spec.dp_bucket_params or max(40_000_000, 1_000_000 * spec.dp * spec.cp)


def _grad_demands(spec: TrainSpec, prefix: str, params: float, lay: GroupLayout) -> list[CollectiveDemand]:
    """Gradient reduce-scatter and parameter all-gather (distributed optimizer) or one all-reduce of
    ``params`` over a data-parallel group: ``dp`` for replicated weights, ``ep`` for routed experts; split into
    buckets of :func:`dp_bucket_params` (at least one)."""
    gbytes = GRAD_DTYPES[spec.grad_reduce_dtype] * params
    buckets = max(1.0, params / dp_bucket_params(spec))
    if spec.distributed_optimizer:
        return [CollectiveDemand(f"{prefix}_grad", "reduce_scatter", gbytes, lay, 1, window="grad", buckets=buckets),
                CollectiveDemand(f"{prefix}_param", "all_gather", 2.0 * params, lay, 1, window="param",
                                 buckets=buckets)]
    return [CollectiveDemand(f"{prefix}_grad", "all_reduce", gbytes, lay, 1, window="grad", buckets=buckets)]


def _fsdp_demands(spec: TrainSpec, params: float, units: int) -> list[CollectiveDemand]:
    """FSDP's collectives for the critical rank's ``params`` (already split over TP) in ``units`` units.

    Without pipelining (PyTorch FSDP/FSDP2, ZeRO-3; torchtitan and Composer accumulate gradients without
    skipping the sync), every microbatch gathers each unit's parameters in bf16 before its forward, again
    before its backward unless ``fsdp_reshard_after_forward`` is off, and reduce-scatters its gradients after
    its backward (in ``grad_reduce_dtype``); HSDP replicas all-reduce the reduced shard. With pipelining,
    ``torch.distributed.pipelining`` keeps the gathered parameters and the unsharded gradients from the first
    forward to the last backward (``backward_maybe_with_nosync``: ``set_reshard_after_backward`` and
    ``set_requires_gradient_sync`` false but on the last backward), so the stage gathers once and reduces once
    a step, in the windows of the distributed optimizer's collectives."""
    m, tp = spec.microbatches, spec.tp
    shard = spec.shard_group
    replicas = spec.dp * spec.cp // shard
    grad_b = GRAD_DTYPES[spec.grad_reduce_dtype]
    out: list[CollectiveDemand] = []
    shard_lay = _layout(spec, shard, tp)
    rep_lay = _layout(spec, replicas, tp * shard)
    if spec.pp > 1:
        if shard > 1:
            out.append(CollectiveDemand("fsdp_rs", "reduce_scatter", grad_b * params, shard_lay, 1, window="grad"))
            out.append(CollectiveDemand("fsdp_ag", "all_gather", 2.0 * params, shard_lay, 1, window="param"))
        if replicas > 1:
            out.append(CollectiveDemand("fsdp_ar", "all_reduce", grad_b * params / shard, rep_lay, 1, window="grad"))
        return out
    unit = params / units
    calls = units * m
    if shard > 1:
        out.append(CollectiveDemand("fsdp_ag", "all_gather", 2.0 * unit, shard_lay, calls, window="layer_fwd"))
        if spec.fsdp_reshard_after_forward:
            out.append(CollectiveDemand("fsdp_ag_bwd", "all_gather", 2.0 * unit, shard_lay, calls, window="layer_bwd"))
        out.append(CollectiveDemand("fsdp_rs", "reduce_scatter", grad_b * unit, shard_lay, calls, window="layer_bwd"))
    if replicas > 1:
        out.append(CollectiveDemand("fsdp_ar", "all_reduce", grad_b * unit / shard, rep_lay, calls, window="layer_bwd"))
    return out


def plan_step(spec: TrainSpec) -> StepPlan:
    """The critical rank's work and every group's collectives for one step (see module docstring).

    Raises DoesNotFitError when the most loaded stage needs more HBM than the chip has.
    """
    chip = get_chip(spec.chip)
    a = spec.arch
    m, pp, v, cp, dp = spec.microbatches, spec.pp, spec.virtual_stages, spec.cp, spec.dp
    works = {(mo, wi): _layer_works(spec, mo, wi) for mo in (False, True) if mo <= a.is_moe
             for wi in (False, True) if wi <= bool(a.sliding_window)}
    if a.is_moe or a.mtp_layers:
        stage_layers = _weighted_stage_layers(spec, works[(a.is_moe, False)].model_flops)
    else:
        stage_layers = _stage_layers(a.layers, pp)
    # Choose the critical stage: the one with the longest nominal per-microbatch time.
    candidates = []
    for i in sorted({0, pp // 2, pp - 1}):
        first, last = i == 0, i == pp - 1
        hf, hb, hmodel = _head_works(spec, first, last)
        kinds = [(works[(mo, wi)], n) for mo, wi, n in _stage_kinds(spec, stage_layers, i)]
        fwd = [_scale(w, n * m) for lw, n in kinds for w in lw.fwd] + [_scale(w, m) for w in hf]
        bwd = [_scale(w, n * m) for lw, n in kinds for w in lw.bwd] + [_scale(w, m) for w in hb]
        n_rec = [(lw, recompute_layer_count(spec, n, stage_layers[i]) if spec.recompute == "full" else n)
                 for lw, n in kinds]
        rec = [_scale(w, r * m) for lw, r in n_rec if r for w in lw.recompute]
        t = works_time_s(chip, fwd + bwd + rec)
        label = "first" if first else ("last" if last else "middle")
        candidates.append((t, label, i, fwd, bwd, rec, (sum(lw.model_flops * n for lw, n in kinds) + hmodel) * m))
    _, label, crit_i, fwd, bwd, rec, crit_model = max(candidates, key=lambda c: c[0])
    bubble_ratio = _bubble_slot_ratio({c[2]: c[0] for c in candidates}, crit_i, pp)
    first, last = crit_i == 0, crit_i == pp - 1
    params = _stage_params(spec, stage_layers[crit_i], first, last)
    shard = spec.shard_group
    opt_flops, opt_bytes = 12.0 * params / shard, 30.0 * params / shard
    experts, moe_l = 0.0, 0
    if a.is_moe:
        params, experts = moe.stage_param_split(spec, _stage_range(stage_layers, crit_i), first, last)
        eshard = dp * cp // spec.ep if spec.distributed_optimizer else 1
        opt_flops = 12.0 * params / shard + 12.0 * experts / eshard
        opt_bytes = 2.5 * opt_flops
        # The all-to-all of the rank with the most MoE layers: every rank runs the same microbatch
        # cadence, so the busiest one's exchanges pace the pipeline when they are not hidden.
        moe_l = max(sum(n for mo, _, n in _stage_kinds(spec, stage_layers, i) if mo)
                    + (a.mtp_layers if i == pp - 1 else 0) for i in range(pp))
    opt = [Work(opt_flops, opt_bytes, "bf16", "elementwise")]
    t_fwd, t_bwd, t_rec = works_time_s(chip, fwd), works_time_s(chip, bwd), works_time_s(chip, rec)
    t_opt = works_time_s(chip, opt)
    t_pipe = t_fwd + t_bwd + t_rec
    compute = tuple(fwd + rec + bwd + opt)

    units = stage_layers[crit_i] + int(first) + int(last)  # FSDP: a unit per layer, the embedding, the head
    demands = _demands(spec, stage_layers[crit_i], params, moe_l, experts, units)
    memory = _memory(spec, stage_layers)
    _check_fits(spec, chip, memory)
    total = t_pipe + t_opt
    return StepPlan(
        compute=compute,
        collectives=tuple(demands),
        microbatches=m,
        pp=pp,
        virtual_stages=v,
        pipelined_fraction=t_pipe / total if total > 0 else 1.0,
        fwd_fraction=t_fwd / t_pipe if t_pipe > 0 else 0.0,
        bwd_fraction=(t_bwd + t_rec) / t_pipe if t_pipe > 0 else 0.0,
        critical_stage=label,
        layers_per_stage=stage_layers,
        model_flops_per_step=model_flops_per_token(a) * spec.tokens_per_step,
        critical_model_flops=crit_model,
        memory=memory,
        schedule=spec.pipeline_schedule,
        bubble_slot_ratio=bubble_ratio,
        dp_overlap=spec.dp_comm_overlap,
        fsdp_units=units,
        comm_compute_share=EfficiencyParams.for_chip(chip).overlap_compute_share,
    )


def _bubble_slot_ratio(stage_s: Mapping[int, float], crit: int, pp: int) -> float:
    """Mean per-microbatch time of the pipeline ranks other than the critical one, over the critical
    rank's (``stage_s``: first, middle and last rank; the middle stands for every inner rank).

    The slowest rank paces the steady state; the warm-up and cool-down are the forward and backward
    passes of the *other* ranks (Narayanan et al. 2021, section 2.2.1: (p - 1)(t_f + t_b), every
    stage alike). A last rank that also runs the logits and loss does not idle for its own extra work.
    """
    if pp <= 1 or stage_s[crit] <= 0:
        return 1.0
    mid = stage_s[pp // 2] if pp > 2 else 0.0
    total = stage_s[0] + stage_s[pp - 1] + (pp - 2) * mid
    return min(1.0, (total - stage_s[crit]) / (pp - 1) / stage_s[crit])


def compose_step(plan: StepPlan, compute_s: float, comm_s: Mapping[str, float]) -> StepBreakdown:
    """Step time from the critical rank's compute seconds and each demand's total comm seconds.

    Inline collectives (TP, CP, PP) sit inside microbatch slots, minus their hidden share; the
    1F1B bubble is (pp - 1) / (virtual_stages x microbatches) of the slot time of the ranks other than
    the critical one (``bubble_slot_ratio`` of its compute, the same inline comm); the DP gradient
    reduce-scatter hides behind the last microbatch's backward plus the cool-down half of the
    bubble, the parameter all-gather behind the first forward plus the warm-up half (both exposed
    when the plan does not overlap DP communication, ``dp_overlap``).
    """
    if compute_s < 0:
        raise SpecError("compute_s", f"must be >= 0, got {compute_s!r}")
    for d in plan.collectives:
        if d.name not in comm_s:
            raise SpecError("comm_s", f"missing seconds for collective {d.name!r}")
    pipe = compute_s * plan.pipelined_fraction
    inline = sum((1.0 - d.hidden_fraction) * comm_s[d.name] for d in plan.collectives if d.window == "inline")
    hidden = sum(d.hidden_fraction * comm_s[d.name] for d in plan.collectives
                 if d.window == "inline" and d.op == "all_to_all")
    if hidden > 0:
        # No more all-to-all hides than there is compute to hide it behind; while it runs beside
        # compute it still occupies compute units (DeepSeek-V3 gives its dispatch/combine kernels 20
        # of 132 SMs), so the compute it overlaps slows down. Unlike the DP buckets and FSDP units
        # (overlapped_exposed_s), a longer exchange leaves the compute no slack to absorb that: the
        # all-to-all kernels are paced by the SMs they are given, which DeepSeek-V3 sizes so that the
        # two finish together.
        share = plan.comm_compute_share
        inline += max(0.0, hidden - pipe) + min(hidden, pipe) * share / (1.0 - share)
    inline += _layer_exposed_s(plan, pipe, comm_s)
    m = plan.microbatches
    # The bubble is the other ranks' passes: their compute (bubble_slot_ratio of the critical rank's)
    # plus the same inline communication.
    idle_slots = pipe * plan.bubble_slot_ratio + inline
    bubble = idle_slots * (plan.pp - 1) / (plan.virtual_stages * m) if plan.pp > 1 else 0.0
    if plan.schedule == "dualpipe":
        # DeepSeek-V3 report, Table 2: (PP/2 - 1)(F&B + B - 3W) slots, with F&B = F + B and the
        # weight-gradient half of backward W = B / 2.
        bubble = idle_slots / m * (plan.pp / 2 - 1) * (plan.fwd_fraction + plan.bwd_fraction / 2)
    windowed = 0.0
    for d in plan.collectives:
        if d.window in ("grad", "param") and not plan.dp_overlap:
            windowed += comm_s[d.name]  # after the pipeline flush (gradients) or before the first forward
        elif d.window in ("grad", "param"):
            # Bucket by bucket behind the last backward (the first forward): what does not fit is exposed, and so is
            # the last gradient bucket (the first parameter bucket), with no compute left (yet) to hide behind.
            share = plan.bwd_fraction if d.window == "grad" else plan.fwd_fraction
            windowed += overlapped_exposed_s(comm_s[d.name], share * pipe / m + bubble / 2, d.buckets,
                                             plan.comm_compute_share)
    exposed = inline + windowed
    return StepBreakdown(compute_s + exposed + bubble, compute_s, exposed, bubble)


def _layer_exposed_s(plan: StepPlan, pipe: float, comm_s: Mapping[str, float]) -> float:
    """Exposed seconds per step of FSDP's per-unit collectives (windows ``layer_fwd`` and ``layer_bwd``).

    In a microbatch's forward FSDP gathers the next unit's parameters while the current unit computes (forward
    prefetch), and in its backward it gathers the next unit and reduce-scatters the last one's gradients behind
    the current unit's backward; the first gather and the last reduction have nothing to hide behind. A pass of
    ``U`` equal units with compute ``C`` and communication ``A`` then takes ``max(A, C) + min(A, C) / U``: ``C +
    A / U`` while the links keep up, ``A + C / U`` when they do not."""
    m, units = plan.microbatches, max(1, plan.fsdp_units)
    out = 0.0
    for window, share in (("layer_fwd", plan.fwd_fraction), ("layer_bwd", plan.bwd_fraction)):
        a = sum(comm_s[d.name] for d in plan.collectives if d.window == window) / m
        if a <= 0.0:
            continue
        out += m * overlapped_exposed_s(a, share * pipe / m, units, plan.comm_compute_share)
    return out


def overlapped_exposed_s(comm_s: float, compute_s: float, pieces: float, share: float = 0.0) -> float:
    """Exposed seconds of ``comm_s`` of communication split into ``pieces`` and overlapped piece by piece with
    ``compute_s`` of compute (FSDP's units, the DP reduction's buckets): what does not fit, and the one piece with
    nothing to hide behind (the first gather, the last reduction). A pass takes ``max(A, C) + min(A, C) / U``.

    While the other pieces run beside the compute, their kernels hold ``share`` of the compute units (NCCL runs a
    collective on its own thread blocks), so the compute loses ``share`` of its rate for as long as they run:
    ``B x share`` of compute time for the ``B = min(A, C) (1 - 1 / U)`` seconds they overlap, less whatever slack
    the compute has when the communication is the longer of the two (``A - C``)."""
    exposed = max(0.0, comm_s - compute_s) + min(comm_s, compute_s) / pieces
    if share > 0.0:
        beside = min(comm_s, compute_s) * (1.0 - 1.0 / pieces)
        exposed += max(0.0, beside * share - max(0.0, comm_s - compute_s))
    return exposed


def demand_times_s(spec: TrainSpec, plan: StepPlan, comm: CommModel) -> dict[str, float]:
    """Total seconds per step of each collective demand under ``comm``, each call at least the time its
    ring chunks take through the chip's HBM (``hbm_touches`` per rank per chunk, for every rank the chip runs)."""
    chip = get_chip(spec.chip)
    return {d.name: d.count * max(comm.collective_time_s(chip, spec.system, d.op, d.bytes_, d.layout),
                                  _hbm_floor_s(chip, d))
            for d in plan.collectives}


def _hbm_floor_s(chip: Chip, d: CollectiveDemand) -> float:
    """Seconds one call of ``d`` keeps the chip's HBM busy: a ring over ``size x ranks_per_chip`` ranks
    moves ``(N-1)/N`` of the buffer through each rank, ``hbm_touches`` accesses per byte, and the chip's
    ranks share its HBM (Neuron docs: large collectives are "HBM bandwidth bound or contended")."""
    if d.hbm_touches <= 0:
        return 0.0
    p = EfficiencyParams.for_chip(chip)
    n = d.layout.size * p.ranks_per_chip
    return d.hbm_touches * p.ranks_per_chip * (n - 1) / n * d.bytes_ / (chip.hbm_Bps * p.hbm_peak_fraction)


@functools.cache
def ring_hbm_touches() -> dict[str, float]:
    """HBM accesses per rank per chunk of a ring step by op (catalog ``efficiency.comm.ring_hbm_touches``)."""
    return {k: float(v) for k, v in _raw()["efficiency"]["comm"]["ring_hbm_touches"].items()}


def link_bytes(plan: StepPlan) -> tuple[float, float]:
    """(scale-up, scale-out) bytes one step's collectives move, for link energy (:attr:`StepPlan.link_bytes`)."""
    return plan.link_bytes
