"""Per-tenant MQTT credentials and topic ACLs for the telemetry broker.

Users: one per tenant (``tenant-<id>``, reads only ``gigacluster/<cluster>/tenants/<id>/#``),
``service`` (writes everywhere) and ``admin`` (reads everything). The same rules produce the
Mosquitto files (:meth:`TelemetryAcl.render_acl_file`, :func:`render_password_file`) and the
check an embedded broker uses (:meth:`TelemetryAcl.allows`), so the two cannot drift.

Password file lines use Mosquitto's ``$7$`` format (``mosquitto_passwd -H sha512-pbkdf2``)::

    user:$7$<iterations>$<base64 salt (12 bytes)>$<base64 PBKDF2-HMAC-SHA512(password, salt), 64 bytes>

with standard base64 (with padding). Checked against ``mosquitto_passwd`` 2.0.11, whose
default is 101 iterations; Mosquitto reads the count from each line, so we use more.
"""

from __future__ import annotations

import base64
import binascii
import enum
import functools
import hashlib
import hmac
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gigacluster.security import InvalidArgument
from gigacluster.security.capability import check_name

#: PBKDF2 iterations for generated hashes. Passwords are random 192-bit secrets, so the count
#: guards nothing a brute force could reach; 10,000 keeps a broker's CONNECT check under ~10 ms.
MOSQUITTO_ITERATIONS = 10_000
MOSQUITTO_SALT_BYTES = 12  # as mosquitto_passwd
SERVICE_USER = "service"
ADMIN_USER = "admin"
TENANT_USER_PREFIX = "tenant-"


def mosquitto_hash(password: str, *, iterations: int = MOSQUITTO_ITERATIONS, salt: bytes | None = None) -> str:
    """``$7$`` PBKDF2-SHA512 hash of ``password`` as Mosquitto's password file stores it."""
    if iterations < 1:
        raise InvalidArgument("iterations", "must be >= 1")
    salt = secrets.token_bytes(MOSQUITTO_SALT_BYTES) if salt is None else salt
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations)
    return f"$7${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def verify_mosquitto_hash(stored: str, password: str) -> bool:
    """True if ``password`` matches a ``$7$`` hash (ours or one written by mosquitto_passwd)."""
    parts = stored.split("$")
    if len(parts) != 5 or parts[0] != "" or parts[1] != "7":
        return False
    try:
        iterations = int(parts[2])
        salt = base64.b64decode(parts[3], validate=True)
        expected = base64.b64decode(parts[4], validate=True)
    except (ValueError, binascii.Error):
        return False
    if not 1 <= iterations <= 10_000_000:
        return False
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations)
    return hmac.compare_digest(digest, expected)


def tenant_user(tenant: str) -> str:
    """The MQTT user name of ``tenant`` (prefixed, so it can never be ``service`` or ``admin``)."""
    return TENANT_USER_PREFIX + check_name("tenant", tenant)


def new_password() -> str:
    """A random MQTT password (32 base64url characters, 192 bits)."""
    return secrets.token_urlsafe(24)


def render_password_file(passwords: Mapping[str, str], *, iterations: int = MOSQUITTO_ITERATIONS) -> str:
    """A Mosquitto password file (``user:$7$...`` lines) for ``{user: password}``."""
    lines = []
    for user in sorted(passwords):
        if not user or any(c in user for c in ":\n\r#+/ ") or user.startswith("$"):
            raise InvalidArgument("user", f"{user!r} cannot be an MQTT user name in a password file")
        lines.append(f"{user}:{mosquitto_hash(passwords[user], iterations=iterations)}")
    return "\n".join(lines) + "\n"


def render_hashed_password_file(hashes: Mapping[str, str]) -> str:
    """A Mosquitto password file from already-hashed ``{user: $7$...}`` (the broker keeps hashes only)."""
    for user, h in hashes.items():
        if not user or any(c in user for c in ":\n\r#+/ ") or not h.startswith("$7$"):
            raise InvalidArgument("user", f"{user!r} needs a name without ':#+/ ' and a $7$ hash")
    return "".join(f"{u}:{hashes[u]}\n" for u in sorted(hashes))


