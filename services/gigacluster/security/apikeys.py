"""Identities and API keys: an admin role, tenants created by the admin, and internal services.

An API key is ``gck_<key id>_<secret>``: the key id (16 hex digits) locates the record without
trying every hash; the secret is 256 random bits. Only an Argon2id hash of the whole key is
stored (``argon2-cffi``), never the key. Keys are high-entropy, so the OWASP minimum Argon2id
parameters are ample; a broker verifies a key once per session and then works with capability
tokens, which are cheap to check.

Roles are separate by construction: the admin can create and delete tenants and list, stop and
release instances, and is refused every data action (memory contents, prompts, job payloads):
:func:`authorize` is the one place that says so.
"""

from __future__ import annotations

import enum
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

import argon2

from gigacluster.security import FailedPrecondition, NotFound, PermissionDenied, Unauthenticated
from gigacluster.security.capability import TENANT_ACTIONS, check_name

API_KEY_PREFIX = "gck"
_KEY_RE = re.compile(r"^gck_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")

#: OWASP Password Storage Cheat Sheet, Argon2id minimum: m=19 MiB, t=2, p=1.
ARGON2_TIME_COST = 2
ARGON2_MEMORY_KIB = 19 * 1024
ARGON2_PARALLELISM = 1


def default_hasher() -> argon2.PasswordHasher:
    """The Argon2id hasher with the OWASP minimum parameters."""
    return argon2.PasswordHasher(
        time_cost=ARGON2_TIME_COST, memory_cost=ARGON2_MEMORY_KIB, parallelism=ARGON2_PARALLELISM,
        type=argon2.Type.ID,
    )


def new_api_key() -> str:
    """A fresh random API key (shown to its owner once, stored only as a hash)."""
    return f"{API_KEY_PREFIX}_{secrets.token_hex(8)}_{secrets.token_urlsafe(32)}"


def api_key_id(key: str) -> str:
    """The public id part of ``key``; Unauthenticated if the key is not well formed."""
    m = _KEY_RE.match(key) if isinstance(key, str) else None
    if m is None:
        raise Unauthenticated("malformed API key", reason="API_KEY_MALFORMED")
    return m.group(1)


def hash_api_key(key: str, *, hasher: argon2.PasswordHasher | None = None) -> str:
    """The Argon2id hash (PHC string) of ``key``, the only form in which keys are stored."""
    api_key_id(key)
    return (hasher or default_hasher()).hash(key)


def verify_api_key(stored_hash: str, key: str, *, hasher: argon2.PasswordHasher | None = None) -> bool:
    """True if ``key`` matches ``stored_hash`` (constant time inside argon2)."""
    try:
        return (hasher or default_hasher()).verify(stored_hash, key)
    except (argon2.exceptions.VerificationError, argon2.exceptions.InvalidHashError):
        return False


class Role(enum.StrEnum):
    """Who a principal is: the cluster admin, a tenant, or an internal service."""

    ADMIN = "admin"
    TENANT = "tenant"
    SERVICE = "service"


@dataclass(frozen=True)
class Principal:
    """Who is calling: the one principal class of every service (``runtime.auth`` re-exports it).

    ``kind`` is a :class:`Role` value (``admin``, ``tenant`` or ``service``); ``tenant`` is the
    tenant's name for a tenant (the services use the resource name, ``tenants/<id>``) and may name
    the admin or a service (:class:`IdentityStore` does; the services leave it empty).
    """

    kind: str
    tenant: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Role(self.kind).value)  # a plain str; ValueError if unknown

    @property
    def role(self) -> Role:
        return Role(self.kind)

    @property
    def name(self) -> str:
        """The principal's name: for a tenant, the tenant."""
        return self.tenant

    @property
    def privileged(self) -> bool:
        """The admin or an internal service (may see every tenant's records where a service allows it)."""
        return self.kind in (Role.ADMIN, Role.SERVICE)


#: What the admin may do: manage tenants and instances, read the audit log. Nothing else.
ADMIN_ACTIONS = frozenset(
    {"tenant.create", "tenant.delete", "tenant.list", "tenant.rotate_key",
     "instance.list", "instance.get", "instance.stop", "instance.release", "audit.read"}
)
#: Broker actions a tenant may take on its own resources.
TENANT_BROKER_ACTIONS = frozenset(
    {"instance.allocate", "instance.list", "instance.get", "instance.stop", "instance.release", "capability.issue"}
)
#: Data actions: reach into a tenant's memory, prompts or payloads. Never granted to the admin.
DATA_ACTIONS = TENANT_ACTIONS | frozenset({"job.payload.read", "prompt.read", "completion.read"})
#: Internal services publish telemetry and report state; they hold no tenant data rights here.
SERVICE_ACTIONS = frozenset({"telemetry.publish", "instance.list", "instance.get"})


