"""Spec switches of issue 15: attention implementation, sequence parallelism, fp16, data-parallel overlap."""

from __future__ import annotations

import pytest

from gigacluster.model import SpecError
from gigacluster.model.step import compose_step, plan_step
from gigacluster.model.training import TrainSpec

BASE = {
    "model": {"layers": 8, "hidden": 2048, "heads": 16, "ffn_hidden": 8192, "vocab": 32000, "seq_len": 2048,
              "mlp": "gelu"},
    "batch": {"global_batch": 64}, "parallelism": {"tp": 4, "microbatch_size": 2},
    "hardware": {"chip": "a100-80gb", "count": 32}, "precision": "bf16",
}


def _spec(**top: object) -> TrainSpec:
    par = top.pop("parallelism", {})
    return TrainSpec.from_dict({**BASE, **top, "parallelism": {**BASE["parallelism"], **par}})  # type: ignore[dict-item]


def test_attention_impl_default_is_flash_and_bad_values_are_refused() -> None:
    """attention_impl defaults to flash; an unknown value or materialized with MLA is refused by field."""
    assert _spec().attention_impl == "flash"
    with pytest.raises(SpecError) as err:
        _spec(attention_impl="paged")
    assert err.value.field == "attention_impl" and "flash, materialized" in str(err.value)
    mla = TrainSpec.from_dict({"model": {"preset": "deepseek-v3"}, "batch": {"global_batch": 64},
                               "hardware": {"chip": "h100-sxm", "count": 64}, "parallelism": {"tp": 8, "pp": 8},
                               "precision": "bf16"})
    with pytest.raises(SpecError) as err:
        mla.with_(attention_impl="materialized")
    assert err.value.field == "attention_impl"


def test_materialized_attention_computes_all_scores_and_moves_them_through_hbm() -> None:
    """Materialised attention runs s x s score and context GEMMs per head (twice the causal FLOPs) plus
    softmax/dropout traffic of 9 bytes per score forward: more hardware FLOPs, more bytes, a slower step."""
    flash, mat = plan_step(_spec()), plan_step(_spec(attention_impl="materialized"))
    heads_t, s, hd = 16 // 4, 2048, 128
    scores = 2 * heads_t * s * s  # microbatch 2: score elements per layer per microbatch
    batched = [w for w in mat.compute if len(w.shape) == 4]
    assert {w.shape for w in batched} >= {(s, s, hd, 2 * heads_t), (s, hd, s, 2 * heads_t)}
    fwd_score = next(w for w in batched if w.shape == (s, s, hd, 2 * heads_t))
    assert fwd_score.flops == pytest.approx(2.0 * s * s * hd * 2 * heads_t)
    assert sum(w.total_bytes for w in mat.compute) > sum(w.total_bytes for w in flash.compute) + 9 * scores
    assert mat.model_flops_per_step == flash.model_flops_per_step  # MFU still counts causal attention


def test_sequence_parallel_off_replicates_norms_and_uses_all_reduces() -> None:
    """Without sequence parallelism (Megatron-LM 2021) the TP collectives are 2 all-reduces forward and
    2 backward per layer (8 all-gather volumes, not SP's 10) and norm/dropout work is not split by TP."""
    sp, nosp = plan_step(_spec()), plan_step(_spec(parallelism={"sequence_parallel": False}))
    tp_sp = next(d for d in sp.collectives if d.name == "tp")
    tp_nosp = next(d for d in nosp.collectives if d.name == "tp")
    m = 64 // 8 // 2
    assert (tp_sp.count, tp_nosp.count) == (10 * 8 * m, 8 * 8 * m)
    elem = lambda p: sum(w.total_bytes for w in p.compute if w.kind == "elementwise")  # noqa: E731
    assert elem(nosp) > elem(sp)
    assert nosp.memory.activations_bytes > sp.memory.activations_bytes
    with pytest.raises(SpecError) as err:
        _spec(parallelism={"sequence_parallel": "no"})
    assert err.value.field == "parallelism.sequence_parallel"


def test_fp16_runs_at_the_bf16_rate_on_a100() -> None:
    """precision fp16 exists (Megatron-LM 2021 trained in fp16); on A100 it has the BF16 peak (312 TFLOP/s)."""
    from gigacluster.model.comm import AlphaBetaCommModel
    from gigacluster.model.training import estimate_train

    fp16, bf16 = _spec(precision="fp16"), _spec()
    assert fp16.precision == "fp16"
    assert estimate_train(fp16, AlphaBetaCommModel()).step_time_s == pytest.approx(
        estimate_train(bf16, AlphaBetaCommModel()).step_time_s, rel=1e-9)


def test_dp_comm_overlap_off_exposes_the_gradient_and_parameter_collectives() -> None:
    """parallelism.dp_comm_overlap defaults to true (DP traffic hides in its windows); false runs the gradient
    reduce-scatter and parameter all-gather after the flush, fully exposed; a non-boolean is refused."""
    spec = _spec(parallelism={"pp": 2})
    assert spec.dp_comm_overlap is True
    comm = {d.name: 0.0 for d in plan_step(spec).collectives}
    comm.update(dp_grad=1e-3, dp_param=5e-4)
    plan = plan_step(spec)
    hidden = compose_step(plan, 10.0, comm)
    exposed = compose_step(plan_step(spec.with_(dp_comm_overlap=False)), 10.0, comm)
    buckets = next(d for d in plan.collectives if d.name == "dp_grad").buckets
    # the last / first bucket, and the compute the other buckets' kernels take from the step while they run beside it
    assert hidden.exposed_comm_s == pytest.approx(1.5e-3 / buckets + 1.5e-3 * (1 - 1 / buckets)
                                                  * plan.comm_compute_share)
    assert exposed.exposed_comm_s == pytest.approx(1.5e-3)
    with pytest.raises(SpecError) as err:
        _spec(parallelism={"dp_comm_overlap": "no"})
    assert err.value.field == "parallelism.dp_comm_overlap"


