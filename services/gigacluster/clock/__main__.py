"""``python -m gigacluster.clock [--port N] ...``: run the event clock's coordinator."""

from __future__ import annotations

import argparse
import sys

from gigacluster.clock.service import ClockConfig, ClockService
from gigacluster.runtime import config as cfgmod
from gigacluster.runtime import eventloop
from gigacluster.runtime.logging import configure
from gigacluster.runtime.server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gigacluster.clock", description=__doc__)
    cfgmod.add_arguments(parser, ClockConfig)
    args = parser.parse_args(argv)
    try:
        config = cfgmod.load(ClockConfig, flags=vars(args), config_file=args.config)
        eventloop.chosen()  # an unknown GIGACLUSTER_EVENT_LOOP fails here, before anything starts
    except cfgmod.ConfigError as exc:
        print(f"gigacluster clock: {exc}", file=sys.stderr)
        return 2
    configure("clock", fmt=config.log_format, level=config.log_level)
    eventloop.run(serve(ClockService(config)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
