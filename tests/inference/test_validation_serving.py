"""Serving latency against published vLLM runs (issue 15 item 5), low and high load.

Lambda's runs (tests/inference/lambda_vllm_runs.py: 10, 40, 160 and 320 ShareGPT prompts sent at once to vLLM 0.6,
every request's lengths listed): Llama 3 8B on one H100 SXM or A100 and on two or eight H100s, Llama 3 70B on two,
four or eight H100s and four or eight A100s, Mixtral 8x7B on two or four H100s; OCI's and AMD's MI300X batch
latencies (below).
Targets (the issue's): p50 within 10%, p99 within 20%. A metric the model misses is a strict xfail with
its cause, so a fix shows as an XPASS; the documented errors are held too, so any change shows.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from gigacluster.inference.cost import api_intake_s, api_prompt_token_s
from gigacluster.inference.engine import ReplicaConfig, ReplicaEngine, Request
from gigacluster.inference.sim import simulate
from gigacluster.model.arch import preset
from tests.inference.lambda_vllm_runs import (
    FILE_TOTALS,
    RUNS,
    STEADY_CHUNK_S,
    STEADY_CHUNKS,
    chunk_gaps_s,
    replay_ms,
    run_config,
    run_requests,
)

# Our error per (prompts, metric), held within 3 points (docs/validation.md section 2d, "Published serving latency").
DOCUMENTED: dict[int | str, dict[str, float]] = {
    10: {"ttft_p50": 0.01, "ttft_p99": 0.00, "tpot_p50": 0.01, "e2e_p50": 0.01, "e2e_p99": 0.03},
    40: {"ttft_p50": 0.03, "ttft_p99": 0.08, "tpot_p50": 0.02, "tpot_p99": 0.08, "e2e_p50": 0.02, "e2e_p99": 0.02},
    160: {"ttft_p50": -0.05, "ttft_p99": -0.06, "tpot_p50": -0.01, "tpot_p99": -0.14, "e2e_p50": -0.04,
          "e2e_p99": -0.01},
    320: {"ttft_p50": 0.00, "ttft_p99": 0.14, "tpot_p50": -0.08, "tpot_p99": -0.11, "e2e_p50": -0.04,
          "e2e_p99": -0.03},
    "a100-160": {"ttft_p50": 0.08, "ttft_p99": 0.07, "tpot_p50": -0.03, "tpot_p99": 0.35, "e2e_p50": -0.02,
                 "e2e_p99": -0.08},  # e2e p99 -8.0% -> -7.6% with the A100's paged-decode floor (2f)
}
TTFT_MISS = ("a burst waits for the API server to take every request in it, serving.api_prompt_token_s per prompt "
             "token (10.84 us, calibrated on the 320-prompt burst's earliest first token; the other bursts imply "
             "9.7-13.7 us)")
TPOT_MISS = ("short outputs whose TPOT holds the burst's prefills (p99): 35% long on the A100, where the model's "
             "first gap (a request's first token to its 11th) is 2.82 s against 2.33: the A100's prefill steps are "
             "priced about a quarter slow (the burst's 18 prefill steps take 2.54 s against 2.06; 158 ms per 2,000 "
             "tokens against about 125), the serving GEMMs at the training-fitted sustained_fraction, which the H100 "
             "rows bear out and the A100 row does not; its decode has the other sign, 17% fast (STEADY_CHUNK_S). Part "
             "is the order the server forwarded the burst: replayed in the published order +23% "
             "(test_tpot_tail_follows_the_servers_forwarding_order)")


def _bound(metric: str) -> float:
    """The issue's target: p50 within 10%, tails within 20%."""
    return 0.10 if metric.endswith("p50") else 0.20


def _lambda_params() -> list[object]:
    out = []
    for n, doc in DOCUMENTED.items():
        for metric, err in doc.items():
            miss = abs(err) > _bound(metric)
            reason = TTFT_MISS if metric.startswith("ttft") else TPOT_MISS
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if miss else []
            out.append(pytest.param(n, metric, id=f"{n}-{metric}", marks=marks))
    return out


@pytest.mark.parametrize(("n", "metric"), _lambda_params())
def test_vllm_llama3_8b_prompts_at_once(n: int | str, metric: str) -> None:
    """Lambda's vLLM 0.6 runs of n prompts sent at once (10: low load; 40-320 and the A100's 160: high load):
    each published percentile within the issue's target (p50 10%, p99 20%)."""
    err = replay_ms(n)[metric] / RUNS[n].published_ms[metric] - 1.0
    assert abs(err) <= _bound(metric)


def test_vllm_lambda_errors_stay_where_documented() -> None:
    """Every Lambda metric at its documented error (DOCUMENTED, within 3 points): end-to-end p50/p99 within
    9% at every load; TPOT p50 within 8%; TTFT p50 within 8% (+1% at 10 prompts, +13% with an intake per
    request instead of per prompt token), p99 within 15%."""
    for n, doc in DOCUMENTED.items():
        got = replay_ms(n)
        for metric, err in doc.items():
            assert got[metric] / RUNS[n].published_ms[metric] - 1.0 == pytest.approx(err, abs=0.03), (n, metric)