def test_fp16_gradient_reduction_halves_the_dp_bytes() -> None:
    """grad_reduce_dtype fp16 (2021 Megatron-LM's default for fp16 runs) reduces 2 bytes per gradient."""
    fp32 = next(d for d in plan_step(_spec()).collectives if d.name == "dp_grad")
    fp16 = next(d for d in plan_step(_spec(parallelism={"grad_reduce_dtype": "fp16"})).collectives
                if d.name == "dp_grad")
    assert fp16.bytes_ == pytest.approx(fp32.bytes_ / 2)


def test_dp_buckets_follow_megatron_and_expose_the_last_one() -> None:
    """The overlapped DP reduction runs in buckets of ``dp_bucket_params`` parameters (Megatron core's default
    when unset: max(40M, 1M x DP x CP), megatron/core/distributed/distributed_data_parallel_config.py,
    ``bucket_size``); the last gradient bucket and the first parameter bucket are exposed, the rest hides while it
    fits its window; one bucket as large as the rank's parameters exposes the whole reduction."""
    from gigacluster.model.step import dp_bucket_params
    small = _spec(parallelism={"pp": 2})
    assert dp_bucket_params(small) == 40_000_000
    big = TrainSpec.from_dict({"model": {"preset": "llama3-8b"}, "batch": {"global_batch": 512},
                               "parallelism": {"cp": 2}, "hardware": {"chip": "h100-sxm", "count": 256},
                               "precision": "bf16"})
    assert dp_bucket_params(big) == 1_000_000 * 128 * 2
    assert dp_bucket_params(big.with_(dp_bucket_params=768_000_000)) == 768_000_000
    grad = next(d for d in plan_step(big.with_(dp_bucket_params=768_000_000)).collectives if d.name == "dp_grad")
    assert grad.buckets == pytest.approx(big.arch.params / 768e6, rel=0.02)
    one = big.with_(dp_bucket_params=10 ** 12)
    plan = plan_step(one)
    comm = {d.name: 0.0 for d in plan.collectives}
    comm.update(dp_grad=1e-3, dp_param=5e-4)
    assert compose_step(plan, 10.0, comm).exposed_comm_s == pytest.approx(1.5e-3)
    with pytest.raises(SpecError) as err:
        _spec(parallelism={"dp_bucket_params": -5})
    assert err.value.field == "parallelism.dp_bucket_params"


def test_collectives_beside_compute_take_their_share_of_the_compute_units() -> None:
    """While an overlapped DP bucket (or FSDP unit) runs, its NCCL kernels hold thread blocks on the chip, so the
    compute beside it loses that share of its rate: ``B x share`` for the ``B`` seconds of communication that run
    beside compute, absorbed by the compute's slack when the communication is the longer of the two.

    The share is the catalog's one ``overlap_compute_share``: 20 of the H800's 132 SMs (DeepSeek-V3 report, arXiv
    2412.19437, section 3.2.2). MLPerf Training v5.1's NeMo Llama 3.1 8B config (mlcommons/training_results_v5.1,
    NVIDIA ``config_common.sh``: ``NCCL_MIN_CTAS=16``, ``NCCL_MAX_CTAS=32``) brackets it on B200's 148 SMs
    (0.108-0.216); Lee et al. 2025 (arXiv 2507.03114) measure compute overlapped with communication 18.9% slower on
    average, where a share of 0.1515 leaves 1 / (1 - 0.1515) = 1.179."""
    from gigacluster.model.step import overlapped_exposed_s
    # A < C: the last piece exposed, and the compute lost beside the other pieces
    assert overlapped_exposed_s(1.0, 4.0, 4, 0.15) == pytest.approx(0.25 + 0.75 * 0.15)
    assert overlapped_exposed_s(1.0, 4.0, 4) == pytest.approx(0.25)  # no share: the plain pass
    # A > C: the links bound the pass; the compute's slack (A - C = 2 s) absorbs the 0.75 x 0.15 s it loses
    assert overlapped_exposed_s(4.0, 2.0, 4, 0.15) == pytest.approx(2.0 + 0.5)
    # A slightly above C: the slack (0.05 s) absorbs only part of the loss
    assert overlapped_exposed_s(2.05, 2.0, 4, 0.15) == pytest.approx(0.05 + 0.5 + (1.5 * 0.15 - 0.05))
    # in a step: the default DP buckets of an H100 job beside 10 s of compute
    spec = _spec(parallelism={"pp": 2})
    plan = plan_step(spec)
    assert plan.comm_compute_share == pytest.approx(0.1515)
    comm = {d.name: 0.0 for d in plan.collectives}
    comm.update(dp_grad=0.2)
    u = next(d for d in plan.collectives if d.name == "dp_grad").buckets
    assert compose_step(plan, 10.0, comm).exposed_comm_s == pytest.approx(0.2 / u + 0.2 * (1 - 1 / u) * 0.1515)
