"""``gigacluster trace JOB`` and ``gigacluster trace-request``: Chrome/Perfetto trace JSON."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gigacluster.cli.client_cmds import _run
from gigacluster.client import Client
from gigacluster.scheduler.v1 import scheduler_pb2
from gigacluster.trace import job_trace, request_trace


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("trace", help="a job's steps as Chrome/Perfetto trace JSON (stdout or --out)")
    p.add_argument("job")
    p.add_argument("--out", default="-", help="file to write (default: stdout)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--cluster", default="local")
    p.set_defaults(handler=cmd_trace)
    r = subparsers.add_parser("trace-request", help="generate once and write the request's hops as trace JSON")
    r.add_argument("prompt")
    r.add_argument("--model", default="llama3-8b")
    r.add_argument("--max-tokens", type=int, default=32)
    r.add_argument("--out", default="-")
    r.add_argument("--api-key", default=None)
    r.add_argument("--cluster", default="local")
    r.set_defaults(handler=cmd_trace_request)


def _write(doc: dict[str, Any], out: str) -> None:
    text = json.dumps(doc)
    if out == "-":
        sys.stdout.write(text + "\n")
    else:
        with open(out, "w") as f:
            f.write(text)
        print(f"wrote {out} ({len(doc['traceEvents'])} events): open it in ui.perfetto.dev", file=sys.stderr)


def cmd_trace(args: argparse.Namespace) -> int:
    async def go(gc: Client) -> int:
        name = args.job if args.job.startswith("jobs/") else f"jobs/{args.job}"
        r = await gc.scheduler.GetJobTrace(scheduler_pb2.GetJobTraceRequest(name=name), metadata=gc.md)
        if not r.steps:
            print(f"{name} has no steps yet", file=sys.stderr)
            return 1
        _write(job_trace(r.name, r.steps, pp=r.pp, microbatches=r.microbatches, virtual_stages=r.virtual_stages),
               args.out)
        return 0

    return _run(go, args)


def cmd_trace_request(args: argparse.Namespace) -> int:
    async def go(gc: Client) -> int:
        model = args.model if args.model.startswith("deployments/") else f"deployments/{args.model}"
        chunks = [c async for c in gc.generate(model, args.prompt, max_tokens=args.max_tokens)]
        _write(request_trace(chunks), args.out)
        return 0

    return _run(go, args)