# The model's decode rate against the published one with the whole burst running (docs/validation.md 2d,
# "Where the TPOT miss lies"): 10-token chunks of request 0, its 5th to 9th, published in the same files.
CHUNK_ERR: dict[int | str, float] = {40: 0.01, 160: 0.00, 320: -0.02, "a100-160": -0.17, "8b-h100x2-160": -0.06,
                                     "8b-h100x8-160": -0.11, "70b-h100x8-160": -0.06, "70b-a100x8-160": -0.25}


def test_decode_rate_with_the_burst_running_is_where_documented() -> None:
    """The model's 10-token chunks with the burst running (24-28, 92-105 and 185-215 requests on the H100, 90-104 on
    the A100) against the Lambda files': within 2% on the H100 once every group of 10 steps pays v0's scheduler
    time per running sequence (serving.v0_schedule_seq_s, 100 us: vLLM issue 6801); they were 3%, 10% and 17%
    short without it, the gap growing with the batch. The A100's chunks stay 17% short (the model decodes too fast;
    22% before), and not for want of a paged-decode line: its decode attention is already priced above one. With
    tensor parallelism (a later round): 6% short on two H100s (8B) and on eight (70B), 11% on eight (8B), and the
    70B's on eight A100s 25% short, the A100's sign again."""
    for n, pub in STEADY_CHUNK_S.items():
        got = float(np.mean(chunk_gaps_s(n)[STEADY_CHUNKS]))
        assert got / pub - 1.0 == pytest.approx(CHUNK_ERR[n], abs=0.03), n


# The prefill rate of the 160-prompt bursts (docs/validation.md 2d, "The A100 prefill and decode errors"): seconds from
# the first visible first token (the end of the second prefill step, seen one step late) to the last one (the end of
# the first decode step), min of each group of the files' ``ttfts``: H100 0.56932 to 1.45031, A100 0.90714 to 2.96321
# (the lone late request 57 left out); the 70B's likewise (H100 320 prompts, A100 160). The replay's error: the A100's
# prefill is priced 16-23% slow at the training-fitted sustained_fraction, which the H100s bear out.
PREFILL_SPAN_S: dict[int | str, float] = {160: 1.45031 - 0.56932, "a100-160": 2.96321 - 0.90714,
                                          "70b-h100x4-320": 5.93695 - 1.01135, "70b-a100x4-160": 7.20838 - 1.45678,
                                          # a later round (the 8B's lone late request 57 left out, as on the A100)
                                          "70b-h100x8-160": 2.28027 - 0.67287, "70b-a100x8-160": 4.98992 - 1.28425,
                                          "8b-h100x2-160": 1.14036 - 0.54332, "8b-h100x8-160": 1.00825 - 0.52304}
PREFILL_SPAN_ERR: dict[int | str, float] = {160: 0.03, "a100-160": 0.23, "70b-h100x4-320": 0.03, "70b-a100x4-160": 0.16,
                                            "70b-h100x8-160": 0.02, "70b-a100x8-160": 0.07, "8b-h100x2-160": -0.07,
                                            "8b-h100x8-160": -0.36}


def _prefill_span_s(n: int | str) -> float:
    """The replay's span of the burst's visible first tokens: from the end of its second prefill step to the end of
    the first step after its last prefill (the engine run as :func:`chunk_gaps_s` runs it)."""
    run = RUNS[n]
    eng = ReplicaEngine(run_config(run), model_energy=False)
    now = float(api_intake_s(np.asarray(run.prompts), v0=not run_config(run).chunked_prefill).sum())
    for r in run_requests(run):
        eng.admit(r, now)
    ends, prefill = [], []
    while (it := eng.next_iteration(now)) is not None and (not prefill or prefill[-1] or len(ends) < 3):
        now += it.predicted_s
        eng.complete_batch(it, now)
        ends.append(now)
        prefill.append(it.prefill_tokens > 0)
    return ends[-1] - ends[1]


def test_prefill_span_of_the_160_prompt_bursts_is_where_documented() -> None:
    """The bursts' prefill phase (Lambda's files, PREFILL_SPAN_S): within 3% on the H100s (the 8B's 160 prompts, the
    70B's 320 on four), 23% long on the A100 (2.54 s against 2.06) and 16% for the 70B on four A100s (6.66 s against
    5.75): with the forwarding order, the cause of the A100s' TPOT p99 misses. With tensor parallelism (a later
    round): the 70B on eight H100s within 2%, on eight A100s 7% long, the 8B on two H100s 7% short and on eight 36%
    short (0.31 s against 0.49: its prefill steps there take about 30 ms, the model's 19)."""
    for n, pub in PREFILL_SPAN_S.items():
        assert _prefill_span_s(n) / pub - 1.0 == pytest.approx(PREFILL_SPAN_ERR[n], abs=0.02), n


# The earliest first token of each published H100 burst (s; min of the files' ``ttfts`` over requests that streamed
# text), and the replay's error: the 320-prompt one is the calibration point of serving.api_prompt_token_s.
EARLIEST_FIRST_TOKEN_S = {10: 0.06192, 40: 0.18671, 160: 0.56932, 320: 0.81445}
EARLIEST_ERR = {10: 0.02, 40: 0.05, 160: -0.17, 320: 0.00}


