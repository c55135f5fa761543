"""Offline estimates and capacity planning: the training model run with the flow-level fabric
model (the code the live fabric service runs), the same job on other chips, and what a power
budget buys.

:func:`estimate_train` is :func:`gigacluster.model.training.estimate_train` with the fabric's
:class:`~gigacluster.fabric.comm_model.FabricCommModel` as its comm model when the caller passes
none, so an offline estimate and a live job on an idle cluster agree. It lives here, above both
the model and the fabric, so the model never imports the fabric.

Choosing parallelism for another chip (documented policy): keep the spec's PP, CP,
microbatch size and global batch; clamp TP to the chip's scale-up domain (TP collectives must
stay on scale-up links); if that does not fit in HBM, or when ``search`` is asked for, try TP in
powers of two up to the domain, PP in powers of two, and recompute none/selective/full, and keep
the fastest configuration that fits. DP takes the rest of the chips, rounded down so that the
global batch stays as close as possible to the spec's (rounded to a multiple of DP x microbatch
size; the JSON reports the batch used). Chips that do not make a whole replica are reported idle.

Power provisioning: a facility provisions every accelerator at its TDP plus the host share
(catalog ``facility.host_overhead_w_per_chip``), times PUE; that is how many chips a budget
feeds. Energy and cost still come from the modelled (average) power.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from gigacluster.fabric.comm_model import FabricCommModel
from gigacluster.hw.catalog import CatalogError, chip_names, default_system, facility, get_chip, get_system
from gigacluster.model import DoesNotFitError, SpecError
from gigacluster.model.arch import preset
from gigacluster.model.comm import CommModel
from gigacluster.model.power import host_overhead_w
from gigacluster.model.training import TRAIN_PRECISIONS, TrainEstimate, TrainSpec
from gigacluster.model.training import estimate_train as _estimate_train


def estimate_train(
    spec: TrainSpec, comm: CommModel | None = None, *, energy_price_usd_per_kwh: float | None = None
) -> TrainEstimate:
    """The model's step for ``spec`` on an idle cluster; ``comm`` defaults to the fabric's flow model on the
    spec's ``network``."""
    if comm is None:  # the spec's network section (default: adaptive routing, one NIC per chip on its rail)
        comm = FabricCommModel(**spec.network.topology_kw())  # type: ignore[assignment]  # duck-typed GroupLayout
    model: CommModel = comm  # type: ignore[assignment]
    return _estimate_train(spec, model, energy_price_usd_per_kwh=energy_price_usd_per_kwh)


REFERENCE_TOKENS = 15_000_000_000_000  # Llama 3 405B: about 15T pre-training tokens (Llama 3 paper)


def provisioned_power_w(chip_name: str) -> float:
    """IT power a facility reserves per accelerator: TDP plus the host share."""
    return get_chip(chip_name).tdp_w + host_overhead_w()


def chips_fed(power_mw: float, chip: str, *, pue: float | None = None) -> int:
    """How many ``chip`` a facility of ``power_mw`` feeds: each provisioned at TDP plus host share, times PUE."""
    pue = facility().pue_default if pue is None else pue
    if pue < 1.0:
        raise SpecError("pue", f"must be >= 1.0, got {pue!r}")
    chips = math.floor(power_mw * 1e6 / (provisioned_power_w(chip) * pue))
    if chips < 1:
        raise SpecError("power_mw", "too small to feed one chip")
    return chips


def _batch_for(spec: TrainSpec, dp: int) -> int:
    """The global batch nearest the spec's that ``dp`` ranks split evenly."""
    unit = dp * spec.microbatch_size
    return max(1, round(spec.global_batch / unit)) * unit


