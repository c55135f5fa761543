"""Chrome / Perfetto trace JSON (the "Trace Event Format") for a job's steps and a request's hops.

Times are virtual seconds, written as microseconds. A job becomes one process per pipeline
stage (rank group) with three threads: compute, exposed communication, pipeline bubble; under
1F1B stage ``s`` of ``pp`` idles ``s`` slots while the pipeline fills and ``pp - 1 - s`` while it
drains (each slot is a microbatch's forward+backward over ``virtual_stages``). An inference
request becomes one process with queue, prefill, KV transfer (disaggregated serving) and decode
slices and an instant event per streamed chunk. Open the file in ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

US = 1e6


def _meta(pid: int, name: str, threads: dict[int, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"ph": "M", "pid": pid, "name": "process_name", "args": {"name": name}}]
    out += [{"ph": "M", "pid": pid, "tid": tid, "name": "thread_name", "args": {"name": t}}
            for tid, t in threads.items()]
    return out


def _slice(pid: int, tid: int, name: str, start_s: float, dur_s: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": start_s * US, "dur": max(dur_s, 0.0) * US,
            "args": args}


def job_trace(name: str, steps: Sequence[Any], *, pp: int = 1, microbatches: int = 1,
              virtual_stages: int = 1) -> dict[str, Any]:
    """Trace events for a job's steps (``StepTrace`` messages or objects with the same fields)."""
    events: list[dict[str, Any]] = []
    threads = {1: "compute", 2: "exposed communication", 3: "pipeline bubble"}
    for stage in range(max(pp, 1)):
        events += _meta(stage + 1, f"{name} stage {stage}" if pp > 1 else name, threads)
    for st in steps:
        comm = dict(st.comm_s)
        slot = st.bubble_s / (pp - 1) if pp > 1 else 0.0
        for stage in range(max(pp, 1)):
            pid = stage + 1
            warm = stage * slot
            t = st.start_s
            if warm > 0:
                events.append(_slice(pid, 3, "bubble (fill)", t, warm, step=st.step))
            events.append(_slice(pid, 1, f"step {st.step}", t + warm, st.compute_s, step=st.step,
                                 step_time_s=st.step_time_s, microbatches=microbatches,
                                 virtual_stages=virtual_stages))
            t_comm = t + warm + st.compute_s
            if st.exposed_comm_s > 0:
                events.append(_slice(pid, 2, "exposed communication", t_comm, st.exposed_comm_s, step=st.step,
                                     **{f"{k}_total_s": v for k, v in comm.items()}))
            drain = (pp - 1 - stage) * slot
            if drain > 0:
                events.append(_slice(pid, 3, "bubble (drain)", t_comm + st.exposed_comm_s, drain, step=st.step))
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"job": name, "clock": "virtual"}}


def request_trace(chunks: Sequence[Any]) -> dict[str, Any]:
    """Trace events for one Generate stream (its ``GenerateResponse`` chunks, the last carrying usage)."""
    if not chunks:
        return {"traceEvents": []}
    last = chunks[-1]
    u = last.usage
    # A chunk carries the time of its LAST token (a stream that fell behind sends several per message), so
    # the request's times come from the last chunk (its last token is the request's last) and the usage.
    arrival = last.time_s - u.e2e_s
    first_t = arrival + u.ttft_s
    rid = last.request_id
    events = _meta(1, f"request {rid}", {1: "router", 2: "replica", 3: "fabric", 4: "tokens"})
    events.append(_slice(1, 1, "queue", arrival, u.queue_s))
    if u.kv_transfer_s > 0:
        prefill_end = first_t - u.kv_transfer_s
        events.append(_slice(1, 2, f"prefill on {u.prefill_replica or 'prefill replica'}", arrival + u.queue_s,
                             prefill_end - arrival - u.queue_s, prompt_tokens=u.prompt_tokens,
                             cached_prompt_tokens=u.cached_prompt_tokens))
        events.append(_slice(1, 3, "KV cache transfer", prefill_end, u.kv_transfer_s, bytes=u.kv_transfer_bytes))
    else:
        events.append(_slice(1, 2, "prefill", arrival + u.queue_s, first_t - arrival - u.queue_s,
                             prompt_tokens=u.prompt_tokens, cached_prompt_tokens=u.cached_prompt_tokens))
    events.append(_slice(1, 2, f"decode on {last.replica}", first_t, arrival + u.e2e_s - first_t,
                         completion_tokens=u.completion_tokens))
    for c in chunks:
        events.append({"ph": "i", "pid": 1, "tid": 4, "s": "t", "name": f"tokens {c.index}+{len(c.token_ids)}",
                       "ts": c.time_s * US})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"request": rid, "clock": "virtual"}}
