"""``gigacluster protos --out DIR``: every proto a client in another language needs, in one place.

Writes the ``.proto`` sources (gigacluster's own from ``protos/``, the standard gRPC health
service, ``google/rpc/status.proto``, ``error_details.proto`` and ``code.proto``) and
``gigacluster.binpb``, one self-contained FileDescriptorSet of all of them plus their imports and
both reflection protos: ``buf curl --schema``, ``grpcurl -protoset`` and
``@grpc/proto-loader``'s ``loadFileDescriptorSetFromBuffer`` read it as is.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import shutil
import sys
from typing import Any

import google.rpc

from gigacluster.runtime.reflection import file_descriptor_set

REPO_PROTOS = pathlib.Path(__file__).resolve().parents[3] / "protos"
THIRD_PARTY = pathlib.Path(__file__).resolve().parents[1] / "runtime" / "third_party"
GOOGLE_RPC = ("status.proto", "error_details.proto", "code.proto")
DESCRIPTOR_SET = "gigacluster.binpb"
# grpcio registers these under its own package paths; clients know them by their canonical names.
CANONICAL_NAMES = {
    "grpc_health/v1/health.proto": "grpc/health/v1/health.proto",
    "grpc_reflection/v1alpha/reflection.proto": "grpc/reflection/v1alpha/reflection.proto",
}


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("protos", help="write every .proto and a descriptor set for clients in other languages")
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write (created; files overwritten)")
    p.set_defaults(handler=cmd_protos)


def _own_protos() -> list[pathlib.Path]:
    """gigacluster's own .proto sources (not the breaking-check baseline). Read here rather than through
    runtime.protogen, which imports grpcio-tools: a dev dependency the image does not install."""
    return [p for p in sorted(REPO_PROTOS.rglob("*.proto")) if "baseline" not in p.relative_to(REPO_PROTOS).parts]


def _own_modules() -> list[Any]:
    """The generated ``*_pb2`` module of every gigacluster proto (their descriptors)."""
    mods = []
    for p in _own_protos():
        rel = p.relative_to(REPO_PROTOS).with_suffix("")
        mods.append(importlib.import_module(".".join(rel.parts) + "_pb2"))
    return mods


def export(out: pathlib.Path) -> list[pathlib.Path]:
    """Write the sources and ``gigacluster.binpb`` under ``out``; returns the files written."""
    written: list[pathlib.Path] = []

    def copy(src: pathlib.Path, rel: pathlib.Path) -> None:
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        written.append(dst)

    for src in _own_protos():
        copy(src, src.relative_to(REPO_PROTOS))
    for src in sorted(THIRD_PARTY.rglob("*.proto")):
        copy(src, src.relative_to(THIRD_PARTY))
    rpc_dir = pathlib.Path(google.rpc.__path__[0])
    for name in GOOGLE_RPC:
        copy(rpc_dir / name, pathlib.Path("google/rpc") / name)
    fds = file_descriptor_set([m.DESCRIPTOR for m in _own_modules()])
    for f in fds.file:
        f.name = CANONICAL_NAMES.get(f.name, f.name)
        deps = [CANONICAL_NAMES.get(d, d) for d in f.dependency]
        del f.dependency[:]
        f.dependency.extend(deps)
    (out / DESCRIPTOR_SET).write_bytes(fds.SerializeToString())
    written.append(out / DESCRIPTOR_SET)
    return written


def cmd_protos(args: argparse.Namespace) -> int:
    out = pathlib.Path(args.out)
    files = export(out)
    print(f"wrote {len(files) - 1} .proto files and {out / DESCRIPTOR_SET} (every file, self-contained)",
          file=sys.stderr)
    print(out)
    return 0
