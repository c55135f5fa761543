"""``gigacluster compare`` and ``gigacluster plan``: capacity planning from the training model.

* ``compare SPEC.yaml --chips a,b,c [--same-power] [--search] [--png FILE] [--json]``: the same job
  on each chip (same count, or the same provisioned facility power), one table and a chart.
* ``compare --infer --model M --chips a,b,c [--isl 1024 --osl 1024] [--precision P] [--png FILE] [--json]``:
  serving frontiers (throughput per GPU against tokens/s per user) per chip, as InferenceMAX charts
  them (:mod:`gigacluster.cli.compare_infer`).
* ``plan --power-mw MW --chip CHIP [--pue X] [--json]``: how many chips a power budget feeds and
  what they do for Llama 3 405B (tokens per day; days for 15T tokens).

Exit code 2 on an invalid spec or option (the message names it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gigacluster.cli import compare_infer
from gigacluster.cli.estimate_train import load_spec
from gigacluster.model import DoesNotFitError, SpecError
from gigacluster.model.training import TRAIN_PRECISIONS
from gigacluster.planning import CompareRow, compare, plan_power

DEFAULT_CHIPS = "trainium3,mi355x,b200,h100-sxm"


def register(subparsers: Any) -> None:
    """Add top-level ``compare`` and ``plan``."""
    c = subparsers.add_parser("compare", help="the same training job (or, with --infer, serving) on several chips")
    c.add_argument("spec", type=Path, nargs="?", default=None, help="training spec YAML (not with --infer)")
    c.add_argument("--infer", action="store_true", help="serving frontier of --model per chip (InferenceMAX-style)")
    c.add_argument("--model", default="deepseek-v3", help="with --infer: model preset")
    c.add_argument("--isl", type=int, default=1024, help="with --infer: prompt tokens (1k/1k, 1k/8k, 8k/1k ...)")
    c.add_argument("--osl", type=int, default=1024, help="with --infer: output tokens")
    c.add_argument("--max-ep", type=int, default=0,
                   help="with --infer: largest EP tried (default the chip's scale-up domain; more = wide EP)")
    c.add_argument("--pue", type=float, default=None, help="with --infer: facility PUE (default: catalog)")
    c.add_argument("--chips", default=DEFAULT_CHIPS, help=f"comma-separated chip names (default {DEFAULT_CHIPS})")
    c.add_argument(
        "--same-power", action="store_true", help="give each chip the spec's provisioned power, not its count"
    )
    c.add_argument("--precision", choices=TRAIN_PRECISIONS, default=None,
                   help="override the spec's precision (each chip must have it)")
    c.add_argument("--search", action="store_true", help="search TP/PP/recompute per chip for the fastest layout")
    c.add_argument("--png", type=Path, default=None, help="write a bar chart (matplotlib, Agg)")
    c.add_argument("--json", action="store_true", help="print a JSON list")
    c.set_defaults(handler=run_compare)

    p = subparsers.add_parser("plan", help="chips a power budget feeds, and what they train")
    p.add_argument("--power-mw", type=float, required=True, help="facility power budget, MW")
    p.add_argument("--chip", required=True, help="chip name from the catalog")
    p.add_argument("--pue", type=float, default=None, help="power usage effectiveness (default: catalog)")
    p.add_argument("--precision", choices=TRAIN_PRECISIONS, default="bf16", help="training precision (default bf16)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run_plan)


def run_compare(args: argparse.Namespace) -> int:
    """Handler of ``compare``."""
    try:
        if args.infer:
            return compare_infer.run(args)
        if args.spec is None:
            raise SpecError("spec", "give a training spec YAML, or --infer --model M for serving")
        spec = load_spec(args.spec)
        if args.precision:
            spec = spec.with_(precision=args.precision)
        chips = [c.strip() for c in args.chips.split(",") if c.strip()]
        rows = compare(spec, chips, same_power=args.same_power, search=args.search)
    except (SpecError, DoesNotFitError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.png is not None:
        write_chart(rows, args.png, title=f"{spec.arch.name}: " + ("same power" if args.same_power else "same count"))
    if args.json:
        print(json.dumps([r.to_dict() for r in rows], indent=2))
        return 0
    basis = "same provisioned power" if args.same_power else "same chip count"
    t = Table(title=f"{spec.name}: {spec.arch.name} ({spec.precision}), {basis}")
    for col in ("chip", "chips", "TP/PP/DP/CP/EP", "step", "tokens/s", "MFU", "clock", "power/chip",
                "days (job)", "MWh facility", "$ job", "$ / M tokens"):
        t.add_column(col, justify="right")
    for r in rows:
        d = r.to_dict()
        p = d["parallelism"]
        days = "-" if d["time_to_train_s"] is None else f"{d['time_to_train_s'] / 86400:,.1f}"
        mwh = "-" if d["energy_facility_mwh"] is None else f"{d['energy_facility_mwh']:,.0f}"
        usd = "-" if d["cost_usd"] is None else f"{d['cost_usd'] / 1e6:,.2f}M"
        t.add_row(
            r.chip, f"{d['count']:,}" + (f" (+{r.idle_chips} idle)" if r.idle_chips else ""),
            f"{p['tp']}/{p['pp']}/{p['dp']}/{p['cp']}/{p['ep']}", f"{d['step_time_s']:.2f} s",
            f"{d['tokens_per_s']:,.0f}",
            f"{d['mfu']:.1%}", f"{d['clock_factor']:.2f}", f"{d['system_power_w']:,.0f} W", days, mwh, usd,
            f"{d['cost_usd_per_million_tokens']:.3f}",
        )
    Console(width=160).print(t)
    return 0


def write_chart(rows: list[CompareRow], path: Path, *, title: str) -> None:
    """Bar chart of tokens/s, MFU and $ per million tokens per chip."""
    from matplotlib.figure import Figure  # deferred: importing matplotlib adds ~0.4 s to every CLI start

    names = [r.chip for r in rows]
    ds = [r.to_dict() for r in rows]
    fig = Figure(figsize=(12, 4))
    axes = fig.subplots(1, 3)
    series = [
        ("tokens / s (millions)", [d["tokens_per_s"] / 1e6 for d in ds]),
        ("MFU (%)", [d["mfu"] * 100 for d in ds]),
        ("$ per million tokens", [d["cost_usd_per_million_tokens"] for d in ds]),
    ]
    for ax, (label, vals) in zip(axes, series, strict=True):
        ax.bar(names, vals, color="#4477aa")
        ax.set_title(label)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run_plan(args: argparse.Namespace) -> int:
    """Handler of ``plan``."""
    try:
        plan = plan_power(args.power_mw, args.chip, pue=args.pue, precision=args.precision)
    except (SpecError, DoesNotFitError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    d = plan.to_dict()
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    ref, whole = d["reference_job"], d["whole_cluster_job"]
    t = Table(title=f"{d['power_mw']:,.0f} MW of {d['chip']} at PUE {d['pue']}, {d['precision']}")
    t.add_column("quantity")
    t.add_column("value", justify="right")
    for k, v in (
        ("provisioned power per chip (TDP + host)", f"{d['provisioned_w_per_chip']:,.0f} W"),
        ("chips fed", f"{d['chips']:,}"),
        (f"one {ref['model']} job on {ref['chips']:,} chips",
         f"{ref['tokens_per_s']:,.0f} tokens/s, MFU {ref['mfu']:.1%}"),
        ("  days to train on 15T tokens", f"{ref['days_to_train_15t']:,.1f}"),
        (f"{d['replicas']:,} such jobs side by side", f"{d['tokens_per_day_replicas']:,.3g} tokens/day"),
        (f"whole cluster as one job ({whole['chips']:,} chips)", f"{whole['tokens_per_day']:,.3g} tokens/day"),
        ("  global batch (tokens)", f"{whole['global_batch_tokens']:,} (far above a useful critical batch)"),
        ("  days to train on 15T tokens", f"{whole['days_to_train_15t']:,.2f}"),
        ("  average facility power", f"{whole['average_facility_mw']:,.0f} MW"),
        ("  cost per day", f"${whole['cost_usd_per_day']:,.0f}"),
    ):
        t.add_row(k, v)
    Console(width=140).print(t)
    return 0
