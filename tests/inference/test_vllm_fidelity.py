"""The engine against vLLM's scheduler (issue 15 item 5): v1 chunked admission, preemption, host time."""

from __future__ import annotations

import pytest

from gigacluster.inference.config import vllm_batch_defaults
from gigacluster.inference.cost import iteration_overhead_s
from gigacluster.inference.engine import ReplicaConfig, ReplicaEngine
from gigacluster.model.arch import preset
from tests.inference.conftest import make_req

LLAMA8B = preset("llama3-8b")


def test_v1_admission_holds_blocks_for_the_scheduled_chunk_only() -> None:
    """vLLM v1 allocates KV blocks for the tokens it schedules (64 blocks for a 1,024-token chunk of a
    6,000-token prompt); v0 reserves the whole prompt (375 blocks) before starting it."""
    for chunked, budget, blocks in ((True, 1024, 1024 // 16), (False, 8192, 6000 // 16)):
        cfg = ReplicaConfig(LLAMA8B, "a100-40gb", chunked_prefill=chunked, max_prefill_tokens=budget)
        eng = ReplicaEngine(cfg)
        eng.admit(make_req("long", 6000, 10), 0.0)
        assert eng.next_iteration(0.0) is not None
        assert eng.kv_used_frac * cfg.kv_blocks == pytest.approx(blocks)


def test_v1_admits_nobody_in_a_step_that_preempted() -> None:
    """Under KV pressure (686 blocks for 8 long requests) decodes and chunks preempt the newest sequence;
    in such a step no waiting request starts (vLLM v1 scheduler: waiting only if not preempted_reqs)."""
    cfg = ReplicaConfig(LLAMA8B, "a100-40gb", kv_fraction=0.4098, chunked_prefill=True, max_prefill_tokens=1024,
                        max_batch=16)
    assert cfg.kv_blocks == 686
    eng = ReplicaEngine(cfg)
    for i in range(8):
        eng.admit(make_req(f"r{i}", 1500, 1500, seed=i), 0.0)
    t, started, preempting_steps = 0.0, set(), 0
    while (it := eng.next_iteration(t)) is not None:
        seen = eng.stats().preemptions  # counted while this iteration was scheduled
        ids = set(it.request_ids)
        if seen > preempting_steps:  # this call preempted
            preempting_steps = seen
            assert ids <= started
        started |= ids
        t += it.predicted_s
        eng.complete(it, t)
    assert preempting_steps > 0  # the scenario does preempt


def test_vllm_v1_batch_defaults_per_chip() -> None:
    """vLLM EngineArgs.get_batch_defaults (OpenAI server): 8,192 tokens and 1,024 sequences on 70 GB+
    accelerators other than A100, else 2,048 and 256."""
    assert vllm_batch_defaults("h100-sxm") == (8192, 1024)
    assert vllm_batch_defaults("mi300x") == (8192, 1024)
    assert vllm_batch_defaults("a100-80gb") == (2048, 256)
    assert vllm_batch_defaults("a100-40gb") == (2048, 256)


def test_every_iteration_pays_the_host_time() -> None:
    """Each iteration's predicted time is its kernels + collectives + the catalog's 1 ms of host time
    (scheduling, sampling, launch), prefill or decode alike, and on vLLM v0's path (no chunked prefill)
    v0's scheduler time per sequence in the batch (serving.v0_schedule_seq_s)."""
    from gigacluster.inference.cost import v0_schedule_seq_s

    for chunked, per_seq in ((True, 0.0), (False, v0_schedule_seq_s())):
        eng = ReplicaEngine(ReplicaConfig(LLAMA8B, "h100-sxm", tp=2, chunked_prefill=chunked))
        eng.admit(make_req("a", 300, 3), 0.0)
        t = 0.0
        while (it := eng.next_iteration(t)) is not None:
            assert it.host_s == pytest.approx(iteration_overhead_s() + per_seq) and iteration_overhead_s() == 1e-3
            assert it.predicted_s == pytest.approx(it.compute_s + it.comm_s + it.host_s)
            t += it.predicted_s
            eng.complete(it, t)
