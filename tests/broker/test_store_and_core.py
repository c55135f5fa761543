"""The broker's durable state: what a core writes, a new core on the same database reads back."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from gigacluster.broker.core import BrokerCore, BrokerLimits, ShardInfo
from gigacluster.broker.store import BrokerStore, InstanceRow
from gigacluster.errors import InvalidArgument, NotFound, PermissionDenied, ResourceExhausted, Unauthenticated
from gigacluster.runtime.auth import Principal
from gigacluster.security import ResourceExhausted as SecResourceExhausted
from gigacluster.security.apikeys import new_api_key
from gigacluster.security.audit import load_anchors, verify_audit
from gigacluster.security.capability import CapabilityVerifier, DeviceSet

ADMIN = Principal("admin")
SHARDS = [ShardInfo("127.0.0.1:1", "h100-sxm", 0, 16, "hgx", 8)]


def core_on(state: pathlib.Path, admin_key: str, **kw: object) -> BrokerCore:
    return BrokerCore(cluster="c1", shards=SHARDS, admin_key=admin_key, service_key="", capability_ttl_s=900.0,
                      store=BrokerStore(state / "broker.db"), audit_path=state / "audit.jsonl",
                      mqtt_dir=state / "mqtt", **kw)  # type: ignore[arg-type]


@pytest.fixture
def admin_key() -> str:
    return new_api_key()


def test_store_commits_and_the_counter_never_repeats(tmp_path: pathlib.Path) -> None:
    """Instance numbers keep counting across reopen, and never fall below an id already in the table."""
    s = BrokerStore(tmp_path / "b.db")
    assert [s.next_instance_number() for _ in range(3)] == [1, 2, 3]
    s.add_instance(InstanceRow("i-41", "acme", "h100-sxm", "none", [0], [2], 1.0, "", 1.0))
    s.close()
    s2 = BrokerStore(tmp_path / "b.db")
    assert s2.next_instance_number() == 42
    assert s2.get_meta("next_instance") == "43"
    assert (tmp_path / "b.db").stat().st_mode & 0o777 == 0o600
    assert s2.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_store_transaction_rolls_back_as_a_whole(tmp_path: pathlib.Path) -> None:
    """An exception inside tx() leaves no partial write behind (counter included)."""
    s = BrokerStore(tmp_path / "b.db")
    with pytest.raises(RuntimeError), s.tx():
        s.next_instance_number()
        s.add_instance(InstanceRow("i-1", "acme", "h100-sxm", "none", [0], [2], 1.0, "", 1.0))
        raise RuntimeError("boom")
    assert s.instances() == [] and s.next_instance_number() == 1


def test_restart_keeps_tenants_keys_instances_and_the_signing_key(tmp_path: pathlib.Path, admin_key: str) -> None:
    """A new core on the same database: tenants, API keys, instances and allocations are back, old
    capability tokens verify, new instances get fresh ids and never a device in use."""
    c1 = core_on(tmp_path, admin_key)
    _, key, _ = c1.create_tenant(ADMIN, "acme", "Acme", 2.0)
    rec1, token1, _ = c1.allocate(ADMIN, chip_type="h100-sxm", count=8, topology=0, purpose="p",
                                  on_behalf="tenants/acme")
    rec2, _, _ = c1.allocate(ADMIN, chip_type="h100-sxm", count=4, topology=0, purpose="", on_behalf="tenants/acme")
    c1.release(ADMIN, rec2.name)
    c1.finish_release(rec2.alloc.instance)
    pem = c1.issuer.public_key_pem()
    c1.store.close()

    c2 = core_on(tmp_path, admin_key)
    assert c2.authenticate(key) == Principal("tenant", "tenants/acme")
    assert c2.tenants["acme"].weight == 2.0 and c2.tenants["acme"].display_name == "Acme"
    assert list(c2.instances) == [rec1.alloc.instance]
    assert c2.instances[rec1.alloc.instance].alloc.devices == rec1.alloc.devices
    assert c2.issuer.public_key_pem() == pem
    cap = CapabilityVerifier({"k1": c2.issuer.public_key_pem()}, cluster="c1").verify(token1, rec1.created_s + 1)
    assert cap.instance == rec1.alloc.instance
    assert c2.allocator is not None and int(np.count_nonzero(c2.allocator.owner < 0)) == 8
    rec3, _, _ = c2.allocate(ADMIN, chip_type="h100-sxm", count=8, topology=0, purpose="", on_behalf="tenants/acme")
    assert rec3.alloc.instance not in (rec1.alloc.instance, rec2.alloc.instance)
    assert not set(rec3.alloc.devices.ids().tolist()) & set(rec1.alloc.devices.ids().tolist())
    with pytest.raises(SecResourceExhausted):
        c2.allocate(ADMIN, chip_type="h100-sxm", count=1, topology=0, purpose="", on_behalf="tenants/acme")
    assert "tenant-acme" in (tmp_path / "mqtt" / "passwd").read_text()


def test_a_release_not_yet_scrubbed_keeps_its_devices_across_a_restart(tmp_path: pathlib.Path,
                                                                       admin_key: str) -> None:
    """Released but unscrubbed: invisible to the tenant, revoked, and its devices never handed out."""
    c1 = core_on(tmp_path, admin_key)
    c1.create_tenant(ADMIN, "acme", "", 0.0)
    rec, token, _ = c1.allocate(ADMIN, chip_type="h100-sxm", count=16, topology=0, purpose="",
                                on_behalf="tenants/acme")
    c1.release(ADMIN, rec.name)
    c1.store.close()
    c2 = core_on(tmp_path, admin_key)
    assert rec.alloc.instance in c2.releasing and rec.alloc.instance not in c2.instances
    with pytest.raises(SecResourceExhausted):
        c2.allocate(ADMIN, chip_type="h100-sxm", count=1, topology=0, purpose="", on_behalf="tenants/acme")
    with pytest.raises(Exception, match="released"):
        c2.verifier.verify(token, rec.created_s + 1)
    c2.finish_release(rec.alloc.instance)
    assert c2.allocate(ADMIN, chip_type="h100-sxm", count=16, topology=0, purpose="",
                       on_behalf="tenants/acme")[0].alloc.instance != rec.alloc.instance


def test_bounds_are_checked_before_any_array_is_built(tmp_path: pathlib.Path, admin_key: str) -> None:
    """A device range to 2^64-1 is refused by its bound, a tenant naming devices is denied first,
    non-finite weights and long names are INVALID_ARGUMENT, oversized counts RESOURCE_EXHAUSTED."""
    c = core_on(tmp_path, admin_key, limits=BrokerLimits(max_instance_devices=8, max_device_ranges=2,
                                                         max_text_chars=10))
    with pytest.raises(PermissionDenied):
        c.device_set(Principal("tenant", "tenants/acme"), [(0, 2**64 - 1)])
    with pytest.raises(NotFound, match="does not exist"):
        c.device_set(ADMIN, [(0, 2**64 - 1)])
    with pytest.raises(InvalidArgument, match="at most 2 ranges"):
        c.device_set(ADMIN, [(0, 1), (2, 3), (4, 5)])
    with pytest.raises(ResourceExhausted, match="max_instance_devices"):
        c.device_set(ADMIN, [(0, 9)])
    assert c.device_set(ADMIN, [(4, 6), (0, 2)]) == DeviceSet.from_ids([0, 1, 4, 5])
    for w in (float("nan"), float("inf"), -1.0):
        with pytest.raises(InvalidArgument, match="weight"):
            c.create_tenant(ADMIN, "acme", "", w)
    with pytest.raises(InvalidArgument, match="display_name"):
        c.create_tenant(ADMIN, "acme", "x" * 11, 1.0)
    c.create_tenant(ADMIN, "acme", "", 1.0)
    with pytest.raises(ResourceExhausted, match="max_instance_devices"):
        c.allocate(ADMIN, chip_type="h100-sxm", count=2**63, topology=0, purpose="", on_behalf="tenants/acme")
    with pytest.raises(InvalidArgument) as exc:
        c.get_instance(ADMIN, "instances/" + "x" * 100_000)
    assert len(str(exc.value)) < 300


def test_audit_is_signed_anchored_and_records_denials(tmp_path: pathlib.Path, admin_key: str) -> None:
    """Denied calls are audited (bounded per second, the excess counted); the log verifies with the
    broker's key against its anchors, and the db head catches a truncation at the next start."""
    c = core_on(tmp_path, admin_key, limits=BrokerLimits(audit_denied_per_s=2))
    c.create_tenant(ADMIN, "acme", "", 1.0)
    for _ in range(5):
        c.audit_denied(None, "gck_0123456789abcdef_" + "A" * 43, "broker.create_tenant", "BAD_API_KEY", 100.2)
    c.audit_denied(Principal("tenant", "tenants/acme"), None, "broker.list_tenants", "ADMIN_ONLY", 101.0)
    c.audit_denied(None, "junk\n", "broker.list_tenants", "not a code", 101.1)
    anchor = c.anchor_audit(102.0)
    assert anchor is not None and c.anchor_audit(103.0) is None
    recs = c.audit.records() if c.audit else []
    denied = [r for r in recs if r["outcome"] == "denied"]
    assert [r["actor"] for r in denied] == ["anonymous:key-0123456789abcdef", "anonymous:key-0123456789abcdef",
                                            "service:broker", "tenant:acme", "anonymous:malformed"]
    assert denied[2]["count"] == 3 and denied[4]["reason"] == "DENIED"
    assert verify_audit(tmp_path / "audit.jsonl", public_key=c.issuer.public_key_pem(),
                        anchors=[anchor]).records == len(recs)
    c.store.close()
    lines = (tmp_path / "audit.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "audit.jsonl").write_bytes(b"".join(lines[:-2]))
    c2 = core_on(tmp_path, admin_key)
    assert c2.audit is not None and c2.audit.tamper.startswith("TRUNCATED")
    assert c2.audit.records()[-1]["reason"] == "TRUNCATED"
    assert load_anchors(tmp_path / "none") == []


def test_unknown_keys_stay_unauthenticated_after_restart(tmp_path: pathlib.Path, admin_key: str) -> None:
    """The admin key comes from config each start; a never-issued key is refused."""
    core_on(tmp_path, admin_key).store.close()
    c = core_on(tmp_path, admin_key)
    assert c.authenticate(admin_key) == ADMIN
    with pytest.raises(Unauthenticated):
        c.authenticate(new_api_key())
