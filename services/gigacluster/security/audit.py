"""Append-only audit log of admin, allocation and denied actions, one JSON line per action.

Each line holds exactly: ``seq``, ``time_s``, ``actor``, ``action``, ``resource``, ``outcome``,
optional ``reason`` and ``count``, ``prev`` (SHA-256 of the previous line, so deleting or editing
a line breaks the chain) and, when the log has a signing key, ``sig``: the broker's Ed25519
signature of the line without it. The API accepts only those fields, each checked against a strict
pattern (names, resource paths, UPPER_SNAKE reasons), so a tenant's data (memory contents,
prompts, payloads) cannot be written to the log even by mistake: no field takes free text.

A hash chain alone can be cut short or recomputed by whoever can write the file, so the head is
anchored outside it: :meth:`AuditLog.anchor` signs ``(seq, head hash, time)`` with the same key;
the broker appends anchors to a separate file and publishes them (retained) on its MQTT telemetry
topic, and keeps the head in its database. :func:`verify_audit` then detects

- an edited or deleted line (``CHAIN_BROKEN``);
- a truncated tail (``TRUNCATED``: an anchor names a line the log no longer has);
- a recomputed chain (``HEAD_MISMATCH``: the line an anchor names hashes differently;
  ``BAD_RECORD_SIGNATURE``: an edited line no longer matches its signature);
- a forged append (``UNSIGNED_RECORD`` / ``BAD_RECORD_SIGNATURE``: only the broker holds the key).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gigacluster.security import InvalidArgument

OUTCOMES = frozenset({"ok", "denied", "failed"})
_ACTOR_RE = re.compile(r"^(admin|tenant|service|anonymous):[a-z0-9][a-z0-9._-]{0,62}$")
_ACTION_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*){0,3}$")
_RESOURCE_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}(/[a-z0-9][a-z0-9._-]{0,62}){0,7}$")
_REASON_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")
_SIG_TAIL_RE = re.compile(rb',"sig":"([A-Za-z0-9_-]{1,128})"\}$')
GENESIS = "0" * 64
RECORD_CONTEXT = b"gigacluster-audit-record/v1\n"
ANCHOR_CONTEXT = "gigacluster-audit-anchor/v1"


class AuditTampered(InvalidArgument):
    """The log does not verify; ``reason`` says how (CHAIN_BROKEN, TRUNCATED, HEAD_MISMATCH, ...)."""

    def __init__(self, message: str, *, reason: str, line: int = 0) -> None:
        super().__init__("audit_log", message, reason=reason)
        self.line = line


def _b64e(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode("ascii")


def _b64d(s: str | bytes) -> bytes:
    raw = s.encode("ascii") if isinstance(s, str) else s
    return base64.urlsafe_b64decode(raw + b"=" * (-len(raw) % 4))


def anchor_message(seq: int, head: str, time_s: float) -> bytes:
    """The bytes an anchor's signature covers."""
    return f"{ANCHOR_CONTEXT}\n{int(seq)}\n{head}\n{float(time_s)!r}".encode()


