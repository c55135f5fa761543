"""vLLM 0.6's API server in front of the engine (a burst waits for it) and v0's multi-step scheduling."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.inference.engine import ReplicaConfig, ReplicaEngine
from gigacluster.inference.frontend import release_times
from gigacluster.inference.sim import simulate
from gigacluster.model import SpecError
from gigacluster.model.arch import preset
from tests.inference.conftest import make_req

LLAMA8B = preset("llama3-8b")


def test_a_burst_is_released_when_the_api_server_has_taken_all_of_it() -> None:
    """Three requests sent at once reach the engine together after 3 x 4 ms; one that finds the server idle
    waits its own 4 ms; one arriving while a burst is taken joins that burst."""
    out = release_times(np.array([0.0, 0.0, 0.0, 0.010, 1.0]), 0.004)
    assert out.tolist() == pytest.approx([0.016, 0.016, 0.016, 0.016, 1.004])


def test_requests_released_together_share_the_first_iteration() -> None:
    """Two requests reaching an idle engine at the same instant are prefilled in one iteration (the
    simulator admits every arrival of that instant before scheduling), so their first tokens coincide."""
    cfg = ReplicaConfig(LLAMA8B, "h100-sxm", chunked_prefill=False, max_prefill_tokens=2048)
    res = simulate(cfg, [make_req("a", 100, 4), make_req("b", 300, 4, seed=1)], keep_requests=True, api_server=False)
    firsts = {s.request_id: s.first_token_s for s in res.requests}
    assert firsts["a"] == firsts["b"] > 0.0


def _drive(eng: ReplicaEngine, arrivals: dict[float, list[object]]) -> tuple[dict[str, float], dict[str, float]]:
    """Run ``eng`` iteration by iteration (1 ms of virtual time per arrival check); finish and start times."""
    t, finish, started = 0.0, {}, {}
    pending = sorted(arrivals.items())
    while True:
        while pending and pending[0][0] <= t:
            for req in pending.pop(0)[1]:
                eng.admit(req, t)  # type: ignore[arg-type]
        it = eng.next_iteration(t)
        if it is None:
            if not pending:
                return finish, started
            t = pending[0][0]
            continue
        for rid, new in zip(it.request_ids, it.new_tokens.tolist(), strict=True):
            if new > 1:
                started.setdefault(rid, t)
        t += it.predicted_s
        for s in eng.complete_batch(it, t).summaries:
            finish[s.request_id] = s.finish_s


def test_multi_step_reports_a_request_at_the_end_of_its_group() -> None:
    """With 4 scheduler steps, a request stopping after its 2nd decode step is seen finished with the 4th
    (vLLM streams a group's tokens at its end), while a lone request is not held (nothing else runs)."""
    ends = {}
    for steps in (1, 4):
        eng = ReplicaEngine(ReplicaConfig(LLAMA8B, "h100-sxm", num_scheduler_steps=steps))
        ends[steps], _ = _drive(eng, {0.0: [make_req("short", 50, 3), make_req("long", 50, 40, seed=1)]})
    step = (ends[1]["long"] - ends[1]["short"]) / 37  # one decode iteration at batch 1-2
    assert ends[4]["short"] - ends[1]["short"] == pytest.approx(2 * step, rel=0.05)
    assert ends[4]["long"] == pytest.approx(ends[1]["long"], rel=1e-9)


def test_multi_step_starts_new_prompts_only_between_groups() -> None:
    """A prompt arriving during a group of 8 decode steps starts after the group, not at the next step."""
    starts = {}
    for steps in (1, 8):
        eng = ReplicaEngine(ReplicaConfig(LLAMA8B, "h100-sxm", num_scheduler_steps=steps))
        _, starts[steps] = _drive(eng, {0.0: [make_req("first", 50, 60)], 0.03: [make_req("late", 50, 5, seed=2)]})
    assert starts[8]["late"] > starts[1]["late"] + 0.01


def test_multi_step_needs_the_v0_scheduler() -> None:
    """vLLM v1 (chunked prefill here) has no multi-step scheduling: the config says so."""
    with pytest.raises(SpecError) as exc:
        ReplicaConfig(LLAMA8B, "h100-sxm", chunked_prefill=True, num_scheduler_steps=4)
    assert exc.value.field == "num_scheduler_steps"
