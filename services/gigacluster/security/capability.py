"""Short-lived, Ed25519-signed capability tokens scoped to tenant, instance, devices and actions.

The broker issues a token when a tenant's instance is allocated; the chip and fabric services
verify it on every call (signature, cluster, expiry, revocation) and then check the call against
its scope with :meth:`Capability.require`. Verification needs only the broker's public keys, so
any process can check a token without calling the broker.

Token wire format (ASCII, fits in one gRPC metadata value)::

    gc1.<key_id>.<payload>.<signature>

``payload`` is base64url (no padding) of compact JSON ``{"aud": cluster, "sub": tenant,
"ins": instance, "dev": DeviceSet wire, "act": [actions], "iat": issued_s, "exp": expires_s,
"jti": token id}``; ``signature`` is base64url of the Ed25519 signature over the ASCII bytes
``gc1.<key_id>.<payload>``. Nothing in the payload is parsed before the signature verifies.

Replay: a token is bearer-style but bound to its scope and a short expiry; a token of a released
instance is revoked. Mutating calls can also carry a per-request nonce and request time, checked
by :class:`ReplayCache` (bounded memory; see its docstring and docs/security.md).
"""

from __future__ import annotations

import binascii
import collections
import heapq
import json
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from gigacluster.security import InvalidArgument, PermissionDenied, Unauthenticated
from gigacluster.security.devices import MAX_DEVICE_ID, DeviceSet, b64url_decode, b64url_encode

TOKEN_PREFIX = "gc1"
#: gRPC's default limit on all request metadata is 8 KiB; a token must leave room for the rest.
MAX_TOKEN_CHARS = 7168
#: Default and hard upper bound of a token's lifetime: short-lived, so revocation lists stay short.
DEFAULT_TTL_S = 300.0
MAX_TTL_S = 3600.0

#: Actions the services check. Others of the same shape are accepted, so new services need no
#: change here, but these are the names the chip and fabric services use.
ACTION_MEMORY_READ = "memory.read"
ACTION_MEMORY_WRITE = "memory.write"
ACTION_COMPUTE_RUN = "compute.run"
ACTION_FABRIC_SEND = "fabric.send"
ACTION_TELEMETRY_READ = "telemetry.read"
TENANT_ACTIONS = frozenset(
    {ACTION_MEMORY_READ, ACTION_MEMORY_WRITE, ACTION_COMPUTE_RUN, ACTION_FABRIC_SEND, ACTION_TELEMETRY_READ}
)

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
_ACTION_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*$")
_KEY_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
_NONCE_RE = re.compile(r"^[A-Za-z0-9_-]{16,64}$")


def check_name(field_name: str, value: object) -> str:
    """``value`` if it is a resource name (lower-case letters, digits, ``._-``, 1-63 chars)."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise InvalidArgument(
            field_name, f"must be 1-63 characters of a-z, 0-9, '.', '_', '-' starting alphanumeric, got {value!r}"
        )
    return value


def _as_device_set(devices: DeviceSet | np.ndarray | Iterable[int]) -> DeviceSet:
    return devices if isinstance(devices, DeviceSet) else DeviceSet.from_ids(devices)


@dataclass(frozen=True)
class Capability:
    """A verified token's scope: who may do what on which devices, until when."""

    tenant: str
    instance: str
    devices: DeviceSet
    actions: frozenset[str]
    issued_s: float
    expires_s: float
    cluster: str
    token_id: str
    key_id: str

    def __post_init__(self) -> None:
        if not self.expires_s > self.issued_s:
            raise InvalidArgument("expires_s", "must be after issued_s")

    def require(
        self,
        action: str,
        devices: DeviceSet | np.ndarray | Iterable[int] | None = None,
        *,
        tenant: str | None = None,
        instance: str | None = None,
    ) -> None:
        """Raise PermissionDenied unless ``action`` on ``devices`` (and tenant/instance if given) is in scope."""
        if tenant is not None and tenant != self.tenant:
            raise PermissionDenied(f"token is for tenant {self.tenant!r}, not {tenant!r}", reason="WRONG_TENANT")
        if instance is not None and instance != self.instance:
            raise PermissionDenied(
                f"token is for instance {self.instance!r}, not {instance!r}", reason="WRONG_INSTANCE"
            )
        if action not in self.actions:
            raise PermissionDenied(
                f"action {action!r} not granted; token allows {', '.join(sorted(self.actions))}",
                reason="ACTION_NOT_GRANTED",
            )
        if devices is not None:
            ok = (
                devices.issubset(self.devices)
                if isinstance(devices, DeviceSet)
                else self.devices.contains_all(np.asarray(devices, dtype=np.int64))
            )
            if not ok:
                raise PermissionDenied(
                    f"devices outside instance {self.instance!r} (token covers {self.devices})",
                    reason="DEVICE_OUT_OF_SCOPE",
                )


