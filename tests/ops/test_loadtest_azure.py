"""The Azure LLM inference trace 2023 replay: the CSV reader (refusals name the row), time and rate scaling
as values, the token bounds, the shipped subset and scenarios, the bounded scenario loader, and the SLO
goodput arithmetic of the report."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest

from gigacluster.errors import InvalidArgument
from gigacluster.loadtest import azure, report, runner, scenario, schedule
from gigacluster.loadtest.drivers import Result
from gigacluster.safeyaml import YamlError

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATA = ROOT / "loadtest" / "data" / "azure-llm-inference-2023"
HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _csv(*rows: str) -> str:
    return HEAD + "".join(r + "\n" for r in rows)


def test_reader_parses_100ns_timestamps_and_counts_relative_to_the_first_row() -> None:
    """Three rows (7 fraction digits, one out of order) become seconds since the earliest row, sorted, with
    their token counts; extra columns and blank lines are ignored and column order follows the header."""
    tr = azure.parse(_csv("2023-11-16 18:17:04.0319600,3180,8", "2023-11-16 18:17:03.9799600,4808,10", "",
                          "2023-11-16 18:18:03.9799600,110,27"))
    assert tr.t_s.tolist() == pytest.approx([0.0, 0.052, 60.0], abs=1e-6)
    assert tr.context_tokens.tolist() == [4808, 3180, 110] and tr.generated_tokens.tolist() == [10, 8, 27]
    swapped = azure.parse("GeneratedTokens,x,TIMESTAMP,ContextTokens\n5,y,2023-11-16 00:00:01,7\n")
    assert swapped.context_tokens.tolist() == [7] and swapped.generated_tokens.tolist() == [5]


@pytest.mark.parametrize(("text", "field", "needle"), [
    (_csv("2023-11-16 18:17:03.98,4808,10", "2023-11-16 18:17:04.03,-3,8"), "ContextTokens", "line 3"),
    (_csv("2023-11-16 18:17:03.98,4808,-1"), "GeneratedTokens", "line 2"),
    (_csv("2023-11-16 18:17:03.98,4808,10", "yesterday,1,1"), "TIMESTAMP", "line 3"),
    (_csv("2023-11-16 18:17:03.98,4808,10", "2023-11-16 18:17:04.03,12.5,8"), "ContextTokens", "line 3"),
    (_csv("2023-11-16 18:17:03.98,4808"), "arrival.path", "line 2"),
    ("TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.98,4808\n", "GeneratedTokens", "no GeneratedTokens column"),
    ("", "arrival.path", "is empty"),
])
def test_reader_refuses_a_bad_row_or_header_naming_it(text: str, field: str, needle: str) -> None:
    """A negative or non-integer token count, a bad timestamp, a short row or a missing column is refused with
    InvalidArgument naming the column and the row's line (or the missing column)."""
    with pytest.raises(InvalidArgument) as ei:
        azure.parse(text, source="t.csv")
    assert ei.value.field == field and needle in str(ei.value), str(ei.value)


def test_reader_bounds_the_file_size(tmp_path: pathlib.Path) -> None:
    """A file above max_bytes is refused before it is read, and a missing file is InvalidArgument, not OSError."""
    f = tmp_path / "t.csv"
    f.write_text(_csv("2023-11-16 18:17:03.98,1,1"))
    with pytest.raises(InvalidArgument, match="at most 10"):
        azure.read(f, max_bytes=10)
    with pytest.raises(InvalidArgument, match="cannot read"):
        azure.read(tmp_path / "absent.csv")


def _trace(n: int, gap_s: float = 1.0) -> azure.Trace:
    return azure.Trace(np.arange(n) * gap_s, np.arange(1, n + 1) * 100, np.arange(1, n + 1))


def test_speed_start_and_window_select_and_compress_trace_time() -> None:
    """Rows every 1 s: start 10 s, window 20 s, speed 10 sends rows 10..29 every 0.1 wall s from 0; a 1.5 s
    duration cuts the same replay at 15 rows."""
    t, ctx, gen = azure.replay(_trace(100), speed=10, start_s=10, window_s=20)
    assert t.tolist() == pytest.approx(np.arange(20) * 0.1)
    assert ctx.tolist() == list(range(1100, 3001, 100)) and gen.tolist() == list(range(11, 31))
    t2, _, _ = azure.replay(_trace(100), speed=10, start_s=10, window_s=20, duration_s=1.5)
    assert t2.size == 15 and t2[-1] == pytest.approx(1.4)


