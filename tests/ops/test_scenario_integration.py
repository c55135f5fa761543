"""``gigacluster scenario``'s runner against a real mesh: tenants, jobs, an inference stream and a chip fault,
driven through the public APIs, and a report whose figures add up."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from gigacluster.scenario import runner, spec
from tests.conftest import live_stack

pytestmark = pytest.mark.integration  # about 40 s on a loaded 2-core machine
ROOT = pathlib.Path(__file__).resolve().parents[2]
# A small model (4 layers, hidden 1024, as tests/integration/test_scheduler_live.py) so steps are short.
SMALL: dict[str, Any] = {
    "model": {"layers": 4, "hidden": 1024, "heads": 8, "kv_heads": 8, "ffn_hidden": 4096, "vocab": 32000,
              "seq_len": 1024, "mlp": "swiglu"},
    "batch": {"global_batch": 32}, "parallelism": {"tp": 8, "microbatch_size": 1},
    "hardware": {"chip": "h100-sxm", "count": 16}, "precision": "bf16", "steps": 1_000_000,
}
TINY: dict[str, Any] = {
    "name": "tiny", "site": {"chip": "h100-sxm", "chips": 64}, "duration_s": 240, "sample_every_s": 10,
    "tenants": [{"name": "alpha", "weight": 2}, {"name": "beta", "weight": 1}],
    "jobs": [
        {"tenant": "alpha", "name": "big", "at_s": 0, "spec": SMALL, "checkpoint_interval_steps": 20,
         "max_restarts": 2},
        {"tenant": "beta", "name": "small", "at_s": 5, "spec": SMALL, "steps": 50},
        {"tenant": "beta", "name": "late", "at_s": 20, "spec": SMALL},
    ],
    "inference": {"tenant": "beta", "start_s": 0, "duration_s": 60, "max_wall_qps": 2, "drain_s": 20,
                  "deploy": {"deployment_id": "tiny-chat", "preset": "llama3-8b", "chip": "h100-sxm", "tp": 1,
                             "replicas": 1},
                  "streams": [{"name": "conv",
                               "path": "loadtest/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"}]},
    "faults": [{"at_s": 60, "kind": "chip_failed", "job": "alpha/big", "device_index": 3, "clear_after_s": 60}],
}


async def test_a_tiny_scenario_runs_end_to_end_and_its_report_adds_up(
        mosquitto: str, tmp_path: pathlib.Path) -> None:
    """Every job is accounted for, tenant chip-hours are > 0 and sum to the jobs', the faulted job failed once
    and restarted, tier utilisations are in [0, 1], and the inference stream was served."""
    sc = spec.parse(TINY, base_dir=ROOT)
    async with live_stack("scen", mosquitto, tmp_path) as st:
        rep = await runner.run(sc, runner.Target(st.endpoints, st.admin_key))
    jobs = {j["key"]: j for j in rep["jobs"]}
    assert set(jobs) == {"alpha/big", "beta/small", "beta/late"}
    assert all(j["job"] and not j["error"] for j in jobs.values()), [j["error"] for j in jobs.values()]
    assert all(j["steps"] > 0 and j["estimate_step_s"] > 0 and j["mean_step_s"] for j in jobs.values())
    assert jobs["alpha/big"]["failures"] == 1 and jobs["alpha/big"]["restarts"] == 1
    assert jobs["beta/small"]["failures"] == 0 and jobs["beta/late"]["failures"] == 0
    tenants = {t["name"]: t for t in rep["tenants"]}
    assert all(t["chip_hours"] > 0 for t in tenants.values())
    assert sum(t["chip_hours"] for t in tenants.values()) == pytest.approx(rep["totals"]["chip_hours_of_jobs"],
                                                                           rel=1e-3)
    assert tenants["alpha"]["jobs"] == 1 and tenants["beta"]["jobs"] == 2
    assert all(0 < (t["goodput"] or 0) <= 1 for t in tenants.values())
    assert rep["tiers"] and all(0 <= r["mean_utilization"] <= 1 and 0 <= r["peak_utilization"] <= 1
                                for r in rep["tiers"])
    assert rep["faults"][0]["affected"] == 1 and rep["faults"][0]["error"] == ""
    conv = rep["inference"]["streams"][0]
    assert conv["offered"] > 0 and conv["ok"] == conv["offered"] and conv["ttft_p50_s"] > 0, conv
    assert rep["speedup_reached"] == pytest.approx(rep["speedup_stack"], rel=0.2)
    assert runner.end_to_end_check(rep) == []


async def test_the_tiny_scenario_runs_on_the_event_clock_with_every_action_at_its_virtual_time(
        mosquitto: str, tmp_path: pathlib.Path) -> None:
    """On an event-clock mesh the runner joins the clock: the fault lands at exactly its virtual time and clears
    exactly ``clear_after_s`` later, the jobs are accounted for as on the wall clock, the fleet is served, and the
    report says which clock it ran on."""
    sc = spec.parse(TINY, base_dir=ROOT)
    async with live_stack("scenev", mosquitto, tmp_path, clock="event") as st:
        rep = await runner.run(sc, runner.Target(st.endpoints, st.admin_key,
                                                 clock_coordinator=st.endpoint_of("clock")))
    assert rep["clock"] == "event"
    jobs = {j["key"]: j for j in rep["jobs"]}
    assert all(j["job"] and not j["error"] for j in jobs.values()), [j["error"] for j in jobs.values()]
    assert all(j["steps"] > 0 and j["mean_step_s"] for j in jobs.values())
    assert jobs["alpha/big"]["failures"] == 1 and jobs["alpha/big"]["restarts"] == 1
    fault = rep["faults"][0]
    assert fault["error"] == "" and fault["affected"] == 1
    assert fault["injected_s"] == pytest.approx(60.0, abs=1e-6)
    assert fault["cleared_s"] == pytest.approx(120.0, abs=1e-6)
    assert rep["virtual_s"] == pytest.approx(240.0, abs=1.0)  # the run ends at duration_s of virtual time
    conv = rep["inference"]["streams"][0]
    assert conv["offered"] > 0 and conv["ok"] == conv["offered"] and conv["server_ttft_p50_s"] > 0
    assert runner.end_to_end_check(rep) == []
