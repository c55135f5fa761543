"""``gigacluster record`` (telemetry to a JSON-lines file) and ``gigacluster report`` (plots, HTML)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pathlib
import sys
import time
from typing import Any

import aiomqtt

from gigacluster.client import load_credentials
from gigacluster.report import load, render


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("record", help="record a running stack's telemetry to a JSON-lines file")
    p.add_argument("out", help="file to append to (JSON lines)")
    p.add_argument("--duration", type=float, default=60.0, help="wall seconds to record (default 60)")
    p.add_argument("--cluster", default="local")
    p.add_argument("--mqtt", default="", help="HOST:PORT (default: from up's credentials)")
    p.set_defaults(handler=cmd_record)
    r = subparsers.add_parser("report", help="render a recording as PNG plots and one HTML page")
    r.add_argument("recording", help="a file written by 'gigacluster record' or 'demo --record'")
    r.add_argument("--out", default="report", help="output directory (default ./report)")
    r.set_defaults(handler=cmd_report)


async def record(out: pathlib.Path, *, endpoint: str, cluster: str, duration_s: float, username: str | None,
                 password: str | None) -> int:
    host, _, port = endpoint.rpartition(":")
    n = 0
    deadline = time.monotonic() + duration_s
    with out.open("a") as f:
        async with aiomqtt.Client(host, int(port), username=username, password=password) as client:
            await client.subscribe(f"gigacluster/{cluster}/#")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(duration_s):
                    async for msg in client.messages:
                        f.write(json.dumps({"topic": str(msg.topic), "t_wall": time.time(),
                                            "payload": json.loads(bytes(msg.payload))}) + "\n")
                        n += 1
                        if time.monotonic() > deadline:
                            break
    return n


def cmd_record(args: argparse.Namespace) -> int:
    creds = load_credentials(args.cluster)
    endpoint = args.mqtt or creds.get("mqtt", "127.0.0.1:1883")
    admin = creds.get("mqtt_admin", {})
    n = asyncio.run(record(pathlib.Path(args.out), endpoint=endpoint, cluster=args.cluster,
                           duration_s=args.duration, username=admin.get("username"),
                           password=admin.get("password")))
    print(f"recorded {n} messages to {args.out}", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    path = pathlib.Path(args.recording)
    if not path.is_file():
        print(f"error: no recording at {path}", file=sys.stderr)
        return 2
    series = load(path.read_text().splitlines())
    if series.empty:
        print(f"error: {path} holds no chip, job or inference telemetry", file=sys.stderr)
        return 2
    page = render(series, pathlib.Path(args.out), title=f"gigacluster run {path.name}")
    print(page)
    return 0