def test_earliest_first_token_of_each_burst_where_documented() -> None:
    """The replay's first first-token of each burst: the intake of its N prompts at serving.api_prompt_token_s per
    prompt token, two prefill steps, first tokens seen one step late. 320 prompts is the calibration point (0.814 s);
    10, 40 and 160 are predictions, +2%, +5% and -17% (with 2.22 ms per request instead: +14%, +3%, -19%): the
    published intake per prompt token is 10.0, 9.7 and 13.7 us there."""
    for n, pub in EARLIEST_FIRST_TOKEN_S.items():
        run = RUNS[n]
        res = simulate(run_config(run), run_requests(run), keep_requests=True)
        first = min(s.first_token_s for s in res.requests)
        assert first / pub - 1.0 == pytest.approx(EARLIEST_ERR[n], abs=0.02), n


def test_burst_reaches_the_engine_after_the_api_server_took_it() -> None:
    """The smallest TTFT of a burst grows with its prompts by serving.api_prompt_token_s per prompt token, as the
    published runs' do (~0.06, 0.19, 0.57 and 0.81 s for 10, 40, 160 and 320 prompts)."""
    firsts = {}
    for n in (10, 160):
        rng = np.random.default_rng(0)
        reqs = [Request(f"r{i}", rng.integers(256, 128000, size=p, dtype=np.int32), max(o, 1), arrival_s=0.0)
                for i, (p, o) in enumerate(zip(RUNS[n].prompts, RUNS[n].outputs, strict=True))]
        cfg = ReplicaConfig(preset("llama3-8b"), "h100-sxm", chunked_prefill=False, max_prefill_tokens=2048)
        firsts[n] = min(s.first_token_s for s in simulate(cfg, reqs, keep_requests=True).requests)
    more = sum(RUNS[160].prompts) - sum(RUNS[10].prompts)
    assert firsts[160] - firsts[10] == pytest.approx(more * api_prompt_token_s(), rel=0.15)


