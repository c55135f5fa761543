"""Durable scheduler state: one SQLite database in WAL mode, one row per job.

Jobs are written on every state change and checkpoint (not every step), so a crash loses at
most the steps since the last checkpoint, which is exactly what a real restart loses too.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sqlite3
from typing import Any

from gigacluster.scheduler.core import JobRecord, State

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    state INTEGER NOT NULL,
    record TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
_SKIP = ("spec", "plan")


class JobStore:
    """SQLite when ``path`` is given, else a no-op (in-memory scheduler)."""

    def __init__(self, path: str | pathlib.Path | None) -> None:
        self.db: sqlite3.Connection | None = None
        if path:
            p = pathlib.Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(p, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)

    def save(self, job: JobRecord, seq: int) -> None:
        if self.db is None:
            return
        rec = {f.name: getattr(job, f.name) for f in dataclasses.fields(job) if f.name not in _SKIP}
        rec["state"] = int(job.state)
        self.db.execute(
            "INSERT INTO jobs(job_id, seq, tenant, state, record) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT(job_id) DO UPDATE SET state=excluded.state, record=excluded.record",
            (job.job_id, seq, job.tenant, int(job.state), json.dumps(rec)),
        )

    def load(self) -> list[tuple[int, dict[str, Any]]]:
        if self.db is None:
            return []
        rows = self.db.execute("SELECT seq, record FROM jobs ORDER BY seq").fetchall()
        out = []
        for seq, record in rows:
            d = json.loads(record)
            d["state"] = State(d["state"])
            out.append((int(seq), d))
        return out

    def get_meta(self, key: str) -> str | None:
        if self.db is None:
            return None
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        if self.db is None:
            return
        self.db.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                        "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value))

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None
