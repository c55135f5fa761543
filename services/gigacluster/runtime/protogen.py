"""Generate the Python stubs from ``protos/`` into ``services/`` (committed, checked for drift).

Usage: ``python -m gigacluster.runtime.protogen`` regenerates; ``--check`` exits 1 when the
committed stubs differ from what the protos produce (CI runs the same check as a test).
"""

from __future__ import annotations

import argparse
import filecmp
import pathlib
import sys
import tempfile

import grpc_tools
from grpc_tools import protoc

REPO = pathlib.Path(__file__).resolve().parents[3]
PROTOS = REPO / "protos"
OUT = REPO / "services"
SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def proto_files() -> list[pathlib.Path]:
    return sorted(PROTOS.rglob("*.proto"))


def generate(out: pathlib.Path) -> list[pathlib.Path]:
    """Run protoc (from grpcio-tools) into ``out``; returns the generated files."""
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    files = [str(p.relative_to(PROTOS)) for p in proto_files()]
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed: " + " ".join(args))
    generated = [p for p in out.rglob("*") if p.name.endswith(SUFFIXES)]
    for d in {p.parent for p in generated}:
        for pkg in [d, *d.relative_to(out).parents]:
            init = (out / pkg) if not pkg.is_absolute() else pkg
            if init == out or init == pathlib.Path("."):
                continue
            f = init / "__init__.py"
            if not f.exists():
                f.write_text("")
    return generated


def drift() -> list[str]:
    """Stub files whose committed content differs from a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(pathlib.Path(tmp))
        diffs = []
        for f in fresh:
            rel = f.relative_to(tmp)
            committed = OUT / rel
            if not committed.exists() or not filecmp.cmp(f, committed, shallow=False):
                diffs.append(str(rel))
        committed_all = {
            str(p.relative_to(OUT)) for p in (OUT / "gigacluster").rglob("*") if p.name.endswith(SUFFIXES)
        }
        diffs += sorted(committed_all - {str(f.relative_to(tmp)) for f in fresh})
        return diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if committed stubs drifted")
    args = parser.parse_args(argv)
    if args.check:
        diffs = drift()
        for d in diffs:
            print(f"drifted: {d}", file=sys.stderr)
        return 1 if diffs else 0
    for f in generate(OUT):
        print(f.relative_to(OUT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
