"""Per-rank shapes, pipeline stage contents and HBM per chip of the training step model.

Split from :mod:`gigacluster.model.step` (which re-exports these names): the tokens and widths one
rank works on, which layers each pipeline rank holds, and the memory of the fullest stage, with
:class:`DoesNotFitError` when it exceeds the chip's HBM.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gigacluster.hw.catalog import Chip, get_chip
from gigacluster.model import DoesNotFitError, moe
from gigacluster.model.roofline import EfficiencyParams
from gigacluster.model.train_spec import GRAD_DTYPES, TrainSpec

# Memory the framework cannot give to tensors: CUDA/Neuron context, NCCL buffers, allocator
# fragmentation. Assumed: 2 GiB plus 5% of HBM (PyTorch caching allocator fragmentation).
RESERVED_FIXED_BYTES = 2 * 2**30
RESERVED_FRACTION = 0.05


@dataclasses.dataclass(frozen=True)
class MemoryBreakdown:
    """HBM bytes per chip on the stage that needs the most."""

    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    other_bytes: float
    reserved_bytes: float
    stage: str

    @property
    def total_bytes(self) -> float:
        """Everything the chip must hold."""
        return (
            self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
            + self.other_bytes + self.reserved_bytes
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        d = dataclasses.asdict(self)
        d["total_bytes"] = self.total_bytes
        return d


def _dims(spec: TrainSpec) -> tuple[int, int, int, int, int]:
    """(tokens per rank per microbatch, q width per TP rank, kv width per TP rank, ffn per rank, head_dim)."""
    a = spec.arch
    t_mb = spec.microbatch_size * a.seq_len // spec.cp
    q_t = a.q_dim // spec.tp
    # KV heads replicate until every rank holds one (Megatron; NxD's kv_replicator): a chip running
    # several ranks (Neuron on Trn1: one per NeuronCore) holds one KV head per rank.
    kv_t = max(a.kv_dim // spec.tp, a.head_dim * EfficiencyParams.for_chip(spec.chip).ranks_per_chip)
    return t_mb, q_t, kv_t, a.ffn_hidden // spec.tp, a.head_dim


def _stage_layers(layers: int, pp: int) -> tuple[int, ...]:
    """Layers per pipeline rank: middle ranks take ceil(L/pp); first and last share the rest
    (they also hold the embedding and the logits, as Llama 3 balanced its pipeline)."""
    if pp == 1:
        return (layers,)
    k = -(-layers // pp)
    rem = layers - k * (pp - 2)
    if pp > 2 and 2 <= rem <= 2 * k:
        first = rem // 2
        return (first, *([k] * (pp - 2)), rem - first)
    base, extra = divmod(layers, pp)
    return tuple(base + (1 if i < extra else 0) for i in range(pp))


def _stage_kinds(spec: TrainSpec, stage_layers: tuple[int, ...], i: int) -> list[tuple[bool, bool, int]]:
    """(MoE layer, windowed attention, how many) of the layers pipeline rank ``i`` holds."""
    a = spec.arch
    start = sum(stage_layers[:i])
    counts: dict[tuple[bool, bool], int] = {}
    for j in range(start, start + stage_layers[i]):
        key = (a.is_moe_layer(j), a.is_window_layer(j))
        counts[key] = counts.get(key, 0) + 1
    return [(m, w, n) for (m, w), n in counts.items()]


def _stage_range(stage_layers: tuple[int, ...], i: int) -> range:
    start = sum(stage_layers[:i])
    return range(start, start + stage_layers[i])


def _stage_params(spec: TrainSpec, layers: int, first: bool, last: bool) -> float:
    a = spec.arch
    p = layers * a.params_per_layer + (a.vocab * a.hidden if first else 0) + (a.vocab * a.hidden if last else 0)
    return p / spec.tp


def _act_bytes_per_token_layer(spec: TrainSpec, dense_mlp: bool = True) -> float:
    """Activation bytes kept for backward per token per layer on one TP rank (bf16); without the
    dense MLP's part when ``dense_mlp`` is False (an MoE layer adds its own, see :mod:`.moe`)."""
    a = spec.arch
    _, q_t, kv_t, f_t, _ = _dims(spec)
    f_t = f_t if dense_mlp else 0
    h_sp = a.hidden / spec.tp if spec.sequence_parallel else float(a.hidden)
    mlp_in = 2 if a.mlp == "swiglu" else 1
    if spec.recompute == "full":
        return 2.0 * h_sp
    if spec.recompute == "op":
        # torchtitan's op-level SAC: the layer input, the attention output and every second matmul output.
        linear_out = q_t + 2 * kv_t + 2 * h_sp + mlp_in * f_t
        return 2.0 * (h_sp + q_t + linear_out / 2)
    # Norm inputs, q, k, v, attention output, MLP up-projection output (+ norm outputs and the
    # activation output unless selective recompute rebuilds them).
    keep = 2 * h_sp + 2 * q_t + 2 * kv_t + mlp_in * f_t
    if spec.recompute == "none":
        keep += 2 * h_sp + f_t
        if spec.attention_impl == "materialized":
            # Softmax output (2 bytes) and dropout mask (1) per query per key per head, counted in
            # 2-byte units (Korthikanti et al. 2022, 5as/t bytes per token).
            keep += 2.5 * (q_t // a.head_dim) * a.seq_len
    return 2.0 * keep


def recompute_layer_count(spec: TrainSpec, layers: int, stage_layers: int) -> int:
    """How many of ``layers`` layers (of a pipeline rank holding ``stage_layers``) re-run their forward under
    recompute full: all of them, or ``recompute_layers`` of the rank's layers shared out in proportion
    (Megatron-LM's ``--recompute-method block --recompute-num-layers``; torchtitan's layer-level selective
    checkpointing of every k-th block is L / k)."""
    if spec.recompute != "full":
        return 0
    if not spec.recompute_layers or stage_layers <= 0:
        return layers
    return round(layers * min(1.0, spec.recompute_layers / stage_layers))


def _stage_act_bytes_per_token(spec: TrainSpec, layers: int) -> float:
    """Activation bytes per token a pipeline rank of ``layers`` dense layers keeps for backward: with
    ``recompute_layers`` only that many layers keep just their input, the rest everything."""
    per_tok = _act_bytes_per_token_layer(spec)
    rec = recompute_layer_count(spec, layers, layers)
    if spec.recompute != "full" or rec == layers:
        return per_tok * layers
    kept = _act_bytes_per_token_layer(dataclasses.replace(spec, recompute="none", recompute_layers=0))
    return per_tok * rec + kept * (layers - rec)


def _fsdp_state_bytes(spec: TrainSpec, params: float, units: int) -> tuple[float, float]:
    """(weights, gradients) bytes per chip under FSDP for ``params`` parameters in ``units`` units: the bf16
    copies gathered (two units at a time with prefetch; every unit from forward to backward without resharding,
    and the whole stage under pipelining) and the gradients (sharded, plus the units being reduced; unsharded for
    the whole step under pipelining, which reduces once at the last backward)."""
    grad_b = GRAD_DTYPES[spec.grad_reduce_dtype]
    in_flight = min(1.0, 2.0 / max(1, units))
    if spec.pp > 1:
        return 2.0 * params, grad_b * params
    gathered = params if not spec.fsdp_reshard_after_forward else in_flight * params
    # One unit's gradients at a time: its bf16 gradients and their copy in the reduction's dtype.
    return 2.0 * gathered, grad_b * params / spec.shard_group + (2.0 + grad_b) * params / max(1, units)


def _memory(spec: TrainSpec, stage_layers: tuple[int, ...]) -> MemoryBreakdown:
    chip = get_chip(spec.chip)
    T, _, _, _, _ = _dims(spec)
    m, pp, v = spec.microbatches, spec.pp, spec.virtual_stages
    grad_b = GRAD_DTYPES[spec.grad_reduce_dtype]
    shard = spec.shard_group
    reserved = RESERVED_FIXED_BYTES + RESERVED_FRACTION * chip.hbm_bytes
    best: MemoryBreakdown | None = None
    for i in sorted({0, pp // 2, pp - 1}):
        first, last = i == 0, i == pp - 1
        params = _stage_params(spec, stage_layers[i], first, last)
        in_flight = min(m, pp - i)
        # Interleaving makes the first stage hold (1 + (pp-1)/(pp v)) x pp microbatches' worth.
        in_flight_f = in_flight * (1 + (pp - 1) / (pp * v)) if v > 1 and i == 0 else float(in_flight)
        if spec.pipeline_schedule == "dualpipe":
            in_flight_f = float(min(m, pp + 1))  # DeepSeek-V3 report, Table 2: PP + 1 per device
        opt = 12.0 * params / shard
        if spec.arch.is_moe:
            params, experts = moe.stage_param_split(spec, _stage_range(stage_layers, i), first, last)
            eshard = spec.dp * spec.cp // spec.ep if spec.distributed_optimizer else 1
            opt = 12.0 * params / shard + 12.0 * experts / eshard
            params += experts
            n_moe = sum(n for is_moe, _, n in _stage_kinds(spec, stage_layers, i) if is_moe)
            attn_tok = (moe.mla_act_bytes_per_token(spec) if spec.arch.attention == "mla"
                        else _act_bytes_per_token_layer(spec, False))
            dense_mlp = _act_bytes_per_token_layer(spec) - _act_bytes_per_token_layer(spec, False)
            dense_tok = attn_tok + dense_mlp * moe.cached_bytes(spec) / 2.0
            moe_tok = attn_tok + moe.moe_act_bytes_per_token(spec, T)
            acts = (dense_tok * (stage_layers[i] - n_moe) + moe_tok * n_moe) * T * in_flight_f
        else:
            acts = _stage_act_bytes_per_token(spec, stage_layers[i]) * T * in_flight_f
        if recompute_layer_count(spec, stage_layers[i], stage_layers[i]):  # the layer being recomputed, whole
            acts += (_act_bytes_per_token_layer(dataclasses.replace(spec, recompute="none", recompute_layers=0))) * T
        # Logits on the last stage: 8 bytes a logit (the fp32 upcast and its softmax kept for backward), or 4 with a
        # fused cross-entropy (the 16-bit logits kept, and their 16-bit gradient while it is written).
        per_logit = 4.0 if spec.loss_impl == "fused" else 8.0
        other = per_logit * T * (-(-spec.arch.vocab // spec.tp)) if last else 0.0
        weights_b = 2.0 * params * (2 if spec.pipeline_schedule == "dualpipe" else 1)
        grads_b = float(grad_b) * params
        if spec.fsdp:
            weights_b, grads_b = _fsdp_state_bytes(spec, params, stage_layers[i] + int(first) + int(last))
        mb = MemoryBreakdown(
            weights_bytes=weights_b,
            grads_bytes=grads_b,
            optimizer_bytes=opt,
            activations_bytes=acts,
            other_bytes=other,
            reserved_bytes=reserved,
            stage="first" if first else ("last" if last else "middle"),
        )
        if best is None or mb.total_bytes > best.total_bytes:
            best = mb
    assert best is not None
    return best


def _check_fits(spec: TrainSpec, chip: Chip, memory: MemoryBreakdown) -> None:
    """DoesNotFitError, with the memory breakdown and what to change, if the stage exceeds HBM."""
    if memory.total_bytes > chip.hbm_bytes:
        gib = 2**30
        raise DoesNotFitError(
            f"{spec.chip}: the {memory.stage} pipeline stage needs {memory.total_bytes / gib:.1f} GiB per chip"
            f" (weights {memory.weights_bytes / gib:.1f}, grads {memory.grads_bytes / gib:.1f}, optimizer"
            f" {memory.optimizer_bytes / gib:.1f}, activations {memory.activations_bytes / gib:.1f}, other"
            f" {memory.other_bytes / gib:.1f}, reserved {memory.reserved_bytes / gib:.1f}) but has"
            f" {chip.hbm_bytes / gib:.1f} GiB; raise {'ep/' if spec.arch.is_moe else ''}tp/pp/cp, use recompute,"
            f" or lower microbatch_size",
            need_bytes=memory.total_bytes,
            have_bytes=float(chip.hbm_bytes),
        )
