"""Training step model: spec validation, plan, compose, memory and the estimate path."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from gigacluster.fabric.comm_model import FabricCommModel
from gigacluster.hw.catalog import get_chip
from gigacluster.model import DoesNotFitError, SpecError
from gigacluster.model.power import works_energy_above_idle_j
from gigacluster.model.roofline import works_time_s
from gigacluster.model.training import (
    TrainSpec,
    compose_step,
    demand_times_s,
    model_flops_per_token,
    plan_step,
)
from gigacluster.planning import estimate_train

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = yaml.safe_load((EXAMPLES / "train-llama3-8b-small.yaml").read_text())


def spec(**over: object) -> TrainSpec:
    d = copy.deepcopy(SMALL)
    for k, v in over.items():
        section, _, key = k.partition("__")
        if key:
            d.setdefault(section, {})[key] = v
        else:
            d[section] = v
    return TrainSpec.from_dict(d)


def test_dp_is_derived_from_count() -> None:
    """Missing dp = count / (tp x pp x cp); tokens per step = global batch x seq len."""
    s = spec()
    assert (s.tp, s.pp, s.cp, s.dp, s.count) == (4, 1, 1, 4, 16)
    assert s.tokens_per_step == 64 * 2048
    assert s.microbatches == 64 // (4 * 2)
    assert s.total_steps() == 100


def test_tokens_give_total_steps() -> None:
    """tokens -> ceil(tokens / tokens per step) steps."""
    d = copy.deepcopy(SMALL)
    del d["steps"]
    d["tokens"] = 64 * 2048 * 10 + 1
    assert TrainSpec.from_dict(d).total_steps() == 11


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"parallelism__recompute": "some"}, "parallelism.recompute"),
        ({"precision": "int8"}, "precision"),
        ({"hardware__chip": "tpu-v9"}, "hardware.chip"),
        ({"hardware__count": 18}, "hardware.count"),
        ({"parallelism__tp": 3}, "hardware.count"),
        ({"parallelism__tp": 0}, "parallelism.tp"),
        ({"batch": {"global_batch": 60}}, "batch.global_batch"),
        ({"model": {"preset": "llama9"}}, "model.preset"),
        ({"parallelism__warp": 2}, "parallelism.warp"),
        ({"pue": 0.9}, "pue"),
        ({"hardware__system": "hgx"}, "hardware.system"),
    ],
)
def test_invalid_spec_names_the_field(over: dict, field: str) -> None:
    """Every invalid field raises SpecError naming it."""
    with pytest.raises(SpecError) as exc:
        spec(**over)
    assert exc.value.field == field


def test_spec_error_lists_allowed_values() -> None:
    """The message says what is allowed."""
    with pytest.raises(SpecError, match="none, selective, op, full"):
        spec(parallelism__recompute="some")


def test_does_not_fit_gives_the_numbers() -> None:
    """Llama 3 70B on 8 H100 without model parallelism raises DoesNotFitError with need > have."""
    d = {"model": {"preset": "llama3-70b"}, "batch": {"global_batch": 64}, "hardware": {"chip": "h100-sxm", "count": 8}}
    with pytest.raises(DoesNotFitError) as exc:
        plan_step(TrainSpec.from_dict(d))
    assert exc.value.need_bytes > exc.value.have_bytes == get_chip("h100-sxm").hbm_bytes
    assert "GiB" in str(exc.value)


def test_estimate_goes_through_plan_roofline_comm_compose() -> None:
    """estimate_train's step time equals works_time_s(plan.compute) + comm + compose_step: the live mesh's path."""
    s = spec()
    est = estimate_train(s)
    plan = plan_step(s)
    chip = get_chip(s.chip)
    comm = demand_times_s(s, plan, FabricCommModel())
    bd = compose_step(plan, works_time_s(chip, plan.compute, clock_factor=est.clock_factor), comm)
    assert est.step_time_s == pytest.approx(bd.step_time_s, rel=1e-12)
    assert bd.step_time_s == pytest.approx(bd.compute_s + bd.exposed_comm_s + bd.bubble_s)


def test_estimate_energy_matches_chip_service_integration() -> None:
    """Chip energy per step = idle x step + sum(work_energy_above_idle_j), as the chip service integrates it."""
    s = spec()
    est = estimate_train(s)
    chip = get_chip(s.chip)
    per_chip = chip.idle_w * est.step_time_s + works_energy_above_idle_j(
        chip, est.plan.compute, clock_factor=est.clock_factor
    )
    assert est.chip_power_w * est.step_time_s == pytest.approx(per_chip)


def test_small_demo_job_takes_seconds_per_step() -> None:
    """The demo example runs a step in a few (virtual) seconds on 16 chips."""
    est = estimate_train(spec())
    assert 0.1 < est.step_time_s < 10.0


def test_compose_bubble_formula() -> None:
    """1F1B bubble = (pp - 1) / (virtual_stages x microbatches) of the other ranks' slot time; DP hides in
    its window."""
    d = {"model": {"preset": "llama3-8b"}, "batch": {"global_batch": 32},
         "parallelism": {"tp": 4, "pp": 4, "virtual_stages": 2}, "hardware": {"chip": "h100-sxm", "count": 32}}
    plan = plan_step(TrainSpec.from_dict(d))
    assert plan.microbatches == 16
    comm = {c.name: 0.0 for c in plan.collectives}
    bd = compose_step(plan, 10.0, comm)
    pipe = 10.0 * plan.pipelined_fraction
    assert bd.bubble_s == pytest.approx(pipe * plan.bubble_slot_ratio * 3 / (2 * 16))
    assert bd.exposed_comm_s == 0.0
    comm["tp"] = 1.0
    assert compose_step(plan, 10.0, comm).exposed_comm_s == pytest.approx(1.0)
    comm["dp_grad"] = 1e-6  # far shorter than one microbatch's backward: fully hidden
    assert compose_step(plan, 10.0, comm).exposed_comm_s == pytest.approx(1.0)


def test_bubble_is_the_other_ranks_passes_not_the_heavier_last_rank() -> None:
    """Llama 3 8B on PP 4 (8 layers per rank): the last rank also runs the 128K-vocab logits and loss and
    paces the steady state, while the bubble is the other ranks' passes (Narayanan et al. 2021, 2.2.1):
    its slot time is theirs, about 8 layers over the last rank's 8 + logits, so under 1."""
    d = {"model": {"preset": "llama3-8b"}, "batch": {"global_batch": 32},
         "parallelism": {"tp": 4, "pp": 4}, "hardware": {"chip": "h100-sxm", "count": 32}}
    plan = plan_step(TrainSpec.from_dict(d))
    assert plan.critical_stage == "last"
    assert 0.7 < plan.bubble_slot_ratio < 0.9
    one = plan_step(TrainSpec.from_dict({**d, "parallelism": {"tp": 4, "pp": 1}, "hardware": {"chip": "h100-sxm",
                                                                                              "count": 8}}))
    assert one.bubble_slot_ratio == 1.0


