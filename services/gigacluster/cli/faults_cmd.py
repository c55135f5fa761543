"""``gigacluster faults run [--table llama3|FILE] [--scale X] [--seed N] [--duration-s S] ...``: inject failures
drawn from a rate table into a running mesh (chips and links, at their virtual times), and ``gigacluster faults
check FILE``: validate a failure table without a mesh.

The injector reads the broker, clock and keys as every service does (flags, ``GIGACLUSTER_*``); without an
admin key it takes the one ``gigacluster up`` left in the cluster's credentials file.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from gigacluster.client import load_credentials
from gigacluster.errors import DomainError
from gigacluster.faults.table import load_table
from gigacluster.runtime import config as cfgmod
from gigacluster.runtime import eventloop
from gigacluster.runtime.logging import configure


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("faults", help="inject failures from a rate table (Llama 3 mix) into a running mesh")
    sub = p.add_subparsers(dest="faults_command", required=True, metavar="ACTION")
    from gigacluster.faults.driver import FaultsConfig
    r = sub.add_parser("run", help="draw failures and inject them into the chips and links at their virtual times")
    cfgmod.add_arguments(r, FaultsConfig)
    r.set_defaults(handler=run)
    c = sub.add_parser("check", help="validate a failure table (YAML) and print its rows")
    c.add_argument("file", metavar="FILE", help="failure table YAML, or a built-in name (llama3)")
    c.set_defaults(handler=check)


def load_config(args: argparse.Namespace) -> Any:
    """The injector's config, the admin key from the credentials file when not given."""
    from gigacluster.faults.driver import FaultsConfig
    cfg = cfgmod.load(FaultsConfig, flags=vars(args), config_file=args.config)
    if not cfg.admin_key:
        cfg = dataclasses.replace(cfg, admin_key=str(load_credentials(cfg.cluster).get("admin_key", "")))
    return cfg


def run(args: argparse.Namespace) -> int:
    from gigacluster.faults.driver import serve
    try:
        cfg = load_config(args)
        eventloop.chosen()  # an unknown GIGACLUSTER_EVENT_LOOP fails here, before anything starts
    except cfgmod.ConfigError as exc:
        print(f"gigacluster faults: {exc}", file=sys.stderr)
        return 2
    configure("faults", fmt=cfg.log_format, level=cfg.log_level)
    try:
        eventloop.run(serve(cfg))
    except DomainError as exc:
        print(f"gigacluster faults: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


def check(args: argparse.Namespace) -> int:
    try:
        table = load_table(args.file)
    except DomainError as exc:
        print(f"gigacluster faults: {exc}", file=sys.stderr)
        return 2
    for r in table.rows:
        print(f"{r.cause:36s} {r.component:13s} {r.rate_per_chip_hour:.3e}/chip-h  repair {r.repair_s:g} s")
    print(f"total: {table.rate_per_chip_s * 3600:.3e} failures per chip-hour")
    return 0
