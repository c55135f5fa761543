"""Commands run from a clone write nothing into the working tree by default."""

from __future__ import annotations

import pathlib

import pytest

from gigacluster.cli.loadtest_cmd import default_out

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_loadtest_output_defaults_to_the_cluster_state_dir(tmp_path: pathlib.Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --out, loadtest writes under GIGACLUSTER_HOME/<cluster>/loadtest, not ./loadtest-out."""
    monkeypatch.setenv("GIGACLUSTER_HOME", str(tmp_path))
    monkeypatch.chdir(ROOT)
    out = default_out("smoke", "local")
    assert out.parent == tmp_path / "local" / "loadtest"
    assert out.name.startswith("smoke-")
    assert ROOT not in out.parents


def test_gitignore_covers_outputs_written_into_a_clone() -> None:
    """An explicit --out loadtest-out or report's default ./report never shows up as untracked files."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    assert "/loadtest-out/" in lines and "/report/" in lines
