"""Durable broker state: one SQLite database in WAL mode (the scheduler's pattern, scheduler/store.py).

What a client is told about is committed before the RPC answers: every mutating method here runs
in one transaction (``with self.tx():``) and returns only after COMMIT, with ``synchronous=FULL``
so a committed write survives a crash of the process or of the machine. Writes are rare (tenant
creation, allocation, release), so a full sync on each costs nothing that matters.

Tables: tenants, api_keys (Argon2id hashes only), instances (device ranges as JSON, a ``releasing``
flag while their devices are being scrubbed), mqtt_users ($7$ hashes only), revocations, and meta
(the instance id counter, the capability signing key, the audit chain head). The file is created
mode 0600: it holds the broker's signing key.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import sqlite3
from collections.abc import Iterator

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tenants (
    tenant_id TEXT PRIMARY KEY, display_name TEXT NOT NULL, weight REAL NOT NULL, created_s REAL NOT NULL);
CREATE TABLE IF NOT EXISTS api_keys (
    key_id TEXT PRIMARY KEY, kind TEXT NOT NULL, tenant TEXT NOT NULL, key_hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS instances (
    instance_id TEXT PRIMARY KEY, tenant TEXT NOT NULL, chip_type TEXT NOT NULL, topology TEXT NOT NULL,
    starts TEXT NOT NULL, stops TEXT NOT NULL, created_s REAL NOT NULL, purpose TEXT NOT NULL,
    nic_share REAL NOT NULL, releasing INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS mqtt_users (user TEXT PRIMARY KEY, hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS revocations (instance TEXT PRIMARY KEY, revoked_s REAL NOT NULL);
"""
NEXT_INSTANCE = "next_instance"


@dataclasses.dataclass(frozen=True)
class TenantRow:
    tenant_id: str
    display_name: str
    weight: float
    created_s: float


@dataclasses.dataclass(frozen=True)
class KeyRow:
    key_id: str
    kind: str
    tenant: str
    key_hash: str


@dataclasses.dataclass(frozen=True)
class InstanceRow:
    instance_id: str
    tenant: str
    chip_type: str
    topology: str
    starts: list[int]
    stops: list[int]
    created_s: float
    purpose: str
    nic_share: float
    releasing: bool = False