class CapabilityIssuer:
    """Signs capability tokens for one cluster with one Ed25519 key (held only by the broker)."""

    def __init__(
        self, private_key: Ed25519PrivateKey, *, cluster: str, key_id: str, max_ttl_s: float = MAX_TTL_S
    ) -> None:
        check_name("cluster", cluster)
        if not _KEY_ID_RE.match(key_id):
            raise InvalidArgument("key_id", "must be 1-32 characters of A-Z, a-z, 0-9, '_', '-'")
        if not 0 < max_ttl_s <= MAX_TTL_S:
            raise InvalidArgument("max_ttl_s", f"must be in (0, {MAX_TTL_S}]")
        self._key = private_key
        self.cluster = cluster
        self.key_id = key_id
        self.max_ttl_s = max_ttl_s

    @classmethod
    def generate(cls, *, cluster: str, key_id: str) -> CapabilityIssuer:
        """An issuer with a fresh random key (the broker keeps it in memory only)."""
        return cls(Ed25519PrivateKey.generate(), cluster=cluster, key_id=key_id)

    def public_key_pem(self) -> bytes:
        """The verification key, to hand to chip and fabric services."""
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def issue(
        self,
        tenant: str,
        instance: str,
        devices: DeviceSet | np.ndarray | Iterable[int],
        actions: Iterable[str],
        ttl_s: float,
        now_s: float,
    ) -> str:
        """A signed token granting ``actions`` on ``devices`` of ``instance`` until ``now_s + ttl_s``."""
        check_name("tenant", tenant)
        check_name("instance", instance)
        acts = sorted(set(actions))
        if not acts:
            raise InvalidArgument("actions", "must name at least one action")
        for a in acts:
            if not isinstance(a, str) or not _ACTION_RE.match(a) or len(a) > 64:
                raise InvalidArgument("actions", f"{a!r} is not an action name like 'memory.read'")
        if not 0 < ttl_s <= self.max_ttl_s:
            raise InvalidArgument("ttl_s", f"must be in (0, {self.max_ttl_s}] seconds, got {ttl_s}")
        dev = _as_device_set(devices)
        if len(dev) == 0:
            raise InvalidArgument("devices", "must name at least one device")
        payload = {
            "aud": self.cluster,
            "sub": tenant,
            "ins": instance,
            "dev": dev.to_wire(),
            "act": acts,
            "iat": float(now_s),
            "exp": float(now_s) + float(ttl_s),
            "jti": b64url_encode(secrets.token_bytes(12)),
        }
        body = b64url_encode(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode())
        signed = f"{TOKEN_PREFIX}.{self.key_id}.{body}"
        token = f"{signed}.{b64url_encode(self._key.sign(signed.encode('ascii')))}"
        if len(token) > MAX_TOKEN_CHARS:
            raise InvalidArgument(
                "devices",
                f"device set has {dev.n_ranges} ranges, token would be {len(token)} > {MAX_TOKEN_CHARS}"
                " characters; allocate with topology 'contiguous' or 'same_domain'",
            )
        return token


