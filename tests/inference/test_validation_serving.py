"""Serving latency against a published vLLM run (issue 15 item 5), low load.

Source: LambdaLabsML/vllm-benchmark, results/prompt_10/1xH100-80GB-SXM/
Meta-Llama-3-8B-Instruct_tp1_len2048.json (vLLM benchmark_serving, 2024-09-07, vLLM 0.6 with
``--max-model-len 2048``: the v0 engine, prefill-first, max_num_batched_tokens 2,048): ten ShareGPT
prompts sent at once to one H100 SXM; the file lists every prompt and output length. Published:
median TTFT 62.19 ms (p99 63.36), median TPOT 7.56 ms, median end-to-end 874.3 ms, p99 5,168.0 ms.
The run streamed 10 tokens per scheduler call (multi-step scheduling: ITL about 72 ms), so its
mean TPOT (11.1 ms) is skewed by short outputs and is not compared.
"""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.inference.engine import ReplicaConfig, Request
from gigacluster.inference.sim import simulate
from gigacluster.model.arch import preset

INPUT = [13, 25, 27, 10, 329, 29, 399, 328, 4, 205]
OUTPUT = [120, 429, 233, 194, 101, 741, 9, 3, 6, 31]
PUBLISHED_MS = {"ttft_p50": 62.19, "tpot_p50": 7.56, "e2e_p50": 874.29, "e2e_p99": 5167.98}
# Our error per metric, held as the test's bound (see docs/validation.md, "Serving").
DOCUMENTED = {"ttft_p50": -0.19, "tpot_p50": -0.07, "e2e_p50": -0.15, "e2e_p99": 0.00}


def _measured_ms() -> dict[str, float]:
    rng = np.random.default_rng(0)
    reqs = [Request(f"r{i}", rng.integers(256, 128000, size=p, dtype=np.int32), o, arrival_s=0.0)
            for i, (p, o) in enumerate(zip(INPUT, OUTPUT, strict=True))]
    cfg = ReplicaConfig(preset("llama3-8b"), "h100-sxm", chunked_prefill=False, max_prefill_tokens=2048)
    r = simulate(cfg, reqs).to_dict()
    return {"ttft_p50": r["ttft_s"]["p50"] * 1e3, "tpot_p50": r["tpot_s"]["p50"] * 1e3,
            "e2e_p50": r["e2e_s"]["p50"] * 1e3, "e2e_p99": r["e2e_s"]["p99"] * 1e3}


@pytest.mark.parametrize("metric", sorted(PUBLISHED_MS))
def test_vllm_h100_llama3_8b_ten_prompts(metric: str) -> None:
    """Lambda's vLLM 0.6 run (module docstring): each metric at its documented error. TPOT and the
    end-to-end p99 are within 10%; TTFT misses by 19% (26% before the API server's 4 ms per request,
    catalog serving.api_request_s; the rest is not traced) and the end-to-end median by 15% (it follows
    from the multi-step streaming)."""
    err = _measured_ms()[metric] / PUBLISHED_MS[metric] - 1.0
    assert err == pytest.approx(DOCUMENTED[metric], abs=0.03)


def test_client_ttft_includes_the_api_servers_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone request's TTFT is the engine's own plus serving.api_request_s (4 ms: vLLM online against
    offline, tenstorrent/tt-inference-server issue 190), measured from the client's send."""
    from gigacluster.inference import sim as sim_mod
    from gigacluster.inference.cost import api_request_s

    rng = np.random.default_rng(1)
    req = Request("solo", rng.integers(256, 128000, size=100, dtype=np.int32), 2, arrival_s=1.0)
    cfg = ReplicaConfig(preset("llama3-8b"), "h100-sxm")
    client = simulate(cfg, [req]).to_dict()["ttft_s"]["mean"]
    monkeypatch.setattr(sim_mod, "api_request_s", lambda: 0.0)
    engine = simulate(cfg, [req]).to_dict()["ttft_s"]["mean"]
    assert api_request_s() == pytest.approx(4e-3)
    assert client == pytest.approx(engine + api_request_s(), rel=1e-6)


# Oracle Cloud blog "Serving Llama 3.1 405B model with AMD MI300X GPUs" (OCI BM.GPU.MI300X.8, vLLM
# scripts/benchmark_latency.py, Llama 3.1 405B FP8 on all eight GPUs, 128 input and 128 output tokens):
# average latency of one batch, seconds, by batch size.
OCI_MI300X_405B_S = {1: 3.530, 2: 3.583, 4: 3.734, 8: 3.974, 16: 4.375, 32: 5.130, 64: 6.919, 128: 10.340, 256: 17.750}
OCI_MISS = ("not traced: the published latencies are 3.45 s + 55.4 ms per request; the model's 1.95 s + 38.9 ms. "
            "Its batch-1 step (16 ms: the FP8 weights read at 80% of HBM plus 252 latency-bound all-reduces) is 57% "
            "of the published 27 ms, and each added request costs 70% of the published; candidates (2024 ROCm FP8 "
            "GEMMs, no FP8 skinny-GEMM kernel before vLLM's wvSplitKQ) are not sourced as figures for this build")


def _oci_latency_s(batch: int) -> float:
    rng = np.random.default_rng(0)
    reqs = [Request(f"r{i}", rng.integers(256, 128000, size=128, dtype=np.int32), 128, arrival_s=0.0)
            for i in range(batch)]
    cfg = ReplicaConfig(preset("llama3-405b"), "mi300x", tp=8, precision="fp8", max_batch=256)
    return float(simulate(cfg, reqs).to_dict()["e2e_s"]["mean"])


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
    so are ours (1.95 s + 38.9 ms): the per-step cost at batch 1 is 43% short and the cost each added request
    brings 30% short (docs/validation.md, "High load, published"), two gaps a fix must close separately."""
    b = sorted(OCI_MI300X_405B_S)
    pub = [OCI_MI300X_405B_S[x] for x in b]
    pi, ps = _affine(b, pub)
    mi, ms = _affine(b, [_oci_latency_s(x) for x in b])
    assert max(abs((pi + ps * x) / y - 1) for x, y in zip(b, pub, strict=True)) < 0.04
    assert (pi, ps) == (pytest.approx(3.45, abs=0.02), pytest.approx(0.0554, abs=0.0005))
    assert mi / pi - 1 == pytest.approx(-0.43, abs=0.03)
    assert ms / ps - 1 == pytest.approx(-0.30, abs=0.03)


def test_oci_mi300x_errors_stay_where_documented() -> None:
    """The OCI rows' errors (docs/validation.md, "Serving"): -41% at batch 1 to -32% at 256, the all-reduces
    of large batches (8 MiB at 256) running at RCCL's step-bound mesh-ring rate, as rccl-tests measure."""
    err = {b: _oci_latency_s(b) / s - 1 for b, s in OCI_MI300X_405B_S.items()}
    assert err[1] == pytest.approx(-0.41, abs=0.03)
    assert err[256] == pytest.approx(-0.32, abs=0.03)
