"""API keys stored as argon2id hashes, tenants made by the admin, and the admin's lack of data access."""

from __future__ import annotations

import argon2
import pytest

from gigacluster.security import FailedPrecondition, NotFound, PermissionDenied, Unauthenticated
from gigacluster.security.apikeys import (
    DATA_ACTIONS,
    IdentityStore,
    Principal,
    Role,
    api_key_id,
    authorize,
    hash_api_key,
    new_api_key,
    verify_api_key,
)

FAST = argon2.PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)  # tests only: keys are random


def test_hash_is_argon2id_with_owasp_parameters_and_verifies() -> None:
    """The stored form is an Argon2id PHC string (m=19 MiB, t=2, p=1: OWASP minimum) that verifies the key only."""
    key = new_api_key()
    h = hash_api_key(key)
    assert h.startswith("$argon2id$") and "m=19456,t=2,p=1" in h
    assert key not in h and key.split("_", 2)[2] not in h  # the secret (token_urlsafe may hold "_")
    assert verify_api_key(h, key)
    assert not verify_api_key(h, new_api_key())
    assert not verify_api_key("not-a-hash", key)


def test_keys_are_random_and_well_formed() -> None:
    """Keys differ every time and carry a 16-hex-digit id; malformed keys are UNAUTHENTICATED."""
    k1, k2 = new_api_key(), new_api_key()
    assert k1 != k2 and len(api_key_id(k1)) == 16
    for bad in ["", "gck_xyz_abc", "Bearer " + k1, k1 + "x"]:
        with pytest.raises(Unauthenticated):
            api_key_id(bad)


def test_admin_creates_tenants_and_tenants_authenticate() -> None:
    """Only the admin creates tenants; each key maps back to its principal; stored records hold no keys."""
    store = IdentityStore(hasher=FAST)
    admin_key = store.bootstrap_admin("root")
    admin = store.authenticate(admin_key)
    assert admin == Principal(Role.ADMIN, "root")
    acme_key = store.create_tenant(admin, "acme")
    assert store.authenticate(acme_key) == Principal(Role.TENANT, "acme")
    with pytest.raises(PermissionDenied):
        store.create_tenant(store.authenticate(acme_key), "evil")
    with pytest.raises(FailedPrecondition):
        store.create_tenant(admin, "acme")
    with pytest.raises(FailedPrecondition):
        store.bootstrap_admin("second")
    assert all(acme_key not in r.key_hash and admin_key not in r.key_hash for r in store.records())
    assert store.tenants() == ["acme"]


def test_wrong_missing_rotated_and_deleted_keys_fail() -> None:
    """A guessed key, no key, a rotated-out key and a deleted tenant's key are UNAUTHENTICATED."""
    store = IdentityStore(hasher=FAST)
    admin = store.authenticate(store.bootstrap_admin())
    key = store.create_tenant(admin, "acme")
    forged = f"gck_{api_key_id(key)}_{'A' * 43}"  # right id, wrong secret
    for bad in [forged, None, new_api_key()]:
        with pytest.raises(Unauthenticated):
            store.authenticate(bad)
    new = store.rotate_key(admin, "acme")
    with pytest.raises(Unauthenticated):
        store.authenticate(key)
    assert store.authenticate(new).name == "acme"
    store.delete_tenant(admin, "acme")
    with pytest.raises(Unauthenticated):
        store.authenticate(new)
    with pytest.raises(NotFound):
        store.delete_tenant(admin, "acme")


def test_records_persist_and_reload() -> None:
    """A store rebuilt from records() authenticates the same keys."""
    store = IdentityStore(hasher=FAST)
    admin = store.authenticate(store.bootstrap_admin())
    key = store.create_tenant(admin, "acme")
    again = IdentityStore(hasher=FAST, records=store.records())
    assert again.authenticate(key) == Principal(Role.TENANT, "acme")


def test_admin_has_no_path_to_tenant_data() -> None:
    """The admin may list, stop and release, but every data action (memory, prompts, payloads) is denied."""
    admin = Principal(Role.ADMIN, "root")
    for ok in ("instance.list", "instance.stop", "instance.release", "tenant.create"):
        authorize(admin, ok)
    assert {"memory.read", "memory.write", "prompt.read", "job.payload.read"} <= DATA_ACTIONS
    for action in sorted(DATA_ACTIONS):
        with pytest.raises(PermissionDenied) as exc:
            authorize(admin, action, tenant="acme")
        assert exc.value.reason == "ADMIN_NO_DATA_ACCESS"


def test_tenant_scope_and_service_scope() -> None:
    """A tenant acts on its own resources only and cannot take admin actions; services only publish and read state."""
    acme = Principal(Role.TENANT, "acme")
    authorize(acme, "memory.read", tenant="acme")
    authorize(acme, "instance.allocate")
    with pytest.raises(PermissionDenied) as exc:
        authorize(acme, "memory.read", tenant="beta")
    assert exc.value.reason == "WRONG_TENANT"
    with pytest.raises(PermissionDenied):
        authorize(acme, "tenant.create")
    svc = Principal(Role.SERVICE, "chip")
    authorize(svc, "telemetry.publish")
    with pytest.raises(PermissionDenied):
        authorize(svc, "memory.read", tenant="acme")
