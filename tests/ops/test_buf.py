"""buf lint and buf breaking (FILE) against the committed baseline, when the buf CLI is available.

.ci/run and the README's test command install buf from the npm registry (tests/ops/buftool.py says
where the tests look); without it the tests skip (the CI step runs the same commands regardless).
"""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import pytest

from tests.ops.buftool import buf_exe

pytestmark = pytest.mark.contract

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASELINE = ROOT / "protos" / "baseline" / "v1.binpb"


def _run(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([buf_exe(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_buf_config_is_v2_standard_lint_and_file_breaking() -> None:
    """buf.yaml is v2 with the module at protos/, buf's standard lint rules and FILE breaking rules."""
    import yaml

    cfg = yaml.safe_load((ROOT / "buf.yaml").read_text())
    assert cfg["version"] == "v2"
    assert cfg["modules"] == [{"path": "protos"}]
    assert cfg["lint"]["use"] == ["STANDARD"]
    assert cfg["breaking"]["use"] == ["FILE"]
    assert BASELINE.is_file() and BASELINE.stat().st_size > 1000


def test_buf_lint_passes() -> None:
    """The protos pass buf lint with the configured (documented) exceptions."""
    r = _run("lint")
    assert r.returncode == 0, r.stdout + r.stderr


def test_buf_breaking_against_baseline_passes() -> None:
    """The current protos break nothing at the FILE level against the committed baseline image."""
    r = _run("breaking", "--against", str(BASELINE))
    assert r.returncode == 0, r.stdout + r.stderr


def test_buf_breaking_catches_a_removed_field(tmp_path: pathlib.Path) -> None:
    """The guard bites: deleting a field from a copy of the protos fails buf breaking against the baseline."""
    shutil.copytree(ROOT / "protos", tmp_path / "protos", ignore=shutil.ignore_patterns("baseline"))
    shutil.copy(ROOT / "buf.yaml", tmp_path / "buf.yaml")
    proto = tmp_path / "protos" / "gigacluster" / "router" / "v1" / "router.proto"
    text = proto.read_text()
    edited = re.sub(r"\n\s*uint32 max_queue = 15;", "", text, count=1)
    assert edited != text
    proto.write_text(edited)
    r = _run("breaking", "--against", str(BASELINE), cwd=tmp_path)
    assert r.returncode != 0
    assert "max_queue" in (r.stdout + r.stderr)
