"""``gigacluster up``: the local stack (``gigacluster demo``, in cli/demo.py, builds on it)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pathlib
import shlex
import signal
import sys
from typing import Any

import grpc

from gigacluster.client import DEFAULT_PORTS, Client, state_dir
from gigacluster.common.v1 import common_pb2
from gigacluster.fabric.sizing import choose_scaleout
from gigacluster.model import SpecError
from gigacluster.router.v1 import router_pb2
from gigacluster.runtime.clock import CLOCK_MODES
from gigacluster.runtime.convert import PRECISION_ENUMS
from gigacluster.runtime.logging import configure
from gigacluster.sites import PRESETS, get_preset
from gigacluster.stack import Stack, StackConfig

DEFAULT_MODEL: dict[str, Any] = {"deployment_id": "llama3-8b", "preset": "llama3-8b", "tp": 1, "replicas": 2}


def _preset_help() -> str:
    rows = "; ".join(f"{p.name}: {p.description}" for p in PRESETS.values())
    return (f"a whole site: chip, chips, shards, scale-out tree and NIC of a {', '.join(PRESETS)} site "
            f"(flags given explicitly win). {rows}")


def add_stack_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", choices=sorted(PRESETS), default=None, help=_preset_help())
    p.add_argument("--chip", default=None, help="chip type of the emulated cluster (default h100-sxm)")
    p.add_argument("--chips", type=int, default=None, help="number of chips (default 64)")
    p.add_argument("--system", default=None, help="scale-up system (default: the chip's own, e.g. hgx, trn2, "
                   "trn3-ultraserver, trn3-ultraserver-144, mi300x-platform)")
    p.add_argument("--shards", type=int, default=None, help="chip emulator processes sharing the chips (default 1)")
    p.add_argument("--tiers", type=int, choices=(2, 3), default=None,
                   help="scale-out fat-tree tiers (default: the smallest tree that holds the chips)")
    p.add_argument("--switch", default=None, help="scale-out switch: tomahawk5, tomahawk6, tomahawk-ultra "
                   "(default: Tomahawk 5 if it holds the chips in three tiers, else Tomahawk 6)")
    p.add_argument("--nic", default=None, help="NIC: nic400 or thor-ultra (default: the chip's own, from the catalog)")
    p.add_argument("--routing", default=None, help="fabric routing: ecmp (one hash per flow) or spray (packet "
                   "spraying over every equal-cost path); default ecmp, spray for the presets")
    p.add_argument("--oversubscription", type=float, default=None,
                   help="leaf downlink:uplink ratio of the scale-out tree (default 1 = non-blocking); e.g. 2 "
                        "for a 2:1 tree, or higher to make a small site's tenants share leaf uplinks")
    p.add_argument("--speedup", type=float, default=1.0, help="virtual seconds per wall second (default 1; wall clock)")
    p.add_argument("--clock", choices=CLOCK_MODES, default="wall",
                   help="wall: virtual time = wall time x speedup (default); event: virtual time jumps to the next "
                        "event once the whole mesh is idle (a clock coordinator process; see docs/architecture.md)")
    p.add_argument("--mqtt", default="", metavar="HOST:PORT", help="use this MQTT broker (default: embedded)")
    p.add_argument("--mqtt-port", type=int, default=1883, help="port of the embedded MQTT broker (default 1883)")
    p.add_argument("--cluster", default="local", help="cluster name (default local)")
    p.add_argument("--tls", action="store_true",
                   help="mutual TLS between every service and client (a local CA under the state directory)")
    p.add_argument("--base-port", type=int, default=0,
                   help="first of five consecutive gRPC ports (default: chip 50051 ... router 50055)")
    p.add_argument("--http-port", type=int, default=None,
                   help="OpenAI-compatible HTTP endpoint of the router (up: 8000; demo: a free port; -1 = off)")
    p.add_argument("--router-frontends", type=int, default=0, metavar="N",
                   help="run the router as a core and N front-end processes sharing its gRPC and HTTP ports "
                        "(client streams, auth and token streaming off the core's event loop; default 0 = one "
                        "process)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="BASE",
                   help="Prometheus /metrics of every service on its own port from BASE: chip, fabric, broker, "
                        "scheduler, router on BASE..BASE+4, further chip shards after (up: 9464; demo: -1 = off; "
                        "0 = free ports)")


#: What ``up`` starts when neither a preset nor a flag says otherwise.
SITE_DEFAULTS: dict[str, Any] = {"chip": "h100-sxm", "chips": 64, "shards": 1, "system": "", "tiers": 0,
                                 "switch": "", "nic": "", "routing": "",
                                 "oversubscription": 0.0}


def site_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Chip, chips, shards, system and scale-out: each flag given wins, then the preset, then the defaults."""
    site = dict(SITE_DEFAULTS)
    preset = getattr(args, "preset", None)
    if preset:
        site.update(get_preset(preset).resolve())
    for key in SITE_DEFAULTS:
        value = getattr(args, key, None)
        if value is not None:
            site[key] = value
    return site


