"""Transformer training estimate: the spec (:mod:`.train_spec`) through the step model (:mod:`.step`).

This module keeps every name it had before the split (re-exported below), so importers are unchanged.

One step is planned once (:func:`plan_step`) as the critical rank's list of :class:`Work` items
plus the collectives each parallel group runs, then composed (:func:`compose_step`) from the
compute seconds and the per-collective seconds. The live scheduler runs exactly that path on
the chip and fabric services; :func:`estimate_train` runs it offline with the roofline, the
thermal steady state and a :class:`CommModel`, so the two agree.

Parallelism follows Megatron-LM: tensor parallelism with sequence parallelism (TP), 1F1B
pipeline parallelism with optional interleaving (PP, ``virtual_stages``), data parallelism with a
distributed optimizer (DP; gradient reduce-scatter overlapped with the last backward, parameter
all-gather with the first forward) and all-gather-based context parallelism (CP, as Llama 3).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gigacluster.hw.catalog import get_chip
from gigacluster.model.comm import CommModel
from gigacluster.model.cost import job_cost
from gigacluster.model.power import (
    J_PER_MWH,
    host_overhead_w,
    link_energy_j,
    works_energy_above_idle_j,
)
from gigacluster.model.roofline import works_time_s
from gigacluster.model.step import (
    RESERVED_FIXED_BYTES,
    RESERVED_FRACTION,
    CollectiveDemand,
    MemoryBreakdown,
    StepBreakdown,
    StepPlan,
    compose_step,
    demand_times_s,
    link_bytes,
    model_flops_per_token,
    plan_step,
)
from gigacluster.model.thermal import ThermalParams, steady_state_with_feedback
from gigacluster.model.train_spec import (
    GRAD_DTYPES,
    MAX_SPEC_INT,
    RECOMPUTE,
    TRAIN_PRECISIONS,
    TrainSpec,
)

# --- the estimate --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrainEstimate:
    """Everything ``gigacluster estimate train`` reports."""

    spec: TrainSpec
    plan: StepPlan
    breakdown: StepBreakdown
    comm_s: dict[str, float]
    clock_factor: float
    temperature_c: float
    chip_power_w: float  # time-averaged per chip over a step
    system_power_w: float  # chip + host share
    step_energy_it_j: float  # whole job, one step
    tokens_per_s: float
    model_tflops_per_chip: float
    hardware_tflops_per_chip: float
    mfu: float
    hfu: float
    total_steps: int | None
    time_to_train_s: float | None
    energy_it_mwh: float | None
    energy_facility_mwh: float | None
    cost_usd: float | None
    chip_cost_usd: float | None
    energy_cost_usd: float | None
    cost_usd_per_hour: float

    @property
    def step_time_s(self) -> float:
        """Seconds per step."""
        return self.breakdown.step_time_s

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of ``estimate train --json``."""
        s = self.spec
        return {
            "name": s.name,
            "model": s.arch.name,
            "params": s.arch.params,
            "active_params": s.arch.active_params,
            "chip": s.chip,
            "system": s.system,
            "count": s.count,
            "precision": s.precision,
            "parallelism": {
                "tp": s.tp, "pp": s.pp, "dp": s.dp, "cp": s.cp, "virtual_stages": s.virtual_stages,
                "microbatch_size": s.microbatch_size, "microbatches": s.microbatches, "recompute": s.recompute,
                "ep": s.ep, "capacity_factor": s.capacity_factor, "moe_overlap": s.moe_overlap,
                "pipeline_schedule": s.pipeline_schedule, "sequence_parallel": s.sequence_parallel,
                "dp_comm_overlap": s.dp_comm_overlap, "fsdp": s.fsdp, "fsdp_shard": s.shard_group if s.fsdp else 0,
                "fsdp_reshard_after_forward": s.fsdp_reshard_after_forward, "recompute_layers": s.recompute_layers,
            },
            "attention_impl": s.attention_impl,
            "tokens_per_step": s.tokens_per_step,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_chip": self.model_tflops_per_chip,
            "hardware_tflops_per_chip": self.hardware_tflops_per_chip,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "memory_per_chip_bytes": self.plan.memory.total_bytes,
            "memory": self.plan.memory.to_dict(),
            "hbm_bytes": get_chip(s.chip).hbm_bytes,
            "clock_factor": self.clock_factor,
            "temperature_c": self.temperature_c,
            "chip_power_w": self.chip_power_w,
            "system_power_w": self.system_power_w,
            "total_steps": self.total_steps,
            "time_to_train_s": self.time_to_train_s,
            "energy_it_mwh": self.energy_it_mwh,
            "energy_facility_mwh": self.energy_facility_mwh,
            "pue": s.pue,
            "network": s.network.to_dict(),
            "cost_usd": self.cost_usd,
            "chip_cost_usd": self.chip_cost_usd,
            "energy_cost_usd": self.energy_cost_usd,
            "cost_usd_per_hour": self.cost_usd_per_hour,
            "breakdown": self.breakdown.to_dict(),
            "comm_s": dict(self.comm_s),
            "critical_stage": self.plan.critical_stage,
        }


