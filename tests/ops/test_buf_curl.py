"""A non-Python gRPC client (the buf CLI from npm) against a live stack: reflection v1, a call that
succeeds, a call that fails with its ErrorInfo decoded, and the protos ``gigacluster protos`` exports.

``buf curl`` prints an error's details through connect-go, which decodes only the types compiled
into buf itself (1.75.0 has no ``google.rpc.ErrorInfo``), so it shows the detail as type plus
base64 value; ``buf convert`` then decodes that value with the exported descriptor set, which is
the documented path (docs/operations.md, "Clients in other languages").
"""

from __future__ import annotations

import asyncio
import base64
import json
import pathlib

import pytest

from gigacluster.cli.protos_cmd import DESCRIPTOR_SET, export
from gigacluster.stack import Stack
from tests.ops.buftool import buf_exe

pytestmark = pytest.mark.integration

SCHEDULER = "gigacluster.scheduler.v1.SchedulerService"


async def _buf(*args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        buf_exe(), *args, stdin=asyncio.subprocess.PIPE if stdin is not None else None,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(stdin), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def _curl(stack: Stack, key: str, method: str, body: dict[str, object], *extra: str) -> list[str]:
    return ["curl", "--protocol", "grpc", "--http2-prior-knowledge", *extra, "-H", f"authorization: Bearer {key}",
            "-d", json.dumps(body), f"http://{stack.endpoints.scheduler}/{SCHEDULER}/{method}"]


@pytest.fixture(scope="module")
def protos_dir(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("protos")
    export(out)
    return out


async def test_buf_curl_lists_methods_over_reflection_v1(stack: Stack) -> None:
    """buf curl with --reflect-protocol grpc-v1 lists the service, health and both reflection services."""
    key = await stack.create_tenant("bufls")
    rc, out, err = await _buf("curl", "--protocol", "grpc", "--http2-prior-knowledge", "--reflect-protocol", "grpc-v1",
                              "-H", f"authorization: Bearer {key}", "--list-methods",
                              f"http://{stack.endpoints.scheduler}")
    assert rc == 0, err
    methods = set(out.split())
    assert {f"{SCHEDULER}/GetJob", "grpc.health.v1.Health/Check",
            "grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
            "grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"} <= methods


async def test_buf_curl_call_succeeds_over_reflection_v1(stack: Stack) -> None:
    """A tenant's ListQueues through buf curl (schema by reflection v1) answers OK with JSON."""
    key = await stack.create_tenant("bufok")
    rc, out, err = await _buf(*_curl(stack, key, "ListQueues", {}, "--reflect-protocol", "grpc-v1"))
    assert rc == 0, err
    assert isinstance(json.loads(out), dict)


async def test_buf_curl_failure_carries_error_info_that_buf_decodes(stack: Stack, protos_dir: pathlib.Path) -> None:
    """GetJob of a missing job: buf curl exits NOT_FOUND with a google.rpc.ErrorInfo detail, and buf
    convert decodes that detail with the exported protos to reason NOT_FOUND and the job's name."""
    key = await stack.create_tenant("bufnf")
    rc, _, err = await _buf(*_curl(stack, key, "GetJob", {"name": "jobs/j-999999"}, "--reflect-protocol", "grpc-v1"))
    assert rc == 5 * 8, err  # buf curl exits with the gRPC code shifted left by three bits
    answer = json.loads(err)
    assert answer["code"] == "not_found"
    [detail] = [d for d in answer["details"] if d["type"] == "google.rpc.ErrorInfo"]
    raw = base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4))
    rc, out, err = await _buf("convert", str(protos_dir / DESCRIPTOR_SET), "--type", "google.rpc.ErrorInfo",
                              "--from", "-#format=binpb", "--to", "-#format=json", stdin=raw)
    assert rc == 0, err
    info = json.loads(out)
    assert info["reason"] == "NOT_FOUND"
    assert info["domain"] == "gigacluster.dev"
    assert "j-999999" in json.dumps(info["metadata"])


async def test_buf_curl_uses_the_exported_descriptor_set_without_reflection(
        stack: Stack, protos_dir: pathlib.Path) -> None:
    """buf curl --schema gigacluster.binpb (no reflection at all) calls the scheduler and health service."""
    key = await stack.create_tenant("bufschema")
    schema = str(protos_dir / DESCRIPTOR_SET)
    rc, out, err = await _buf(*_curl(stack, key, "ListQueues", {}, "--schema", schema))
    assert rc == 0, err
    rc, out, err = await _buf("curl", "--protocol", "grpc", "--http2-prior-knowledge", "--schema", schema,
                              "-d", "{}", f"http://{stack.endpoints.scheduler}/grpc.health.v1.Health/Check")
    assert rc == 0, err
    assert json.loads(out) == {"status": "SERVING"}


async def test_exported_proto_sources_compile_with_buf(protos_dir: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The exported .proto sources (ours, grpc health, google/rpc status and details) build on their own."""
    image = tmp_path / "image.binpb"
    rc, _, err = await _buf("build", str(protos_dir), "-o", str(image))
    assert rc == 0, err
    rc, out, err = await _buf("ls-files", str(protos_dir))
    assert rc == 0, err
    files = set(out.split())
    assert {"grpc/health/v1/health.proto", "google/rpc/status.proto", "google/rpc/error_details.proto",
            "gigacluster/scheduler/v1/scheduler.proto"} <= {f.removeprefix(str(protos_dir) + "/") for f in files}