def test_compose_rejects_missing_collective() -> None:
    """compose_step names a collective the caller forgot to time."""
    plan = plan_step(spec())
    with pytest.raises(SpecError, match="tp"):
        compose_step(plan, 1.0, {})


def test_collective_layouts_follow_megatron_order() -> None:
    """TP 4 sits inside one 64-chip domain; the DP group of 4 ranks (stride 4) also fits in it."""
    plan = plan_step(spec())
    by = {c.name: c for c in plan.collectives}
    assert by["tp"].layout.size == 4 and by["tp"].layout.ranks_per_domain == 4
    assert by["dp_grad"].op == "reduce_scatter" and by["dp_grad"].layout.size == 4


def test_full_recompute_adds_a_forward_not_model_flops() -> None:
    """Full recompute raises hardware FLOPs by about a third (one more forward) but not model FLOPs."""
    none = estimate_train(spec(parallelism__recompute="none"))
    full = estimate_train(spec(parallelism__recompute="full"))
    ratio = sum(w.total_flops for w in full.plan.compute) / sum(w.total_flops for w in none.plan.compute)
    assert 1.25 < ratio < 1.36
    assert full.plan.model_flops_per_step == none.plan.model_flops_per_step
    assert full.plan.memory.activations_bytes < 0.3 * none.plan.memory.activations_bytes
    assert full.step_time_s > none.step_time_s