def test_client_ttft_includes_the_api_servers_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone request's TTFT is the engine's own plus its replica's API server's intake, measured from the client's
    send: on vLLM v0's path serving.api_prompt_token_s per prompt token (10.84 us, tokenising on the server's loop;
    calibrated on the 320-prompt Lambda burst's earliest first token), on v1's serving.api_request_s (2.22 ms, the
    same point read per request; the tokeniser left the loop in vLLM PR 10635)."""
    from gigacluster.inference import sim as sim_mod
    from gigacluster.inference.cost import api_request_s

    rng = np.random.default_rng(1)
    req = Request("solo", rng.integers(256, 128000, size=100, dtype=np.int32), 2, arrival_s=1.0)
    assert api_prompt_token_s() == pytest.approx(1.084e-5)
    assert api_request_s() == pytest.approx(2.22e-3)
    for chunked, intake in ((False, 100 * api_prompt_token_s()), (True, api_request_s())):
        cfg = ReplicaConfig(preset("llama3-8b"), "h100-sxm", chunked_prefill=chunked)
        with monkeypatch.context() as m:
            client = simulate(cfg, [req]).to_dict()["ttft_s"]["mean"]
            m.setattr(sim_mod, "api_intake_s", lambda tokens, v0: np.zeros(len(tokens)))
            engine = simulate(cfg, [req]).to_dict()["ttft_s"]["mean"]
        assert client == pytest.approx(engine + intake, rel=1e-6), chunked


# The campaign's tensor-parallel runs (docs/validation.md 2f; data in tests/inference/lambda_vllm_runs.py): Llama 3 70B
# on four H100s (10, 40, 160, 320 prompts) and on four A100s (10, 160), Mixtral 8x7B on two H100s (10, 160). Our
# error per (run, metric), held within 3 points.
TP_DOCUMENTED: dict[str, dict[str, float]] = {
    "70b-h100x4-10": {"ttft_p50": 0.04, "ttft_p99": 0.04, "tpot_p50": 0.00, "tpot_p99": 0.02, "e2e_p50": 0.00,
                      "e2e_p99": 0.01},
    "70b-h100x4-40": {"ttft_p50": -0.03, "ttft_p99": 0.05, "tpot_p50": -0.04, "tpot_p99": 0.07, "e2e_p50": -0.04,
                      "e2e_p99": -0.01},
    "70b-h100x4-160": {"ttft_p50": -0.40, "ttft_p99": -0.28, "tpot_p50": 0.00, "tpot_p99": 0.37, "e2e_p50": -0.20,
                       "e2e_p99": -0.09},
    "70b-h100x4-320": {"ttft_p50": 0.06, "ttft_p99": 0.02, "tpot_p50": -0.05, "tpot_p99": 0.32, "e2e_p50": -0.02,
                       "e2e_p99": -0.03},
    "70b-a100x4-10": {"ttft_p50": -0.03, "ttft_p99": -0.04, "tpot_p50": -0.03, "tpot_p99": -0.08, "e2e_p50": -0.05,
                      "e2e_p99": -0.02},
    "70b-a100x4-160": {"ttft_p50": 0.06, "ttft_p99": 0.08, "tpot_p50": -0.09, "tpot_p99": 0.44, "e2e_p50": -0.05,
                       "e2e_p99": -0.11},
    "mixtral-h100x2-10": {"ttft_p50": -0.95, "ttft_p99": -0.95, "tpot_p50": 0.02, "tpot_p99": 0.08, "e2e_p50": -0.44,
                          "e2e_p99": -0.15},
    "mixtral-h100x2-160": {"ttft_p50": -0.88, "ttft_p99": -0.82, "tpot_p50": -0.02, "tpot_p99": -0.58,
                           "e2e_p50": -0.61, "e2e_p99": -0.25},
    # A later round: the campaign's other tensor-parallel files (70B on 2 and 8 H100s and 8 A100s, 8B on 2 and 8
    # H100s, Mixtral on 4 H100s), errors to a tenth of a point so that a row near its target is marked as it runs.
    "70b-h100x2-10": {"ttft_p50": 0.088, "ttft_p99": 0.083, "tpot_p50": 0.048, "tpot_p99": 0.044, "e2e_p50": 0.049,
                      "e2e_p99": 0.055},
    "70b-h100x2-40": {"ttft_p50": 0.030, "ttft_p99": 0.007, "tpot_p50": 0.000, "tpot_p99": 0.026, "e2e_p50": -0.001,
                      "e2e_p99": 0.024},
    "70b-h100x8-10": {"ttft_p50": -0.162, "ttft_p99": -0.168, "tpot_p50": -0.033, "tpot_p99": -0.105,
                      "e2e_p50": -0.052, "e2e_p99": -0.013},
    "70b-h100x8-160": {"ttft_p50": 0.107, "ttft_p99": -0.041, "tpot_p50": -0.040, "tpot_p99": 0.102, "e2e_p50": -0.056,
                       "e2e_p99": -0.071},
    "70b-a100x8-10": {"ttft_p50": -0.048, "ttft_p99": -0.054, "tpot_p50": -0.067, "tpot_p99": -0.145,
                      "e2e_p50": -0.097, "e2e_p99": -0.004},
    "70b-a100x8-160": {"ttft_p50": -0.031, "ttft_p99": -0.045, "tpot_p50": -0.133, "tpot_p99": 0.185,
                       "e2e_p50": -0.125, "e2e_p99": -0.156},
    "8b-h100x2-160": {"ttft_p50": -0.176, "ttft_p99": -0.143, "tpot_p50": -0.032, "tpot_p99": -0.137, "e2e_p50": -0.103,
                      "e2e_p99": -0.049},
    "8b-h100x8-10": {"ttft_p50": -0.403, "ttft_p99": -0.416, "tpot_p50": 0.033, "tpot_p99": 2.320, "e2e_p50": -0.044,
                     "e2e_p99": 0.041},
    "8b-h100x8-160": {"ttft_p50": -0.318, "ttft_p99": -0.305, "tpot_p50": -0.109, "tpot_p99": -0.267, "e2e_p50": -0.215,
                      "e2e_p99": -0.127},
    "mixtral-h100x4-160": {"ttft_p50": -0.881, "ttft_p99": -0.837, "tpot_p50": 0.000, "tpot_p99": -0.412,
                           "e2e_p50": -0.658, "e2e_p99": -0.318},
}
LATE_START_MISS = ("the published burst's first visible first tokens came at 1.54 s, 0.53 s later than in the "
                   "320-prompt burst of the same server (1.01 s, twice the prompts), then 0.47 s passed before the "
                   "next prefill group, where later groups are 0.12-0.16 s apart; all four 160-prompt bursts start "
                   "late (the model's earliest first token -17% and -27% for the 8B on H100 and A100, -57% here, "
                   "-22% for the 70B A100) while the 10-, 40- and 320-prompt ones fit within 5%; no mechanism found")
ORDER_MISS = ("short outputs whose TPOT is their wait for the rest of the burst's prefills (p99): which requests are "
              "prefilled first decides it. vLLM 0.6's server forwarded each burst out of send order (the 320-prompt "
              "burst's first tokens are for requests 216-282); the replay sends in order. Replayed in the published "
              "order (FORWARD_ORDER) the error is +1% at 320 and -1% at 160 prompts on the H100s and +25% on the "
              "A100s, whose prefill the model prices 16% slow (test_tpot_tail_follows_the_servers_forwarding_order)")
JIT_MISS = ("a cold server: the first prefills JIT-compile vLLM's Triton fused-MoE kernel for token counts the "
            "start-up profile and CUDA-graph capture did not reach (vllm-project/vllm PR 55268), and LambdaLabsML's "
            "benchmark.py starts a fresh server for each run, with no warm-up. The 10-prompt run's one prefill of "
            "1,585 tokens shows its first tokens after 1.85 s (the model: 0.09 s); the 160-prompt run pauses twice "
            "for 1.8 s between its first prefill groups, then has one every 50-65 ms as the model's 53-55 ms. Decode "
            "is not affected (TPOT p50 within 3%)")


TP8_FIRST_PREFILL_MISS = (
    "the burst's one prefill on eight H100s takes longer than the model's: the file's first tokens come at "
    "0.121-0.123 s for the 70B and 0.056-0.057 s for the 8B (1,369 prompt tokens, 14.8 ms of intake, one decode step "
    "after), the model's at 0.102 and 0.033 s. The 8B's first prefill on eight GPUs (about 38 ms) is as long as on one "
    "(about 40 ms, the 1-GPU 10-prompt file); the 70B's 10-prompt prefills on two and four H100s fit (earliest first "
    "token +9%, +5%) and its 160-prompt prefill on eight is within 2% of the file (PREFILL_SPAN_ERR). Not traced: a "
    "fresh server's first prefill (LambdaLabsML's benchmark.py starts one for every run) costing about 20 ms more on "
    "eight GPUs")
LATER_MISS: dict[tuple[str, str], str] = {
    ("70b-h100x8-10", "ttft_p50"): TP8_FIRST_PREFILL_MISS,
    ("8b-h100x8-10", "ttft_p50"): TP8_FIRST_PREFILL_MISS,
    ("8b-h100x8-10", "ttft_p99"): TP8_FIRST_PREFILL_MISS,
    ("70b-h100x8-160", "ttft_p50"): (
        "the median falls inside the prefill phase, where which requests share a step decides it: the server "
        "forwarded requests 99-153 first (FORWARD_ORDER), the replay sends in order; replayed in the published order "
        "the error is -16.8%, the burst then starting 17% early as all 160-prompt bursts do (LATE_START_MISS); the "
        "prefill span itself is within 2% (PREFILL_SPAN_ERR)"),
    ("8b-h100x8-10", "tpot_p99"): (
        "the short requests' ends: the file shows the 3-, 6- and 9-token requests finished 9.5, 15.8 and 29.6 ms "
        "after their first tokens, i.e. about when they stopped; the model holds them to their group's end (10 steps "
        "of 3.2-3.4 ms: 15.8 ms a token for the 3-token one), as vLLM 0.6's multi-step scheduling does in the same "
        "prompts' 1-GPU file (each seen 71 ms, ten 7.1 ms steps, after its first token) and in the 70B's 8-GPU "
        "file (the 6-token request 130 ms, about eleven 11.9 ms steps). Why this run reports them early is not "
        "traced"),
    ("70b-a100x8-160", "tpot_p50"): (
        "the A100's decode at about 100 running sequences: with the burst running the file's 10-token chunks take "
        "0.320 s, the model's 0.241 (CHUNK_ERR -25%), the same sign as the 8B on one A100 (-17%) and the 70B on "
        "four (TPOT p50 -9%); at 1-8 sequences (the 10-prompt file on the same GPUs) the model is within 7%. The "
        "A100's serving GEMMs at m about 100 are not separated from the rest by any published table"),
    ("8b-h100x2-160", "ttft_p50"): (
        "the burst starts late, as every 160-prompt burst (LATE_START_MISS): the file's earliest first token is at "
        "0.543 s, the model's 0.432 (-20%), while its prefill span is within 7% and its decode chunks within 6%"),
    ("8b-h100x8-160", "ttft_p50"): (
        "a late start (earliest first token 0.523 s, the model's 0.403: -23%) and the 8B's prefill on eight H100s: "
        "the file's prefill span is 0.485 s, the model's 0.309 (-36%, about 30 ms a 2,048-token step against 19), "
        "and its decode chunks 11% longer than the model's; the 8B's steps on eight GPUs are longer than the model's "
        "kernels, all-reduces and host time add up to, a cause not traced"),
    ("mixtral-h100x4-160", "ttft_p50"): (
        "a cold server, as on two H100s (JIT_MISS): the file's first tokens come at 4.10-4.14 s (one group), then, "
        "after a 2.0 s pause, from 6.17 s on a group every 35-45 ms; the model's first at 0.47 s. Decode is not "
        "affected (TPOT p50 +0.0%)"),
}
for _m in ("ttft_p99", "tpot_p99", "e2e_p50", "e2e_p99"):
    LATER_MISS[("mixtral-h100x4-160", _m)] = LATER_MISS[("mixtral-h100x4-160", "ttft_p50")]
for _m in ("ttft_p99", "tpot_p50", "tpot_p99", "e2e_p50"):
    LATER_MISS[("8b-h100x8-160", _m)] = LATER_MISS[("8b-h100x8-160", "ttft_p50")]
LATER_MISS[("8b-h100x2-160", "e2e_p50")] = LATER_MISS[("8b-h100x2-160", "ttft_p50")]
LATER_MISS[("70b-a100x8-160", "e2e_p50")] = LATER_MISS[("70b-a100x8-160", "tpot_p50")]


def _tp_reason(n: str, metric: str) -> str:
    """The cause of a tensor-parallel run's miss (docs/validation.md 2f)."""
    if (n, metric) in LATER_MISS:
        return LATER_MISS[(n, metric)]
    if n.startswith("mixtral"):
        return JIT_MISS
    return ORDER_MISS if metric == "tpot_p99" else LATE_START_MISS