@pytest.mark.parametrize(("scale", "count"), [(0.5, 50), (0.25, 25), (1 / 3, 33), (1.0, 100), (2.0, 200), (2.5, 250)])
def test_rate_scale_thins_or_replicates_to_exactly_floor_n_times_scale(scale: float, count: int) -> None:
    """100 rows at rate_scale s give exactly floor(100 s) arrivals, deterministically (same call, same output)."""
    a = azure.replay(_trace(100), rate_scale=scale)
    assert a[0].size == count
    assert all(np.array_equal(x, y) for x, y in zip(a, azure.replay(_trace(100), rate_scale=scale), strict=True))


def test_thinning_keeps_every_other_row_and_replicas_split_the_gap_to_the_next_row() -> None:
    """At 0.5 rows 2, 4, 6 ... are kept (times 1, 3, 5 s); at 2.0 each row is sent at its time and half-way to
    the next (0, 0.5, 1, 1.5 ... s), carrying its own token counts; the last row's replicas share its time."""
    t, ctx, _ = azure.replay(_trace(6), rate_scale=0.5)
    assert t.tolist() == [1.0, 3.0, 5.0] and ctx.tolist() == [200, 400, 600]
    t, ctx, gen = azure.replay(_trace(3), rate_scale=2.0)
    assert t.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0, 2.0]
    assert ctx.tolist() == [100, 100, 200, 200, 300, 300] and gen.tolist() == [1, 1, 2, 2, 3, 3]


def test_target_qps_sets_the_windows_mean_wall_rate() -> None:
    """1,000 rows over 1,000 s at speed 10 and a 100 s duration aimed at 2 req/s give 200 arrivals in 100 wall s
    (20 req/s: 2,000); with no duration the window is the trace's 999 s span, so 2 req/s gives floor(199.8)."""
    t, _, _ = azure.replay(_trace(1000), speed=10, duration_s=100, target_qps=2)
    assert t.size == 200 and t[-1] < 100
    t, _, _ = azure.replay(_trace(1000), speed=10, duration_s=100, target_qps=20)
    assert t.size == 2000
    assert azure.replay(_trace(1000), speed=10, target_qps=2)[0].size == 199


def test_prompts_are_cut_to_what_the_router_accepts() -> None:
    """Prompt + output never exceed the context (8,192): a 14,050-token context with 1,000 output tokens
    sends 7,192 prompt tokens; max_prompt_tokens caps further; a 0 count takes the stream's default."""
    sc = _scenario()
    s = sc.streams[0]
    p, o = schedule.bound_tokens(s, np.array([14050, 100, 0, 9000]), np.array([1000, 0, 5, 9000]))
    assert p.tolist() == [7192, 100, 128, 1] and o.tolist() == [1000, 32, 5, 8191]
    s2 = scenario.Stream(name="x", kind="generate", arrival=s.arrival, max_prompt_tokens=500)
    assert schedule.bound_tokens(s2, np.array([14050]), np.array([10]))[0].tolist() == [500]


def _scenario(**arrival: object) -> scenario.Scenario:
    return scenario.parse({
        "name": "t", "duration_s": 60, "deploy": {"deployment_id": "m"},
        "streams": [{"name": "conv", "kind": "generate", "arrival": {
            "type": "azure_csv", "path": str(DATA / "AzureLLMInferenceTrace_conv.csv"), **arrival}}]})


def test_shipped_subset_is_the_first_30_minutes_and_small() -> None:
    """The shipped CSVs are 5,740 (code) and 10,101 (conv) rows within 30 min, together under 1 MB, and
    carry the CC-BY 4.0 license with the Splitwise citation."""
    code = azure.read(DATA / "AzureLLMInferenceTrace_code.csv")
    conv = azure.read(DATA / "AzureLLMInferenceTrace_conv.csv")
    assert (len(code), len(conv)) == (5740, 10101)
    assert code.span_s < 1800 and conv.span_s < 1800 and conv.span_s > 1790
    assert sum(f.stat().st_size for f in DATA.glob("*.csv")) < 1 << 20
    lic = (DATA / "LICENSE.md").read_text()
    assert "CC BY 4.0" in lic and "Splitwise: Efficient generative LLM inference using phase splitting" in lic


