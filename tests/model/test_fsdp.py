"""Fully sharded data parallelism (FSDP / ZeRO-3) and the recompute options torchtitan runs (`op`,
`recompute_layers`) in the training step model: what a spec asks of the fabric, how much of it a step
hides, what it holds in HBM, and how the live scheduler lays the groups out."""

from __future__ import annotations

from typing import Any

import pytest

from gigacluster.model import DoesNotFitError, SpecError
from gigacluster.model.comm import AlphaBetaCommModel
from gigacluster.model.step import compose_step, plan_step
from gigacluster.model.training import TrainSpec, estimate_train
from gigacluster.scheduler.core import rank_groups


def spec(**par: Any) -> TrainSpec:
    """Llama 3 8B on 64 A100 80GB, one microbatch of 8,192 tokens per rank (torchtitan's layout)."""
    d: dict[str, Any] = {"model": {"preset": "llama3-8b"}, "batch": {"global_batch": par.pop("global_batch", 64)},
                         "hardware": {"chip": par.pop("chip", "a100-80gb"), "count": par.pop("count", 64)},
                         "parallelism": {"fsdp": True, "recompute": "op", **par}}
    return TrainSpec.from_dict(d)


def by_name(s: TrainSpec) -> dict[str, Any]:
    return {d.name: d for d in plan_step(s).collectives}


def test_fsdp_gathers_every_unit_twice_and_reduces_it_once_per_microbatch() -> None:
    """Per microbatch each unit (32 layers, the embedding, the head) is all-gathered in bf16 for its forward and
    again for its backward, and its gradients reduce-scattered in fp32, over all 64 data-parallel ranks."""
    s = spec(global_batch=128)  # 2 microbatches
    d = by_name(s)
    assert set(d) == {"fsdp_ag", "fsdp_ag_bwd", "fsdp_rs"}
    a = s.arch
    params = a.layers * a.params_per_layer + 2 * a.vocab * a.hidden
    units = a.layers + 2
    for name, per_param, window in (("fsdp_ag", 2, "layer_fwd"), ("fsdp_ag_bwd", 2, "layer_bwd"),
                                    ("fsdp_rs", 4, "layer_bwd")):
        assert d[name].count == units * 2
        assert d[name].bytes_ == pytest.approx(per_param * params / units)
        assert d[name].window == window
        assert d[name].layout.size == 64


def test_no_reshard_after_forward_drops_the_backward_gather() -> None:
    """With ``fsdp_reshard_after_forward: false`` (ZeRO-2-like) the forward's gather is kept to the backward."""
    assert set(by_name(spec(fsdp_reshard_after_forward=False))) == {"fsdp_ag", "fsdp_rs"}


def test_hsdp_shards_within_a_block_and_all_reduces_across_replicas() -> None:
    """HSDP: parameters sharded over 8 ranks, the 8 replicas all-reduce the reduced shard (a 1/8 of the unit)."""
    d = by_name(spec(fsdp_shard=8))
    assert d["fsdp_ag"].layout.size == 8 and d["fsdp_ar"].layout.size == 8
    assert d["fsdp_ar"].op == "all_reduce"
    assert d["fsdp_ar"].bytes_ == pytest.approx(d["fsdp_rs"].bytes_ / 8)


def test_fsdp_under_pipelining_gathers_once_and_reduces_once_a_step() -> None:
    """With PP, torch.distributed.pipelining keeps the gathered parameters and unsharded gradients from the first
    forward to the last backward: one gather (param window) and one reduction (grad window) per step."""
    d = by_name(spec(pp=4, global_batch=64))
    assert {n: (x.window, x.count) for n, x in d.items() if n.startswith("fsdp")} == {
        "fsdp_ag": ("param", 1), "fsdp_rs": ("grad", 1)}


def test_fsdp_shards_the_optimizer_and_gradients_so_70b_fits_on_64_a100() -> None:
    """Llama 3 70B with one microbatch per rank on 64 A100 80GB: the distributed optimizer alone keeps bf16
    weights and fp32 gradients whole (does not fit); FSDP shards them (fits, as torchtitan ran it)."""
    base = {"model": {"preset": "llama3-70b"}, "batch": {"global_batch": 64},
            "hardware": {"chip": "a100-80gb", "count": 64}}
    with pytest.raises(DoesNotFitError):
        plan_step(TrainSpec.from_dict({**base, "parallelism": {"recompute": "full"}}))
    mem = plan_step(TrainSpec.from_dict({**base, "parallelism": {"fsdp": True, "recompute": "full"}})).memory
    assert mem.optimizer_bytes == pytest.approx(12 * (80 * TrainSpec.from_dict(
        {**base, "parallelism": {"fsdp": True}}).arch.params_per_layer + 2 * 128256 * 8192) / 64)
    assert mem.weights_bytes < 2 * 70e9 / 20  # two units gathered, not the model


def _exposed_s(s: TrainSpec, comm_per_call_s: float) -> float:
    """Exposed communication of a 10 s step whose every collective call takes ``comm_per_call_s``."""
    plan = plan_step(s)
    comm = {d.name: d.count * comm_per_call_s for d in plan.collectives}
    return compose_step(plan, 10.0, comm).exposed_comm_s


