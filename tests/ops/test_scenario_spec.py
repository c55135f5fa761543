"""Scenario files: the shipped examples parse, and each kind of bad field is refused by name before any stack
is touched (gigacluster.scenario.spec), and the report's arithmetic (gigacluster.scenario.report)."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest

from gigacluster.common.v1 import common_pb2
from gigacluster.errors import InvalidArgument
from gigacluster.safeyaml import YamlError
from gigacluster.scenario import report, spec
from gigacluster.scenario.runner import end_to_end_check, nth_device

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRACE = "loadtest/data/azure-llm-inference-2023/AzureLLMInferenceTrace_conv.csv"
SMALL_8B: dict[str, Any] = {
    "model": {"preset": "llama3-8b", "seq_len": 4096}, "batch": {"global_batch_tokens": 2097152},
    "parallelism": {"tp": 4, "pp": 1, "microbatch_size": 1, "recompute": "selective"},
    "hardware": {"chip": "trainium3", "count": 64}, "precision": "bf16", "steps": 100,
}
GOOD: dict[str, Any] = {
    "name": "t", "site": {"chip": "trainium3", "chips": 4096}, "speedup": 20, "duration_s": 600,
    "tenants": [{"name": "alpha", "weight": 2}, {"name": "beta"}],
    "jobs": [{"tenant": "alpha", "name": "a", "at_s": 0, "spec": SMALL_8B},
             {"tenant": "beta", "name": "b", "at_s": 10, "repeat": 2, "every_s": 5, "chips": 128,
              "file": "examples/train-llama3-8b-small.yaml", "steps": 50}],
    "inference": {"tenant": "beta", "deploy": {"deployment_id": "chat", "preset": "llama3-8b", "chip": "trainium3"},
                  "streams": [{"name": "conv", "path": TRACE, "rate_scale": 0.5}]},
    "faults": [{"at_s": 100, "kind": "chip_failed", "job": "alpha/a", "device_index": 3, "clear_after_s": 60},
               {"at_s": 200, "kind": "link_degraded", "target": "switches/spine0", "capacity_factor": 0.5}],
}


def parse(d: dict[str, Any]) -> spec.Scenario:
    return spec.parse(d, base_dir=ROOT)


def bad(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """GOOD with the item at ``path`` set to ``value`` (a missing last key is added)."""
    d = copy.deepcopy(GOOD)
    node = d
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return d


def test_a_good_file_parses_with_repeats_overrides_and_faults() -> None:
    """Repeats expand to named jobs at their times, chips/steps override the file, faults keep their targets."""
    sc = parse(GOOD)
    assert [j.key for j in sc.jobs] == ["alpha/a", "beta/b-0", "beta/b-1"]
    assert [j.at_s for j in sc.jobs] == [0.0, 10.0, 15.0]
    assert sc.jobs[1].chips == 128 and sc.jobs[1].spec["steps"] == 50 and sc.jobs[1].fields["name"] == "b-0"
    assert sc.tenants[0].weight == 2.0 and sc.tenants[1].weight == 1.0
    assert sc.faults[0].is_chip and sc.faults[0].device_index == 3 and not sc.faults[1].is_chip
    assert sc.inference is not None and sc.inference.streams[0].rate_scale == 0.5
    assert sc.sample_s == 10.0
    assert sc.with_overrides(duration_s=60, speedup=5).duration_s == 60.0


@pytest.mark.parametrize("name", ["gigawatt-small.yaml", "gigawatt.yaml"])
def test_the_shipped_examples_parse(name: str) -> None:
    """examples/gigawatt*.yaml are valid, and the big one has the shape issue 13 asks for."""
    sc = spec.load(ROOT / "examples" / name)
    assert len(sc.tenants) >= (4 if name == "gigawatt.yaml" else 2)
    assert sc.inference is not None and sc.faults
    if name == "gigawatt.yaml":
        assert sc.site.preset == "2gw-trainium3" and sc.site.chips == 1_623_040
        assert len(sc.jobs) >= 20
        sizes = [j.chips for j in sc.jobs]
        assert min(sizes) >= 1000 and max(sizes) >= 98_000
    else:
        assert sc.site.chips == 4096 and 6 <= len(sc.jobs) <= 8
        assert all(64 <= j.chips <= 1024 for j in sc.jobs)


@pytest.mark.parametrize(("path", "value", "field"), [
    (("colour",), "blue", "colour"),
    (("tenants", 0, "budget"), 1, "tenants[0].budget"),
    (("jobs", 0, "gpus"), 1, "jobs[0].gpus"),
    (("inference", "deploy", "gpus"), 1, "inference.deploy.gpus"),
    (("inference", "streams", 0, "speed"), 1, "inference.streams[0].speed"),
    (("faults", 0, "when"), 1, "faults[0].when"),
    (("site", "racks"), 1, "site.racks"),
])
def test_unknown_keys_are_refused_with_the_key_named(path: tuple[Any, ...], value: Any, field: str) -> None:
    """An unknown key anywhere is refused naming it (as loadtest scenarios do)."""
    with pytest.raises(InvalidArgument) as exc:
        parse(bad(path, value))
    assert exc.value.field == field
    assert "unknown key" in str(exc.value)


@pytest.mark.parametrize(("path", "value", "field"), [
    (("jobs", 0, "chips"), 8192, "jobs.alpha/a.chips"),  # larger than the 4,096-chip site
    (("jobs", 0, "spec", "hardware", "chip"), "h100-sxm", "jobs.alpha/a.hardware.chip"),
    (("tenants", 0, "name"), "Alpha_Team", "tenants[0].name"),
    (("tenants", 0, "name"), "a" * 36, "tenants[0].name"),
    (("tenants", 1, "weight"), float("nan"), "tenants.beta.weight"),
    (("jobs", 0, "tenant"), "gamma", "jobs[0].tenant"),
    (("jobs", 0, "at_s"), -5, "jobs.alpha/a.at_s"),
    (("jobs", 0, "spec", "parallelism", "tp"), 3, "jobs.alpha/a.hardware.count"),  # not a multiple of TP
    (("jobs", 0, "spec", "model", "preset"), "gpt-9", "jobs.alpha/a.model.preset"),
    (("jobs", 0, "spec", "cost"), {"energy_price_usd_per_kwh": 0.1}, "jobs.alpha/a.cost"),
    (("jobs", 0, "priority"), "high", "jobs.alpha/a.priority"),
    (("jobs", 1, "file"), "examples/no-such-file.yaml", "jobs[1].file"),
    (("faults", 0, "job"), "alpha/nope", "faults[0].job"),
    (("faults", 0, "device_index"), 64, "faults[0].device_index"),
    (("faults", 0, "kind"), "meteor", "faults[0].kind"),
    (("faults", 1, "target"), "spine0", "faults[1].target"),
    (("inference", "tenant"), "nobody", "inference.tenant"),
    (("inference", "max_wall_qps"), 0, "inference.max_wall_qps"),
    (("site", "chips"), True, "site.chips"),
    (("site",), {"preset": "3gw-moon"}, "site.preset"),
    (("duration_s",), float("inf"), "duration_s"),
])
def test_bad_fields_are_refused_with_the_field_named(path: tuple[Any, ...], value: Any, field: str) -> None:
    """A job larger than the site, an invalid tenant name, a bad spec or a dangling fault is refused by field."""
    with pytest.raises(InvalidArgument) as exc:
        parse(bad(path, value))
    assert exc.value.field.startswith(field), exc.value.field


def test_both_file_and_spec_and_duplicates_are_refused() -> None:
    """A job gives exactly one source, and names are unique per tenant."""
    with pytest.raises(InvalidArgument, match="one of them"):
        parse(bad(("jobs", 0, "file"), "examples/train-llama3-8b-small.yaml"))
    twice = copy.deepcopy(GOOD)
    twice["jobs"].append(copy.deepcopy(GOOD["jobs"][0]))
    with pytest.raises(InvalidArgument, match="defined twice"):
        parse(twice)
    with pytest.raises(InvalidArgument, match="listed twice"):
        parse(bad(("tenants", 1, "name"), "alpha"))


def test_limits_bound_what_a_file_may_ask_for() -> None:
    """Repeats past the job limit are refused (the limits are a config value, not magic numbers)."""
    with pytest.raises(InvalidArgument) as exc:
        spec.parse(bad(("jobs", 1, "repeat"), 5), base_dir=ROOT, limits=spec.Limits(max_jobs=4))
    assert exc.value.field.startswith("jobs")


def test_the_file_is_read_with_the_bounded_yaml_loader(tmp_path: pathlib.Path) -> None:
    """An alias bomb is refused by safeyaml before any parsing."""
    p = tmp_path / "bomb.yaml"
    p.write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)))
    with pytest.raises(YamlError):
        spec.load(p)


def _obs() -> dict[str, Any]:
    job = {"name": "jobs/j-1", "step": 10, "steps_total": 100, "goodput": 0.5, "started_s": 100.0,
           "finished_s": 300.0, "lost_s": 20.0, "restart_s": 10.0, "checkpoint_pause_s": 5.0, "failures": 1,
           "restarts": 1, "preemptions": 0, "mfu": 0.4, "compute_s": 1.0, "exposed_comm_s": 0.1, "bubble_s": 0.0,
           "state": "CANCELLED",
           "usage": {"energy_it_j": 3.6e6, "energy_facility_j": 7.2e6, "chip_hours": 2.0, "cost_usd": 10.0}}
    tier = {"tier": "leaf", "links": 8, "mean_utilization": 0.2, "max_utilization": 0.9, "links_down": 0,
            "links_degraded": 1}
    return {"scenario": "t", "site": {"chip": "trainium3", "chips": 4096, "preset": ""}, "speedup_expected": 20,
            "speedup_stack": 20.0, "wall_s": 10.0, "virtual_s": 200.0, "end_s": 300.0,
            "jobs": [{"key": "alpha/a", "tenant": "alpha", "name": "a", "chips": 64, "at_s": 0.0, "job": job,
                      "state_at_end": "RUNNING", "step_samples": [1.2, 1.0], "estimate_step_s": 1.0,
                      "estimate_mfu": 0.46},
                     {"key": "beta/b", "tenant": "beta", "name": "b", "chips": 128, "at_s": 0.0, "job": {},
                      "error": "RESOURCE_EXHAUSTED: quota", "step_samples": [], "estimate_step_s": 2.0,
                      "estimate_mfu": 0.46}],
            "tenants": [{"name": "alpha", "id": "alpha-1234", "weight": 2.0, "chip_hours_share": 1.0,
                         "usage": job["usage"]},
                        {"name": "beta", "id": "beta-1234", "weight": 1.0, "chip_hours_share": 0.0, "usage": {}}],
            "link_samples": [{"t_s": 0, "tiers": [tier]}, {"t_s": 1, "tiers": [{**tier, "mean_utilization": 0.4}]}],
            "inference": {}, "faults": []}


def test_the_report_computes_goodput_slowdown_energy_and_tiers() -> None:
    """Slowdown is the live mean over the idle estimate; tenant goodput is useful over allocated chip-seconds."""
    rep = report.build(_obs())
    a, b = rep["jobs"]
    assert a["mean_step_s"] == pytest.approx(1.1) and a["slowdown"] == pytest.approx(0.1)
    assert a["allocated_s"] == 200.0 and a["useful_s"] == 100.0
    assert a["stepping_share"] == pytest.approx((10 * 1.1 + 20.0) / 200.0)
    assert b["slowdown"] is None and b["error"].startswith("RESOURCE_EXHAUSTED")
    alpha = rep["tenants"][0]
    assert alpha["goodput"] == pytest.approx(0.5) and alpha["energy_it_kwh"] == pytest.approx(1.0)
    assert alpha["energy_facility_kwh"] == pytest.approx(2.0)
    assert alpha["lost_chip_hours"] == pytest.approx(20 * 64 / 3600)
    assert rep["tenants"][1]["goodput"] is None
    assert rep["totals"]["chip_hours"] == 2.0 and rep["speedup_reached"] == 20.0
    assert rep["tiers"] == [{"tier": "leaf", "links": 8, "samples": 2, "mean_utilization": pytest.approx(0.3),
                             "sampled_mean_utilization": pytest.approx(0.3), "busy_link_s": None,
                             "bytes_carried": None, "elapsed_s": None, "peak_utilization": 0.9,
                             "max_links_faulty": 1}]
    assert end_to_end_check(rep) == []
    md = report.markdown(rep)
    assert "| alpha/a | 64 | RUNNING | 10/100 | 1.1 | 1 | +10.0% |" in md and "+10.0%" in md


def test_the_reports_tier_utilisation_is_the_fabrics_link_seconds_over_links_times_the_elapsed_time() -> None:
    """With the fabric's cumulative totals read at the start and end, a tier's mean utilisation is their difference
    in link-seconds over (links x elapsed virtual s), whatever the samples saw; bytes carried is the difference."""
    obs = _obs()
    obs["link_totals"] = {
        "start": {"t_s": 100.0, "tiers": {"leaf": {"links": 8, "busy_link_s": 10.0, "bytes_carried": 1e12}}},
        "end": {"t_s": 300.0, "tiers": {"leaf": {"links": 8, "busy_link_s": 410.0, "bytes_carried": 5e12}}},
    }
    (row,) = report.build(obs)["tiers"]
    assert row["mean_utilization"] == pytest.approx(400.0 / (8 * 200.0))
    assert row["sampled_mean_utilization"] == pytest.approx(0.3) and row["peak_utilization"] == 0.9
    assert row["busy_link_s"] == pytest.approx(400.0) and row["bytes_carried"] == pytest.approx(4e12)
    assert row["elapsed_s"] == 200.0
    assert "| leaf | 8 | 25.000% | 4 | 90.0% | 2 | 30.000% | 1 |" in report.markdown(report.build(obs))


def test_the_cli_checks_a_file_and_refuses_a_bad_one_naming_the_field(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`gigacluster scenario check` summarises a good file; a bad file exits 2 naming the field, no stack needed."""
    from gigacluster.cli.main import main

    assert main(["scenario", "check", str(ROOT / "examples" / "gigawatt-small.yaml")]) == 0
    assert "7 jobs" in capsys.readouterr().out
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nsite: {chip: trainium3, chips: 64}\nduration_s: 10\ntenants: [{name: Bad!}]\n")
    assert main(["scenario", "run", str(p), "--cluster", "nonexistent"]) == 2
    assert "tenants[0].name" in capsys.readouterr().err


def test_a_chip_fault_finds_its_device_across_an_instances_ranges() -> None:
    """device_index counts through the instance's ranges in order, as the job's ranks do."""
    ranges = [common_pb2.DeviceRange(start=64, end=72), common_pb2.DeviceRange(start=128, end=136)]
    assert [nth_device(ranges, i) for i in (0, 7, 8, 15)] == [64, 71, 128, 135]


def test_the_parser_and_the_report_import_no_grpc() -> None:
    """spec and report are pure (only the runner talks to the stack): importing them loads no grpc."""
    import subprocess
    import sys

    code = ("import sys, gigacluster.scenario.spec, gigacluster.scenario.report; "
            "print(sorted(m for m in sys.modules if m == 'grpc' or m.startswith('grpc.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