def test_azure_scenarios_offer_the_target_rate_from_the_trace() -> None:
    """azure-conv and azure-code each offer 2 req/s x 60 s = 120 arrivals, sorted within 60 s, with the trace's
    own token counts (conv's first row: 374 context, 44 generated tokens, kept at thinning 1 in ~27.5)."""
    for name in ("azure-conv", "azure-code"):
        sc = scenario.load(ROOT / "loadtest" / f"{name}.yaml")
        tl = schedule.build(sc)
        assert len(tl) == 120 and np.all(np.diff(tl.t_s) >= 0) and tl.t_s[-1] < 60
        assert tl.prompt_tokens.min() >= 1 and np.all(tl.prompt_tokens + tl.max_tokens <= 8192)
    tl = schedule.build(_scenario(speed=1, window_s=5))
    assert tl.prompt_tokens.tolist()[0] == 374 and tl.max_tokens.tolist()[0] == 44


@pytest.mark.parametrize(("data", "field"), [
    ({"rate_scale": 0}, "arrival.rate_scale"),
    ({"speed": -1}, "arrival.speed"),
    ({"target_qps": 2, "rate_scale": 0.5}, "arrival.target_qps"),
    ({"start_s": -5}, "arrival.start_s"),
    ({"speed": float("nan")}, "arrival.speed"),
    ({"sped": 10}, "streams.conv.arrival.sped"),
])
def test_bad_azure_arrivals_fail_naming_the_field(data: dict[str, object], field: str) -> None:
    """Zero, negative, non-finite or conflicting scaling and a misspelt arrival key are refused by name."""
    with pytest.raises(InvalidArgument) as ei:
        _scenario(**data)
    assert ei.value.field == field, str(ei.value)


@pytest.mark.parametrize(("patch", "field"), [
    ({"slo": {"ttft_s": 0.2, "tpot": 0.1}}, "slo.tpot"),
    ({"slo": {"ttft_s": 0}}, "slo.ttft_s"),
    ({"rate": 3}, "rate"),
    ({"deploy": {"deployment_id": "m", "replica": 2}}, "deploy.replica"),
    ({"streams": [{"name": "a", "kind": "generate", "arrival": {}, "max_token": 3}]}, "streams[0].max_token"),
    ({"streams": [{"name": "a", "kind": "generate", "arrival": {"type": "poisson", "speed": 2}}]}, "arrival.speed"),
])
def test_unknown_or_bad_keys_anywhere_are_refused_by_name(patch: dict[str, object], field: str) -> None:
    """An unknown key in the scenario, its deploy, a stream or an slo, a bad SLO value, or a CSV-only key on a Poisson
    arrival is refused with InvalidArgument whose field names it."""
    data: dict[str, object] = {"name": "t", "deploy": {"deployment_id": "m"},
                               "streams": [{"name": "a", "kind": "generate", "arrival": {}}]}
    data.update(patch)
    with pytest.raises(InvalidArgument) as ei:
        scenario.parse(data)
    assert ei.value.field == field, str(ei.value)


