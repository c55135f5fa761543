"""Reflection v1 alongside v1alpha, and the protos ``gigacluster protos`` exports for other languages."""

from __future__ import annotations

import pathlib

from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2

from gigacluster.cli.protos_cmd import DESCRIPTOR_SET, THIRD_PARTY, export
from gigacluster.runtime import reflection


def _proto(fd: object) -> descriptor_pb2.FileDescriptorProto:
    out = descriptor_pb2.FileDescriptorProto()
    fd.CopyToProto(out)  # type: ignore[attr-defined]
    return out


def test_v1_reflection_is_v1alpha_under_the_v1_package() -> None:
    """The v1 descriptor has v1alpha's messages and fields, every type reference moved to grpc.reflection.v1."""
    v1, alpha = _proto(reflection.V1_DESCRIPTOR), _proto(reflection_pb2.DESCRIPTOR)
    assert (v1.name, v1.package) == ("grpc/reflection/v1/reflection.proto", "grpc.reflection.v1")
    assert [m.name for m in v1.message_type] == [m.name for m in alpha.message_type]
    for m1, ma in zip(v1.message_type, alpha.message_type, strict=True):
        assert [(f.name, f.number, f.type) for f in m1.field] == [(f.name, f.number, f.type) for f in ma.field]
        assert all(not f.type_name or f.type_name.startswith(".grpc.reflection.v1.") for f in m1.field)
    [method] = v1.service[0].method
    assert (method.input_type, method.output_type) == (".grpc.reflection.v1.ServerReflectionRequest",
                                                        ".grpc.reflection.v1.ServerReflectionResponse")


def test_descriptor_set_holds_status_error_details_and_health() -> None:
    """The reflected set carries google.rpc.Status, ErrorInfo and the health service, dependencies first."""
    names = [f.name for f in reflection.file_descriptor_set([]).file]
    assert {"google/rpc/status.proto", "google/rpc/error_details.proto", "grpc_health/v1/health.proto",
            "grpc/reflection/v1/reflection.proto"} <= set(names)
    assert names.index("google/protobuf/any.proto") < names.index("google/rpc/status.proto")


def _strip(d: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """``d`` without what protoc adds and grpcio's copy lacks (name, options, json names)."""
    d.ClearField("options")
    d.ClearField("name")
    for msg in [*d.message_type, *(n for m in d.message_type for n in m.nested_type)]:
        for f in msg.field:
            f.ClearField("json_name")
    return d


def test_shipped_health_proto_matches_grpcio(tmp_path: pathlib.Path) -> None:
    """The health.proto shipped for other languages declares exactly grpcio's health messages and RPCs."""
    from grpc_tools import protoc

    dst = tmp_path / "h.binpb"
    assert protoc.main(["protoc", f"-I{THIRD_PARTY}", f"--descriptor_set_out={dst}",
                        "grpc/health/v1/health.proto"]) == 0
    shipped = descriptor_pb2.FileDescriptorSet.FromString(dst.read_bytes()).file[0]
    assert _strip(shipped) == _strip(_proto(health_pb2.DESCRIPTOR))


def test_export_writes_sources_and_a_self_contained_descriptor_set(tmp_path: pathlib.Path) -> None:
    """gigacluster protos writes every source a client imports and a descriptor set with no missing import."""
    export(tmp_path)
    for rel in ("gigacluster/router/v1/router.proto", "gigacluster/common/v1/common.proto",
                "grpc/health/v1/health.proto", "google/rpc/status.proto", "google/rpc/error_details.proto"):
        assert (tmp_path / rel).is_file(), rel
    fds = descriptor_pb2.FileDescriptorSet.FromString((tmp_path / DESCRIPTOR_SET).read_bytes())
    names = [f.name for f in fds.file]
    for i, f in enumerate(fds.file):
        assert all(d in names[:i] for d in f.dependency), f.name
    assert "grpc/health/v1/health.proto" in names and "gigacluster/scheduler/v1/scheduler.proto" in names
