"""A short open-loop scenario against the real five-process mesh: every gRPC generation completes with all
its tokens, job submissions are accepted, and the run cleans up after itself."""

from __future__ import annotations

import pathlib

import grpc
import pytest

from gigacluster.client import Client
from gigacluster.loadtest import report, runner, scenario, schedule
from gigacluster.router.v1 import router_pb2
from gigacluster.scheduler.v1 import scheduler_pb2
from gigacluster.stack import Stack

pytestmark = pytest.mark.integration

JOB = """name: lt-small
model: {preset: llama3-8b, seq_len: 2048}
batch: {global_batch: 16}
parallelism: {tp: 8, pp: 1, cp: 1, microbatch_size: 2}
hardware: {chip: h100-sxm, count: 8}
precision: bf16
steps: 2
"""


async def test_short_scenario_against_the_stack(stack: Stack, tenant: Client, tmp_path: pathlib.Path) -> None:
    """Poisson-timed generations (4/s over 3 s: the seeded timeline's 14) and 2 uniform job submissions run
    open-loop: each generation streams exactly max_tokens tokens with TTFT < end-to-end and a positive
    virtual TTFT, both jobs are accepted, and afterwards the deployment is deleted and the jobs have ended."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    sc = scenario.parse({
        "name": "itest", "duration_s": 3.0, "seed": 5, "drain_s": 60,
        "deploy": {"deployment_id": "lt-itest", "preset": "llama3-8b", "chip": "h100-sxm", "tp": 1, "replicas": 1},
        "streams": [
            {"name": "chat", "kind": "generate", "arrival": {"type": "poisson", "rate_per_s": 4},
             "prompt_tokens": 64, "max_tokens": 8},
            {"name": "train", "kind": "submit_job", "arrival": {"type": "uniform", "rate_per_s": 0.5},
             "job": str(job)},
        ]})
    run = await runner.run(sc, runner.Target(stack.endpoints, tenant.api_key))
    chat = [r for r in run.results if r.stream == 0]
    train = [r for r in run.results if r.stream == 1]
    assert len(chat) == int((schedule.build(sc).stream == 0).sum()) == 14 and len(train) == 2
    assert all(r.ok for r in run.results), [(r.status, r.detail) for r in run.results if not r.ok]
    assert all(r.tokens == 8 and 0 < r.ttft_s <= r.e2e_s and r.virtual_ttft_s > 0 for r in chat), [
        (r.tokens, r.ttft_s, r.e2e_s, r.virtual_ttft_s) for r in chat]
    summary = report.summarize(sc, run.results, wall_s=run.wall_s)
    assert summary["streams"][0]["ok"] == 14 and summary["streams"][0]["ttft"]["count"] == 14
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await tenant.router.GetDeployment(router_pb2.GetDeploymentRequest(name="deployments/lt-itest"),
                                          metadata=tenant.md)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    jobs = [j for j in await tenant.list_jobs() if j.display_name.startswith("lt-small")]
    assert len(jobs) == 2
    ended = (scheduler_pb2.Job.STATE_SUCCEEDED, scheduler_pb2.Job.STATE_FAILED, scheduler_pb2.Job.STATE_CANCELLED)
    assert all(j.state in ended for j in jobs), [j.state for j in jobs]


async def test_calls_given_up_at_the_drain_end_are_timeouts_not_cancelled(stack: Stack, tenant: Client) -> None:
    """Generations still streaming when the drain ends are TIMEOUT: the client gave up on them. gRPC reports
    a call its own client cancels as CANCELLED, which the run used to record, and the benchmarks then counted
    as calls the router cancelled."""
    sc = scenario.parse({
        "name": "itest-drain", "duration_s": 1.0, "seed": 5, "drain_s": 0.01,
        "deploy": {"deployment_id": "lt-drain", "preset": "llama3-8b", "chip": "h100-sxm", "tp": 1, "replicas": 1},
        "streams": [{"name": "long", "kind": "generate", "arrival": {"type": "uniform", "rate_per_s": 3},
                     "prompt_tokens": 6000, "max_tokens": 2000}]})  # ~15 s of decode at speed-up 10: ~1.5 s wall
    run = await runner.run(sc, runner.Target(stack.endpoints, tenant.api_key))
    assert len(run.results) == 3
    assert [r.status for r in run.results] == ["TIMEOUT"] * 3, [(r.status, r.detail) for r in run.results]
    assert all("drain" in r.detail for r in run.results)