def _with_hardware(
    base: TrainSpec, chip: str, count: int, tp: int, pp: int, recompute: str, virtual: int
) -> TrainSpec | None:
    """``base`` moved to ``chip`` with these degrees, or None when no valid layout exists."""
    per_replica = tp * pp * base.cp
    max_dp = count // per_replica
    if max_dp < 1:
        return None
    # Expert parallelism stays the spec's where the chips allow: the largest divisor of the experts
    # up to it that DP can hold; DP is then a multiple of EP (EP ranks come from DP).
    ep = max(d for d in range(1, min(base.ep, max_dp) + 1) if base.arch.experts % d == 0)
    dp = max_dp - max_dp % ep
    if base.arch.layers < pp * virtual or pp == 1:
        virtual = 1 if pp == 1 or base.arch.layers < pp * virtual else virtual
    try:
        return dataclasses.replace(
            base, chip=chip, system=default_system(chip), count=per_replica * dp, tp=tp, pp=pp, dp=dp, ep=ep,
            recompute=recompute, virtual_stages=virtual, price_per_chip_hour_usd=None,
            global_batch=_batch_for(base, dp),
        )
    except SpecError:
        return None


def _try(spec: TrainSpec | None) -> TrainEstimate | None:
    if spec is None:
        return None
    try:
        return estimate_train(spec)
    except DoesNotFitError:
        return None


def choose_parallelism(base: TrainSpec, chip: str, count: int, *, search: bool = False) -> TrainEstimate:
    """Estimate ``base`` on ``count`` chips of ``chip`` with the policy in the module docstring."""
    try:
        domain = get_system(default_system(chip)).chips
    except CatalogError as exc:
        raise SpecError("chips", str(exc)) from exc
    tp0 = min(base.tp, domain)
    first = _try(_with_hardware(base, chip, count, tp0, base.pp, base.recompute, base.virtual_stages))
    if first is not None and not search:
        return first
    best = first
    tps = [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= domain]
    pps = [p for p in (1, 2, 4, 8, 16, 32) if p <= base.arch.layers]
    for rec in ("none", "selective", "full"):
        for tp in tps:
            for pp in pps:
                est = _try(_with_hardware(base, chip, count, tp, pp, rec, base.virtual_stages))
                if est is not None and (best is None or est.tokens_per_s > best.tokens_per_s):
                    best = est
        if best is not None and not search:
            break
    if best is None:
        raise DoesNotFitError(
            f"{base.arch.name} does not fit on {count} x {chip} with any TP <= {domain}, PP <= 32 and recompute",
            need_bytes=float("nan"),
            have_bytes=float(get_chip(chip).hbm_bytes),
        )
    return best


