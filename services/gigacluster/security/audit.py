"""Append-only audit log of admin and allocation actions, one JSON line per action.

Each line holds exactly: ``seq``, ``time_s``, ``actor``, ``action``, ``resource``, ``outcome``,
optional ``reason`` and ``prev`` (SHA-256 of the previous line, so deleting or editing a line
breaks the chain, see :func:`verify_chain`). The API accepts only those fields, each checked
against a strict pattern (names, resource paths, UPPER_SNAKE reasons), so a tenant's data
(memory contents, prompts, payloads) cannot be written to the log even by mistake: there is no
field that would take free text.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from pathlib import Path

from gigacluster.security import InvalidArgument

OUTCOMES = frozenset({"ok", "denied", "failed"})
_ACTOR_RE = re.compile(r"^(admin|tenant|service):[a-z0-9][a-z0-9._-]{0,62}$")
_ACTION_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*){0,3}$")
_RESOURCE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}(/[a-z0-9][a-z0-9._-]{0,62}){0,7}$")
_REASON_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
GENESIS = "0" * 64


class AuditLog:
    """Appends audit records to a JSON-lines file (created if missing, never rewritten)."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self._seq, self._prev = 0, GENESIS
        if self.path.exists():
            with self.path.open("rb") as f:
                for line in f:
                    if line.strip():
                        self._seq += 1
                        self._prev = hashlib.sha256(line.rstrip(b"\n")).hexdigest()

    def append(
        self, actor: str, action: str, resource: str, outcome: str, time_s: float, *, reason: str = ""
    ) -> dict[str, object]:
        """Record that ``actor`` did ``action`` on ``resource`` with ``outcome`` at ``time_s``.

        ``actor`` is ``role:name`` (``admin:root``, ``tenant:acme``), ``resource`` a resource path
        (``tenants/acme/instances/i-1``), ``outcome`` one of ok, denied, failed, ``reason`` an
        UPPER_SNAKE code. Returns the record written.
        """
        for field, value, pattern in (
            ("actor", actor, _ACTOR_RE), ("action", action, _ACTION_RE), ("resource", resource, _RESOURCE_RE),
        ):
            if not isinstance(value, str) or not pattern.match(value):
                raise InvalidArgument(field, f"{value!r} does not match {pattern.pattern}")
        if outcome not in OUTCOMES:
            raise InvalidArgument("outcome", f"allowed: {', '.join(sorted(OUTCOMES))}, got {outcome!r}")
        if reason and not (isinstance(reason, str) and _REASON_RE.match(reason)):
            raise InvalidArgument("reason", "must be an UPPER_SNAKE_CASE code")
        if not isinstance(time_s, int | float) or not math.isfinite(time_s):
            raise InvalidArgument("time_s", "must be a finite number of seconds")
        record: dict[str, object] = {
            "seq": self._seq + 1, "time_s": float(time_s), "actor": actor, "action": action,
            "resource": resource, "outcome": outcome,
        }
        if reason:
            record["reason"] = reason
        record["prev"] = self._prev
        line = json.dumps(record, separators=(",", ":")).encode()
        with self.path.open("ab") as f:
            f.write(line + b"\n")
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        self._seq += 1
        self._prev = hashlib.sha256(line).hexdigest()
        return record

    def records(self) -> list[dict[str, object]]:
        """All records, oldest first."""
        with self.path.open("rb") as f:
            return [json.loads(line) for line in f if line.strip()]


def verify_chain(path: str | os.PathLike[str]) -> int:
    """Check the hash chain and sequence of a log; returns the record count or raises InvalidArgument."""
    prev, n = GENESIS, 0
    with Path(path).open("rb") as f:
        for line in f:
            line = line.rstrip(b"\n")
            if not line:
                continue
            n += 1
            rec = json.loads(line)
            if rec.get("prev") != prev or rec.get("seq") != n:
                raise InvalidArgument("audit_log", f"chain broken at line {n}")
            prev = hashlib.sha256(line).hexdigest()
    return n