def estimate_train(
    spec: TrainSpec, comm: CommModel, *, energy_price_usd_per_kwh: float | None = None
) -> TrainEstimate:
    """Offline estimate through the same path the live mesh runs (plan, roofline, comm, compose).

    ``comm`` prices the collectives; :func:`gigacluster.planning.estimate_train` passes the
    fabric's flow model, the default everywhere a caller does not choose.
    """
    chip = spec.chip_spec()
    plan = plan_step(spec)
    comm_s = demand_times_s(spec, plan, comm)

    def chip_power_at(cf: float) -> float:
        compute_s = works_time_s(chip, plan.compute, clock_factor=cf)
        step = compose_step(plan, compute_s, comm_s).step_time_s
        return chip.idle_w + works_energy_above_idle_j(chip, plan.compute, clock_factor=cf) / step

    temp_c, cf = steady_state_with_feedback(ThermalParams.for_chip(chip), chip_power_at)
    compute_s = works_time_s(chip, plan.compute, clock_factor=cf)
    bd = compose_step(plan, compute_s, comm_s)
    step = bd.step_time_s
    chip_w = chip.idle_w + works_energy_above_idle_j(chip, plan.compute, clock_factor=cf) / step
    sys_w = chip_w + host_overhead_w()
    up, out = link_bytes(plan)
    step_j = spec.count * (sys_w * step + link_energy_j(up, out))
    peak = chip.peak_flops(spec.precision)
    model_tf = plan.model_flops_per_step / spec.count / step
    hw_flops = sum(w.total_flops for w in plan.compute)
    steps = spec.total_steps()
    price = energy_price_usd_per_kwh if energy_price_usd_per_kwh is not None else spec.energy_price_usd_per_kwh
    hour = job_cost(chip, spec.count, 3600.0, step_j / step * 3600.0 * spec.pue, energy_price_usd_per_kwh=price)
    if steps is not None:
        ttt = steps * step
        e_it = step_j * steps
        c = job_cost(chip, spec.count, ttt, e_it * spec.pue, energy_price_usd_per_kwh=price)
        costs: tuple[float | None, ...] = (c.total_usd, c.chip_usd, c.energy_usd)
        e_it_mwh: float | None = e_it / J_PER_MWH
        e_fac: float | None = e_it * spec.pue / J_PER_MWH
        ttt_s: float | None = ttt
    else:
        costs, e_it_mwh, e_fac, ttt_s = (None, None, None), None, None, None
    return TrainEstimate(
        spec=spec,
        plan=plan,
        breakdown=bd,
        comm_s=comm_s,
        clock_factor=cf,
        temperature_c=temp_c,
        chip_power_w=chip_w,
        system_power_w=sys_w,
        step_energy_it_j=step_j,
        tokens_per_s=spec.tokens_per_step / step,
        model_tflops_per_chip=model_tf / 1e12,
        hardware_tflops_per_chip=hw_flops / step / 1e12,
        mfu=model_tf / peak,
        hfu=hw_flops / step / peak,
        total_steps=steps,
        time_to_train_s=ttt_s,
        energy_it_mwh=e_it_mwh,
        energy_facility_mwh=e_fac,
        cost_usd=costs[0],
        chip_cost_usd=costs[1],
        energy_cost_usd=costs[2],
        cost_usd_per_hour=hour.total_usd,
    )


__all__ = [
    "GRAD_DTYPES",
    "MAX_SPEC_INT",
    "RECOMPUTE",
    "RESERVED_FIXED_BYTES",
    "RESERVED_FRACTION",
    "TRAIN_PRECISIONS",
    "CollectiveDemand",
    "MemoryBreakdown",
    "StepBreakdown",
    "StepPlan",
    "TrainEstimate",
    "TrainSpec",
    "compose_step",
    "demand_times_s",
    "estimate_train",
    "link_bytes",
    "model_flops_per_token",
    "plan_step",
]
