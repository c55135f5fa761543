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
    (vLLM streams a group's tokens at its end), while a lone request is not held (nothing else runs); each
    scheduler call (every step with 1 scheduler step; the prefill and every group's first step with 4) pays
    v0's host time per sequence in it."""
    from gigacluster.inference.cost import v0_schedule_seq_s

    c = v0_schedule_seq_s()

    ends = {}
    for steps in (1, 4):
        eng = ReplicaEngine(ReplicaConfig(LLAMA8B, "h100-sxm", num_scheduler_steps=steps))
        ends[steps], _ = _drive(eng, {0.0: [make_req("short", 50, 3), make_req("long", 50, 40, seed=1)]})
    step = (ends[1]["long"] - ends[1]["short"]) / 37 - c  # one decode iteration at batch 1, less its scheduler call
    # "short" is seen 2 steps later, and its 2nd step is not a scheduler call with 4 steps (2 sequences in it).
    assert ends[4]["short"] - ends[1]["short"] == pytest.approx(2 * step - 2 * c, rel=0.05)
    # Scheduler calls per sequence: 1 step: prefill 2 + 2 x 2 + 37 = 43; 4 steps: prefill 2 + group 2 + 9 groups = 13.
    assert ends[4]["long"] == pytest.approx(ends[1]["long"] - 30 * c, rel=1e-9)


def test_a_scheduler_call_costs_v0s_host_time_per_running_sequence() -> None:
    """vLLM v0's path pays serving.v0_schedule_seq_s per running sequence at each scheduler call (100 us: vLLM
    issue 6801, 20 ms between two steps at batch 200): every step with one scheduler step, a group's first step
    with multi-step; v1's path (chunked prefill, steps 0 here) never does."""
    from gigacluster.inference.cost import iteration_overhead_s, v0_schedule_seq_s

    assert v0_schedule_seq_s() == pytest.approx(1e-4)
    hosts = {}
    for steps in (0, 1, 4):
        eng = ReplicaEngine(ReplicaConfig(LLAMA8B, "h100-sxm", num_scheduler_steps=max(steps, 1),
                                          chunked_prefill=steps == 0))
        for i in range(8):
            eng.admit(make_req(f"r{i}", 50, 20, seed=i), 0.0)
        t, hosts[steps] = 0.0, []
        for _ in range(6):  # the prefill, then 5 decode steps
            it = eng.next_iteration(t)
            assert it is not None
            t += it.predicted_s
            eng.complete_batch(it, t)
            hosts[steps].append(it.host_s)
    base, extra = iteration_overhead_s(), 8 * v0_schedule_seq_s()
    assert hosts[0] == pytest.approx([base] * 6)
    assert hosts[1] == pytest.approx([base + extra] * 6)
    assert hosts[4] == pytest.approx([base + extra, base + extra, base, base, base, base + extra])


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


def _ends_and_summaries(cfg: ReplicaConfig, reqs: list[object]) -> tuple[list[float], dict[str, object]]:
    """Iteration end times and finished requests' summaries of ``reqs`` sent at once to one engine."""
    eng = ReplicaEngine(cfg)
    for r in reqs:
        eng.admit(r, 0.0)  # type: ignore[arg-type]
    t, ends, out = 0.0, [], {}
    while (it := eng.next_iteration(t)) is not None:
        t += it.predicted_s
        ends.append(t)
        out.update({s.request_id: s for s in eng.complete_batch(it, t).summaries})
    return ends, out


def test_async_output_shows_an_iterations_tokens_when_the_next_one_ends() -> None:
    """vLLM v0.6's asynchronous output processor (PRs 7049, 8050): the client sees an iteration's first tokens and
    finished requests when the next iteration ends; the iteration that leaves the engine idle delivers its own."""
    reqs = [make_req("a", 50, 3), make_req("b", 80, 6, seed=1)]
    ends, now = _ends_and_summaries(ReplicaConfig(LLAMA8B, "h100-sxm"), reqs)
    lag_ends, late = _ends_and_summaries(ReplicaConfig(LLAMA8B, "h100-sxm", async_output=True), reqs)
    assert lag_ends == ends and len(ends) == 6  # the engine's own timing is unchanged
    assert [now["a"].first_token_s, now["a"].finish_s, now["b"].finish_s] == [ends[0], ends[2], ends[5]]
    assert [late["a"].first_token_s, late["b"].first_token_s] == [ends[1], ends[1]]
    assert late["a"].finish_s == ends[3]  # finished in the 3rd iteration, seen when the 4th ends
    assert late["b"].finish_s == ends[5]  # the last iteration drains the engine: seen at once
