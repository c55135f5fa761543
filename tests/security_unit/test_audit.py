"""The audit log: one JSON line per action, fixed fields only, hash-chained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gigacluster.security import InvalidArgument
from gigacluster.security.audit import AuditLog, verify_chain


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
