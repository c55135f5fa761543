"""The scenario report's contention section (pure): steps and requests split by whether the other side ran, and
the steady inference streams a scenario file can ask for."""

from __future__ import annotations

import math
import pathlib
from typing import Any

import pytest

from gigacluster.errors import InvalidArgument
from gigacluster.scenario import contention, spec

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _step(start: float, a2a: float, length: float = 1.0) -> dict[str, Any]:
    return {"start_s": start, "step_time_s": length, "exposed_comm_s": a2a, "comm_s": {"ep_a2a": a2a, "tp": 0.1}}


def _req(arrival: float, ttft: float, tpot: float, e2e: float = 1.0) -> dict[str, Any]:
    return {"arrival_s": arrival, "ok": True, "server_ttft_s": ttft, "server_tpot_s": tpot, "client_ttft_s": ttft,
            "e2e_s": e2e}


def test_steps_and_requests_fall_in_one_phase_each_and_the_ratios_follow() -> None:
    """Steps overlapping the fleet's window count as with the fleet (a2a 0.2 vs 0.1 alone: +100%, peak 3x), requests
    overlapping the job's window as with training (TTFT 0.3 vs 0.1 mean: +200%)."""
    steps = [_step(0, 0.1), _step(1, 0.1), _step(2, 0.1), _step(10, 0.2), _step(11, 0.1), _step(12, 0.3)]
    reqs = [_req(14, 0.1, 0.02), _req(15, 0.1, 0.02), _req(10.5, 0.3, 0.02), _req(11.5, 0.3, 0.04)]
    c = contention.build([{"key": "t/j", "trace": steps}], reqs, speedup=1.0)
    (j,) = c["jobs"]
    assert (j["alone"]["steps"], j["with_fleet"]["steps"]) == (3, 3)
    assert j["alone"]["mean_a2a_s"] == pytest.approx(0.1) and j["with_fleet"]["mean_a2a_s"] == pytest.approx(0.2)
    assert j["a2a_slowdown"] == pytest.approx(1.0) and j["a2a_peak_ratio"] == pytest.approx(3.0)
    f = c["fleet"]
    assert (f["alone"]["requests"], f["with_training"]["requests"]) == (2, 2)
    assert f["ttft_mean_slowdown"] == pytest.approx(2.0) and f["tpot_mean_slowdown"] == pytest.approx(0.5)
    assert c["fleet_window_s"] == [10.5, 16] and c["job_windows_s"] == [[0, 13]]
    assert any("Contention" in line for line in contention.markdown(c))


def test_requests_are_with_training_while_a_job_ran_though_its_trace_begins_later() -> None:
    """A trace holds a job's latest steps only: a job that ran from 100 s (stack time; the run began at 100) to the
    end has steps from 5,000 s in its trace, and the fleet's requests at 10-20 s still count as with training
    (its record's started_s and finished_s); without the record they would all count as alone."""
    steps = [_step(5000 + i, 0.1) for i in range(3)]
    reqs = [_req(10, 0.1, 0.02), _req(20, 0.1, 0.02)]
    job = {"key": "t/j", "trace": steps, "job": {"started_s": 100.0, "finished_s": 0.0}}
    c = contention.build([job], reqs, speedup=1.0, v0_s=100.0, end_s=6100.0)
    assert c["job_windows_s"] == [[0.0, 6000.0]]
    assert (c["fleet"]["alone"]["requests"], c["fleet"]["with_training"]["requests"]) == (0, 2)
    old = contention.build([{"key": "t/j", "trace": steps}], reqs, speedup=1.0)
    assert (old["fleet"]["alone"]["requests"], old["fleet"]["with_training"]["requests"]) == (2, 0)


def test_no_section_without_a_fleet_or_steps() -> None:
    """Without requests or without any stepped job the section is empty (and renders as nothing)."""
    assert contention.build([{"key": "t/j", "trace": [_step(0, 0.1)]}], [], 1.0) == {}
    assert contention.build([{"key": "t/j", "trace": []}], [_req(0, 0.1, 0.1)], 1.0) == {}
    assert contention.markdown({}) == []


def test_a_job_without_an_all_to_all_has_no_a2a_ratio() -> None:
    """A dense job's steps have no ep_a2a demand: its all-to-all figures are absent, its step slowdown is not."""
    steps = [{"start_s": 0.0, "step_time_s": 1.0, "comm_s": {}}, {"start_s": 5.0, "step_time_s": 2.0, "comm_s": {}}]
    (j,) = contention.build([{"key": "t/j", "trace": steps}], [_req(4.5, 0.1, 0.1)], 1.0)["jobs"]
    assert j["a2a_slowdown"] is None and j["step_slowdown"] == pytest.approx(1.0)
    assert j["alone"]["mean_a2a_s"] is None or math.isnan(j["alone"]["mean_a2a_s"])


def test_the_example_parses_with_a_steady_stream() -> None:
    """examples/moe-contention.yaml parses: a steady stream of 10 requests/s of 2,048 + 27 tokens, an EP job."""
    sc = spec.load(ROOT / "examples" / "moe-contention.yaml")
    (s,) = sc.inference.streams  # type: ignore[union-attr]
    assert s.steady and (s.rate_per_s, s.prompt_tokens, s.output_tokens) == (10.0, 2048, 27)
    assert sc.inference.deploy["ep"] == 16  # type: ignore[union-attr]
    assert sc.jobs[0].spec["parallelism"]["ep"] == 8


@pytest.mark.parametrize("stream, field", [
    ({"name": "s", "rate_per_s": 1, "prompt_tokens": 10}, "output_tokens"),
    ({"name": "s", "rate_per_s": 1, "prompt_tokens": 5000, "output_tokens": 1, "context_tokens": 4096},
     "prompt_tokens"),
    ({"name": "s", "path": "x.csv", "rate_per_s": 1}, "streams[0]"),
    ({"name": "s"}, "streams[0]"),
])
def test_bad_steady_streams_are_refused_by_field(stream: dict[str, Any], field: str) -> None:
    """A steady stream missing a field, a prompt longer than the context, or a stream that is both kinds is refused
    naming the field."""
    raw = {"name": "x", "site": {"chip": "h100-sxm", "chips": 32}, "duration_s": 10, "tenants": [{"name": "a"}],
           "inference": {"tenant": "a", "deploy": {"deployment_id": "d"}, "streams": [stream]}}
    with pytest.raises(InvalidArgument) as ei:
        spec.parse(raw, base_dir=ROOT)
    assert field in ei.value.field


def test_the_consistency_check_counts_requests_in_the_phases() -> None:
    """A contention section whose phases hold every offered request passes; one that lost a request is named."""
    c = contention.build([{"key": "t/j", "trace": [_step(0, 0.1), _step(10, 0.2)]}],
                         [_req(10.5, 0.1, 0.02), _req(20, 0.1, 0.02)], 1.0)
    assert contention.check(c, 2) == [] and contention.check({}, 5) == []
    assert "2 offered" not in " ".join(contention.check(c, 2)) and "3 offered" in contention.check(c, 3)[0]