def open_db(path: str | os.PathLike[str], *, synchronous: str = "FULL") -> sqlite3.Connection:
    """An autocommit SQLite connection in WAL mode on ``path`` (parent created, file mode 0600)."""
    p = pathlib.Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if not p.exists():
        p.touch(mode=0o600)
    db = sqlite3.connect(p, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("PRAGMA busy_timeout=5000")
    return db


class BrokerStore:
    """The broker's tables; ``path=None`` keeps everything in memory (tests, a throwaway broker)."""

    def __init__(self, path: str | os.PathLike[str] | None) -> None:
        self.path = pathlib.Path(path) if path else None
        self.db = open_db(path) if path else sqlite3.connect(":memory:", isolation_level=None,
                                                             check_same_thread=False)
        self.db.executescript(SCHEMA)
        self._depth = 0
        self._raise_counter_floor()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction (nested calls join the outer one); committed when the block ends."""
        if self._depth:
            self._depth += 1
            try:
                yield self.db
            finally:
                self._depth -= 1
            return
        self.db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield self.db
        except BaseException:
            self._depth = 0
            self.db.execute("ROLLBACK")
            raise
        self._depth = 0
        self.db.execute("COMMIT")

    # -- meta -------------------------------------------------------------------------------------
    def get_meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self.tx() as db:
            db.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                       "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value))

    def next_instance_number(self) -> int:
        """Take the next instance number (durably: never handed out again, even after a crash)."""
        with self.tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (NEXT_INSTANCE,)).fetchone()
            n = int(row[0]) if row else 1
            db.execute("INSERT INTO meta(key, value) VALUES (?, ?) "
                       "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (NEXT_INSTANCE, str(n + 1)))
        return n

    def _raise_counter_floor(self) -> None:
        """Keep the counter above every id in the table (a db written before the counter existed)."""
        floor = 1
        for (iid,) in self.db.execute("SELECT instance_id FROM instances"):
            tail = str(iid).removeprefix("i-")
            if tail.isdigit():
                floor = max(floor, int(tail) + 1)
        cur = self.get_meta(NEXT_INSTANCE)
        if cur is None or int(cur) < floor:
            self.set_meta(NEXT_INSTANCE, str(floor))

    # -- tenants and keys -------------------------------------------------------------------------
    def add_tenant(self, t: TenantRow, key: KeyRow, mqtt_user: str, mqtt_hash: str) -> None:
        """A tenant with its first key and its MQTT user, all or nothing."""
        with self.tx() as db:
            db.execute("INSERT INTO tenants(tenant_id, display_name, weight, created_s) VALUES (?, ?, ?, ?)",
                       (t.tenant_id, t.display_name, t.weight, t.created_s))
            self._put_key(db, key)
            db.execute("INSERT INTO mqtt_users(user, hash) VALUES (?, ?) "
                       "ON CONFLICT(user) DO UPDATE SET hash=excluded.hash", (mqtt_user, mqtt_hash))

    @staticmethod
    def _put_key(db: sqlite3.Connection, k: KeyRow) -> None:
        db.execute("INSERT INTO api_keys(key_id, kind, tenant, key_hash) VALUES (?, ?, ?, ?) "
                   "ON CONFLICT(key_id) DO UPDATE SET kind=excluded.kind, tenant=excluded.tenant, "
                   "key_hash=excluded.key_hash", (k.key_id, k.kind, k.tenant, k.key_hash))

    def tenants(self) -> list[TenantRow]:
        rows = self.db.execute("SELECT tenant_id, display_name, weight, created_s FROM tenants ORDER BY tenant_id")
        return [TenantRow(str(a), str(b), float(c), float(d)) for a, b, c, d in rows]

    def api_keys(self) -> list[KeyRow]:
        rows = self.db.execute("SELECT key_id, kind, tenant, key_hash FROM api_keys")
        return [KeyRow(str(a), str(b), str(c), str(d)) for a, b, c, d in rows]

    def mqtt_users(self) -> dict[str, str]:
        return {str(u): str(h) for u, h in self.db.execute("SELECT user, hash FROM mqtt_users")}

    # -- instances --------------------------------------------------------------------------------
    def add_instance(self, r: InstanceRow) -> None:
        with self.tx() as db:
            db.execute(
                "INSERT INTO instances(instance_id, tenant, chip_type, topology, starts, stops, created_s, purpose,"
                " nic_share, releasing) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (r.instance_id, r.tenant, r.chip_type, r.topology, json.dumps(r.starts), json.dumps(r.stops),
                 r.created_s, r.purpose, r.nic_share, int(r.releasing)))

    def mark_releasing(self, instance_id: str, revoked_s: float) -> None:
        """The instance is gone for its tenant (token revoked) but its devices await a scrub."""
        with self.tx() as db:
            db.execute("UPDATE instances SET releasing = 1 WHERE instance_id = ?", (instance_id,))
            db.execute("INSERT INTO revocations(instance, revoked_s) VALUES (?, ?) "
                       "ON CONFLICT(instance) DO UPDATE SET revoked_s=max(revoked_s, excluded.revoked_s)",
                       (instance_id, revoked_s))

    def delete_instance(self, instance_id: str) -> None:
        """The instance's devices are scrubbed: forget it (its revocation stays)."""
        with self.tx() as db:
            db.execute("DELETE FROM instances WHERE instance_id = ?", (instance_id,))

    def instances(self) -> list[InstanceRow]:
        rows = self.db.execute(
            "SELECT instance_id, tenant, chip_type, topology, starts, stops, created_s, purpose, nic_share, releasing"
            " FROM instances ORDER BY created_s, instance_id")
        return [InstanceRow(str(a), str(b), str(c), str(d), list(json.loads(e)), list(json.loads(f)), float(g),
                            str(h), float(i), bool(j)) for a, b, c, d, e, f, g, h, i, j in rows]

    # -- revocations ------------------------------------------------------------------------------
    def revocations(self) -> list[tuple[str, float]]:
        return [(str(i), float(t)) for i, t in self.db.execute("SELECT instance, revoked_s FROM revocations")]

    def prune_revocations(self, before_s: float) -> int:
        """Forget revocations older than ``before_s`` (every token they cover has expired)."""
        with self.tx() as db:
            return int(db.execute("DELETE FROM revocations WHERE revoked_s < ?", (before_s,)).rowcount)

    def close(self) -> None:
        self.db.close()
