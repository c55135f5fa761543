"""``gigacluster health HOST:PORT``: ask a service's standard gRPC health service; exit 0 when SERVING.

Used as the container health check in ``deploy/docker-compose.yml`` and the Kubernetes probes, so
they need no extra binary (grpc_health_probe) in the image.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gigacluster.cli import standalone
from gigacluster.runtime.channels import open_channel

#: Exit codes: 0 SERVING, 1 answered but not SERVING, 2 no answer (unreachable, timeout, error).
SERVING, NOT_SERVING, UNREACHABLE = 0, 1, 2


async def check(target: str, *, service: str = "", timeout_s: float = 3.0) -> tuple[int, str]:
    """(exit code, status name) of ``target``'s health service for ``service`` ("" = the server)."""
    try:
        async with open_channel(target) as ch:
            r = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        return UNREACHABLE, exc.code().name
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
    return (SERVING if r.status == health_pb2.HealthCheckResponse.SERVING else NOT_SERVING), name


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("health", help="check a service through the gRPC health service (exit 0 = SERVING)")
    _add_args(p)
    p.set_defaults(handler=run)


def _add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", metavar="HOST:PORT", help="the service's gRPC endpoint")
    p.add_argument("--service", default="", help="service name to check (default: the whole server)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for an answer (default 3)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing; the exit code says it")


def run(args: argparse.Namespace) -> int:
    code, status = asyncio.run(check(args.target, service=args.service, timeout_s=args.timeout))
    if not args.quiet:
        print(f"{args.target} {status}", file=sys.stdout if code == SERVING else sys.stderr)
    return code


main = standalone("gigacluster health", __doc__, _add_args, run)  # python -m gigacluster.cli.health HOST:PORT


if __name__ == "__main__":
    sys.exit(main())