def test_model_flops_are_6n_plus_attention() -> None:
    """Model FLOPs per token = 6 x (non-embedding params + logits) + 6 L s h (causal attention)."""
    s = spec()
    a = s.arch
    n = a.layers * a.params_per_layer + a.vocab * a.hidden
    assert model_flops_per_token(a) == pytest.approx(6 * n + 6 * a.layers * a.seq_len * a.hidden)


def test_more_tp_less_memory_per_chip() -> None:
    """Doubling TP lowers the weights and activations each chip holds."""
    m4 = plan_step(spec()).memory
    m8 = plan_step(spec(parallelism__tp=8)).memory
    assert m8.weights_bytes == pytest.approx(m4.weights_bytes / 2)
    assert m8.activations_bytes < m4.activations_bytes


def test_liquid_trn3_holds_clock_on_demo_job() -> None:
    """The demo job: liquid-cooled Trainium3 settles below the throttle point at nominal clock."""
    est = estimate_train(spec())
    assert est.clock_factor == 1.0
    assert est.temperature_c < 85.0


def test_to_dict_has_the_documented_keys() -> None:
    """The JSON of estimate train carries every field the issue lists."""
    d = estimate_train(spec()).to_dict()
    for k in ("step_time_s", "tokens_per_s", "model_tflops_per_chip", "hardware_tflops_per_chip", "mfu", "hfu",
              "memory_per_chip_bytes", "time_to_train_s", "energy_it_mwh", "energy_facility_mwh", "cost_usd"):
        assert d[k] is not None and d[k] > 0, k
    assert set(d["breakdown"]) >= {"compute_s", "exposed_comm_s", "bubble_s"}
    assert d["energy_facility_mwh"] == pytest.approx(d["energy_it_mwh"] * d["pue"])
    assert d["hfu"] >= d["mfu"]


def _dp_allreduce_spec(chip: str, count: int, tp: int) -> TrainSpec:
    """A 1.7B GPT (Megatron-LM SC'21 Table 1's smallest) with a plain data-parallel all-reduce, exposed."""
    return TrainSpec.from_dict({
        "model": {"layers": 24, "hidden": 2304, "heads": 24, "kv_heads": 24, "ffn_hidden": 4 * 2304, "vocab": 51200,
                  "seq_len": 2048, "mlp": "gelu"},
        "batch": {"global_batch": 512},
        "parallelism": {"tp": tp, "microbatch_size": 4, "recompute": "selective", "distributed_optimizer": False,
                        "dp_comm_overlap": False},
        "hardware": {"chip": chip, "count": count}, "precision": "bf16"})


def test_training_dp_allreduce_runs_nvls_tree_in_both_comm_models() -> None:
    """On 2 x 8 H100 the DP gradient all-reduce (8 ranks per node) is NCCL's NVLSTree in the fabric and the
    alpha-beta model alike, the same seconds from the same NCCL ceiling, near half the alpha-beta ring's."""
    from gigacluster.model.comm import AlphaBetaCommModel

    s = _dp_allreduce_spec("h100-sxm", 16, 1)
    fabric = estimate_train(s).to_dict()["comm_s"]["dp_grad"]
    nvls = estimate_train(s, AlphaBetaCommModel()).to_dict()["comm_s"]["dp_grad"]
    ring = estimate_train(s, AlphaBetaCommModel(nvls=False)).to_dict()["comm_s"]["dp_grad"]
    assert nvls == pytest.approx(fabric, rel=0.02)
    assert nvls < 0.6 * ring


def test_training_dp_allreduce_of_two_ranks_per_node_keeps_the_rings() -> None:
    """TP 4 leaves two DP ranks per 8-GPU node: NCCL sets no NVLS up for <= 2 local GPUs (src/transport/nvls.cc),
    so the alpha-beta DP all-reduce is its ring with NVLS on or off."""
    from gigacluster.model.comm import AlphaBetaCommModel

    s = _dp_allreduce_spec("h100-sxm", 32, 4)
    on, off = (estimate_train(s, AlphaBetaCommModel(nvls=v)).to_dict()["comm_s"]["dp_grad"] for v in (True, False))
    assert on == off
