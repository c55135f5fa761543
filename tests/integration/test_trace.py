"""Timelines: a job's steps and a request's hops as Chrome/Perfetto trace JSON, from the live mesh."""

from __future__ import annotations

import json

import pytest

from gigacluster.client import Client
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.scheduler.v1 import scheduler_pb2
from gigacluster.stack import Stack
from gigacluster.trace import US, job_trace, request_trace

pytestmark = pytest.mark.integration


async def test_job_trace_has_compute_communication_and_bubbles_per_stage(stack: Stack, tenant: Client) -> None:
    """A 2-stage pipeline job's trace has one process per stage; each step's compute, exposed communication and
    1F1B bubbles (stage 0 drains, stage 1 fills) add up to the step time the scheduler reported."""
    spec = {"model": {"preset": "llama3-8b", "seq_len": 2048}, "batch": {"global_batch": 16},
            "parallelism": {"tp": 8, "pp": 2, "microbatch_size": 1}, "hardware": {"chip": "h100-sxm", "count": 16},
            "precision": "bf16", "steps": 3}
    job = await tenant.submit_job(spec)
    async for _ in tenant.watch_job(job.name):
        pass
    r = await tenant.scheduler.GetJobTrace(scheduler_pb2.GetJobTraceRequest(name=job.name), metadata=tenant.md)
    assert [s.step for s in r.steps] == [1, 2, 3] and r.pp == 2
    doc = json.loads(json.dumps(job_trace(r.name, r.steps, pp=r.pp, microbatches=r.microbatches)))
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {1, 2}
    for st in r.steps:
        for pid in (1, 2):
            mine = [e for e in slices if e["pid"] == pid and e["args"].get("step") == st.step]
            total = sum(e["dur"] for e in mine) / US
            assert total == pytest.approx(st.step_time_s, rel=1e-6)
        names = {e["name"] for e in slices if e["args"].get("step") == st.step}
        assert {"bubble (fill)", "bubble (drain)"} <= names and st.bubble_s > 0


async def test_request_trace_shows_queue_prefill_decode_and_every_chunk(stack: Stack, tenant: Client) -> None:
    """A streamed request's trace has queue, prefill and decode slices ending at the last chunk, and one instant
    per chunk."""
    await tenant.router.DeployModel(router_pb2.DeployModelRequest(
        deployment_id="trace-test", model=common_pb2.ModelArchitecture(preset="llama3-8b"), chip="h100-sxm",
        replicas=1), metadata=tenant.md)
    chunks = [c async for c in tenant.generate("deployments/trace-test", "trace me please", max_tokens=12)]
    doc = request_trace(chunks)
    slices = {e["name"].split(" on ")[0]: e for e in doc["traceEvents"] if e["ph"] == "X"}
    assert {"queue", "prefill", "decode"} <= set(slices)
    # A chunk carries the time of its last token: the first token (prefill's end) is at the first chunk's time
    # when that chunk holds one token, earlier when the stream sent several tokens in it.
    first_token_us = slices["prefill"]["ts"] + slices["prefill"]["dur"]
    if len(chunks[0].token_ids) == 1:
        assert first_token_us == pytest.approx(chunks[0].time_s * US, abs=1.0)
    assert first_token_us <= chunks[0].time_s * US + 1.0
    assert slices["decode"]["ts"] + slices["decode"]["dur"] == pytest.approx(chunks[-1].time_s * US, abs=1.0)
    assert len([e for e in doc["traceEvents"] if e["ph"] == "i"]) == len(chunks)