def stack_config(args: argparse.Namespace, *, state: pathlib.Path, log_format: str = "json") -> StackConfig:
    ports = dict(DEFAULT_PORTS)
    if args.base_port:
        ports = {k: args.base_port + i for i, k in enumerate(DEFAULT_PORTS)}
    site = site_settings(args)
    try:  # a tree too small for the chips fails here, before any process starts
        choose_scaleout(site["chip"], site["chips"], system=site["system"], nic=site["nic"], tiers=site["tiers"],
                        switch=site["switch"], oversubscription=site["oversubscription"] or 1.0)
    except SpecError as err:
        raise SystemExit(f"error: {err.message}") from None
    return StackConfig(cluster=args.cluster, chip=site["chip"], system=site["system"], chips=site["chips"],
                       shards=site["shards"], tiers=site["tiers"], switch=site["switch"], nic=site["nic"],
                       routing=site["routing"], oversubscription=site["oversubscription"],
                       speedup=args.speedup, clock=getattr(args, "clock", "wall"), mqtt=args.mqtt,
                       mqtt_port=args.mqtt_port, ports=ports,
                       state_dir=state, log_format=log_format,
                       http_port=_http_port(args), tls=getattr(args, "tls", False),
                       metrics=_metrics_port(args) >= 0, metrics_base_port=max(_metrics_port(args), 0),
                       router_frontends=getattr(args, "router_frontends", 0))


def _http_port(args: argparse.Namespace) -> int:
    """``up`` serves the OpenAI-compatible endpoint on 8000 by default, the demo on a free port."""
    if getattr(args, "http_port", None) is not None:
        return int(args.http_port)
    return 8000 if getattr(args, "handler", None) is run_up else 0


#: First metrics port of ``up``: 9464 is the port the compose and Kubernetes files give every service.
UP_METRICS_BASE_PORT = 9464


def _metrics_port(args: argparse.Namespace) -> int:
    """``up`` serves metrics from 9464 by default; the demo none."""
    if getattr(args, "metrics_port", None) is not None:
        if int(args.metrics_port) < -1:
            raise SystemExit(f"--metrics-port must be -1 (off), 0 (free ports) or a port, got {args.metrics_port}")
        return int(args.metrics_port)
    return UP_METRICS_BASE_PORT if getattr(args, "handler", None) is run_up else -1


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("up", help="start the local stack: five services and an MQTT broker")
    add_stack_args(p)
    p.add_argument("--no-model", action="store_true", help="do not deploy the default model")
    p.add_argument("--model", default=None, metavar="PRESET",
                   help=f"model to deploy instead of {DEFAULT_MODEL['preset']}, e.g. gpt-oss-120b, mixtral-8x7b, "
                        "deepseek-v3 (an MoE deploys expert-parallel with --model-ep)")
    p.add_argument("--model-tp", type=int, default=None, help="tensor parallelism of each replica (default 1)")
    p.add_argument("--model-ep", type=int, default=None,
                   help="expert parallelism of each replica of an MoE model (default 1; must divide its experts)")
    p.add_argument("--model-precision", default=None, help="weights precision: fp16, bf16 (default), fp8, mxfp6, "
                   "mxfp4, nvfp4 (the chip must support it)")
    p.set_defaults(handler=run_up)


def model_request(chip: str, args: argparse.Namespace | None = None, *,
                  disaggregated: bool = False) -> router_pb2.DeployModelRequest:
    """The DeployModel request ``up`` sends: the default model, or ``--model`` with its TP, EP and precision
    (the router checks them: an EP that does not divide the experts, or a precision the chip lacks, is refused
    with the allowed values and ``up`` exits with that message)."""
    model = getattr(args, "model", None) or str(DEFAULT_MODEL["preset"])
    precision = getattr(args, "model_precision", None) or ""
    if precision and precision not in PRECISION_ENUMS:
        raise SystemExit(f"error: --model-precision {precision[:32]!r}: allowed {', '.join(sorted(PRECISION_ENUMS))}")
    req = router_pb2.DeployModelRequest(
        deployment_id=model, model=common_pb2.ModelArchitecture(preset=model), chip=chip,
        tp=int(getattr(args, "model_tp", None) or DEFAULT_MODEL["tp"]),
        ep=int(getattr(args, "model_ep", None) or 0),
        replicas=0 if disaggregated else int(DEFAULT_MODEL["replicas"]), policy="prefix_aware",
        prefill_replicas=1 if disaggregated else 0, decode_replicas=1 if disaggregated else 0)
    if precision:
        req.precision = PRECISION_ENUMS[precision]  # type: ignore[assignment]  # protobuf enums are int NewTypes
    return req


