"""``gigacluster estimate train SPEC.yaml [--json]``: offline training-step estimate.

Exit codes: 0 ok, 2 invalid spec (the message names the field and the allowed values) or a
configuration that does not fit in HBM.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gigacluster import safeyaml
from gigacluster.model import DoesNotFitError, SpecError
from gigacluster.model.training import TrainEstimate, TrainSpec
from gigacluster.planning import estimate_train


def register(subparsers: Any) -> None:
    """Add ``train`` under ``gigacluster estimate``."""
    p = subparsers.add_parser("train", help="step time, MFU, memory, energy and cost of a training job")
    p.add_argument("spec", type=Path, help="training spec YAML (see examples/train-*.yaml)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--energy-price", type=float, default=None, metavar="USD_PER_KWH", help="override $/kWh")
    p.set_defaults(handler=run)


# Fields of a scheduler job file (gigacluster.scheduler.spec.JOB_FIELDS) that are not part of
# the training spec; a job file can be estimated offline as it is.
JOB_ONLY_FIELDS = ("queue", "priority", "checkpoint_interval_steps", "max_restarts", "request_id")


def load_spec(path: Path) -> TrainSpec:
    """Read and validate a spec (or scheduler job) file; raises SpecError naming the bad field."""
    try:
        data = safeyaml.load_file(path)  # bounded: size, aliases, expanded size, depth
    except safeyaml.YamlError as exc:
        raise SpecError("spec", exc.message) from exc
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in JOB_ONLY_FIELDS}
    return TrainSpec.from_dict(data)


def run(args: argparse.Namespace) -> int:
    """Handler of ``estimate train``."""
    try:
        spec = load_spec(args.spec)
        est = estimate_train(spec, energy_price_usd_per_kwh=args.energy_price)
    except (SpecError, DoesNotFitError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(est.to_dict(), indent=2))
    else:
        print_table(est)
    return 0


def _fmt_s(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 86400:
        return f"{s / 86400:,.1f} days"
    if s >= 3600:
        return f"{s / 3600:,.1f} h"
    return f"{s:,.3f} s"


def print_table(est: TrainEstimate) -> None:
    """Human-readable report with rich."""
    d = est.to_dict()
    p = d["parallelism"]
    t = Table(title=f"{d['name']}: {d['model']} on {d['count']:,} x {d['chip']} ({d['system']}, {d['precision']})")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    bd = d["breakdown"]
    rows: list[tuple[str, str]] = [
        ("parallelism", f"TP {p['tp']} PP {p['pp']}x{p['virtual_stages']} DP {p['dp']} CP {p['cp']}"
         + (f" EP {p['ep']} ({p['pipeline_schedule']}, all-to-all {p['moe_overlap']:.0%} hidden)"
            if p["ep"] > 1 else "")
         + ", "
         f"{p['microbatches']} microbatches of {p['microbatch_size']}, recompute {p['recompute']}"
         + (f" ({p['recompute_layers']} layers per stage)" if p["recompute_layers"] else "")
         + ("" if p["sequence_parallel"] else ", no sequence parallelism")
         + (f", FSDP over {p['fsdp_shard']}" + ("" if p["fsdp_shard"] == p["dp"] * p["cp"] else " (HSDP)")
            + ("" if p["fsdp_reshard_after_forward"] else ", no reshard after forward") if p["fsdp"] else "")),
        ("attention", f"{d['attention_impl']}" + (" (default)" if d["attention_impl"] == "flash" else "")),
        ("step time", _fmt_s(d["step_time_s"])),
        ("  compute", _fmt_s(bd["compute_s"])),
        ("  exposed communication", _fmt_s(bd["exposed_comm_s"])),
        ("  pipeline bubble", _fmt_s(bd["bubble_s"])),
        ("tokens / s", f"{d['tokens_per_s']:,.0f}"),
        ("model TFLOP/s per chip", f"{d['model_tflops_per_chip']:,.1f}"),
        ("hardware TFLOP/s per chip", f"{d['hardware_tflops_per_chip']:,.1f}"),
        ("MFU / HFU", f"{d['mfu']:.1%} / {d['hfu']:.1%}"),
        ("parameters (active per token)", f"{d['params'] / 1e9:,.1f}B ({d['active_params'] / 1e9:,.1f}B)"),
        ("memory per chip", f"{d['memory_per_chip_bytes'] / 2**30:,.1f} GiB of {d['hbm_bytes'] / 2**30:,.1f}"),
        ("clock factor / temperature", f"{d['clock_factor']:.3f} / {d['temperature_c']:.0f} C"),
        ("power per chip (chip / with host)", f"{d['chip_power_w']:,.0f} W / {d['system_power_w']:,.0f} W"),
        ("steps", "-" if d["total_steps"] is None else f"{d['total_steps']:,}"),
        ("time to train", _fmt_s(d["time_to_train_s"])),
        ("energy IT / facility", "-" if d["energy_it_mwh"] is None
         else f"{d['energy_it_mwh']:,.2f} / {d['energy_facility_mwh']:,.2f} MWh (PUE {d['pue']})"),
        ("cost", "-" if d["cost_usd"] is None
         else f"${d['cost_usd']:,.0f} (chips ${d['chip_cost_usd']:,.0f}, energy ${d['energy_cost_usd']:,.0f})"),
        ("cost per hour", f"${d['cost_usd_per_hour']:,.0f}"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    Console().print(t)
