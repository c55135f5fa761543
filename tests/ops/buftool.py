"""Where the tests find the buf CLI: ``BUF_BIN``, then ``buf`` on PATH, then where .ci/run and the
README's test command install it from npm (``/tmp/gigacluster-buf-<version>``)."""

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