def _tp_params() -> list[object]:
    out = []
    for n, doc in TP_DOCUMENTED.items():
        for metric, err in doc.items():
            miss = abs(err) > _bound(metric)
            marks = [pytest.mark.xfail(strict=True, reason=_tp_reason(n, metric))] if miss else []
            out.append(pytest.param(n, metric, id=f"{n}-{metric}", marks=marks))
    return out


@pytest.mark.parametrize(("n", "metric"), _tp_params())
def test_vllm_lambda_tensor_parallel_prompts_at_once(n: str, metric: str) -> None:
    """Lambda's vLLM 0.6 runs with tensor parallelism (70B on 2, 4 or 8 H100s and 4 or 8 A100s, 8B on 2 or 8 H100s,
    Mixtral 8x7B on 2 or 4 H100s; 10 prompts at once is low load, 40-320 high): each published percentile within the
    issue's target (p50 10%, p99 20%)."""
    err = replay_ms(n)[metric] / RUNS[n].published_ms[metric] - 1.0
    assert abs(err) <= _bound(metric)


def test_vllm_lambda_tensor_parallel_errors_stay_where_documented() -> None:
    """Every tensor-parallel metric at its documented error (TP_DOCUMENTED, within 3 points): the 70B's 10-, 40- and
    320-prompt runs within 8% but TPOT p99, the A100 70B 10-prompt run within 8% (10.7% at end-to-end p50 before the
    A100's paged-decode floor), Mixtral's decode within 3%; of a later round's, the 70B on two H100s within 9% on
    every metric, on eight A100s within 10% at 10 prompts."""
    for n, doc in TP_DOCUMENTED.items():
        got = replay_ms(n)
        for metric, err in doc.items():
            assert got[metric] / RUNS[n].published_ms[metric] - 1.0 == pytest.approx(err, abs=0.03), (n, metric)