class CapabilityVerifier:
    """Checks tokens against the broker's public keys, the cluster name, expiry and revocations.

    Keeps a bounded cache of tokens whose signature already verified (signature checks cost tens
    of microseconds; expiry and revocation are still checked on every call).
    """

    def __init__(
        self,
        public_keys: Mapping[str, bytes],
        *,
        cluster: str,
        leeway_s: float = 1.0,
        max_ttl_s: float = MAX_TTL_S,
        cache_size: int = 4096,
    ) -> None:
        check_name("cluster", cluster)
        if leeway_s < 0:
            raise InvalidArgument("leeway_s", "must be >= 0")
        if cache_size < 0:
            raise InvalidArgument("cache_size", "must be >= 0")
        self.cluster = cluster
        self.leeway_s = leeway_s
        self.max_ttl_s = max_ttl_s
        self._keys: dict[str, Ed25519PublicKey] = {}
        for kid, pem in public_keys.items():
            self.add_key(kid, pem)
        self._revoked: dict[str, float] = {}
        self._cache: collections.OrderedDict[str, Capability] = collections.OrderedDict()
        self._cache_size = cache_size

    def add_key(self, key_id: str, pem: bytes) -> None:
        """Trust another issuer key (key rotation: old and new verify side by side)."""
        if not _KEY_ID_RE.match(key_id):
            raise InvalidArgument("key_id", "must be 1-32 characters of A-Z, a-z, 0-9, '_', '-'")
        key = serialization.load_pem_public_key(pem)
        if not isinstance(key, Ed25519PublicKey):
            raise InvalidArgument("public_keys", f"key {key_id!r} is not an Ed25519 public key")
        self._keys[key_id] = key

    def remove_key(self, key_id: str) -> None:
        """Stop trusting a key; tokens it signed fail from now on."""
        self._keys.pop(key_id, None)
        self._cache.clear()

    def revoke(self, instance: str, at_s: float) -> None:
        """Reject every token of ``instance`` issued at or before ``at_s`` (called on release)."""
        self._revoked[instance] = max(at_s, self._revoked.get(instance, float("-inf")))

    def is_revoked(self, instance: str) -> bool:
        """Whether any token of ``instance`` has been revoked (instances are released once; ids never repeat)."""
        return instance in self._revoked

    def revocations(self) -> list[tuple[str, float]]:
        """The revocation list as plain data, to ship to other processes."""
        return sorted(self._revoked.items())

    def load_revocations(self, items: Iterable[tuple[str, float]]) -> None:
        """Merge a revocation list produced by :meth:`revocations` (possibly of another process)."""
        for instance, at_s in items:
            self.revoke(str(instance), float(at_s))

    def prune(self, now_s: float) -> int:
        """Forget revocations older than the longest token lifetime; returns how many were dropped."""
        horizon = now_s - self.max_ttl_s - self.leeway_s
        old = [i for i, t in self._revoked.items() if t < horizon]
        for i in old:
            del self._revoked[i]
        return len(old)

    def verify(self, token: str | None, now_s: float) -> Capability:
        """The token's Capability, or Unauthenticated with a reason saying why it is not valid."""
        cap = self._cache.get(token) if isinstance(token, str) else None
        if cap is None:
            cap = self._verify_signature(token)
            if self._cache_size:
                self._cache[token] = cap  # type: ignore[index]
                if len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        if cap.cluster != self.cluster:
            raise Unauthenticated(f"token is for cluster {cap.cluster!r}", reason="WRONG_CLUSTER")
        if now_s + self.leeway_s < cap.issued_s:
            raise Unauthenticated("token is not valid yet", reason="TOKEN_NOT_YET_VALID")
        if now_s >= cap.expires_s:
            raise Unauthenticated(f"token expired at {cap.expires_s:.3f} s", reason="TOKEN_EXPIRED")
        revoked_at = self._revoked.get(cap.instance)
        if revoked_at is not None and cap.issued_s <= revoked_at:
            raise Unauthenticated(f"instance {cap.instance!r} was released", reason="TOKEN_REVOKED")
        return cap

    def _verify_signature(self, token: str | None) -> Capability:
        if not token:
            raise Unauthenticated("no capability token", reason="TOKEN_MISSING")
        if not isinstance(token, str) or len(token) > MAX_TOKEN_CHARS:
            raise Unauthenticated("malformed capability token", reason="TOKEN_MALFORMED")
        parts = token.split(".")
        if len(parts) != 4 or parts[0] != TOKEN_PREFIX:
            raise Unauthenticated("malformed capability token", reason="TOKEN_MALFORMED")
        _, kid, body, sig_b64 = parts
        key = self._keys.get(kid)
        if key is None:
            raise Unauthenticated(f"token signed by unknown key {kid[:32]!r}", reason="TOKEN_UNKNOWN_KEY")
        try:
            sig = b64url_decode(sig_b64)
        except (ValueError, binascii.Error) as exc:
            raise Unauthenticated("malformed token signature", reason="TOKEN_MALFORMED") from exc
        try:
            key.verify(sig, f"{TOKEN_PREFIX}.{kid}.{body}".encode("ascii"))
        except (InvalidSignature, UnicodeEncodeError) as exc:
            raise Unauthenticated("token signature does not verify", reason="TOKEN_BAD_SIGNATURE") from exc
        # Signed by a trusted key from here on; a malformed payload means a broken issuer.
        try:
            p = json.loads(b64url_decode(body))
            return Capability(
                tenant=check_name("tenant", p["sub"]),
                instance=check_name("instance", p["ins"]),
                devices=DeviceSet.from_wire(p["dev"]),
                actions=frozenset(str(a) for a in p["act"]),
                issued_s=float(p["iat"]),
                expires_s=float(p["exp"]),
                cluster=str(p["aud"]),
                token_id=str(p["jti"]),
                key_id=kid,
            )
        except (ValueError, KeyError, TypeError, binascii.Error) as exc:
            raise Unauthenticated("malformed token payload", reason="TOKEN_MALFORMED") from exc


