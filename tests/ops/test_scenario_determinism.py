"""The event clock is reproducible: one scenario run twice on two fresh event-clock meshes gives the same
report, a hot chip that throttles, a slow chip, a switch down and samples that coincide with them included."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from gigacluster.scenario import runner, spec
from tests.conftest import live_stack

pytestmark = pytest.mark.integration  # two small event-clock runs: about 1-2 min on a loaded 2-core machine
ROOT = pathlib.Path(__file__).resolve().parents[2]
# One air-cooled H200 running a compute-bound model with no communication at all: it draws about 83% of its
# TDP, settles a little above the catalog's throttle point (85 C) within a few thermal time constants (60 s)
# and throttles by a percent or so, so its steps change with its temperature.
HOT: dict[str, Any] = {
    "model": {"layers": 4, "hidden": 8192, "heads": 32, "kv_heads": 8, "ffn_hidden": 28672, "vocab": 32000,
              "seq_len": 4096, "mlp": "swiglu"},
    "batch": {"global_batch": 8}, "parallelism": {"tp": 1, "microbatch_size": 1, "recompute": "none"},
    "hardware": {"chip": "h200", "count": 1}, "precision": "bf16", "steps": 1_000_000,
}
THROTTLE_FREE_STEP_S = 1.3819  # its mean step at full clock (the model's step at clock 1.0, as a run never cut)
# Sixteen chips, two HGX nodes: data-parallel traffic over the scale-out links.
WIDE: dict[str, Any] = {
    "model": {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 32000,
              "seq_len": 1024, "mlp": "swiglu"},
    "batch": {"global_batch": 64}, "parallelism": {"tp": 4, "microbatch_size": 1},
    "hardware": {"chip": "h200", "count": 16}, "precision": "bf16", "steps": 1_000_000,
}
# Every fault lands on a sample's instant (multiples of sample_every_s), and the slow chip is cleared at the
# same instant as the switch comes back: the runner's concurrent actions at one virtual time.
SCENARIO: dict[str, Any] = {
    "name": "det", "site": {"chip": "h200", "chips": 64}, "duration_s": 400, "sample_every_s": 20,
    "tenants": [{"name": "alpha"}, {"name": "beta"}],
    "jobs": [
        {"tenant": "alpha", "name": "hot", "at_s": 0, "spec": HOT},
        {"tenant": "beta", "name": "wide", "at_s": 20, "spec": WIDE},
    ],
    "faults": [
        {"at_s": 100, "kind": "chip_slow", "job": "beta/wide", "device_index": 5, "clock_factor": 0.7,
         "clear_after_s": 100},
        {"at_s": 140, "kind": "link_down", "target": "switches/spine0", "clear_after_s": 60},
    ],
}


# Windows of at most 20 steps: every job forms a window many times over the run, each from a per-step reference.
SHORT_WINDOWS = {"GIGACLUSTER_SCHEDULER_MAX_WINDOW_STEPS": "20"}


def figures(rep: dict[str, Any]) -> dict[str, Any]:
    """What a run's report says about the modelled cluster (not the wall time it took)."""
    out: dict[str, Any] = {"totals": {k: rep["totals"][k] for k in ("chip_hours", "energy_it_kwh",
                                                                     "energy_facility_kwh", "cost_usd")}}
    for j in rep["jobs"]:
        out[j["key"]] = {k: j[k] for k in ("steps", "mean_step_s", "energy_it_kwh", "chip_hours", "mfu", "goodput")}
    for t in rep["tiers"]:
        # mean_utilization is the fabric's link-seconds over the run (flows and windows), not a mean of samples
        out[f"tier {t['tier']}"] = {k: t[k] for k in ("mean_utilization", "bytes_carried", "peak_utilization",
                                                       "max_links_faulty")}
    out["faults"] = [(f.get("injected_s"), f.get("cleared_s"), f["affected"], f["error"]) for f in rep["faults"]]
    return out


async def test_a_scenario_run_twice_on_the_event_clock_reports_the_same_figures(
        mosquitto: str, tmp_path: pathlib.Path) -> None:
    """Two runs of one scenario on two fresh event-clock meshes give the same job mean steps, energy, chip-hours
    and per-tier link utilisation, although a chip heats past its throttle point, a chip is slowed, a switch goes
    down and every fault coincides with a sample (and a clear with another fault's clear)."""
    sc = spec.parse(SCENARIO, base_dir=ROOT)
    reps = []
    for i in range(2):
        async with live_stack(f"det{i}", mosquitto, tmp_path / str(i), chip="h200", clock="event",
                              extra_env=SHORT_WINDOWS) as st:
            reps.append(await runner.run(sc, runner.Target(st.endpoints, st.admin_key,
                                                           clock_coordinator=st.endpoint_of("clock"))))
    first, second = (figures(r) for r in reps)
    jobs = {j["key"]: j for j in reps[0]["jobs"]}
    assert all(j["steps"] > 0 and not j["error"] for j in jobs.values()), [j["error"] for j in jobs.values()]
    assert jobs["alpha/hot"]["mean_step_s"] > THROTTLE_FREE_STEP_S  # it did throttle
    assert all(f["error"] == "" and f["affected"] > 0 for f in reps[0]["faults"])
    assert first == second
