"""A Node gRPC client (@grpc/grpc-js + @grpc/proto-loader from npm) against a live stack, knowing the
API only through the descriptor set ``gigacluster protos`` exports (tests/ops/node_client.js)."""

from __future__ import annotations

import asyncio
import json
import pathlib

import pytest

from gigacluster.cli.protos_cmd import DESCRIPTOR_SET, export
from gigacluster.stack import Stack
from tests.ops.buftool import node_client_env

pytestmark = pytest.mark.integration

SCRIPT = pathlib.Path(__file__).with_name("node_client.js")


async def test_node_client_calls_checks_health_and_decodes_error_info(stack: Stack, tmp_path: pathlib.Path) -> None:
    """ListQueues succeeds, Health/Check answers SERVING, and GetJob of a missing job fails NOT_FOUND with
    a google.rpc.Status whose ErrorInfo the Node client decodes from the exported protos."""
    env = node_client_env()
    export(tmp_path)
    key = await stack.create_tenant("node1")
    proc = await asyncio.create_subprocess_exec(
        "node", str(SCRIPT), str(tmp_path / DESCRIPTOR_SET), stack.endpoints.scheduler, key, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out)
    assert result["ok"]["error"] is None and result["ok"]["queues"] is not None
    assert result["health"] == "SERVING"
    fail = result["fail"]
    assert fail["code"] == 5 and "j-999999" in fail["details"]
    [info] = [d["value"] for d in fail["decoded"] if d["type"] == "google.rpc.ErrorInfo"]
    assert info["reason"] == "NOT_FOUND" and info["domain"] == "gigacluster.dev"
    assert {"key": "resource", "value": "jobs/j-999999"} in info["metadata"]
