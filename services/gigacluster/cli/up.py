"""``gigacluster up``: the local stack; ``gigacluster demo``: the stack plus a scenario and report."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pathlib
import signal
import sys
from typing import Any

import grpc

from gigacluster.client import DEFAULT_PORTS, Client, state_dir
from gigacluster.common.v1 import common_pb2
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime.logging import configure
from gigacluster.stack import Stack, StackConfig

DEFAULT_MODEL: dict[str, Any] = {"deployment_id": "llama3-8b", "preset": "llama3-8b", "tp": 1, "replicas": 2}


def add_stack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chip", default="h100-sxm", help="chip type of the emulated cluster (default h100-sxm)")
    p.add_argument("--chips", type=int, default=64, help="number of chips (default 64)")
    p.add_argument("--system", default="", help="scale-up system (default: the chip's own, e.g. hgx, trn2, "
                   "trn3-ultraserver, trn3-ultraserver-144, mi300x-platform)")
    p.add_argument("--shards", type=int, default=1, help="chip emulator processes sharing the chips (default 1)")
    p.add_argument("--speedup", type=float, default=1.0, help="virtual seconds per wall second (default 1)")
    p.add_argument("--mqtt", default="", metavar="HOST:PORT", help="use this MQTT broker (default: embedded)")
    p.add_argument("--mqtt-port", type=int, default=1883, help="port of the embedded MQTT broker (default 1883)")
    p.add_argument("--cluster", default="local", help="cluster name (default local)")
    p.add_argument("--tls", action="store_true",
                   help="mutual TLS between every service and client (a local CA under the state directory)")
    p.add_argument("--base-port", type=int, default=0,
                   help="first of five consecutive gRPC ports (default: chip 50051 ... router 50055)")
    p.add_argument("--http-port", type=int, default=None,
                   help="OpenAI-compatible HTTP endpoint of the router (up: 8000; demo: a free port; -1 = off)")


def stack_config(args: argparse.Namespace, *, state: pathlib.Path, log_format: str = "json") -> StackConfig:
    ports = dict(DEFAULT_PORTS)
    if args.base_port:
        ports = {k: args.base_port + i for i, k in enumerate(DEFAULT_PORTS)}
    return StackConfig(cluster=args.cluster, chip=args.chip, system=args.system, chips=args.chips, shards=args.shards,
                       speedup=args.speedup, mqtt=args.mqtt, mqtt_port=args.mqtt_port, ports=ports,
                       state_dir=state, log_format=log_format,
                       http_port=_http_port(args), tls=getattr(args, "tls", False))


def _http_port(args: argparse.Namespace) -> int:
    """``up`` serves the OpenAI-compatible endpoint on 8000 by default, the demo on a free port."""
    if getattr(args, "http_port", None) is not None:
        return int(args.http_port)
    return 8000 if getattr(args, "handler", None) is run_up else 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("up", help="start the local stack: five services and an MQTT broker")
    add_stack_args(p)
    p.add_argument("--no-model", action="store_true", help="do not deploy the default model")
    p.set_defaults(handler=run_up)
    d = subparsers.add_parser("demo", help="start the stack, run a training job and an inference burst, report")
    add_stack_args(d)
    d.set_defaults(handler=run_demo)
    d.add_argument("--requests", type=int, default=48, help="inference requests in the burst (default 48)")
    d.add_argument("--job", default="", help="job file (default: examples/demo-train-h100.yaml)")
    d.add_argument("--record", default="", metavar="DIR",
                   help="also record the run's telemetry and write plots and report.html into DIR")


async def bring_up(stack: Stack, *, deploy: bool = True, disaggregated: bool = False) -> str:
    """Start the stack, create the default tenant, deploy the default model; returns its API key.

    ``disaggregated`` serves it with one prefill and one decode replica, so every prompt's KV cache
    crosses the fabric (the demo uses it, so inference and training share the fabric too).
    """
    await stack.start()
    # Same state directory, same keys: the default tenant and its key survive a restart of ``up``.
    key = await stack.default_tenant_key("default")
    stack.write_credentials(key)
    if deploy:
        async with Client(stack.endpoints, key, tls=stack.tls) as gc:
            try:
                await gc.router.DeployModel(router_pb2.DeployModelRequest(
                    deployment_id=DEFAULT_MODEL["deployment_id"],
                    model=common_pb2.ModelArchitecture(preset=str(DEFAULT_MODEL["preset"])),
                    chip=stack.cfg.chip, tp=int(DEFAULT_MODEL["tp"]),
                    replicas=0 if disaggregated else int(DEFAULT_MODEL["replicas"]), policy="prefix_aware",
                    prefill_replicas=1 if disaggregated else 0, decode_replicas=1 if disaggregated else 0),
                    metadata=gc.md)
            except grpc.aio.AioRpcError as err:
                # A restart on the same state directory: the router kept the default deployment.
                if err.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise
    return key


def print_endpoints(stack: Stack, out: Any = sys.stdout) -> None:
    eps = stack.endpoints
    print("gigacluster is up", file=out)
    for name in DEFAULT_PORTS:
        print(f"  {name:<10} {getattr(eps, name)}", file=out)
    print(f"  {'mqtt':<10} {stack.mqtt}  (topics gigacluster/{stack.cfg.cluster}/#)", file=out)
    if stack.cfg.state_dir is not None:
        print(f"  credentials {stack.cfg.state_dir / 'credentials.json'}", file=out)
        print(f"  logs        {stack.cfg.state_dir / 'logs'}", file=out)
    print(f"  model       deployments/{DEFAULT_MODEL['deployment_id']} on {stack.cfg.chip}", file=out)
    if stack.openai_base_url:
        print(f"  openai      {stack.openai_base_url}  (Authorization: Bearer <api key from credentials>)", file=out)
    print("Ctrl-C stops everything.", file=out)


def run_up(args: argparse.Namespace) -> int:
    configure("up", fmt="console")

    async def main() -> None:
        stack = Stack(stack_config(args, state=state_dir(args.cluster)))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await bring_up(stack, deploy=not args.no_model)
            print_endpoints(stack)
            await stop.wait()
        finally:
            print("stopping ...", file=sys.stderr)
            await stack.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0


def run_demo(args: argparse.Namespace) -> int:
    from gigacluster.cli.demo import demo

    configure("demo", fmt="console", level="warning")
    return asyncio.run(demo(args))
