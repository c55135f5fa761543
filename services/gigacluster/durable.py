"""Durable files: a JSON state file replaced all or nothing (no gRPC; imports nothing of the package).

Used by the processes that keep a small state in a file of their own (the fault injector's journal, a chip
shard's faults, the fabric's link faults); the larger stores are SQLite (``broker/store.py``, ...).
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any


def write_json_atomic(path: pathlib.Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON, all or nothing: a temporary file, fsync, rename, then an fsync
    of the directory so the rename itself survives a crash (parent created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
