"""``gigacluster loadtest SCENARIO [--duration S] [--slo-ttft S] [--slo-tpot S] [--out DIR]``: run an open-loop
load scenario (loadtest/*.yaml) against a running cluster and report HDR percentiles, SLO attainment and
goodput, a table and a PNG.

Credentials as every client command (``Client.connect``: ``--api-key``, ``GIGACLUSTER_API_KEY`` or
the file ``gigacluster up`` writes); the admin key (``GIGACLUSTER_ADMIN_KEY`` or that file) is
needed only for scenarios with more than one tenant, and against an event-clock mesh.

Against a mesh in event-clock mode (``gigacluster up --clock event`` leaves its coordinator's address
in the credentials file; else ``--clock-coordinator`` or ``GIGACLUSTER_CLOCK_COORDINATOR``) the load
generator takes part in the clock: arrivals go out at their virtual times and the report is in
virtual seconds, however fast the mesh runs.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time
from typing import Any

from gigacluster.client import Client, load_credentials, state_dir
from gigacluster.errors import DomainError
from gigacluster.loadtest import report, runner, scenario
from gigacluster.runtime import eventloop


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("loadtest", help="run an open-loop load scenario against a running cluster")
    p.add_argument("scenario", metavar="SCENARIO", help="scenario YAML (see loadtest/)")
    p.add_argument("--duration", type=float, default=None, metavar="S", help="override the scenario's duration_s")
    p.add_argument("--slo-ttft", type=float, default=None, metavar="S",
                   help="override the scenario's TTFT objective, seconds (goodput counts requests meeting both)")
    p.add_argument("--slo-tpot", type=float, default=None, metavar="S",
                   help="override the scenario's TPOT objective, seconds per output token after the first")
    p.add_argument("--out", default="", metavar="DIR",
                   help="output directory (default ~/.gigacluster/<cluster>/loadtest/<name>-<time>, outside the tree)")
    p.add_argument("--http", default="", metavar="URL",
                   help="router's OpenAI-compatible base URL for HTTP streams (default http://<router host>:8000)")
    p.add_argument("--clock-coordinator", default=None, metavar="HOST:PORT",
                   help="an event-clock mesh's coordinator: send arrivals in virtual time (default: "
                        "GIGACLUSTER_CLOCK_COORDINATOR or the credentials file; none = wall time)")
    p.add_argument("--cluster", default="local", help="cluster whose credentials to read (default local)")
    p.add_argument("--api-key", default=None, help="tenant API key (default: GIGACLUSTER_API_KEY or credentials)")
    p.set_defaults(handler=run)


def target_from(args: argparse.Namespace) -> runner.Target:
    client = Client.connect(api_key=args.api_key, cluster=args.cluster)
    creds = load_credentials(args.cluster)
    admin = os.environ.get("GIGACLUSTER_ADMIN_KEY") or creds.get("admin_key")
    http = args.http or f"http://{client.endpoints.router.rpartition(':')[0]}:8000"
    coordinator = getattr(args, "clock_coordinator", None)
    if coordinator is None:
        coordinator = os.environ.get("GIGACLUSTER_CLOCK_COORDINATOR") or str(creds.get("clock_coordinator") or "")
    return runner.Target(client.endpoints, client.api_key, admin, http, clock_coordinator=coordinator)


def default_out(name: str, cluster: str = "local") -> pathlib.Path:
    """Where a run's table, JSON and PNG go without ``--out``: the cluster's state directory
    (``GIGACLUSTER_HOME`` or ~/.gigacluster), never the working tree."""
    return state_dir(cluster) / "loadtest" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"


def run(args: argparse.Namespace) -> int:
    try:
        sc = scenario.load(args.scenario)
        if args.duration is not None:
            sc = sc.with_duration(args.duration)
        sc = sc.with_slo(args.slo_ttft, args.slo_tpot)
    except (DomainError, OSError) as exc:
        print(f"gigacluster loadtest: {exc}", file=sys.stderr)
        return 2
    try:
        eventloop.chosen()
    except ValueError as exc:  # runtime.config.ConfigError: an unknown GIGACLUSTER_EVENT_LOOP
        print(f"gigacluster loadtest: {exc}", file=sys.stderr)
        return 2
    out = pathlib.Path(args.out) if args.out else default_out(sc.name, args.cluster)
    try:
        result = eventloop.run(runner.run(sc, target_from(args), progress=lambda m: print(m, file=sys.stderr)))
    except DomainError as exc:
        print(f"gigacluster loadtest: {exc}", file=sys.stderr)
        return 2
    summary = report.summarize(sc, result.results, wall_s=result.elapsed_s if result.virtual else result.wall_s)
    paths = report.write(out, sc, summary, result.results)
    print(report.table(summary))
    took = (f"{result.elapsed_s:.1f} virtual s (event clock) in {result.wall_s:.1f} s wall" if result.virtual
            else f"{result.wall_s:.1f} s wall")
    print(f"\n{len(result.results)} arrivals, {took}; wrote " + ", ".join(str(p) for p in paths))
    return 0
