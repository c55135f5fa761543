"""``gigacluster serve SERVICE``: run one service as its own process."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from gigacluster.runtime import allocator, eventloop
from gigacluster.runtime import config as cfgmod
from gigacluster.runtime.logging import configure
from gigacluster.runtime.server import serve

SERVICES = {
    "chip": "gigacluster.chip.service:ChipService",
    "fabric": "gigacluster.fabric.service:FabricService",
    "broker": "gigacluster.broker.service:BrokerService",
    "scheduler": "gigacluster.scheduler.service:SchedulerService",
    "router": "gigacluster.router.service:RouterService",
    "clock": "gigacluster.clock.service:ClockService",
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("serve", help="run one service (chip, fabric, broker, scheduler, router; clock: "
                              "the event clock's coordinator)")
    sp = p.add_subparsers(dest="service", required=True, metavar="SERVICE")
    for name, cls in cfgmod.SERVE_CONFIGS.items():
        s = sp.add_parser(name, help=f"run the {name} service")
        cfgmod.add_arguments(s, cls)
        s.set_defaults(handler=run)


def service_class(name: str) -> type:
    module, _, attr = SERVICES[name].partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def run(args: argparse.Namespace) -> int:
    cls = cfgmod.SERVE_CONFIGS[args.service]
    try:
        config = cfgmod.load(cls, flags=vars(args), config_file=args.config)
        eventloop.chosen()  # an unknown GIGACLUSTER_EVENT_LOOP fails here, before anything starts
    except cfgmod.ConfigError as exc:
        print(f"gigacluster serve {args.service}: {exc}", file=sys.stderr)
        return 2
    configure(args.service, fmt=config.log_format, level=config.log_level)
    allocator.tune()  # large arrays reuse the heap's pages instead of faulting fresh ones (runtime/allocator.py)
    service = service_class(args.service)(config)
    eventloop.run(serve(service))
    return 0