def parse_password_file(text: str) -> dict[str, str]:
    """``{user: hash}`` from a Mosquitto password file (comments and blank lines skipped)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            user, sep, h = line.partition(":")
            if sep:
                out[user] = h
    return out


class Access(enum.StrEnum):
    """What a client wants to do with a topic: receive a message, subscribe a filter, publish."""

    READ = "read"
    SUBSCRIBE = "subscribe"
    WRITE = "write"


@dataclass(frozen=True)
class AclRule:
    """``user`` may ``access`` (read or write; read covers subscribe) topics matching ``pattern``."""

    user: str
    access: str
    pattern: str


def _levels_within(request: str, pattern: str) -> bool:
    """True if every topic matching ``request`` (a topic or a filter) also matches ``pattern``.

    A wildcard in the request is only covered by the same or a broader wildcard in the pattern,
    so a tenant cannot widen its view with ``+`` or ``#``. Per MQTT, wildcards at the first level
    never match topics starting with ``$``.
    """
    req = request.split("/")
    pat = pattern.split("/")
    if req[0].startswith("$") and pat[0] in ("+", "#"):
        return False
    for i, p in enumerate(pat):
        if p == "#":
            return True
        if i >= len(req):
            return False
        r = req[i]
        if r == "#":
            return False
        if p != "+" and p != r:
            return False
    return len(req) == len(pat)


def _valid_topic(topic: str, access: Access) -> bool:
    if not topic or len(topic.encode()) > 65535 or "\x00" in topic:
        return False
    levels = topic.split("/")
    for i, lv in enumerate(levels):
        if ("+" in lv or "#" in lv) and (access is not Access.SUBSCRIBE or len(lv) > 1):
            return False
        if lv == "#" and i != len(levels) - 1:
            return False
    return True


#: Services that publish per-tenant telemetry under ``<service>/tenants/<tenant>/``.
TENANT_SERVICES = ("chip", "fabric", "broker", "scheduler", "router")


@dataclass(frozen=True)
class TelemetryAcl:
    """Topic rules of one cluster's telemetry broker for its tenants, services and admin."""

    cluster: str
    tenants: frozenset[str]

    def __post_init__(self) -> None:
        check_name("cluster", self.cluster)
        object.__setattr__(self, "tenants", frozenset(check_name("tenant", t) for t in self.tenants))

    @classmethod
    def of(cls, cluster: str, tenants: Iterable[str]) -> TelemetryAcl:
        """Rules for ``cluster`` with ``tenants``."""
        return cls(cluster, frozenset(tenants))

    def tenant_prefixes(self, tenant: str) -> list[str]:
        """The topic subtrees a tenant reads: its own branch under every service
        (``gigacluster/<cluster>/<service>/tenants/<tenant>``, docs/telemetry.md)."""
        return [f"gigacluster/{self.cluster}/{svc}/tenants/{tenant}" for svc in TENANT_SERVICES]

    def rules(self) -> list[AclRule]:
        """Every rule, in the order the ACL file lists them."""
        out = [AclRule(SERVICE_USER, "write", "#"), AclRule(ADMIN_USER, "read", "#")]
        out += [AclRule(tenant_user(t), "read", prefix + "/#")
                for t in sorted(self.tenants) for prefix in self.tenant_prefixes(t)]
        return out

    def render_acl_file(self) -> str:
        """A Mosquitto ``acl_file``: no anonymous access, then one ``user`` block per user."""
        lines = [f"# gigacluster telemetry ACL for cluster {self.cluster}; generated, do not edit", ""]
        for r in self.rules():
            lines += [f"user {r.user}", f"topic {r.access} {r.pattern}", ""]
        return "\n".join(lines)

    def users(self) -> list[str]:
        """All MQTT users the rules name."""
        return [SERVICE_USER, ADMIN_USER] + [tenant_user(t) for t in sorted(self.tenants)]

    def allows(self, user: str | None, topic: str, access: Access | str) -> bool:
        """True if ``user`` may ``access`` (read, subscribe, write) ``topic``; unknown users get nothing."""
        try:
            acc = Access(access)
        except ValueError:
            return False
        if not user or not isinstance(topic, str) or not _valid_topic(topic, acc):
            return False
        want = "write" if acc is Access.WRITE else "read"
        return any(r.access == want and _levels_within(topic, r.pattern) for r in self._rules_by_user.get(user, ()))

    @functools.cached_property
    def _rules_by_user(self) -> dict[str, tuple[AclRule, ...]]:
        by_user: dict[str, list[AclRule]] = {}
        for r in self.rules():
            by_user.setdefault(r.user, []).append(r)
        return {u: tuple(rs) for u, rs in by_user.items()}

    def credentials(self, existing: Mapping[str, str] | None = None) -> dict[str, str]:
        """``{user: password}`` for every user, keeping ``existing`` passwords and adding new ones."""
        old = dict(existing or {})
        return {u: old.get(u) or new_password() for u in self.users()}


def acl_allows(user: str | None, topic: str, access: Access | str, *, cluster: str, tenants: Iterable[str]) -> bool:
    """Functional form of :meth:`TelemetryAcl.allows`."""
    return TelemetryAcl.of(cluster, tenants).allows(user, topic, access)