def test_scenario_files_load_through_the_bounded_yaml_loader(tmp_path: pathlib.Path) -> None:
    """A billion-laughs scenario file is refused by safeyaml's alias bound, not expanded."""
    f = tmp_path / "bomb.yaml"
    f.write_text("a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [" + ", ".join([f"*{p}"] * 10) + "]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)))
    with pytest.raises(YamlError, match="alias"):
        scenario.load(f)


def test_tpot_slo_attainment_and_goodput_arithmetic(tmp_path: pathlib.Path) -> None:
    """Over a 10 s window, 5 offered: (TTFT 0.1 s, 11 tokens in 1.1 s: TPOT 0.1 s) meets both at the limits,
    (0.3 s) misses TTFT, (0.1 s, TPOT 0.2 s) misses TPOT, a 1-token answer has TPOT 0 and meets, an error
    misses: 2 met, attainment 40%, goodput 0.2 req/s; the table row, JSON and results lines carry them."""
    sc = scenario.parse({"name": "t", "duration_s": 10, "deploy": {"deployment_id": "m"},
                         "slo": {"ttft_s": 0.25, "tpot_s": 0.1},
                         "streams": [{"name": "a", "kind": "generate", "arrival": {}},
                                     {"name": "b", "kind": "generate", "arrival": {},
                                      "slo": {"ttft_s": 1, "tpot_s": 1}}]})
    rs = [Result(0, 0.0, ttft_s=0.25, e2e_s=1.25, tokens=11), Result(0, 1.0, ttft_s=0.3, e2e_s=0.35, tokens=2),
          Result(0, 2.0, ttft_s=0.1, e2e_s=2.1, tokens=11), Result(0, 3.0, ttft_s=0.05, e2e_s=0.05, tokens=1),
          Result(0, 4.0, status="UNAVAILABLE"), Result(1, 0.0, ttft_s=0.3, e2e_s=0.4, tokens=2)]
    assert [report.tpot_s(r) for r in rs[:4]] == pytest.approx([0.1, 0.05, 0.2, 0.0])
    assert math.isnan(report.tpot_s(rs[4]))
    summary = report.summarize(sc, rs, wall_s=10.0)
    a, b = summary["streams"]
    assert a["slo"] == {"ttft_s": 0.25, "tpot_s": 0.1, "offered": 5, "met_ttft": 3, "met_tpot": 3, "met": 2,
                        "attainment_pct": 40.0, "goodput_per_s": 0.2}
    assert b["slo"]["met"] == 1 and b["slo"]["attainment_pct"] == 100.0 and b["slo"]["ttft_s"] == 1
    assert a["tpot"]["count"] == 4
    row = next(line for line in report.table(summary).splitlines() if line.startswith("| a | 250 |"))
    assert row == "| a | 250 | 100 | 5 | 3 | 3 | 2 | 40.0 | 0.20 | 0.40 |"
    paths = report.write(tmp_path, sc, summary, rs)
    assert json.loads(paths[0].read_text())["streams"][0]["slo"]["goodput_per_s"] == 0.2
    assert json.loads(paths[2].read_text().splitlines()[2])["tpot_s"] == pytest.approx(0.2)
    assert paths[3].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_slo_defaults_and_overrides() -> None:
    """With no slo the scenario uses DistServe's chatbot SLO (0.25 s, 0.1 s); with_slo (the CLI's --slo-ttft and
    --slo-tpot) replaces only the objectives given, and a stream's own slo wins over the scenario's."""
    sc = scenario.parse({"name": "t", "deploy": {"deployment_id": "m"},
                         "streams": [{"name": "a", "kind": "generate", "arrival": {}},
                                     {"name": "b", "kind": "generate", "arrival": {}, "slo": {"tpot_s": 0.05}}]})
    assert (sc.slo.ttft_s, sc.slo.tpot_s) == (0.25, 0.1)
    sc2 = sc.with_slo(ttft_s=2.0)
    assert (sc2.slo_of(sc2.streams[0]).ttft_s, sc2.slo_of(sc2.streams[0]).tpot_s) == (2.0, 0.1)
    assert (sc2.slo_of(sc2.streams[1]).ttft_s, sc2.slo_of(sc2.streams[1]).tpot_s) == (0.25, 0.05)


def test_synthetic_prompts_depend_on_seed_and_arrival_index_only() -> None:
    """Arrival 7's prompt has the asked length, is the same on every call (whatever came before), differs from
    arrival 8's, and its ids are within [100, 30000), inside every preset's vocabulary."""
    a = runner.synthetic_prompt(23, 7, 1000)
    assert len(a) == 1000 and a == runner.synthetic_prompt(23, 7, 1000)
    assert a != runner.synthetic_prompt(23, 8, 1000) and a != runner.synthetic_prompt(24, 7, 1000)
    assert min(a) >= 100 and max(a) < 30000


def test_explicit_stream_sizes_are_not_cut() -> None:
    """A Poisson stream's own prompt_tokens and max_tokens go to the router as written (the router refuses what
    it must); only trace rows are cut to the context."""
    sc = scenario.parse({"name": "t", "duration_s": 10, "deploy": {"deployment_id": "m"},
                         "streams": [{"name": "a", "kind": "generate", "arrival": {"type": "uniform", "rate_per_s": 1},
                                      "prompt_tokens": 8000, "max_tokens": 500}]})
    tl = schedule.build(sc)
    assert set(tl.prompt_tokens.tolist()) == {8000} and set(tl.max_tokens.tolist()) == {500}
