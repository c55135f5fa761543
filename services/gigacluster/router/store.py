"""Durable router state: one SQLite database in WAL mode (as the scheduler's ``JobStore``).

One row per deployment holds the request that created it (serialised ``DeployModelRequest``),
its owner, its creation time (the ``created`` of ``GET /v1/models``) and the broker instances backing it,
written before and after every allocation, so a restarted router knows every deployment and every
instance it may hold. A ``meta`` counter
gives each deployment a sequence number that never repeats across restarts: it is part of the
``purpose`` the router stamps on its broker instances, so an instance of a deleted deployment is
never mistaken for one of a later deployment with the same name.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS deployments (
    key TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    tenant TEXT NOT NULL,
    deployment_id TEXT NOT NULL,
    request BLOB NOT NULL,
    instances TEXT NOT NULL,
    created_s REAL NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclasses.dataclass(frozen=True)
class StoredDeployment:
    """A deployment as persisted: who owns it, how it was asked for, which instances back it."""

    seq: int
    tenant: str
    deployment_id: str
    request: bytes
    instances: tuple[str, ...]
    created_s: float = 0.0  # Unix time the deployment was created (0 = a row written before this was kept)


class DeploymentStore:
    """SQLite when ``path`` is given, else in memory only (sequence numbers still never repeat in a process)."""

    def __init__(self, path: str | pathlib.Path | None) -> None:
        self.db: sqlite3.Connection | None = None
        self._seq = 0
        if path:
            p = pathlib.Path(path)
            p.parent.mkdir(parents=True, exist_ok=True)
            self.db = sqlite3.connect(p, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=FULL")  # a client was told about it: survive power loss too
            self.db.executescript(SCHEMA)
            cols = {r[1] for r in self.db.execute("PRAGMA table_info(deployments)")}
            if "created_s" not in cols:  # a database of an earlier version: add the column in place
                self.db.execute("ALTER TABLE deployments ADD COLUMN created_s REAL NOT NULL DEFAULT 0")
            row = self.db.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()
            self._seq = int(row[0]) if row else 0

    @staticmethod
    def key(tenant: str, deployment_id: str) -> str:
        return f"{tenant}/deployments/{deployment_id}"

    def next_seq(self) -> int:
        """A number never handed out before by this store (persisted before it is returned)."""
        self._seq += 1
        if self.db is not None:
            self.db.execute("INSERT INTO meta(key, value) VALUES ('seq', ?) "
                            "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (str(self._seq),))
        return self._seq

    def save(self, d: StoredDeployment) -> None:
        if self.db is None:
            return
        self.db.execute(
            "INSERT INTO deployments(key, seq, tenant, deployment_id, request, instances, created_s) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) "
            "ON CONFLICT(key) DO UPDATE SET seq=excluded.seq, request=excluded.request, "
            "instances=excluded.instances, created_s=excluded.created_s",
            (self.key(d.tenant, d.deployment_id), d.seq, d.tenant, d.deployment_id, d.request,
             json.dumps(list(d.instances)), d.created_s),
        )

    def delete(self, tenant: str, deployment_id: str) -> None:
        if self.db is not None:
            self.db.execute("DELETE FROM deployments WHERE key = ?", (self.key(tenant, deployment_id),))

    def load(self) -> list[StoredDeployment]:
        if self.db is None:
            return []
        rows = self.db.execute(
            "SELECT seq, tenant, deployment_id, request, instances, created_s FROM deployments ORDER BY seq").fetchall()
        return [StoredDeployment(int(seq), str(t), str(did), bytes(req), tuple(json.loads(inst)), float(created))
                for seq, t, did, req, inst, created in rows]

    def close(self) -> None:
        if self.db is not None:
            self.db.close()
            self.db = None
