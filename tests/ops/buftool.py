"""Where the tests find the non-Python clients they drive, installed from npm by .ci/run and the
README's test command: the buf CLI (``BUF_BIN``, then ``buf`` on PATH, then
``/tmp/gigacluster-buf-<version>``) and Node's @grpc/grpc-js with @grpc/proto-loader
(``/tmp/gigacluster-grpc-node``)."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

BUF_VERSION = "1.75.0"
NPM_PREFIX = pathlib.Path(f"/tmp/gigacluster-buf-{BUF_VERSION}")


def buf_exe() -> str:
    """The buf executable; skips the test when buf is genuinely not installed."""
    for exe in (os.environ.get("BUF_BIN"), shutil.which("buf"), str(NPM_PREFIX / "node_modules/.bin/buf")):
        if exe and os.access(exe, os.X_OK):
            return exe
    pytest.skip(f"buf CLI not installed (npm install --prefix {NPM_PREFIX} @bufbuild/buf@{BUF_VERSION})")


NODE_CLIENT_PREFIX = pathlib.Path("/tmp/gigacluster-grpc-node")
NODE_CLIENT_PACKAGES = ("@grpc/grpc-js@1.14.7", "@grpc/proto-loader@0.8.1")


def node_client_env() -> dict[str, str]:
    """Environment for ``node`` with @grpc/grpc-js and @grpc/proto-loader resolvable; skips the test when
    node or those npm packages are genuinely not installed (the README and .ci/run install them)."""
    modules = NODE_CLIENT_PREFIX / "node_modules"
    if shutil.which("node") is None or not (modules / "@grpc" / "proto-loader").is_dir():
        pytest.skip(f"node or the npm gRPC packages missing (npm install --prefix {NODE_CLIENT_PREFIX} "
                    + " ".join(NODE_CLIENT_PACKAGES) + ")")
    return {**os.environ, "NODE_PATH": str(modules)}
