"""Every training validation row's error under the current model, per family, and what moved against a saved run.

    python -m tests.model.sweep --out /tmp/after.json [--against /tmp/before.json] [--threshold 0.002]

A change to the training model moves rows of several families at once (docs/validation.md sections 1-1c); this
recomputes all of them (about 5 s), prints each family's median and max |error| and rows within 10%, and, given an
earlier run's file, every row that moved by more than ``--threshold`` and every row that crossed the 10% band. Run
it on the tree before a change (``git stash``), then after. The errors are the tests' own functions, so a figure
here is the figure the pinned tests check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable

from gigacluster.planning import estimate_train

from . import test_calibration as calibration
from . import test_validation_llmfoundry as llmfoundry
from . import test_validation_megascale as megascale
from . import test_validation_megatron as megatron
from . import test_validation_mlperf as mlperf
from . import test_validation_nemo as nemo
from . import test_validation_neuron as neuron
from . import test_validation_torchtitan as torchtitan


def _llama3() -> dict[str, float]:
    out = {}
    for gpus, cp, _, seq, tflops, _ in calibration.LLAMA3_ROWS:
        est = estimate_train(calibration.llama3_row_spec(gpus, cp, seq))
        out[f"{gpus}-cp{cp}"] = est.model_tflops_per_chip / tflops - 1.0
    return out


FAMILIES: dict[str, Callable[[], dict[str, float]]] = {
    "llama3": _llama3,
    "megatron": lambda: {f"{r[0]}B-{r[6]}": megatron.table1_error(r) for r in megatron.TABLE1},
    "megascale": lambda: {**{f"table2-{r[0]}": megascale.megascale_error(r) for r in megascale.TABLE2_MEGATRON},
                          **{f"figure9-{r[0]}": megascale.figure9_error(r) for r in megascale.FIGURE9_MEGATRON}},
    "nemo": lambda: {r[0]: nemo._error(r) for r in nemo.ROWS},
    "nemo-repro": lambda: {r[0]: nemo.repro_error(r) for r in nemo.REPRO_ROWS},
    "torchtitan": lambda: {r[0]: torchtitan.error(r) for r in torchtitan.ROWS},
    "llmfoundry": lambda: {llmfoundry.row_id(r): llmfoundry.error(r) for r in llmfoundry.ROWS},
    "llmfoundry-mb": lambda: {llmfoundry.sweep_id(r): llmfoundry.sweep_error(r) for r in llmfoundry.MICROBATCH_SWEEP},
    "neuron": lambda: {r[0]: neuron.trn1_error(r) for r in neuron.ROWS},
    "mlperf": lambda: {r[0]: mlperf.mlperf_error(r) for r in mlperf.ROWS},
}


def sweep() -> dict[str, dict[str, float]]:
    return {name: rows() for name, rows in FAMILIES.items()}


def summary(errors: dict[str, dict[str, float]]) -> list[str]:
    lines = []
    for name, rows in errors.items():
        a = [abs(e) for e in rows.values()]
        lines.append(f"{name:13s} rows {len(a):3d}  median {statistics.median(a):6.1%}  max {max(a):6.1%}  "
                     f"within 10% {sum(e <= 0.10 for e in a):3d}")
    return lines


def compare(before: dict[str, dict[str, float]], after: dict[str, dict[str, float]], threshold: float) -> list[str]:
    lines = []
    for name, rows in after.items():
        old = before.get(name, {})
        for key, e in rows.items():
            if key not in old:
                lines.append(f"{name:13s} {key:48s} new {e:+7.1%}")
            elif abs(e - old[key]) > threshold or (abs(e) <= 0.10) != (abs(old[key]) <= 0.10):
                cross = "  crossed 10%" if (abs(e) <= 0.10) != (abs(old[key]) <= 0.10) else ""
                lines.append(f"{name:13s} {key:48s} {old[key]:+7.1%} -> {e:+7.1%}{cross}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.model.sweep", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="write every row's error here (JSON)")
    ap.add_argument("--against", help="an earlier --out file to compare with")
    ap.add_argument("--threshold", type=float, default=0.002, help="list rows that moved by more (default 0.002)")
    args = ap.parse_args(argv)
    errors = sweep()
    print("\n".join(summary(errors)))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(errors, f, indent=1, sort_keys=True)
    if args.against:
        with open(args.against) as f:
            before = json.load(f)
        print(f"\nagainst {args.against}:")
        print("\n".join(compare(before, errors, args.threshold)) or "no row moved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