# TPOT p99 replayed with each burst handed to the engine in the order the published server forwarded it
# (FORWARD_ORDER), against the published figure: the order closes the H100 tails; the A100's keep the error of their
# prefill, priced 16-23% slow (PREFILL_SPAN_ERR).
ORDERED_TPOT_P99_ERR: dict[int | str, float] = {"70b-h100x4-160": 0.01, "70b-h100x4-320": 0.03,
                                                "70b-a100x4-160": 0.25, "a100-160": 0.23}


def test_lambda_runs_match_the_files_totals() -> None:
    """Each later-round run's lists sum to its file's total_input_tokens and total_output_tokens (FILE_TOTALS), so the
    replay serves the published lengths."""
    for n, (prompt, output) in FILE_TOTALS.items():
        assert (sum(RUNS[n].prompts), sum(RUNS[n].outputs)) == (prompt, output), n
        assert len(RUNS[n].prompts) == len(RUNS[n].outputs), n


def test_ttft_median_of_the_70b_on_eight_h100s_follows_the_forwarding_order() -> None:
    """The 70B's 160-prompt burst on eight H100s: TTFT p50 +10.7% in send order, -16.8% replayed in the order the
    server forwarded it (FORWARD_ORDER): the median lies inside the prefill phase; the tails do not move."""
    n = "70b-h100x8-160"
    pub, ordered = RUNS[n].published_ms, replay_ms(n, ordered=True)
    assert ordered["ttft_p50"] / pub["ttft_p50"] - 1 == pytest.approx(-0.168, abs=0.02)
    assert ordered["ttft_p99"] / pub["ttft_p99"] - 1 == pytest.approx(-0.04, abs=0.02)


def test_tpot_tail_follows_the_servers_forwarding_order() -> None:
    """The TPOT p99 misses (+32% to +44%) are the order in which vLLM 0.6's server handed the burst to the engine:
    replayed in the published order the H100 tails come within 3.5% (the medians within 3%), the A100 ones to
    +23-25%."""
    for n, err in ORDERED_TPOT_P99_ERR.items():
        got = replay_ms(n, ordered=True)
        pub = RUNS[n].published_ms
        assert got["tpot_p99"] / pub["tpot_p99"] - 1.0 == pytest.approx(err, abs=0.02), n
        assert abs(got["tpot_p50"] / pub["tpot_p50"] - 1.0) < 0.13, n


# The earliest visible first token of the tensor-parallel bursts (s, min of the files' ``ttfts`` over requests that
# streamed text) and the replay's error: the 160-prompt bursts start late (LATE_START_MISS), the others fit but the
# first prefill on eight H100s (TP8_FIRST_PREFILL_MISS) and Mixtral's cold server.
TP_EARLIEST_FIRST_TOKEN_S = {"70b-h100x4-10": 0.14007, "70b-h100x4-40": 0.37364, "70b-h100x4-160": 1.53777,
                             "70b-h100x4-320": 1.01135, "70b-a100x4-10": 0.34699, "70b-a100x4-160": 1.45678,
                             "70b-h100x2-10": 0.21856, "70b-h100x2-40": 0.54379, "70b-h100x8-10": 0.12142,
                             "70b-h100x8-160": 0.67287, "70b-a100x8-10": 0.22200, "70b-a100x8-160": 1.28425,
                             "8b-h100x2-160": 0.54332, "8b-h100x8-10": 0.05552, "8b-h100x8-160": 0.52304,
                             "mixtral-h100x4-160": 4.09791}
