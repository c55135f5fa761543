"""The broker's domain state: tenants and their key hashes, instances and their capabilities.

Pure (no gRPC): the service layer authenticates the caller into a :class:`Principal` and calls
these methods, which decide what the principal may do. API keys are kept only as argon2 hashes;
a verified key is remembered by its SHA-256 for the process lifetime so argon2 (slow by design)
runs once per key, not once per call.

Everything a client is told about is in a :class:`~gigacluster.broker.store.BrokerStore` before
the method returns (tenants, key hashes, instances and their devices, MQTT user hashes,
revocations, the instance counter and the capability signing key), and a new core loads it back:
the database is the source of truth for allocations, so a restarted broker never reports an
allocated device free and never hands it out twice. A released instance keeps its devices until
the chips have scrubbed them (:meth:`BrokerCore.finish_release`), even across a restart.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import math
import os
import pathlib
import re
import time
from collections.abc import Iterable, Sequence

import numpy as np
import structlog
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gigacluster.broker.store import BrokerStore, InstanceRow, KeyRow, TenantRow
from gigacluster.errors import (
    AlreadyExists,
    DomainError,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
)
from gigacluster.security import SecurityError, apikeys
from gigacluster.security.allocator import DeviceAllocator, InstanceAllocation, PlacementConstraint, Shard
from gigacluster.security.apikeys import Principal
from gigacluster.security.audit import Anchor, AuditLog
from gigacluster.security.capability import (
    ACTION_COMPUTE_RUN,
    ACTION_FABRIC_SEND,
    ACTION_MEMORY_READ,
    ACTION_MEMORY_WRITE,
    ACTION_TELEMETRY_READ,
    CapabilityIssuer,
    CapabilityVerifier,
    DeviceSet,
)
from gigacluster.security.mqtt_auth import (
    ADMIN_USER,
    SERVICE_USER,
    TelemetryAcl,
    mosquitto_hash,
    new_password,
    render_hashed_password_file,
    tenant_user,
)

TENANT_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
INSTANCE_ID_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")
SIGNING_KEY = "capability_signing_key"
AUDIT_HEAD = "audit_head"
KEY_ID = "k1"
log = structlog.get_logger()


def quote(value: object, n: int = 40) -> str:
    """A short, printable prefix of hostile input for an error message."""
    s = str(value)
    return repr(s[:n]) + ("..." if len(s) > n else "")


@dataclasses.dataclass(frozen=True)
class BrokerLimits:
    """Bounds on what one request may ask of the broker (runtime/config.py BrokerConfig sets them)."""

    max_instance_devices: int = 1 << 20
    max_device_ranges: int = 4096
    max_text_chars: int = 200
    audit_denied_per_s: float = 50.0

    def __post_init__(self) -> None:
        if self.max_instance_devices < 1 or self.max_device_ranges < 1 or self.max_text_chars < 1:
            raise ValueError("broker limits must be >= 1")
        if not (math.isfinite(self.audit_denied_per_s) and self.audit_denied_per_s >= 0):
            raise ValueError("audit_denied_per_s must be a finite number >= 0")
INSTANCE_ACTIONS = frozenset(
    {ACTION_COMPUTE_RUN, ACTION_FABRIC_SEND, ACTION_MEMORY_READ, ACTION_MEMORY_WRITE, ACTION_TELEMETRY_READ}
)


@dataclasses.dataclass
class TenantRecord:
    tenant_id: str
    display_name: str
    weight: float
    created_s: float
    key_hashes: list[str]

    @property
    def name(self) -> str:
        return f"tenants/{self.tenant_id}"


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    endpoint: str
    chip_type: str
    start: int
    end: int
    system: str
    chips_per_domain: int


@dataclasses.dataclass(frozen=True)
class InstanceRecord:
    alloc: InstanceAllocation
    created_s: float
    purpose: str
    nic_share: float

    @property
    def name(self) -> str:
        return f"instances/{self.alloc.instance}"


def tenant_id_of(name: str, field: str = "name") -> str:
    tid = name.removeprefix("tenants/")
    if not name.startswith("tenants/") or not TENANT_ID_RE.match(tid):
        raise InvalidArgument(field, f"must look like 'tenants/<id>' (a-z, 0-9, '-', 1-40 chars), got {quote(name)}")
    return tid


def instance_id_of(name: str, field: str = "name") -> str:
    iid = name.removeprefix("instances/")
    if not name.startswith("instances/") or not INSTANCE_ID_RE.match(iid):
        raise InvalidArgument(field, f"must look like 'instances/<id>' (id: 1-63 of a-z, 0-9, '.', '_', '-'), "
                                     f"got {quote(name)}")
    return iid




def _load_signing_key(store: BrokerStore) -> Ed25519PrivateKey:
    """The capability signing key from the store, generated and stored on first start, so tokens
    issued before a restart still verify (chips and fabric keep trusting key ``k1``)."""
    raw = store.get_meta(SIGNING_KEY)
    if raw:
        return Ed25519PrivateKey.from_private_bytes(base64.b64decode(raw))
    key = Ed25519PrivateKey.generate()
    store.set_meta(SIGNING_KEY, base64.b64encode(key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption())).decode())
    return key


class BrokerCore:
    """Tenants, keys, instances and capabilities of one cluster, durable in ``store``."""

    def __init__(self, *, cluster: str, shards: Iterable[ShardInfo], admin_key: str, service_key: str,
                 capability_ttl_s: float, store: BrokerStore | None = None,
                 audit_path: pathlib.Path | None = None, mqtt_dir: pathlib.Path | None = None,
                 mqtt_service_password: str = "", mqtt_admin_password: str = "",
                 limits: BrokerLimits | None = None) -> None:
        shards = sorted(shards, key=lambda s: s.start)
        expect = 0
        for s in shards:
            if s.start != expect:
                raise ValueError(f"chip shards must cover device ids 0.. without gaps: shard {s.endpoint} "
                                 f"starts at {s.start}, expected {expect}")
            expect = s.end
        self.cluster = cluster
        self.shards = shards
        self.limits = limits or BrokerLimits()
        self.store = store or BrokerStore(None)
        self.allocator = DeviceAllocator(
            [Shard(s.chip_type, s.end - s.start, s.chips_per_domain) for s in shards]
        ) if shards else None
        self.n_devices = expect
        signing_key = _load_signing_key(self.store)
        self.issuer = CapabilityIssuer(signing_key, cluster=cluster, key_id=KEY_ID)
        self.verifier = CapabilityVerifier({KEY_ID: self.issuer.public_key_pem()}, cluster=cluster)
        self.verifier.load_revocations(self.store.revocations())
        self.capability_ttl_s = capability_ttl_s
        self.tenants: dict[str, TenantRecord] = {}
        self.instances: dict[str, InstanceRecord] = {}
        #: Released instances whose devices still await a scrub: held, invisible to their tenant.
        self.releasing: dict[str, InstanceRecord] = {}
        # key id (the public part of a key) -> (principal, argon2 hash): one hash check per new key.
        self._keys: dict[str, tuple[Principal, str]] = {}
        self._verified: dict[str, Principal] = {}
        self._denied_window = (0, 0, 0)  # (second, logged, suppressed)
        self._load()
        for key, principal in ((admin_key, Principal("admin")), (service_key, Principal("service"))):
            if key:
                self._keys[apikeys.api_key_id(key)] = (principal, apikeys.hash_api_key(key))
        # Telemetry (MQTT) users: hashes only, written as Mosquitto passwd + acl files.
        self.mqtt_dir = mqtt_dir
        self.mqtt_hashes: dict[str, str] = self.store.mqtt_users()
        if mqtt_service_password:
            self.mqtt_hashes[SERVICE_USER] = mosquitto_hash(mqtt_service_password)
        if mqtt_admin_password:
            self.mqtt_hashes[ADMIN_USER] = mosquitto_hash(mqtt_admin_password)
        self.write_mqtt_files()
        self.audit: AuditLog | None = None
        self._anchored: tuple[int, str] | None = None
        if audit_path is not None:
            head = self.store.get_meta(AUDIT_HEAD)
            expected = None
            if head:
                seq, _, digest = head.partition(":")
                expected = (int(seq), digest)
            self.audit = AuditLog(audit_path, signer=signing_key, key_id=KEY_ID, expected_head=expected)
            if self.audit.tamper:
                log.error("audit log does not match the head stored in the broker database", problem=self.audit.tamper)
                self.audit.append("service:broker", "audit.verify", "audit", "failed", time.time(),
                                  reason=self.audit.tamper.partition(":")[0])

    def _load(self) -> None:
        """Tenants, keys and instances from the store; allocations are re-applied to the allocator."""
        for t in self.store.tenants():
            self.tenants[t.tenant_id] = TenantRecord(t.tenant_id, t.display_name, t.weight, t.created_s, [])
        for k in self.store.api_keys():
            if k.kind == "tenant" and k.tenant in self.tenants:
                self._keys[k.key_id] = (Principal("tenant", f"tenants/{k.tenant}"), k.key_hash)
                self.tenants[k.tenant].key_hashes.append(k.key_hash)
        for r in self.store.instances():
            if self.allocator is None:
                log.error("instance in the database but no chip shards", instance=r.instance_id)
                continue
            devices = DeviceSet(np.asarray(r.starts, np.int64), np.asarray(r.stops, np.int64))
            try:
                alloc = self.allocator.allocate_exact(r.tenant, r.instance_id, r.chip_type, devices)
            except DomainError as exc:  # the shards changed under the database: keep the row
                log.error("stored instance does not fit the chip shards; not loaded", instance=r.instance_id,
                          error=str(exc))
                continue
            alloc = dataclasses.replace(alloc, topology=PlacementConstraint(r.topology))
            rec = InstanceRecord(alloc, r.created_s, r.purpose, r.nic_share)
            (self.releasing if r.releasing else self.instances)[r.instance_id] = rec
        log.info("broker state loaded", tenants=len(self.tenants), instances=len(self.instances),
                 releasing=len(self.releasing))

    def write_mqtt_files(self) -> None:
        """Regenerate the Mosquitto password and ACL files from the tenants (atomic replace)."""
        if self.mqtt_dir is None:
            return
        self.mqtt_dir.mkdir(parents=True, exist_ok=True)
        acl = TelemetryAcl.of(self.cluster, self.tenants)
        for name, text in (("passwd", render_hashed_password_file(self.mqtt_hashes)),
                           ("acl", acl.render_acl_file())):
            tmp = self.mqtt_dir / f".{name}.tmp"
            tmp.write_text(text)
            tmp.chmod(0o644)
            os.replace(tmp, self.mqtt_dir / name)

    # -- identities -------------------------------------------------------------------------------
    def authenticate(self, key: str | None) -> Principal:
        if not key:
            raise Unauthenticated("missing credentials: send 'authorization: Bearer <api key>'", reason="NO_API_KEY")
        digest = hashlib.sha256(key.encode()).hexdigest()
        hit = self._verified.get(digest)
        if hit is not None:
            return hit
        try:
            entry = self._keys.get(apikeys.api_key_id(key))
        except Exception as exc:
            raise Unauthenticated("invalid API key (malformed)", reason="BAD_API_KEY") from exc
        if entry is None or not apikeys.verify_api_key(entry[1], key):
            raise Unauthenticated("invalid API key", reason="BAD_API_KEY")
        p = entry[0]
        self._verified[digest] = p
        return p

    # -- audit ------------------------------------------------------------------------------------
    @staticmethod
    def actor_of(p: Principal | None, key: str | None = None) -> str:
        """The audit actor of a principal, or of an unauthenticated caller by its key's public id."""
        if p is not None:
            return {"admin": "admin:root", "service": "service:mesh"}.get(
                p.kind, f"tenant:{p.tenant.removeprefix('tenants/')}")
        if not key:
            return "anonymous:none"
        try:
            return f"anonymous:key-{apikeys.api_key_id(key)}"
        except SecurityError:
            return "anonymous:malformed"

    def _log(self, actor: Principal, action: str, resource: str, outcome: str, reason: str = "") -> None:
        if self.audit is not None:
            self.audit.append(actor=self.actor_of(actor), action=action, resource=resource, outcome=outcome,
                              time_s=time.time(), reason=reason)

    def audit_denied(self, p: Principal | None, key: str | None, action: str, reason: str, now_s: float) -> None:
        """Log a refused call (bad credential, permission denied), at most ``audit_denied_per_s`` a
        second; the excess of a second is one record with its ``count``, so a flood cannot fill the disk."""
        if self.audit is None:
            return
        second, logged, suppressed = self._denied_window
        if int(now_s) != second:
            if suppressed:
                self.audit.append("service:broker", "audit.suppressed", "audit", "denied", now_s,
                                  reason="DENIED_RATE_LIMITED", count=suppressed)
            second, logged, suppressed = int(now_s), 0, 0
        if logged >= self.limits.audit_denied_per_s:
            self._denied_window = (second, logged, suppressed + 1)
            return
        self._denied_window = (second, logged + 1, suppressed)
        safe_reason = reason if re.match(r"^[A-Z][A-Z0-9_]{0,63}$", reason or "") else "DENIED"
        self.audit.append(self.actor_of(p, key), action, "broker", "denied", now_s, reason=safe_reason)

    def anchor_audit(self, now_s: float) -> Anchor | None:
        """A signed anchor of the audit head if it moved since the last one (head also stored in the db)."""
        if self.audit is None:
            return None
        head = self.audit.head
        if head == self._anchored:
            return None
        a = self.audit.anchor(now_s)
        self.store.set_meta(AUDIT_HEAD, f"{a.seq}:{a.head}")
        self._anchored = head
        return a

    # -- tenants ----------------------------------------------------------------------------------
    def create_tenant(self, actor: Principal, tenant_id: str, display_name: str,
                      weight: float) -> tuple[TenantRecord, str, str]:
        """A new tenant, its API key and its MQTT password (both shown once, stored as hashes)."""
        if actor.kind != "admin":
            raise PermissionDenied("only the admin creates tenants", reason="ADMIN_ONLY")
        if not TENANT_ID_RE.match(tenant_id or ""):
            raise InvalidArgument("tenant_id", f"must be 1-40 characters of a-z, 0-9, '-', got {quote(tenant_id)}")
        if len(display_name) > self.limits.max_text_chars:
            raise InvalidArgument("display_name", f"at most {self.limits.max_text_chars} characters, "
                                                  f"got {len(display_name)}")
        if not math.isfinite(weight) or weight < 0 or weight > 1e6:
            raise InvalidArgument("weight", f"must be a finite number in [0, 1e6] (0 = default 1), got {weight}")
        if tenant_id in self.tenants:
            raise AlreadyExists(f"tenant tenants/{tenant_id} already exists")
        key = apikeys.new_api_key()
        key_hash = apikeys.hash_api_key(key)
        rec = TenantRecord(tenant_id, display_name or tenant_id, weight or 1.0, time.time(), [key_hash])
        mqtt_password = new_password()
        mqtt_hash = mosquitto_hash(mqtt_password)
        self.store.add_tenant(TenantRow(rec.tenant_id, rec.display_name, rec.weight, rec.created_s),
                              KeyRow(apikeys.api_key_id(key), "tenant", tenant_id, key_hash),
                              tenant_user(tenant_id), mqtt_hash)
        self.tenants[tenant_id] = rec
        self._keys[apikeys.api_key_id(key)] = (Principal("tenant", rec.name), key_hash)
        self.mqtt_hashes[tenant_user(tenant_id)] = mqtt_hash
        self.write_mqtt_files()
        self._log(actor, "tenant.create", rec.name, "ok")
        return rec, key, mqtt_password

    def get_tenant(self, actor: Principal, name: str) -> TenantRecord:
        tid = tenant_id_of(name)
        if not actor.privileged and actor.tenant != f"tenants/{tid}":
            raise PermissionDenied(f"{actor.tenant} cannot read tenants/{tid}", reason="OTHER_TENANT")
        if tid not in self.tenants:
            raise NotFound(f"tenants/{tid}")
        return self.tenants[tid]

    def devices_held(self, tenant_name: str) -> int:
        return sum(len(r.alloc.devices) for r in self.instances.values() if f"tenants/{r.alloc.tenant}" == tenant_name)

    # -- instances --------------------------------------------------------------------------------
    def device_set(self, actor: Principal, ranges: Sequence[tuple[int, int]]) -> DeviceSet:
        """The exact devices a privileged caller names, checked against the bounds before any
        array is built (a range to 2^64-1 is INVALID_ARGUMENT, not an allocation of exabytes)."""
        if not actor.privileged:
            raise PermissionDenied("only the admin or a service names exact devices", reason="ADMIN_ONLY")
        lim = self.limits
        if len(ranges) > lim.max_device_ranges:
            raise InvalidArgument("devices", f"at most {lim.max_device_ranges} ranges, got {len(ranges)}")
        total = 0
        for i, (start, end) in enumerate(ranges):
            if end <= start:
                raise InvalidArgument(f"devices[{i}]", f"end ({end}) must be > start ({start})")
            if end > self.n_devices:
                raise NotFound(f"devices[{i}]", f"device {end - 1} does not exist (the cluster has {self.n_devices})")
            total += end - start
        self._check_instance_size(total)
        return DeviceSet.from_ids(np.concatenate([np.arange(a, b, dtype=np.int64) for a, b in ranges]))

    def _check_instance_size(self, count: int) -> None:
        """RESOURCE_EXHAUSTED (a quota) for an instance larger than ``max_instance_devices``."""
        limit = self.limits.max_instance_devices
        if count > limit:
            free = int(np.count_nonzero(self.allocator.owner < 0)) if self.allocator is not None else 0
            raise ResourceExhausted(f"need {count} devices; an instance holds at most {limit} "
                                    f"(max_instance_devices), {free} are free", reason="INSTANCE_DEVICE_LIMIT",
                                    requested=count, limit=limit)

    def allocate(self, actor: Principal, *, chip_type: str, count: int, topology: int, purpose: str,
                 on_behalf: str, devices: DeviceSet | None = None) -> tuple[InstanceRecord, str, float]:
        if on_behalf:
            if not actor.privileged:
                raise PermissionDenied("only the admin or a service allocates for another tenant",
                                       reason="ADMIN_ONLY")
            tid = tenant_id_of(on_behalf, "tenant")
        elif actor.kind == "tenant":
            tid = actor.tenant.removeprefix("tenants/")
        else:
            raise InvalidArgument("tenant", "the admin must name the tenant to allocate for")
        if devices is not None and not actor.privileged:
            raise PermissionDenied("only the admin or a service names exact devices", reason="ADMIN_ONLY")
        if tid not in self.tenants:
            raise NotFound(f"tenants/{tid}")
        if not chip_type:
            raise InvalidArgument("chip_type", "required")
        if len(chip_type) > 64:
            raise InvalidArgument("chip_type", f"unknown chip type {quote(chip_type)}")
        if count <= 0:
            raise InvalidArgument("count", f"must be > 0, got {count}")
        self._check_instance_size(count)
        if len(purpose) > self.limits.max_text_chars:
            raise InvalidArgument("purpose", f"at most {self.limits.max_text_chars} characters, got {len(purpose)}")
        if self.allocator is None:
            raise NotFound("shards", "this broker has no chip shards")
        pc = PlacementConstraint
        topo = {0: pc.NONE, 1: pc.NONE, 2: pc.SAME_DOMAIN, 3: pc.CONTIGUOUS}.get(topology)
        if topo is None:
            raise InvalidArgument("topology", "allowed: TOPOLOGY_CONSTRAINT_NONE, _SAME_DOMAIN, _CONTIGUOUS")
        if devices is not None and len(devices) != count:
            raise InvalidArgument("devices", f"names {len(devices)} devices but count is {count}")
        iid = ""
        try:
            # One transaction: the id is taken only if the allocation is committed with it.
            with self.store.tx():
                iid = f"i-{self.store.next_instance_number()}"
                alloc = (self.allocator.allocate_exact(tid, iid, chip_type, devices) if devices is not None
                         else self.allocator.allocate(tid, iid, chip_type, int(count), topo))
                rec = InstanceRecord(alloc, time.time(), purpose, 1.0)
                d = alloc.devices
                self.store.add_instance(InstanceRow(iid, tid, chip_type, alloc.topology.value, d.starts.tolist(),
                                                    d.stops.tolist(), rec.created_s, purpose, rec.nic_share))
        except Exception:
            if iid and self.allocator is not None:
                with contextlib.suppress(SecurityError):  # nothing was allocated under this id
                    self.allocator.release(iid)
            self._log(actor, "instance.allocate", f"tenants/{tid}", "failed")
            raise
        self.instances[iid] = rec
        token, exp = self.capability(rec)
        self._log(actor, "instance.allocate", rec.name, "ok")
        return rec, token, exp

    def capability(self, rec: InstanceRecord) -> tuple[str, float]:
        now = time.time()
        token = self.issuer.issue(rec.alloc.tenant, rec.alloc.instance, rec.alloc.devices, INSTANCE_ACTIONS,
                                  self.capability_ttl_s, now)
        return token, now + self.capability_ttl_s

    def get_instance(self, actor: Principal, name: str) -> InstanceRecord:
        iid = instance_id_of(name)
        rec = self.instances.get(iid)
        if rec is None or (not actor.privileged and actor.tenant != f"tenants/{rec.alloc.tenant}"):
            # Another tenant's instance is indistinguishable from a missing one.
            raise NotFound(f"instances/{iid}")
        return rec

    def list_instances(self, actor: Principal) -> list[InstanceRecord]:
        return [r for r in self.instances.values()
                if actor.privileged or actor.tenant == f"tenants/{r.alloc.tenant}"]

    def release(self, actor: Principal, name: str) -> InstanceRecord:
        """Revoke the instance for its tenant at once (durably); its devices stay held until
        :meth:`finish_release` says the chips scrubbed them."""
        rec = self.get_instance(actor, name)
        now = time.time()
        self.store.mark_releasing(rec.alloc.instance, now)
        self.verifier.revoke(rec.alloc.instance, now)
        del self.instances[rec.alloc.instance]
        self.releasing[rec.alloc.instance] = rec
        self._log(actor, "instance.release", rec.name, "ok")
        return rec

    def finish_release(self, instance_id: str) -> None:
        """The instance's devices are scrubbed: free them for the next tenant."""
        rec = self.releasing.pop(instance_id, None)
        if rec is None:
            return
        self.store.delete_instance(instance_id)
        assert self.allocator is not None
        self.allocator.release(instance_id)

    def prune_revocations(self, now_s: float) -> int:
        """Forget revocations every token of which has expired (memory and database)."""
        horizon = now_s - self.verifier.max_ttl_s - self.verifier.leeway_s
        self.verifier.prune(now_s)
        return self.store.prune_revocations(horizon)

    def shards_of(self, rec: InstanceRecord) -> list[ShardInfo]:
        """The shards holding any of the instance's devices (compared range by range, no id arrays)."""
        d = rec.alloc.devices
        return [s for s in self.shards
                if ((d.starts < s.end) & (d.stops > s.start)).any()]