def authorize(principal: Principal, action: str, *, tenant: str | None = None) -> None:
    """Raise PermissionDenied unless ``principal`` may take ``action`` on ``tenant``'s resources."""
    if principal.role is Role.ADMIN:
        if action in ADMIN_ACTIONS:
            return
        reason = "ADMIN_NO_DATA_ACCESS" if action in DATA_ACTIONS else "ACTION_NOT_ALLOWED"
        raise PermissionDenied(f"the admin role cannot {action!r}", reason=reason)
    if principal.role is Role.SERVICE:
        if action in SERVICE_ACTIONS:
            return
        raise PermissionDenied(f"service {principal.name!r} cannot {action!r}", reason="ACTION_NOT_ALLOWED")
    if action not in TENANT_BROKER_ACTIONS and action not in DATA_ACTIONS:
        raise PermissionDenied(f"tenants cannot {action!r}", reason="ACTION_NOT_ALLOWED")
    if tenant is not None and tenant != principal.name:
        raise PermissionDenied(f"resource belongs to another tenant, not {principal.name!r}", reason="WRONG_TENANT")


@dataclass(frozen=True)
class KeyRecord:
    """What is stored per key: its id, its hash and whose it is (never the key)."""

    key_id: str
    key_hash: str
    principal: Principal


class IdentityStore:
    """Principals and their hashed keys; the broker keeps one and persists :meth:`records`."""

    def __init__(self, *, hasher: argon2.PasswordHasher | None = None,
                 records: Iterable[KeyRecord] = ()) -> None:
        self._hasher = hasher or default_hasher()
        self._by_key_id: dict[str, KeyRecord] = {}
        for r in records:
            self._by_key_id[r.key_id] = r

    def records(self) -> list[KeyRecord]:
        """All stored records (hashes only), for persistence."""
        return list(self._by_key_id.values())

    def _add(self, principal: Principal) -> str:
        check_name("name", principal.name)
        key = new_api_key()
        rec = KeyRecord(api_key_id(key), hash_api_key(key, hasher=self._hasher), principal)
        self._by_key_id[rec.key_id] = rec
        return key

    def _principals(self, role: Role) -> set[str]:
        return {r.principal.name for r in self._by_key_id.values() if r.principal.role is role}

    def bootstrap_admin(self, name: str = "admin") -> str:
        """Create the admin principal (once, at cluster start); returns its key."""
        if self._principals(Role.ADMIN):
            raise FailedPrecondition("an admin already exists", reason="ADMIN_EXISTS")
        return self._add(Principal(Role.ADMIN, name))

    def add_service(self, name: str) -> str:
        """Create an internal service principal; returns its key."""
        return self._add(Principal(Role.SERVICE, name))

    def create_tenant(self, actor: Principal, tenant: str) -> str:
        """The admin creates ``tenant``; returns the tenant's first key (shown once)."""
        authorize(actor, "tenant.create")
        check_name("tenant", tenant)
        if tenant in self._principals(Role.TENANT):
            raise FailedPrecondition(f"tenant {tenant!r} already exists", reason="TENANT_EXISTS")
        return self._add(Principal(Role.TENANT, tenant))

    def rotate_key(self, actor: Principal, tenant: str) -> str:
        """Replace all of ``tenant``'s keys with a new one; returns it."""
        authorize(actor, "tenant.rotate_key")
        self._remove_tenant_keys(tenant)
        return self._add(Principal(Role.TENANT, tenant))

    def delete_tenant(self, actor: Principal, tenant: str) -> None:
        """The admin deletes ``tenant``; its keys stop working at once."""
        authorize(actor, "tenant.delete")
        self._remove_tenant_keys(tenant)

    def _remove_tenant_keys(self, tenant: str) -> None:
        ids = [k for k, r in self._by_key_id.items() if r.principal == Principal(Role.TENANT, tenant)]
        if not ids:
            raise NotFound(f"no tenant {tenant!r}", reason="TENANT_NOT_FOUND")
        for k in ids:
            del self._by_key_id[k]

    def tenants(self) -> list[str]:
        """Tenant ids, sorted."""
        return sorted(self._principals(Role.TENANT))

    def authenticate(self, key: str | None) -> Principal:
        """The principal owning ``key``, or Unauthenticated."""
        if not key:
            raise Unauthenticated("no API key", reason="API_KEY_MISSING")
        rec = self._by_key_id.get(api_key_id(key))
        if rec is None or not verify_api_key(rec.key_hash, key, hasher=self._hasher):
            raise Unauthenticated("API key not valid", reason="API_KEY_INVALID")
        return rec.principal


__all__ = [
    "ADMIN_ACTIONS",
    "DATA_ACTIONS",
    "IdentityStore",
    "KeyRecord",
    "Principal",
    "Role",
    "api_key_id",
    "authorize",
    "hash_api_key",
    "new_api_key",
    "verify_api_key",
]