@dataclasses.dataclass(frozen=True)
class Anchor:
    """A signed statement that the log had ``seq`` lines, the last hashing to ``head``, at ``time_s``."""

    seq: int
    head: str
    time_s: float
    key_id: str
    sig: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Anchor:
        try:
            return cls(int(d["seq"]), str(d["head"]), float(d["time_s"]), str(d["key_id"]), str(d["sig"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise AuditTampered("malformed anchor", reason="BAD_ANCHOR") from exc

    def verify(self, public_key: Ed25519PublicKey) -> None:
        try:
            public_key.verify(_b64d(self.sig), anchor_message(self.seq, self.head, self.time_s))
        except (InvalidSignature, ValueError) as exc:
            raise AuditTampered(f"anchor at seq {self.seq} has a bad signature", reason="BAD_ANCHOR_SIGNATURE") from exc


def _line_hashes(path: Path) -> list[tuple[bytes, str]]:
    out = []
    if path.exists():
        with path.open("rb") as f:
            for raw in f:
                line = raw.rstrip(b"\n")
                if line:
                    out.append((line, hashlib.sha256(line).hexdigest()))
    return out


class AuditLog:
    """Appends audit records to a JSON-lines file (created if missing, never rewritten).

    ``signer`` signs every record and every anchor. ``expected_head`` is the ``(seq, hash)`` the
    owner last stored elsewhere (the broker's database); if the file no longer holds that line,
    :attr:`tamper` says so (the owner logs it and records it in the log itself).
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False,
                 signer: Ed25519PrivateKey | None = None, key_id: str = "k1",
                 expected_head: tuple[int, str] | None = None) -> None:
        self.path = Path(path)
        self.fsync = fsync
        self.signer = signer
        self.key_id = key_id
        self._seq, self._prev = 0, GENESIS
        self.tamper = ""
        lines = _line_hashes(self.path)
        if lines:
            self._seq, self._prev = len(lines), lines[-1][1]
        if expected_head is not None and expected_head[0] > 0:
            seq, head = expected_head
            if seq > len(lines):
                self.tamper = f"TRUNCATED: the database head is line {seq}, the log has {len(lines)} lines"
            elif lines[seq - 1][1] != head:
                self.tamper = f"HEAD_MISMATCH: line {seq} does not hash to the database head"

    @property
    def head(self) -> tuple[int, str]:
        """``(records so far, SHA-256 of the last line)``."""
        return self._seq, self._prev

    def append(
        self, actor: str, action: str, resource: str, outcome: str, time_s: float, *, reason: str = "",
        count: int = 0,
    ) -> dict[str, object]:
        """Record that ``actor`` did ``action`` on ``resource`` with ``outcome`` at ``time_s``.

        ``actor`` is ``role:name`` (``admin:root``, ``tenant:acme``, ``anonymous:none``), ``resource``
        a resource path (``tenants/acme/instances/i-1``), ``outcome`` one of ok, denied, failed,
        ``reason`` an UPPER_SNAKE code, ``count`` (> 1) how many like events the record stands for.
        Returns the record written.
        """
        for field, value, pattern in (
            ("actor", actor, _ACTOR_RE), ("action", action, _ACTION_RE), ("resource", resource, _RESOURCE_RE),
        ):
            if not isinstance(value, str) or not pattern.match(value):
                raise InvalidArgument(field, f"{str(value)[:64]!r} does not match {pattern.pattern}")
        if outcome not in OUTCOMES:
            raise InvalidArgument("outcome", f"allowed: {', '.join(sorted(OUTCOMES))}, got {str(outcome)[:32]!r}")
        if reason and not (isinstance(reason, str) and _REASON_RE.match(reason)):
            raise InvalidArgument("reason", "must be an UPPER_SNAKE_CASE code")
        if not isinstance(time_s, int | float) or not math.isfinite(time_s):
            raise InvalidArgument("time_s", "must be a finite number of seconds")
        if not isinstance(count, int) or count < 0:
            raise InvalidArgument("count", "must be an integer >= 0")
        record: dict[str, object] = {
            "seq": self._seq + 1, "time_s": float(time_s), "actor": actor, "action": action,
            "resource": resource, "outcome": outcome,
        }
        if reason:
            record["reason"] = reason
        if count > 1:
            record["count"] = count
        record["prev"] = self._prev
        line = json.dumps(record, separators=(",", ":")).encode()
        if self.signer is not None:
            sig = _b64e(self.signer.sign(RECORD_CONTEXT + line))
            line = line[:-1] + f',"sig":"{sig}"}}'.encode()
            record["sig"] = sig
        with self.path.open("ab") as f:
            f.write(line + b"\n")
            if self.fsync:
                f.flush()
                os.fsync(f.fileno())
        self._seq += 1
        self._prev = hashlib.sha256(line).hexdigest()
        return record

    def anchor(self, time_s: float) -> Anchor:
        """A signed anchor of the current head (needs a signer)."""
        if self.signer is None:
            raise InvalidArgument("signer", "anchoring needs the broker's signing key")
        sig = _b64e(self.signer.sign(anchor_message(self._seq, self._prev, time_s)))
        return Anchor(self._seq, self._prev, float(time_s), self.key_id, sig)

    def records(self) -> list[dict[str, object]]:
        """All records, oldest first."""
        with self.path.open("rb") as f:
            return [json.loads(line) for line in f if line.strip()]


def append_anchor(path: str | os.PathLike[str], anchor: Anchor) -> None:
    """Append ``anchor`` to an anchors file (one JSON object per line, flushed to disk)."""
    with Path(path).open("ab") as f:
        f.write(json.dumps(anchor.to_json(), separators=(",", ":")).encode() + b"\n")
        f.flush()
        os.fsync(f.fileno())


def load_anchors(path: str | os.PathLike[str]) -> list[Anchor]:
    """The anchors of an anchors file (empty if it does not exist)."""
    p = Path(path)
    if not p.exists():
        return []
    with p.open("rb") as f:
        return [Anchor.from_json(json.loads(line)) for line in f if line.strip()]


def load_public_key(pem: bytes | str | Ed25519PublicKey) -> Ed25519PublicKey:
    """An Ed25519 public key from PEM (or passed through)."""
    if isinstance(pem, Ed25519PublicKey):
        return pem
    key = serialization.load_pem_public_key(pem.encode() if isinstance(pem, str) else pem)
    if not isinstance(key, Ed25519PublicKey):
        raise InvalidArgument("public_key", "not an Ed25519 public key")
    return key


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """What a verified log holds: ``records`` lines, the last ``anchored`` of them covered by an anchor."""

    records: int
    anchored: int
    head: str


def verify_audit(path: str | os.PathLike[str], *, public_key: bytes | str | Ed25519PublicKey | None = None,
                 anchors: Iterable[Anchor] = ()) -> AuditReport:
    """Check a log's chain, its records' signatures (with ``public_key``) and every anchor.

    Raises :class:`AuditTampered` naming the first problem. Without a key only the chain and the
    anchors' positions are checked (anchors then prove nothing about who wrote them).
    """
    key = load_public_key(public_key) if public_key is not None else None
    lines = _line_hashes(Path(path))
    prev = GENESIS
    for n, (line, digest) in enumerate(lines, start=1):
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise AuditTampered(f"line {n} is not JSON", reason="CHAIN_BROKEN", line=n) from exc
        if not isinstance(rec, dict) or rec.get("prev") != prev or rec.get("seq") != n:
            raise AuditTampered(f"chain broken at line {n}", reason="CHAIN_BROKEN", line=n)
        if key is not None:
            m = _SIG_TAIL_RE.search(line)
            if m is None:
                raise AuditTampered(f"line {n} is not signed", reason="UNSIGNED_RECORD", line=n)
            body = line[: m.start()] + b"}"
            try:
                key.verify(_b64d(m.group(1)), RECORD_CONTEXT + body)
            except (InvalidSignature, ValueError) as exc:
                raise AuditTampered(f"line {n} does not match its signature", reason="BAD_RECORD_SIGNATURE",
                                    line=n) from exc
        prev = digest
    anchored = 0
    for a in anchors:
        if key is not None:
            a.verify(key)
        if a.seq > len(lines):
            raise AuditTampered(f"an anchor of {a.time_s:.0f} s covers {a.seq} lines, the log has {len(lines)}",
                                reason="TRUNCATED", line=len(lines))
        if a.seq > 0 and lines[a.seq - 1][1] != a.head:
            raise AuditTampered(f"line {a.seq} does not hash to the anchored head", reason="HEAD_MISMATCH",
                                line=a.seq)
        anchored = max(anchored, a.seq)
    return AuditReport(len(lines), anchored, prev)


def verify_chain(path: str | os.PathLike[str]) -> int:
    """Check the hash chain and sequence of a log; returns the record count or raises InvalidArgument."""
    return verify_audit(path).records


def main(argv: list[str] | None = None) -> int:
    """``python -m gigacluster.security.audit STATE_DIR [ANCHOR.json ...]``: verify the broker's
    ``audit.jsonl`` with ``audit.pub``, its anchors file and any anchors kept elsewhere (e.g. the
    retained MQTT message); exit 0 if it holds, 1 with the reason if not."""
    p = argparse.ArgumentParser(prog="python -m gigacluster.security.audit", description=main.__doc__)
    p.add_argument("state_dir", type=Path)
    p.add_argument("anchors", nargs="*", type=Path, help="extra anchor files (one JSON anchor each)")
    args = p.parse_args(argv)
    log_path = args.state_dir / "audit.jsonl"
    try:
        anchors = load_anchors(log_path.with_name(log_path.name + ".anchors"))
        anchors += [Anchor.from_json(json.loads(a.read_text())) for a in args.anchors]
        report = verify_audit(log_path, public_key=(args.state_dir / "audit.pub").read_bytes(), anchors=anchors)
    except AuditTampered as exc:
        print(f"TAMPERED ({exc.reason}): {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"cannot verify: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {report.records} records, the first {report.anchored} covered by a signed anchor")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