@dataclasses.dataclass(frozen=True)
class CompareRow:
    """One chip's result in ``gigacluster compare``."""

    chip: str
    estimate: TrainEstimate
    idle_chips: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form: the estimate plus a few headline fields."""
        d = self.estimate.to_dict()
        d["idle_chips"] = self.idle_chips
        d["provisioned_power_mw"] = d["count"] * provisioned_power_w(self.chip) * d["pue"] / 1e6
        d["cost_usd_per_million_tokens"] = self.estimate.cost_usd_per_hour / (self.estimate.tokens_per_s * 3600) * 1e6
        return d


def compare(spec: TrainSpec, chips: list[str], *, same_power: bool = False, search: bool = False) -> list[CompareRow]:
    """The job in ``spec`` on each chip: same chip count, or same provisioned facility power."""
    if not chips:
        raise SpecError("chips", f"give at least one chip; allowed: {', '.join(chip_names())}")
    for c in chips:
        if c not in chip_names():
            raise SpecError("chips", f"unknown chip {c!r}; allowed: {', '.join(chip_names())}")
        if spec.precision not in get_chip(c).peak_tflops:
            have = ", ".join(p for p in get_chip(c).precisions() if p in TRAIN_PRECISIONS)
            raise SpecError("precision", f"{c} has no {spec.precision} units; it supports: {have}")
    budget_w = spec.count * provisioned_power_w(spec.chip)
    rows = []
    for c in chips:
        count = math.floor(budget_w / provisioned_power_w(c)) if same_power else spec.count
        est = choose_parallelism(spec, c, count, search=search)
        rows.append(CompareRow(c, est, count - est.spec.count))
    return rows


@dataclasses.dataclass(frozen=True)
class PowerPlan:
    """What a power budget feeds and what that cluster does for the reference job."""

    power_mw: float
    chip: str
    pue: float
    chips: int
    reference: TrainEstimate  # one Llama 3 405B job on a reference slice
    whole: TrainEstimate  # the whole cluster as one data-parallel job (larger global batch)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        ref, whole = self.reference, self.whole
        replicas = self.chips // ref.spec.count
        return {
            "power_mw": self.power_mw,
            "chip": self.chip,
            "pue": self.pue,
            "precision": self.reference.spec.precision,
            "provisioned_w_per_chip": provisioned_power_w(self.chip),
            "chips": self.chips,
            "reference_job": {
                "model": ref.spec.arch.name,
                "chips": ref.spec.count,
                "tokens_per_s": ref.tokens_per_s,
                "mfu": ref.mfu,
                "days_to_train_15t": REFERENCE_TOKENS / ref.tokens_per_s / 86400,
                "parallelism": ref.to_dict()["parallelism"],
            },
            "replicas": replicas,
            "tokens_per_day_replicas": replicas * ref.tokens_per_s * 86400,
            "whole_cluster_job": {
                "chips": whole.spec.count,
                "global_batch_tokens": whole.spec.tokens_per_step,
                "tokens_per_s": whole.tokens_per_s,
                "tokens_per_day": whole.tokens_per_s * 86400,
                "mfu": whole.mfu,
                "days_to_train_15t": REFERENCE_TOKENS / whole.tokens_per_s / 86400,
                "average_facility_mw": whole.step_energy_it_j / whole.step_time_s * self.pue / 1e6,
                "cost_usd_per_day": whole.cost_usd_per_hour * 24,
            },
        }


def reference_spec(chip: str, count: int) -> TrainSpec:
    """Llama 3 405B at 8K context, 16M-token batches, Llama 3 row-1 parallelism (TP clamped to the domain)."""
    domain = get_system(default_system(chip)).chips
    tp = min(8, domain)
    pp = 16
    dp = max(1, count // (tp * pp))
    if dp <= 128:
        dp = 2 ** int(math.log2(dp))  # divides the 2,048-sequence (16M-token) batch
        batch = 2048
    else:
        batch = 16 * dp  # Llama 3 row 2 per-rank batch; the global batch grows with the cluster
    return TrainSpec(
        arch=preset("llama3-405b"), chip=chip, count=tp * pp * dp, system=default_system(chip), tp=tp, pp=pp,
        dp=dp, global_batch=batch, recompute="selective", virtual_stages=4,
        tp_comm_overlap=0.5, name="llama3-405b-reference",
    )


def plan_power(
    power_mw: float, chip: str, *, pue: float | None = None, precision: str = "bf16", reference_chips: int = 16384
) -> PowerPlan:
    """How many ``chip`` a ``power_mw`` facility feeds, and what they do for Llama 3 405B."""
    if not power_mw > 0:
        raise SpecError("power_mw", f"must be > 0, got {power_mw!r}")
    if chip not in chip_names():
        raise SpecError("chip", f"unknown chip {chip!r}; allowed: {', '.join(chip_names())}")
    pue = facility().pue_default if pue is None else pue
    chips = chips_fed(power_mw, chip, pue=pue)
    base = reference_spec(chip, min(chips, reference_chips)).with_(pue=pue, precision=precision)
    ref = choose_parallelism(base, chip, base.count)
    whole_base = reference_spec(chip, chips).with_(pue=pue, precision=precision)
    whole = choose_parallelism(whole_base, chip, whole_base.count)
    return PowerPlan(power_mw, chip, pue, chips, ref, whole)
