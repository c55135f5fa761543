"""The validation sweep (tests/model/sweep.py) reports what a model change moved."""

from __future__ import annotations

import pathlib

from .sweep import FAMILIES, compare, summary


def test_the_sweep_covers_every_training_validation_module() -> None:
    """Every tests/model/test_validation_*.py family (and the Llama 3 calibration rows) is swept."""
    here = pathlib.Path(__file__).parent
    modules = {p.stem.removeprefix("test_validation_") for p in here.glob("test_validation_*.py")}
    assert modules <= set(FAMILIES) and "llama3" in FAMILIES


def test_compare_lists_rows_that_moved_or_crossed_the_band() -> None:
    before = {"f": {"a": 0.050, "b": 0.095, "c": 0.200}}
    after = {"f": {"a": 0.051, "b": 0.105, "c": 0.150, "d": 0.0}}
    lines = compare(before, after, threshold=0.002)
    assert not any(" a " in line for line in lines)  # moved 0.1 point: under the threshold
    assert any(" b " in line and "crossed 10%" in line for line in lines)
    assert any(" c " in line and "crossed" not in line for line in lines)
    assert any(" d " in line and "new" in line for line in lines)
    assert "within 10%   2" in summary(after)[0]
