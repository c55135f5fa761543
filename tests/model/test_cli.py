"""The estimate train, compare and plan commands."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gigacluster.cli.main import main
from gigacluster.hw.catalog import facility, get_chip

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def test_estimate_train_json(capsys: pytest.CaptureFixture[str]) -> None:
    """--json prints one object with the step time and its breakdown."""
    rc, out, _ = run(["estimate", "train", str(EXAMPLES / "train-llama3-8b-small.yaml"), "--json"], capsys)
    d = json.loads(out)
    assert rc == 0
    parts = sum(d["breakdown"][k] for k in ("compute_s", "exposed_comm_s", "bubble_s"))
    assert d["step_time_s"] == pytest.approx(parts)


def test_estimate_train_table(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json a readable table names MFU and the time to train."""
    rc, out, _ = run(["estimate", "train", str(EXAMPLES / "llama3-405b-8k.yaml")], capsys)
    assert rc == 0
    assert "MFU" in out and "time to train" in out


def test_invalid_spec_exits_2_naming_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A bad precision exits 2 and the message names the field and the allowed values."""
    f = tmp_path / "bad.yaml"
    f.write_text("model: {preset: llama3-8b}\nbatch: {global_batch: 8}\nhardware: {chip: h100-sxm, count: 8}\n"
                 "precision: fp4\n")
    rc, _, err = run(["estimate", "train", str(f)], capsys)
    assert rc == 2
    assert "precision" in err and "bf16, fp8" in err


def test_does_not_fit_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job that does not fit in HBM exits 2 with the numbers."""
    f = tmp_path / "big.yaml"
    f.write_text("model: {preset: llama3-405b}\nbatch: {global_batch: 8}\nhardware: {chip: h100-sxm, count: 8}\n")
    rc, _, err = run(["estimate", "train", str(f)], capsys)
    assert rc == 2
    assert "GiB" in err


def test_compare_json_and_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """compare runs the same job on each chip and writes a PNG chart."""
    png = tmp_path / "c.png"
    rc, out, _ = run(["compare", str(EXAMPLES / "train-llama3-8b-small.yaml"), "--chips", "trainium3,h100-sxm",
                      "--json", "--png", str(png)], capsys)
    rows = json.loads(out)
    assert rc == 0
    assert [r["chip"] for r in rows] == ["trainium3", "h100-sxm"]
    assert all(r["count"] == 16 for r in rows)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_same_power_scales_counts(capsys: pytest.CaptureFixture[str]) -> None:
    """--same-power gives the lower-power chip more chips for the same provisioned budget."""
    rc, out, _ = run(["compare", str(EXAMPLES / "llama3-405b-8k.yaml"), "--chips", "h100-sxm,b200", "--same-power",
                      "--json"], capsys)
    rows = {r["chip"]: r for r in json.loads(out)}
    assert rc == 0
    assert rows["h100-sxm"]["count"] == 8192
    assert rows["b200"]["count"] + rows["b200"]["idle_chips"] == math.floor(8192 * 820 / 1120)


def test_compare_unknown_chip_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown chip exits 2 and lists the allowed ones."""
    rc, _, err = run(["compare", str(EXAMPLES / "train-llama3-8b-small.yaml"), "--chips", "tpu9"], capsys)
    assert rc == 2
    assert "trainium3" in err


def test_plan_power_budget(capsys: pytest.CaptureFixture[str]) -> None:
    """2 GW of Trainium3 (OpenAI-AWS agreement) feeds floor(2e9 / ((TDP + host) x PUE)) chips."""
    rc, out, _ = run(["plan", "--power-mw", "2000", "--chip", "trainium3", "--json"], capsys)
    d = json.loads(out)
    chip = get_chip("trainium3")
    assert rc == 0
    assert d["chips"] == math.floor(2e9 / ((chip.tdp_w + facility().host_overhead_w_per_chip) * facility().pue_default))
    ref = d["reference_job"]
    assert ref["days_to_train_15t"] == pytest.approx(15e12 / ref["tokens_per_s"] / 86400)
    assert d["whole_cluster_job"]["average_facility_mw"] < 2000


def test_plan_sizes_the_fabric_for_800g_nics(capsys: pytest.CaptureFixture[str]) -> None:
    """2 GW of GB300 (one 800 Gb/s ConnectX-8 per GPU, MLPerf v5.1's GB300 NVL72 system description): the
    estimate's fabric is the smallest tree that holds the job, as ``up`` sizes its own; three tiers of Tomahawk 5
    hold half the 800 Gb/s chips they hold at 400 Gb/s, so the 74,808-chip groups of the whole-cluster job need
    Tomahawk 6 (this exited 2 with "more than a three-tier tomahawk5 tree holds" before)."""
    rc, out, err = run(["plan", "--power-mw", "2000", "--chip", "gb300", "--json"], capsys)
    assert rc == 0, err
    d = json.loads(out)
    assert d["chips"] > 1_000_000 and d["whole_cluster_job"]["tokens_per_s"] > d["reference_job"]["tokens_per_s"]


def test_scheduler_job_file_estimates_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A job file with scheduler-only fields (checkpointing, restarts) estimates as its spec."""
    f = tmp_path / "job.yaml"
    extra = "checkpoint_interval_steps: 10\nmax_restarts: 2\n"
    f.write_text((EXAMPLES / "train-llama3-8b-small.yaml").read_text() + extra)
    rc, out, _ = run(["estimate", "train", str(f), "--json"], capsys)
    assert rc == 0
    assert json.loads(out)["count"] == 16
