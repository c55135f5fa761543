"""``gigacluster scenario run FILE [--cluster NAME] [--speedup X] [--duration-s S] [--out report.json] [--markdown]``:
run a multi-tenant scenario (examples/gigawatt*.yaml, docs/scenarios.md) against the stack ``gigacluster up``
started (on the wall clock at its speed-up, or on the event clock of ``up --clock event``, which the run joins),
and print its report; ``gigacluster scenario check FILE`` validates a file without a stack.

Endpoints and the admin key as the other client commands find them (``Client.connect``; the admin key from
``GIGACLUSTER_ADMIN_KEY`` or the credentials file ``up`` writes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import sys
import time
from typing import Any

import grpc

from gigacluster.cli.client_cmds import json_safe, one_line
from gigacluster.client import Client, load_credentials, state_dir
from gigacluster.errors import DomainError
from gigacluster.scenario import report, runner, spec


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("scenario", help="run a multi-tenant scenario file against a running cluster")
    sub = p.add_subparsers(dest="scenario_command", required=True, metavar="ACTION")
    r = sub.add_parser("run", help="run a scenario and print its report (tenants, jobs, fabric tiers, inference)")
    r.add_argument("file", metavar="FILE", help="scenario YAML (see examples/gigawatt-small.yaml)")
    options: tuple[tuple[str, dict[str, Any]], ...] = (
        ("--cluster", {"default": "local", "help": "cluster whose credentials to read (default local)"}),
        ("--speedup", {"type": float, "metavar": "X",
                       "help": "the stack's speed-up (default the file's speedup; checked against its clock)"}),
        ("--duration-s", {"type": float, "metavar": "S", "help": "override the file's duration_s (virtual seconds)"}),
        ("--out", {"default": "", "metavar": "FILE",
                   "help": "report JSON (default ~/.gigacluster/<cluster>/scenario/<name>-<time>.json)"}),
        ("--markdown", {"action": "store_true", "help": "also write the markdown tables next to the JSON (.md)"}),
    )
    for flag, kw in options:
        r.add_argument(flag, **kw)
    r.set_defaults(handler=cmd_run)
    c = sub.add_parser("check", help="validate a scenario file (no stack needed)")
    c.add_argument("file", metavar="FILE")
    c.set_defaults(handler=cmd_check)


def cmd_check(args: argparse.Namespace) -> int:
    try:
        sc = spec.load(args.file)
    except (DomainError, OSError) as exc:
        print(f"gigacluster scenario: {one_line(str(exc))}", file=sys.stderr)
        return 2
    chips = sum(j.chips for j in sc.jobs)
    print(f"{sc.name}: {len(sc.tenants)} tenants, {len(sc.jobs)} jobs ({chips:,} chips if all ran at once) on "
          f"{sc.site.chips:,} x {sc.site.chip}, {len(sc.faults)} faults, "
          f"{'an inference fleet' if sc.inference else 'no inference'}, {sc.duration_s:g} virtual s")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    try:
        sc = spec.load(args.file).with_overrides(duration_s=args.duration_s, speedup=args.speedup)
    except (DomainError, OSError) as exc:
        print(f"gigacluster scenario: {one_line(str(exc))}", file=sys.stderr)
        return 2
    client = Client.connect(cluster=args.cluster)
    admin = os.environ.get("GIGACLUSTER_ADMIN_KEY") or load_credentials(args.cluster).get("admin_key")
    if not admin:
        print("gigacluster scenario: no admin key: run 'gigacluster up' first, or set GIGACLUSTER_ADMIN_KEY",
              file=sys.stderr)
        return 2
    coordinator = os.environ.get("GIGACLUSTER_CLOCK_COORDINATOR") or str(
        load_credentials(args.cluster).get("clock_coordinator") or "")
    target = runner.Target(client.endpoints, str(admin), client.tls, clock_coordinator=coordinator)
    try:
        rep = asyncio.run(runner.run(sc, target, progress=lambda m: print(m, file=sys.stderr, flush=True)))
    except DomainError as exc:
        print(f"gigacluster scenario: {exc.code}: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as exc:
        print(f"gigacluster scenario: {exc.code().name}: {one_line(exc.details() or '')}", file=sys.stderr)
        return 1
    out = pathlib.Path(args.out) if args.out else (
        state_dir(args.cluster) / "scenario" / f"{sc.name}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(json_safe(rep), indent=2, allow_nan=False) + "\n")
    md = report.markdown(rep)
    written = [out]
    if args.markdown:
        written.append(out.with_suffix(".md"))
        written[-1].write_text(md + "\n")
    print(md)
    bad = runner.end_to_end_check(rep)
    for b in bad:
        print(f"warning: {b}", file=sys.stderr)
    print(f"\nwrote {', '.join(map(str, written))}", file=sys.stderr)
    return 0