class ReplayCache:
    """Bounded per-request nonce check for mutating calls.

    A mutating request carries ``nonce`` (16-64 base64url characters, fresh random per request)
    and ``request_time_s`` (the client's clock). It is accepted once: the cache remembers
    ``(token_id, nonce)`` until ``request_time_s + window_s``; a request whose time is further than
    ``window_s`` from the server's clock is refused as stale, so a nonce never needs to be kept
    longer than the window. Memory is bounded by ``capacity``: when full, the oldest entry is
    evicted and its request time becomes a floor below which every request is refused, so
    eviction can never re-open a replay (it can only make the window shorter under flood).
    """

    def __init__(self, *, capacity: int = 100_000, window_s: float = 30.0) -> None:
        if capacity < 1:
            raise InvalidArgument("capacity", "must be >= 1")
        if window_s <= 0:
            raise InvalidArgument("window_s", "must be > 0")
        self.capacity = capacity
        self.window_s = window_s
        self._seen: set[tuple[str, str]] = set()
        self._heap: list[tuple[float, tuple[str, str]]] = []
        self._floor_s = float("-inf")

    def __len__(self) -> int:
        return len(self._seen)

    def check(self, token_id: str, nonce: str | None, request_time_s: float, now_s: float) -> None:
        """Accept this (token, nonce) once, or raise Unauthenticated (missing, stale, replayed)."""
        if not nonce:
            raise Unauthenticated("mutating call without a nonce", reason="NONCE_MISSING")
        if not isinstance(nonce, str) or not _NONCE_RE.match(nonce):
            raise Unauthenticated("nonce must be 16-64 base64url characters", reason="NONCE_MALFORMED")
        if abs(now_s - request_time_s) > self.window_s or request_time_s <= self._floor_s:
            raise Unauthenticated("request time outside the replay window", reason="REQUEST_STALE")
        while self._heap and self._heap[0][0] + self.window_s < now_s:
            _, old = heapq.heappop(self._heap)
            self._seen.discard(old)
        key = (token_id, nonce)
        if key in self._seen:
            raise Unauthenticated("nonce already used", reason="NONCE_REPLAYED")
        self._seen.add(key)
        heapq.heappush(self._heap, (request_time_s, key))
        while len(self._seen) > self.capacity:
            t, old = heapq.heappop(self._heap)
            self._seen.discard(old)
            self._floor_s = max(self._floor_s, t)


def new_nonce() -> str:
    """A fresh random request nonce (22 base64url characters, 128 bits)."""
    return b64url_encode(secrets.token_bytes(16))


__all__ = [
    "ACTION_COMPUTE_RUN",
    "ACTION_FABRIC_SEND",
    "ACTION_MEMORY_READ",
    "ACTION_MEMORY_WRITE",
    "ACTION_TELEMETRY_READ",
    "MAX_DEVICE_ID",
    "TENANT_ACTIONS",
    "Capability",
    "CapabilityIssuer",
    "CapabilityVerifier",
    "DeviceSet",  # re-exported: defined in security.devices
    "ReplayCache",
    "new_nonce",
]
