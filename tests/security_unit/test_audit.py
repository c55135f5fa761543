"""The audit log: one JSON line per action, fixed fields only, hash-chained, signed and anchored."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gigacluster.security import InvalidArgument
from gigacluster.security.audit import (
    GENESIS,
    AuditLog,
    AuditTampered,
    append_anchor,
    load_anchors,
    verify_audit,
    verify_chain,
)


def test_records_have_exactly_the_audit_fields(tmp_path: Path) -> None:
    """Each line carries seq, time, actor, action, resource, outcome (and reason, prev) and nothing else."""
    log = AuditLog(tmp_path / "audit.jsonl")
    log.append("admin:root", "tenant.create", "tenants/acme", "ok", 10.0)
    log.append("tenant:acme", "instance.allocate", "tenants/acme/instances/i-1", "denied", 11.5,
               reason="NOT_ENOUGH_DEVICES")
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    recs = [json.loads(x) for x in lines]
    assert set(recs[0]) == {"seq", "time_s", "actor", "action", "resource", "outcome", "prev"}
    assert recs[1]["reason"] == "NOT_ENOUGH_DEVICES" and recs[1]["seq"] == 2
    assert log.records() == recs
    assert verify_chain(tmp_path / "audit.jsonl") == 2


def test_free_text_cannot_reach_the_log(tmp_path: Path) -> None:
    """Strings that could carry tenant data (spaces, prompts, bytes) are refused in every field."""
    log = AuditLog(tmp_path / "a.jsonl")
    bad = [
        ("tenant:acme", "memory.write", "tenants/acme/alloc/1 data=SECRET", "ok", "resource"),
        ("tenant:acme", "prompt: tell me the plan", "tenants/acme", "ok", "action"),
        ("acme", "instance.stop", "tenants/acme", "ok", "actor"),
        ("tenant:acme", "instance.stop", "tenants/acme", "done, payload follows", "outcome"),
    ]
    for actor, action, resource, outcome, field in bad:
        with pytest.raises(InvalidArgument) as exc:
            log.append(actor, action, resource, outcome, 1.0)
        assert exc.value.field == field
    with pytest.raises(InvalidArgument):
        log.append("tenant:acme", "instance.stop", "tenants/acme", "ok", 1.0, reason="because the prompt said")
    assert not (tmp_path / "a.jsonl").exists()


def test_chain_detects_edits_and_deletions_and_survives_reopen(tmp_path: Path) -> None:
    """Reopening continues the chain; editing or deleting a line breaks verify_chain."""
    path = tmp_path / "audit.jsonl"
    log = AuditLog(path)
    for i in range(3):
        log.append("admin:root", "instance.release", f"tenants/acme/instances/i-{i}", "ok", float(i))
    AuditLog(path).append("admin:root", "instance.list", "instances", "ok", 9.0)
    assert verify_chain(path) == 4
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:1] + lines[2:]) + "\n")
    with pytest.raises(InvalidArgument):
        verify_chain(path)
    path.write_text("\n".join([lines[0].replace('"ok"', '"denied"'), *lines[1:]]) + "\n")
    with pytest.raises(InvalidArgument):
        verify_chain(path)


# -- anchored, signed logs: each tamper case --------------------------------------------------------


def _signed_log(path: Path, n: int = 5) -> tuple[Ed25519PrivateKey, AuditLog]:
    key = Ed25519PrivateKey.generate()
    log = AuditLog(path, signer=key)
    for i in range(n):
        log.append("admin:root", "instance.release", f"instances/i-{i}", "ok", float(i))
    return key, log


def _rechain(lines: list[bytes]) -> list[bytes]:
    """What an attacker with write access does: rewrite seq and prev so the chain verifies again."""
    out, prev = [], GENESIS
    for i, line in enumerate(lines, start=1):
        rec = json.loads(line)
        rec.pop("sig", None)
        rec["seq"], rec["prev"] = i, prev
        b = json.dumps(rec, separators=(",", ":")).encode()
        out.append(b)
        prev = hashlib.sha256(b).hexdigest()
    return out


def test_a_signed_anchored_log_verifies(tmp_path: Path) -> None:
    """Untouched: every record's signature and every anchor check out."""
    key, log = _signed_log(tmp_path / "a.jsonl")
    anchor = log.anchor(10.0)
    append_anchor(tmp_path / "a.anchors", anchor)
    log.append("tenant:acme", "broker.list_tenants", "broker", "denied", 11.0, reason="ADMIN_ONLY")
    report = verify_audit(tmp_path / "a.jsonl", public_key=key.public_key(),
                          anchors=load_anchors(tmp_path / "a.anchors"))
    assert (report.records, report.anchored) == (6, 5)
    assert load_anchors(tmp_path / "a.anchors") == [anchor]


