"""Server reflection, ``grpc.reflection.v1`` and ``v1alpha``, over every proto a client needs.

grpcio-reflection (1.85) ships only ``grpc.reflection.v1alpha``; clients such as
``buf curl --reflect-protocol grpc-v1`` and newer grpcurl ask for ``grpc.reflection.v1``. The two
protos are the same messages with the same field numbers under another package, so v1 is served
by the same servicer with the v1alpha message classes as codecs, and a v1 file descriptor (the
v1alpha one renamed) is added to the pool so a client can describe the v1 service too.

Reflection answers from the default descriptor pool: importing ``google.rpc.status_pb2`` and
``error_details_pb2`` here puts ``google.rpc.Status`` and ``google.rpc.ErrorInfo`` in it, so a
client resolves the error details every status carries. :func:`file_descriptor_set` is the same
set of files, self-contained, for clients that load protos from disk (``gigacluster protos``).
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.descriptor import FileDescriptor
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_health.v1 import health, health_pb2
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

V1_FILE = "grpc/reflection/v1/reflection.proto"
V1_PACKAGE = "grpc.reflection.v1"
V1_SERVICE_NAME = f"{V1_PACKAGE}.ServerReflection"
V1ALPHA_SERVICE_NAME: str = reflection.SERVICE_NAME

# Files every client needs beside the service's own: health, the status and its details.
SUPPORT_FILES: tuple[FileDescriptor, ...] = (
    health_pb2.DESCRIPTOR, status_pb2.DESCRIPTOR, error_details_pb2.DESCRIPTOR, code_pb2.DESCRIPTOR,
)


def _v1_file() -> descriptor_pb2.FileDescriptorProto:
    """``grpc/reflection/v1/reflection.proto`` built from the v1alpha descriptor (same wire format)."""
    fdp = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(fdp)
    old = f".{fdp.package}."
    fdp.name, fdp.package = V1_FILE, V1_PACKAGE
    fdp.ClearField("options")
    for msg in fdp.message_type:
        for field in msg.field:
            if field.type_name.startswith(old):
                field.type_name = f".{V1_PACKAGE}." + field.type_name[len(old):]
    for svc in fdp.service:
        for m in svc.method:
            m.input_type = f".{V1_PACKAGE}." + m.input_type[len(old):]
            m.output_type = f".{V1_PACKAGE}." + m.output_type[len(old):]
    return fdp


def _register_v1() -> FileDescriptor:
    pool = descriptor_pool.Default()
    try:
        return pool.FindFileByName(V1_FILE)
    except KeyError:
        pool.AddSerializedFile(_v1_file().SerializeToString())
        return pool.FindFileByName(V1_FILE)


V1_DESCRIPTOR = _register_v1()


def enable(service_names: Iterable[str], server: grpc.aio.Server) -> list[str]:
    """Serve reflection v1 and v1alpha on ``server``; returns every service name it lists."""
    names = [*service_names, health.SERVICE_NAME, V1_SERVICE_NAME, V1ALPHA_SERVICE_NAME]
    servicer = reflection.aio.ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(V1_SERVICE_NAME, {
        "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
            servicer.ServerReflectionInfo,
            request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
            response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString),
    }),))
    return names


def file_descriptor_set(files: Iterable[FileDescriptor]) -> descriptor_pb2.FileDescriptorSet:
    """``files``, the support files and all their imports, dependencies first (a protoset)."""
    out = descriptor_pb2.FileDescriptorSet()
    seen: set[str] = set()

    def add(fd: FileDescriptor) -> None:
        if fd.name in seen:
            return
        seen.add(fd.name)
        for dep in fd.dependencies:
            add(dep)
        fd.CopyToProto(out.file.add())

    for fd in [*files, *SUPPORT_FILES, reflection_pb2.DESCRIPTOR, V1_DESCRIPTOR]:
        add(fd)
    return out
