"""Client commands against a running stack: submit, jobs, watch, cancel, generate."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from rich.console import Console
from rich.table import Table

from gigacluster.client import Client, read_job_file
from gigacluster.errors import DomainError
from gigacluster.runtime.errors import error_info
from gigacluster.scheduler.v1 import scheduler_pb2


def _state(job: scheduler_pb2.Job) -> str:
    return scheduler_pb2.Job.State.Name(job.state).removeprefix("STATE_")


def job_dict(job: scheduler_pb2.Job) -> dict[str, Any]:
    return {
        "name": job.name, "display_name": job.display_name, "tenant": job.tenant, "state": _state(job),
        "reason": job.reason, "step": job.step, "steps_total": job.steps_total, "tokens": job.tokens,
        "step_time_s": job.last_step_time_s, "predicted_step_time_s": job.predicted_step_time_s, "mfu": job.mfu,
        "energy_it_kwh": job.usage.energy_it_j / 3.6e6, "cost_usd": job.usage.cost_usd, "eta_s": job.eta_s,
        "restarts": job.restarts, "chips": job.spec.hardware.count, "chip": job.spec.hardware.chip,
    }


def _connect(args: argparse.Namespace) -> Client:
    # A refusal with a retry-after (a saturated router, a full queue, a rate limit) is retried as the server says.
    return Client.connect(api_key=args.api_key, cluster=args.cluster, retry_refused=True)


def _run(fn: Callable[[Client], Awaitable[int]], args: argparse.Namespace) -> int:
    async def main() -> int:
        async with _connect(args) as gc:
            if not gc.api_key:
                print("no API key: run 'gigacluster up' first, or set GIGACLUSTER_API_KEY", file=sys.stderr)
                return 2
            return await fn(gc)

    try:
        return asyncio.run(main())
    except grpc.aio.AioRpcError as err:
        info = error_info(err)
        extra = f" [{info.reason}]" if info is not None else ""
        print(f"error: {err.code().name}: {one_line(err.details() or '')}{extra}", file=sys.stderr)
        return 2 if err.code() == grpc.StatusCode.INVALID_ARGUMENT else 1
    except DomainError as exc:
        print(f"error: {exc.code}: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2


def one_line(text: str, limit: int = 300) -> str:
    """An error for the terminal: one line, bounded (a hostile file cannot flood it)."""
    s = " ".join(text.split())
    return s if len(s) <= limit else s[: limit - 3] + "..."


def json_safe(v: Any) -> Any:
    """``v`` with every non-finite float as null: strict JSON never holds a bare NaN or Infinity."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [json_safe(x) for x in v]
    return v


def dumps(v: Any) -> str:
    return json.dumps(json_safe(v), allow_nan=False)


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        spec, fields = read_job_file(args.file)  # a bad file is refused here, before any connection
    except DomainError as exc:
        print(f"error: {exc.code}: {one_line(str(exc))}", file=sys.stderr)
        return 2

    async def go(gc: Client) -> int:
        job = await gc.submit_job(spec, **fields)
        if args.json:
            print(dumps(job_dict(job)))
        else:
            print(job.name)
        return 0
    return _run(go, args)


def cmd_jobs(args: argparse.Namespace) -> int:
    async def go(gc: Client) -> int:
        jobs = await gc.list_jobs()
        if args.json:
            print(dumps([job_dict(j) for j in jobs]))
            return 0
        t = Table("job", "state", "step", "step time", "MFU", "kWh", "$", "reason")
        for j in jobs:
            t.add_row(j.name, _state(j), f"{j.step}/{j.steps_total}", f"{j.last_step_time_s:.3f} s",
                      f"{j.mfu * 100:.1f}%", f"{j.usage.energy_it_j / 3.6e6:.3f}", f"{j.usage.cost_usd:.2f}", j.reason)
        Console().print(t)
        return 0
    return _run(go, args)


def cmd_watch(args: argparse.Namespace) -> int:
    async def go(gc: Client) -> int:
        last = None
        async for upd in gc.watch_job(args.job):
            j = upd.job
            last = j
            line = (f"{j.name} {_state(j)} step {j.step}/{j.steps_total} step_time {j.last_step_time_s:.3f}s "
                    f"(model {j.predicted_step_time_s:.3f}s) mfu {j.mfu * 100:.1f}% "
                    f"energy {j.usage.energy_it_j / 3.6e6:.4f} kWh cost ${j.usage.cost_usd:.2f} eta {j.eta_s:.0f}s")
            if upd.message:
                line += f" | {upd.message}"
            print(line, flush=True)
        return 0 if last is not None and last.state == scheduler_pb2.Job.STATE_SUCCEEDED else 1
    return _run(go, args)


def cmd_cancel(args: argparse.Namespace) -> int:
    async def go(gc: Client) -> int:
        job = await gc.cancel_job(args.job)
        print(f"{job.name} {_state(job)}")
        return 0
    return _run(go, args)


def cmd_generate(args: argparse.Namespace) -> int:
    async def go(gc: Client) -> int:
        model = args.model if args.model.startswith("deployments/") else f"deployments/{args.model}"
        usage = None
        async for chunk in gc.generate(model, args.prompt, max_tokens=args.max_tokens):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            if chunk.HasField("usage"):
                usage = chunk.usage
        print()
        if usage is not None:
            print(f"[{usage.prompt_tokens} prompt + {usage.completion_tokens} tokens, TTFT {usage.ttft_s * 1e3:.1f} ms,"
                  f" total {usage.e2e_s * 1e3:.1f} ms virtual, {usage.cached_prompt_tokens} prompt tokens cached]",
                  file=sys.stderr)
        return 0
    return _run(go, args)


def register(subparsers: Any) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--api-key", default=None, help="tenant API key (default: GIGACLUSTER_API_KEY or up's file)")
        p.add_argument("--cluster", default="local", help="cluster name (default local)")

    p = subparsers.add_parser("submit", help="submit a training job file")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print the job as JSON")
    common(p)
    p.set_defaults(handler=cmd_submit)
    p = subparsers.add_parser("jobs", help="list your jobs")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    common(p)
    p.set_defaults(handler=cmd_jobs)
    p = subparsers.add_parser("watch", help="follow a job until it ends")
    p.add_argument("job")
    common(p)
    p.set_defaults(handler=cmd_watch)
    p = subparsers.add_parser("cancel", help="cancel a job")
    p.add_argument("job")
    common(p)
    p.set_defaults(handler=cmd_cancel)
    p = subparsers.add_parser("generate", help="stream a completion from a deployed model")
    p.add_argument("prompt")
    p.add_argument("--model", default="llama3-8b", help="deployment (default llama3-8b)")
    p.add_argument("--max-tokens", type=int, default=64)
    common(p)
    p.set_defaults(handler=cmd_generate)