TP_EARLIEST_ERR = {"70b-h100x4-10": 0.05, "70b-h100x4-40": 0.02, "70b-h100x4-160": -0.57, "70b-h100x4-320": -0.01,
                   "70b-a100x4-10": -0.01, "70b-a100x4-160": -0.22, "70b-h100x2-10": 0.09, "70b-h100x2-40": 0.09,
                   "70b-h100x8-10": -0.16, "70b-h100x8-160": -0.17, "70b-a100x8-10": -0.05, "70b-a100x8-160": -0.36,
                   "8b-h100x2-160": -0.20, "8b-h100x8-10": -0.40, "8b-h100x8-160": -0.23, "mixtral-h100x4-160": -0.88}


def test_earliest_first_token_of_the_70b_bursts_where_documented() -> None:
    """The tensor-parallel bursts' first first-token (the intake at serving.api_prompt_token_s per prompt token, two
    prefill steps, the first seen one step late): the 70B's on four GPUs within 5% at 10, 40 and 320 prompts, 57% and
    22% early at 160 (the runs start late); of a later round's, on two H100s 9% late, on eight A100s 5% early at 10
    prompts, every 160-prompt burst 17-36% early, the 10-prompt ones on eight H100s 16% (70B) and 40% (8B) early."""
    for n, pub in TP_EARLIEST_FIRST_TOKEN_S.items():
        run = RUNS[n]
        res = simulate(run_config(run), run_requests(run), keep_requests=True)
        first = min(s.first_token_s for s in res.requests if run.outputs[int(s.request_id[1:])] > 0)
        assert first / pub - 1 == pytest.approx(TP_EARLIEST_ERR[n], abs=0.02), n

# Oracle Cloud blog "Serving Llama 3.1 405B model with AMD MI300X GPUs" (OCI BM.GPU.MI300X.8, vLLM
# scripts/benchmark_latency.py, Llama 3.1 405B FP8 on all eight GPUs, 128 input and 128 output tokens):
# average latency of one batch, seconds, by batch size.
OCI_MI300X_405B_S = {1: 3.530, 2: 3.583, 4: 3.734, 8: 3.974, 16: 4.375, 32: 5.130, 64: 6.919, 128: 10.340, 256: 17.750}
OCI_MISS = ("the batch-1 step: the published latencies are 3.45 s + 55.4 ms per request, the model's 2.53 s + "
            "49.0 ms. The model's batch-1 step (20.7 ms: the FP8 weights through hipBLASLt's measured M=1 line, "
            "9.7 us + bytes / 4.14 TB/s a GEMM, plus 252 latency-bound all-reduces) is 77% of the published 27 ms; "
            "what the rest is (the all-reduces' latency in that build, the small kernels between the GEMMs) is not "
            "sourced as figures")


def _oci_latency_s(batch: int) -> float:
    rng = np.random.default_rng(0)
    reqs = [Request(f"r{i}", rng.integers(256, 128000, size=128, dtype=np.int32), 128, arrival_s=0.0)
            for i in range(batch)]
    cfg = ReplicaConfig(preset("llama3-405b"), "mi300x", tp=8, precision="fp8", max_batch=256)
    return float(simulate(cfg, reqs, api_server=False).to_dict()["e2e_s"]["mean"])


@pytest.mark.parametrize("batch", [pytest.param(b, marks=pytest.mark.xfail(strict=True, reason=OCI_MISS))
                                   for b in sorted(OCI_MI300X_405B_S)])
def test_oci_mi300x_llama31_405b_batch_latency(batch: int) -> None:
    """OCI's vLLM latency table (OCI_MI300X_405B_S, batch 1 to 256): the mean end-to-end time of the batch
    within 10% (the issue's end-to-end target), from one request (low load) to 256 at once (high load)."""
    assert _oci_latency_s(batch) == pytest.approx(OCI_MI300X_405B_S[batch], rel=0.10)


def _affine(batches: list[int], secs: list[float]) -> tuple[float, float]:
    """(intercept s, slope s per request) of the least-squares line of ``secs`` over ``batches``."""
    slope, icpt = np.polyfit(np.asarray(batches, dtype=float), np.asarray(secs), 1)
    return float(icpt), float(slope)


def test_oci_mi300x_miss_splits_into_intercept_and_slope() -> None:
    """OCI's latencies are affine in batch (3.45 s + 55.4 ms per request, every row within 4% of the line);
    so are ours (2.53 s + 49.0 ms): the per-step cost at batch 1 is 27% short (44% before hipBLASLt's FP8
    call time at m below one tile), the cost each added request brings 11% short (7% before: batches 1-64 gain
    the call time, 128 and 256 do not; docs/validation.md, "High load, published")."""
    b = sorted(OCI_MI300X_405B_S)
    pub = [OCI_MI300X_405B_S[x] for x in b]
    pi, ps = _affine(b, pub)
    mi, ms = _affine(b, [_oci_latency_s(x) for x in b])
    assert max(abs((pi + ps * x) / y - 1) for x, y in zip(b, pub, strict=True)) < 0.04
    assert (pi, ps) == (pytest.approx(3.45, abs=0.02), pytest.approx(0.0554, abs=0.0005))
    assert mi / pi - 1 == pytest.approx(-0.27, abs=0.03)
    assert ms / ps - 1 == pytest.approx(-0.11, abs=0.03)