async def bring_up(stack: Stack, *, deploy: bool = True, disaggregated: bool = False,
                   args: argparse.Namespace | None = None) -> str:
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
                await gc.router.DeployModel(model_request(stack.cfg.chip, args, disaggregated=disaggregated),
                                            metadata=gc.md)
            except grpc.aio.AioRpcError as err:
                # A restart on the same state directory: the router kept the deployment.
                if err.code() == grpc.StatusCode.ALREADY_EXISTS:
                    return key
                if err.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND):
                    raise SystemExit(f"error: the model could not be deployed: {(err.details() or '')[:300]}") \
                        from None
                raise
    return key


def _password_cmd(creds: pathlib.Path, *keys: str) -> str:
    """A shell substitution printing ``creds[keys...]`` (python3 is there wherever gigacluster is)."""
    lookup = "".join(f"[{json.dumps(k)}]" for k in keys)
    code = f"import json, sys; print(json.load(open(sys.argv[1])){lookup})"
    return f'"$(python3 -c {shlex.quote(code)} {shlex.quote(str(creds))})"'


def mosquitto_sub_command(stack: Stack, *, who: str = "admin") -> str:
    """The ``mosquitto_sub`` command line that reads the stack's telemetry with the credentials
    ``up`` wrote: ``admin`` reads every topic; ``tenant`` the default tenant's own branches.
    Without a state directory (no credentials are enforced) it subscribes anonymously."""
    host, _, port = stack.mqtt.rpartition(":")
    root = f"gigacluster/{stack.cfg.cluster}"
    base = ["mosquitto_sub", "-h", host, "-p", port]
    creds = stack.cfg.state_dir / "credentials.json" if stack.cfg.state_dir is not None else None
    if who == "tenant":
        topics = [f"{root}/{svc}/tenants/default/#" for svc in ("scheduler", "router")]
        user = stack.tenant_mqtt.get("default", ("tenant-default", ""))[0] or "tenant-default"
        keys: tuple[str, ...] = ("mqtt_password",)
    else:
        topics, user, keys = [f"{root}/#"], "admin", ("mqtt_admin", "password")
    auth = f" -u {shlex.quote(user)} -P {_password_cmd(creds, *keys)}" if creds is not None else ""
    subs = "".join(f" -t {shlex.quote(t)}" for t in topics)
    return f"{shlex.join(base)}{auth}{subs} -v"


def print_endpoints(stack: Stack, out: Any = sys.stdout) -> None:
    """The banner: every endpoint a client or tool needs, and how to authenticate to each."""
    cfg = stack.cfg
    state = cfg.state_dir
    creds = state / "credentials.json" if state is not None else None
    print(f"gigacluster is up: cluster {cfg.cluster}, {cfg.chips} x {cfg.chip} in {cfg.shards} shard(s)", file=out)
    grpc_eps = [(n, stack.endpoint_of(n)) for n in DEFAULT_PORTS]
    grpc_eps += [(f"chip-{i}", stack.endpoint_of(f"chip-{i}")) for i in range(1, len(stack.shard_ports))]
    if cfg.clock == "event":  # the event clock's coordinator (GetTime: the mesh's virtual time)
        grpc_eps.append(("clock", stack.endpoint_of("clock")))
    for i, (name, ep) in enumerate(grpc_eps):
        print(f"  {'gRPC' if i == 0 else '':<9} {name:<10} {ep}", file=out)
    if creds is not None:
        print(f"  {'':<9} (metadata authorization: Bearer <api_key in {creds}>)", file=out)
    if stack.openai_base_url:
        print(f"  {'OpenAI':<9} {stack.openai_base_url}  (Authorization: Bearer <api_key>)", file=out)
    for i, (name, url) in enumerate(stack.metrics_urls.items()):
        print(f"  {'metrics' if i == 0 else '':<9} {name:<10} {url}", file=out)
    print(f"  {'MQTT':<9} {stack.mqtt}  topics gigacluster/{cfg.cluster}/<service>/...", file=out)
    if creds is not None:
        print(f"  {'':<9} users in {creds}: mqtt_admin reads all, mqtt_username/mqtt_password the "
              "default tenant's topics; everything:", file=out)
    print(f"  {'':<9} {mosquitto_sub_command(stack)}", file=out)
    if state is not None:
        print(f"  {'logs':<9} {state / 'logs'}", file=out)
    print(f"  {'model':<9} deployments/{DEFAULT_MODEL['deployment_id']} on {cfg.chip}", file=out)
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
            await bring_up(stack, deploy=not args.no_model, args=args)
            print_endpoints(stack)
            await stop.wait()
        finally:
            print("stopping ...", file=sys.stderr)
            await stack.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
    return 0