def test_truncated_tail_is_detected_by_the_anchor(tmp_path: Path) -> None:
    """Cutting the last lines leaves a valid chain, but the anchor names a line that is gone."""
    key, log = _signed_log(tmp_path / "a.jsonl")
    anchor = log.anchor(10.0)
    lines = (tmp_path / "a.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_bytes(b"".join(lines[:3]))
    assert verify_chain(tmp_path / "a.jsonl") == 3
    with pytest.raises(AuditTampered) as exc:
        verify_audit(tmp_path / "a.jsonl", public_key=key.public_key(), anchors=[anchor])
    assert exc.value.reason == "TRUNCATED"


def test_recomputed_chain_is_detected(tmp_path: Path) -> None:
    """An edited line with the chain recomputed: the anchored head differs, and (with the key) the
    edited line is no longer signed."""
    key, log = _signed_log(tmp_path / "a.jsonl")
    anchor = log.anchor(10.0)
    lines = (tmp_path / "a.jsonl").read_bytes().splitlines()
    lines[1] = lines[1].replace(b'"ok"', b'"failed"')
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(_rechain(lines)) + b"\n")
    assert verify_chain(tmp_path / "a.jsonl") == 5
    with pytest.raises(AuditTampered) as exc:
        verify_audit(tmp_path / "a.jsonl", anchors=[anchor])
    assert exc.value.reason == "HEAD_MISMATCH"
    with pytest.raises(AuditTampered) as exc:
        verify_audit(tmp_path / "a.jsonl", public_key=key.public_key())
    assert exc.value.reason == "UNSIGNED_RECORD"


def test_forged_append_is_detected(tmp_path: Path) -> None:
    """A line appended with a correct chain but without the broker's key: unsigned or badly signed."""
    key, log = _signed_log(tmp_path / "a.jsonl")
    anchor = log.anchor(10.0)
    AuditLog(tmp_path / "a.jsonl").append("admin:root", "tenant.delete", "tenants/acme", "ok", 20.0)
    with pytest.raises(AuditTampered) as exc:
        verify_audit(tmp_path / "a.jsonl", public_key=key.public_key(), anchors=[anchor])
    assert exc.value.reason == "UNSIGNED_RECORD" and exc.value.line == 6
    path2 = tmp_path / "b.jsonl"
    key2, _ = _signed_log(path2, 2)
    AuditLog(path2, signer=Ed25519PrivateKey.generate()).append("admin:root", "tenant.delete", "tenants/a", "ok", 3.0)
    with pytest.raises(AuditTampered) as exc:
        verify_audit(path2, public_key=key2.public_key())
    assert exc.value.reason == "BAD_RECORD_SIGNATURE"


def test_a_forged_anchor_is_refused(tmp_path: Path) -> None:
    """An anchor written by anyone but the broker (recomputed to match a rewritten log) fails its signature."""
    key, _ = _signed_log(tmp_path / "a.jsonl")
    forged = AuditLog(tmp_path / "a.jsonl", signer=Ed25519PrivateKey.generate()).anchor(10.0)
    with pytest.raises(AuditTampered) as exc:
        verify_audit(tmp_path / "a.jsonl", public_key=key.public_key(), anchors=[forged])
    assert exc.value.reason == "BAD_ANCHOR_SIGNATURE"


def test_reopen_against_a_stored_head_reports_tampering(tmp_path: Path) -> None:
    """The head kept outside the log (the broker's db) exposes a truncation or a rewrite on reopen."""
    _, log = _signed_log(tmp_path / "a.jsonl")
    head = log.head
    assert AuditLog(tmp_path / "a.jsonl", expected_head=head).tamper == ""
    lines = (tmp_path / "a.jsonl").read_bytes().splitlines()
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(lines[:4]) + b"\n")
    assert AuditLog(tmp_path / "a.jsonl", expected_head=head).tamper.startswith("TRUNCATED")
    (tmp_path / "a.jsonl").write_bytes(b"\n".join(_rechain([*lines[:4], lines[4].replace(b"i-4", b"i-9")])) + b"\n")
    assert AuditLog(tmp_path / "a.jsonl", expected_head=head).tamper.startswith("HEAD_MISMATCH")


def test_the_verifier_command_reports_ok_and_tampering(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m gigacluster.security.audit STATE_DIR`` exits 0 on a sound log, 1 naming the reason."""
    from cryptography.hazmat.primitives import serialization

    from gigacluster.security.audit import main

    key, log = _signed_log(tmp_path / "audit.jsonl")
    (tmp_path / "audit.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    append_anchor(tmp_path / "audit.jsonl.anchors", log.anchor(10.0))
    assert main([str(tmp_path)]) == 0
    assert "5 records" in capsys.readouterr().out
    lines = (tmp_path / "audit.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "audit.jsonl").write_bytes(b"".join(lines[:2]))
    assert main([str(tmp_path)]) == 1
    assert "TAMPERED (TRUNCATED)" in capsys.readouterr().err