def test_oci_mi300x_errors_stay_where_documented() -> None:
    """The OCI rows' errors (docs/validation.md, "Serving"): -25% at batch 1 (-41% before hipBLASLt's FP8 call
    time) to -13% at 256: the all-reduces of large batches (8 MiB at 256) run at RCCL's step-bound mesh-ring rate,
    as rccl-tests measure, and every step pays v0's scheduler time per sequence (25.6 ms at 256)."""
    err = {b: _oci_latency_s(b) / s - 1 for b, s in OCI_MI300X_405B_S.items()}
    assert err[1] == pytest.approx(-0.25, abs=0.03)
    assert err[256] == pytest.approx(-0.13, abs=0.03)


# AMD's own table: ROCm/vllm docs/dev-docker/README.md, the version of 2025-01-24 ("What is New: 20250124"; image
# rocm/vllm-dev:main with ROCm 6.3.1, vLLM 0.6.6), "Latency Measurements": benchmark_latency.py on 8 MI300X, TP 8,
# amd/Llama-3.1-{70B,405B}-Instruct-FP8-KV, 128 input and 2048 output tokens, seconds per batch (the table gives ms).
# Its FP8 decode GEMMs still ran through hipBLASLt (batch 1 is no faster per request than batch 2, unlike the later
# builds with vLLM's FP8 skinny kernel). A second model size with the same stack: not used to set anything.
AMD_MI300X_FP8_S: dict[tuple[str, int], float] = {
    ("llama3-70b", 1): 19.08859, ("llama3-70b", 2): 19.61046, ("llama3-70b", 4): 19.91130,
    ("llama3-70b", 8): 21.85880, ("llama3-70b", 16): 23.53759, ("llama3-70b", 32): 25.34294,
    ("llama3-70b", 64): 32.54819, ("llama3-70b", 128): 45.21637,
    ("llama3-405b", 1): 51.73970, ("llama3-405b", 2): 52.76915, ("llama3-405b", 4): 54.55707,
    ("llama3-405b", 8): 56.90186, ("llama3-405b", 16): 60.43212, ("llama3-405b", 32): 67.35301,
    ("llama3-405b", 64): 81.08533, ("llama3-405b", 128): 116.13851,
}
# Our error per row (docs/validation.md 2d, "AMD's table"), held within 3 points.
AMD_ERR: dict[tuple[str, int], float] = {
    ("llama3-70b", 1): -0.16, ("llama3-70b", 2): -0.17, ("llama3-70b", 4): -0.15, ("llama3-70b", 8): -0.17,
    ("llama3-70b", 16): -0.13, ("llama3-70b", 32): -0.01, ("llama3-70b", 64): 0.06, ("llama3-70b", 128): 0.11,
    ("llama3-405b", 1): -0.18, ("llama3-405b", 2): -0.19, ("llama3-405b", 4): -0.20, ("llama3-405b", 8): -0.20,
    ("llama3-405b", 16): -0.19, ("llama3-405b", 32): -0.16, ("llama3-405b", 64): -0.08, ("llama3-405b", 128): -0.17,
}
AMD_MISS = ("small batches: 1.5 ms (70B) and 4.6 ms (405B) per step short, 19 and 37 us per layer, after "
            "hipBLASLt's FP8 call time (the same unsourced remainder as OCI's batch-1 step); at 128 the 405B is 17% "
            "fast and the 70B 11% slow, the all-reduces of 2-4 MiB and the GEMMs at m = 128 not separated")


@functools.cache
def _amd_latency_s(model: str, batch: int) -> float:
    rng = np.random.default_rng(0)
    reqs = [Request(f"r{i}", rng.integers(256, 128000, size=128, dtype=np.int32), 2048, arrival_s=0.0)
            for i in range(batch)]
    cfg = ReplicaConfig(preset(model), "mi300x", tp=8, precision="fp8", max_batch=256)
    return float(simulate(cfg, reqs, api_server=False).to_dict()["e2e_s"]["mean"])


@pytest.mark.parametrize(("model", "batch"), [
    pytest.param(m, b, id=f"{m}-{b}",
                 marks=[pytest.mark.xfail(strict=True, reason=AMD_MISS)] if abs(AMD_ERR[(m, b)]) > 0.10 else [])
    for m, b in AMD_MI300X_FP8_S])
def test_amd_mi300x_llama31_fp8_batch_latency(model: str, batch: int) -> None:
    """AMD's vLLM 0.6.6 latency table (AMD_MI300X_FP8_S, 70B and 405B FP8 on 8 MI300X, batch 1 to 128, 128 in and
    2048 out): the mean end-to-end time of the batch within 10% (the issue's end-to-end target)."""
    assert _amd_latency_s(model, batch) == pytest.approx(AMD_MI300X_FP8_S[(model, batch)], rel=0.10)


def test_amd_mi300x_errors_stay_where_documented() -> None:
    """Every row of AMD's table at its documented error (AMD_ERR, within 3 points): -13% to -20% at batches 1-16 for
    both sizes (-34% to -45% before hipBLASLt's FP8 call time at m below one tile), within 8% at 32-64."""
    for key, pub in AMD_MI300X_FP8_S.items():
        assert _amd_latency_s(*key) / pub - 1 == pytest.approx(AMD_ERR[key], abs=0.03), key
