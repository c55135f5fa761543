"""``gigacluster compare --infer``: serving frontiers per chip, the way InferenceMAX charts them.

For ``--model`` and one sequence shape (``--isl``/``--osl``), each chip's frontier of output
throughput per GPU against interactivity (tokens/s per user) over concurrencies and TP/EP layouts
(:mod:`gigacluster.inference.frontier`), with cost per million output tokens (catalog price) and
output tokens/s per provisioned MW (TDP plus host share, times the facility PUE:
:func:`gigacluster.planning.provisioned_power_w`). JSON and/or a PNG (throughput and cost against
interactivity).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gigacluster.hw.catalog import facility
from gigacluster.inference.frontier import frontier
from gigacluster.model.arch import preset
from gigacluster.planning import provisioned_power_w


def compare_infer(args: argparse.Namespace) -> dict[str, Any]:
    """The frontiers as one JSON-ready mapping (raises SpecError / DoesNotFitError)."""
    arch = preset(args.model)
    precision = args.precision or "bf16"
    pue = args.pue or facility().pue_default
    fr = frontier(arch, [c.strip() for c in args.chips.split(",") if c.strip()], isl=args.isl, osl=args.osl,
                  precision=precision, max_ep=args.max_ep)
    chips = {}
    for chip, pts in fr.items():
        mw = provisioned_power_w(chip) * pue / 1e6
        chips[chip] = {"provisioned_w_per_gpu": provisioned_power_w(chip),
                       "frontier": [{**p.to_dict(), "output_tok_s_per_provisioned_mw": p.output_tok_s_per_gpu / mw}
                                    for p in pts]}
    return {"model": arch.name, "isl": args.isl, "osl": args.osl, "precision": precision, "pue": pue,
            "assumption": "closed loop of `concurrency` users; prefills stall decodes; uniform expert routing; "
                          "EP all-to-all not overlapped (see gigacluster.inference.frontier)",
            "chips": chips}


def print_table(out: dict[str, Any]) -> None:
    t = Table(title=f"{out['model']} {out['isl']}/{out['osl']} {out['precision']}: serving frontier")
    for col in ("chip", "TP/EP", "users", "tok/s/user", "out tok/s/GPU", "prefill s", "$ / M out", "tok/s per MW"):
        t.add_column(col, justify="right")
    for chip, d in out["chips"].items():
        for p in d["frontier"]:
            t.add_row(chip, f"{p['tp']}/{p['ep']}", str(p["concurrency"]), f"{p['interactivity_tok_s_user']:,.1f}",
                      f"{p['output_tok_s_per_gpu']:,.0f}", f"{p['prefill_s']:.3f}",
                      f"{p['cost_usd_per_million_output']:.3f}", f"{p['output_tok_s_per_provisioned_mw']:,.0f}")
    Console(width=140).print(t)


def write_chart(out: dict[str, Any], path: Path) -> None:
    """Throughput per GPU and cost per million output tokens against interactivity, one line per chip."""
    from matplotlib.figure import Figure  # deferred: importing matplotlib adds ~0.4 s to every CLI start

    fig = Figure(figsize=(12, 4.5))
    ax1, ax2 = fig.subplots(1, 2)
    for chip, d in out["chips"].items():
        xs = [p["interactivity_tok_s_user"] for p in d["frontier"]]
        ax1.plot(xs, [p["output_tok_s_per_gpu"] for p in d["frontier"]], marker="o", label=chip)
        ax2.plot(xs, [p["cost_usd_per_million_output"] for p in d["frontier"]], marker="o", label=chip)
    ax1.set(xlabel="interactivity (tokens/s per user)", ylabel="output tokens/s per GPU", title="throughput")
    ax2.set(xlabel="interactivity (tokens/s per user)", ylabel="$ per million output tokens", title="cost",
            yscale="log")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"{out['model']} {out['isl']}/{out['osl']} {out['precision']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def run(args: argparse.Namespace) -> int:
    """``compare --infer`` after the shared error handling of ``run_compare``."""
    out = compare_infer(args)
    if args.png is not None:
        write_chart(out, args.png)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print_table(out)
    return 0