def test_prefetch_hides_all_but_one_unit_while_the_links_keep_up() -> None:
    """A pass of U units hides its gathers behind compute except the first: C + A / U while A < C, plus the compute
    lost to the collectives' share of the compute units while the other U - 1 run beside it; bound by the links when
    A > C: A + C / U (the compute's slack absorbs that loss)."""
    s = spec()
    plan = plan_step(s)
    u, share = plan.fsdp_units, plan.comm_compute_share
    assert share == pytest.approx(20 / 132, abs=1e-4)  # DeepSeek-V3 report section 3.2.2: 20 of 132 SMs
    pipe = 10.0 * plan.pipelined_fraction
    c_f, c_b = plan.fwd_fraction * pipe, plan.bwd_fraction * pipe
    small = 1e-4
    exposed = _exposed_s(s, small)
    a_f, a_b = u * small, 2 * u * small
    assert exposed == pytest.approx((a_f + a_b) / u + (a_f + a_b) * (1 - 1 / u) * share)
    big = 1.0
    exposed = _exposed_s(s, big)
    a_f, a_b = u * big, 2 * u * big
    assert exposed == pytest.approx((a_f + c_f / u - c_f) + (a_b + c_b / u - c_b))


def test_op_recompute_reruns_half_the_forward_gemms() -> None:
    """torchtitan's op-level SAC re-runs every second matmul: half the forward GEMM FLOPs, between selective
    (none) and full (all)."""
    def gemm_flops(rec: str) -> float:
        p = plan_step(spec(recompute=rec))
        return sum(w.total_flops for w in p.compute if w.kind == "matmul")
    none, op, full = gemm_flops("none"), gemm_flops("op"), gemm_flops("full")
    fwd = full - none
    assert op - none == pytest.approx(fwd / 2, rel=1e-9)


def test_recompute_layers_reruns_that_many_layers() -> None:
    """``recompute_layers`` (Megatron's block method, torchtitan's every-k-th layer): 16 of 32 layers re-run, half
    the extra FLOPs of recomputing them all."""
    def flops(**par: Any) -> float:
        return sum(w.total_flops for w in plan_step(spec(**par)).compute)
    none, full = flops(recompute="none"), flops(recompute="full")
    assert flops(recompute="full", recompute_layers=16) - none == pytest.approx((full - none) / 2, rel=1e-9)


@pytest.mark.parametrize(("par", "field"), [
    ({"fsdp_shard": 7}, "parallelism.fsdp_shard"),
    ({"fsdp": False, "fsdp_shard": 8}, "parallelism.fsdp_shard"),
    ({"recompute": "op", "recompute_layers": 4}, "parallelism.recompute_layers"),
    ({"recompute": "full", "recompute_layers": 33}, "parallelism.recompute_layers"),
    ({"fsdp_shard": -1}, "parallelism.fsdp_shard"),
    ({"fsdp": "yes"}, "parallelism.fsdp"),
])
def test_bad_fsdp_and_recompute_fields_name_the_field(par: dict[str, Any], field: str) -> None:
    """Every invalid FSDP / recompute field raises SpecError naming it."""
    with pytest.raises(SpecError) as exc:
        spec(**par)
    assert exc.value.field == field


def test_fsdp_with_expert_parallelism_is_refused() -> None:
    """FSDP with EP is not modelled: refused with the field and what to use instead."""
    d = {"model": {"preset": "mixtral-8x7b"}, "batch": {"global_batch": 64},
         "hardware": {"chip": "h100-sxm", "count": 64}, "parallelism": {"fsdp": True, "ep": 8}}
    with pytest.raises(SpecError, match="expert parallelism") as exc:
        TrainSpec.from_dict(d)
    assert exc.value.field == "parallelism.fsdp"


def test_live_rank_groups_cover_every_rank_once() -> None:
    """The scheduler's groups for the FSDP demands partition the ranks: shard groups are blocks of consecutive
    data-parallel ranks (stride tp), replica groups join the same position of every block."""
    s = spec(tp=2, count=64, fsdp_shard=8, global_batch=32)  # tp 2 x dp 32: 4 replicas of 8
    for name in ("fsdp_ag", "fsdp_ar"):
        size, stride, copies, offsets = rank_groups(s, name)
        ranks = sorted(o + stride * j for o in offsets for j in range(size))
        assert ranks == list(range(64)), name
        assert copies == len(offsets)
    size, stride, _, offsets = rank_groups(s, "fsdp_ag")
    assert (size, stride) == (8, 2) and offsets[:3] == [0, 1, 16]


def test_fsdp_comm_is_priced_by_any_comm_model() -> None:
    """The offline estimate runs FSDP through the alpha-beta model too, and the comm shows in the breakdown only
    as far as prefetch cannot hide it."""
    e = estimate_train(spec(), AlphaBetaCommModel())
    assert {"fsdp_ag", "fsdp_ag_bwd", "fsdp_rs"} <= set(e.comm_s)
    assert 0 < e.breakdown.exposed_comm_s < sum(e.comm_s.values())
