"""Entry point of the ``gigacluster`` console script.

Each command lives in its own module with a ``register(subparsers)`` function; this file only
wires them together, so adding a command never touches another command's code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from gigacluster.cli import (
    client_cmds,
    demo,
    estimate_collective,
    estimate_infer,
    estimate_train,
    faults_cmd,
    health,
    loadtest_cmd,
    mqtt_files,
    planning,
    preset_files,
    protos_cmd,
    report_cmds,
    scenario_cmd,
    serve,
    trace_cmds,
    up,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gigacluster",
        description="Emulate an AI supercomputer: chips, fabric, isolation broker, scheduler, router.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    est = sub.add_parser("estimate", help="offline estimates from the models (no running stack)")
    est_sub = est.add_subparsers(dest="estimate_command", required=True, metavar="WHAT")
    estimate_train.register(est_sub)
    estimate_collective.register(est_sub)
    estimate_infer.register(est_sub)
    planning.register(sub)
    serve.register(sub)
    up.register(sub)
    demo.register(sub)  # after up: the help lists up, then demo
    client_cmds.register(sub)
    report_cmds.register(sub)
    trace_cmds.register(sub)
    health.register(sub)
    mqtt_files.register(sub)
    preset_files.register(sub)
    loadtest_cmd.register(sub)
    scenario_cmd.register(sub)
    faults_cmd.register(sub)
    protos_cmd.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
