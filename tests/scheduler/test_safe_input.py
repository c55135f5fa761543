"""Safe input: the bounded YAML loader, and the CLI's answer to bad job files (one line, exit 2,
the field named, no traceback), checked before any connection is made."""

from __future__ import annotations

import json
import math
import pathlib
import tracemalloc

import pytest

from gigacluster import safeyaml
from gigacluster.cli import client_cmds
from gigacluster.cli.main import main

GOOD = ("model: {preset: llama3-8b, seq_len: 2048}\nbatch: {global_batch: 64}\nparallelism: {tp: 8}\n"
        "steps: 30\n")


def laughs(levels: int = 9) -> str:
    s = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    prev = "a"
    for n in "bcdefghijk"[: levels - 1]:
        s += f"{n}: &{n} [{','.join(['*' + prev] * 9)}]\n"
        prev = n
    return s


def test_billion_laughs_is_refused_cheaply() -> None:
    """A billion-laughs document is refused before it is expanded (it cost the CLI 1 GB)."""
    tracemalloc.start()
    with pytest.raises(safeyaml.YamlError, match="expands to more than"):
        safeyaml.loads(laughs())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 20 * 2**20


def test_many_aliases_are_refused() -> None:
    """More alias uses than the limit are refused even if they expand to little."""
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * 101) + "]\n"
    with pytest.raises(safeyaml.YamlError, match="alias"):
        safeyaml.loads(text)


def test_modest_aliases_still_work() -> None:
    """Ordinary anchors and aliases load as PyYAML's safe loader would."""
    assert safeyaml.loads("a: &x {k: 1}\nb: *x\n") == {"a": {"k": 1}, "b": {"k": 1}}


@pytest.mark.parametrize("text", ["[" * 100_000, "a:\n" + "".join("  " * i + "b:\n" for i in range(1, 200))])
def test_deep_nesting_is_refused(text: str) -> None:
    """Deep flow or block nesting is refused at the depth limit, not with a RecursionError."""
    with pytest.raises(safeyaml.YamlError):
        safeyaml.loads(text)


def test_recursive_alias_and_size_limits() -> None:
    """A self-referencing node and an oversize document are refused."""
    with pytest.raises(safeyaml.YamlError, match="recursive"):
        safeyaml.loads("a: &a [*a]")
    with pytest.raises(safeyaml.YamlError, match="larger than"):
        safeyaml.loads("a: 1\n" * 10, limits=safeyaml.Limits(max_bytes=10))


def test_arbitrary_objects_are_refused() -> None:
    """Python object tags stay refused (safe loader underneath), as one line."""
    with pytest.raises(safeyaml.YamlError) as err:
        safeyaml.loads("!!python/object/apply:os.system ['true']")
    assert "\n" not in str(err.value)


BAD_FILES: dict[str, tuple[bytes, str]] = {
    "count_negative": ((GOOD + "hardware: {chip: h100-sxm, count: -8}\n").encode(), "spec.hardware.count"),
    "count_fraction": ((GOOD + "hardware: {chip: h100-sxm, count: 8.5}\n").encode(), "spec.hardware.count"),
    "count_word": ((GOOD + "hardware: {chip: h100-sxm, count: eight}\n").encode(), "spec.hardware.count"),
    "empty": (b"", "spec"),
    "list": (b"- a\n- b\n", "spec"),
    "binary": (bytes(range(256)) * 4, "not UTF-8"),
    "model_string": (b"model: llama3-8b\nbatch: {global_batch: 64}\nhardware: {chip: h100-sxm, count: 8}\n",
                     "spec.model"),
    "huge_priority": ((GOOD + "hardware: {chip: h100-sxm, count: 8}\npriority: 1e300\n").encode(), "priority"),
    "deep_nesting": (("a: " + "[" * 50_000 + "]" * 50_000 + "\n").encode(), "nested deeper"),
    "billion_laughs": (laughs().encode(), "expands to more than"),
    "pue_nan": ((GOOD + "hardware: {chip: h100-sxm, count: 8}\npue: .nan\n").encode(), "spec.pue"),
    "unknown_key": ((GOOD + "hardware: {chip: h100-sxm, count: 8}\nbogus: 1\n").encode(), "spec.bogus"),
    "huge_queue": ((GOOD + "hardware: {chip: h100-sxm, count: 8}\nqueue: " + "q" * 100_000 + "\n").encode(),
                   "queue"),
}


@pytest.mark.parametrize("name", sorted(BAD_FILES))
def test_cli_submit_bad_file_is_one_line_and_exit_2(name: str, tmp_path: pathlib.Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each bad job file gives exit 2 and one short stderr line naming the field; no traceback, no connection."""
    data, needle = BAD_FILES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    monkeypatch.setenv("GIGACLUSTER_API_KEY", "gk_unused")
    monkeypatch.setattr(client_cmds, "_connect", lambda args: pytest.fail("connected for a bad file"))
    rc = main(["submit", str(path)])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: INVALID_ARGUMENT: ")
    assert needle in lines[0] and "Traceback" not in err and len(lines[0]) <= 320


def test_cli_estimate_train_reads_with_the_safe_loader(tmp_path: pathlib.Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """estimate train refuses a billion-laughs spec with exit 2 too."""
    path = tmp_path / "l.yaml"
    path.write_text(laughs())
    assert main(["estimate", "train", str(path)]) == 2
    assert "expands to more than" in capsys.readouterr().err


def test_json_output_never_prints_nan() -> None:
    """Non-finite floats become null, so `jobs --json` is strict JSON."""
    text = client_cmds.dumps([{"cost_usd": math.nan, "eta_s": math.inf, "mfu": 0.5, "x": [-math.inf]}])
    assert json.loads(text) == [{"cost_usd": None, "eta_s": None, "mfu": 0.5, "x": [None]}]
    assert "NaN" not in text and "Infinity" not in text
