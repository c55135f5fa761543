"""The broker's domain state: tenants and their key hashes, instances and their capabilities.

Pure (no gRPC): the service layer authenticates the caller into a :class:`Principal` and calls
these methods, which decide what the principal may do. API keys are kept only as argon2 hashes;
a verified key is remembered by its SHA-256 for the process lifetime so argon2 (slow by design)
runs once per key, not once per call.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import os
import pathlib
import re
import time
from collections.abc import Iterable

from gigacluster.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied, Unauthenticated
from gigacluster.runtime.auth import Principal
from gigacluster.security import apikeys
from gigacluster.security.allocator import DeviceAllocator, InstanceAllocation, Shard, Topology
from gigacluster.security.audit import AuditLog
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
        raise InvalidArgument(field, f"must look like 'tenants/<id>' (a-z, 0-9, '-', 1-40 chars), got {name!r}")
    return tid


def instance_id_of(name: str, field: str = "name") -> str:
    iid = name.removeprefix("instances/")
    if not name.startswith("instances/") or not iid:
        raise InvalidArgument(field, f"must look like 'instances/<id>', got {name!r}")
    return iid


class BrokerCore:
    """Tenants, keys, instances and capabilities of one cluster."""

    def __init__(self, *, cluster: str, shards: Iterable[ShardInfo], admin_key: str, service_key: str,
                 capability_ttl_s: float, audit: AuditLog | None = None, mqtt_dir: pathlib.Path | None = None,
                 mqtt_service_password: str = "", mqtt_admin_password: str = "") -> None:
        shards = sorted(shards, key=lambda s: s.start)
        expect = 0
        for s in shards:
            if s.start != expect:
                raise ValueError(f"chip shards must cover device ids 0.. without gaps: shard {s.endpoint} "
                                 f"starts at {s.start}, expected {expect}")
            expect = s.end
        self.cluster = cluster
        self.shards = shards
        self.allocator = DeviceAllocator(
            [Shard(s.chip_type, s.end - s.start, s.chips_per_domain) for s in shards]
        ) if shards else None
        self.issuer = CapabilityIssuer.generate(cluster=cluster, key_id="k1")
        self.verifier = CapabilityVerifier({"k1": self.issuer.public_key_pem()}, cluster=cluster)
        self.capability_ttl_s = capability_ttl_s
        self.audit = audit
        self.tenants: dict[str, TenantRecord] = {}
        self.instances: dict[str, InstanceRecord] = {}
        # key id (the public part of a key) -> (principal, argon2 hash): one hash check per new key.
        self._keys: dict[str, tuple[Principal, str]] = {}
        for key, principal in ((admin_key, Principal("admin")), (service_key, Principal("service"))):
            if key:
                self._keys[apikeys.api_key_id(key)] = (principal, apikeys.hash_api_key(key))
        self._verified: dict[str, Principal] = {}
        self._ids = itertools.count(1)
        # Telemetry (MQTT) users: hashes only, written as Mosquitto passwd + acl files.
        self.mqtt_dir = mqtt_dir
        self.mqtt_hashes: dict[str, str] = {}
        if mqtt_service_password:
            self.mqtt_hashes[SERVICE_USER] = mosquitto_hash(mqtt_service_password)
        if mqtt_admin_password:
            self.mqtt_hashes[ADMIN_USER] = mosquitto_hash(mqtt_admin_password)
        self.write_mqtt_files()

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

    def _log(self, actor: Principal, action: str, resource: str, outcome: str) -> None:
        if self.audit is not None:
            who = {"admin": "admin:root", "service": "service:mesh"}.get(
                actor.kind, f"tenant:{actor.tenant.removeprefix('tenants/')}")
            self.audit.append(actor=who, action=action, resource=resource, outcome=outcome, time_s=time.time())

    def create_tenant(self, actor: Principal, tenant_id: str, display_name: str,
                      weight: float) -> tuple[TenantRecord, str, str]:
        """A new tenant, its API key and its MQTT password (both shown once, stored as hashes)."""
        if actor.kind != "admin":
            self._log(actor, "tenant.create", f"tenants/{tenant_id}", "denied")
            raise PermissionDenied("only the admin creates tenants", reason="ADMIN_ONLY")
        if not TENANT_ID_RE.match(tenant_id or ""):
            raise InvalidArgument("tenant_id", f"must be 1-40 characters of a-z, 0-9, '-', got {tenant_id!r}")
        if weight < 0 or weight > 1e6:
            raise InvalidArgument("weight", f"must be in [0, 1e6] (0 = default 1), got {weight}")
        if tenant_id in self.tenants:
            raise AlreadyExists(f"tenant tenants/{tenant_id} already exists")
        key = apikeys.new_api_key()
        key_hash = apikeys.hash_api_key(key)
        rec = TenantRecord(tenant_id, display_name or tenant_id, weight or 1.0, time.time(), [key_hash])
        self.tenants[tenant_id] = rec
        self._keys[apikeys.api_key_id(key)] = (Principal("tenant", rec.name), key_hash)
        mqtt_password = new_password()
        self.mqtt_hashes[tenant_user(tenant_id)] = mosquitto_hash(mqtt_password)
        self.write_mqtt_files()
        self._log(actor, "tenant.create", rec.name, "ok")
        return rec, key, mqtt_password

    def get_tenant(self, actor: Principal, name: str) -> TenantRecord:
        tid = tenant_id_of(name)
        if not actor.privileged and actor.tenant != f"tenants/{tid}":
            raise PermissionDenied(f"{actor.tenant} cannot read {name}", reason="OTHER_TENANT")
        if tid not in self.tenants:
            raise NotFound(name)
        return self.tenants[tid]

    def devices_held(self, tenant_name: str) -> int:
        return sum(len(r.alloc.devices) for r in self.instances.values() if f"tenants/{r.alloc.tenant}" == tenant_name)

    # -- instances --------------------------------------------------------------------------------
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
        if tid not in self.tenants:
            raise NotFound(f"tenants/{tid}")
        if not chip_type:
            raise InvalidArgument("chip_type", "required")
        if count <= 0:
            raise InvalidArgument("count", f"must be > 0, got {count}")
        if len(purpose) > 200:
            raise InvalidArgument("purpose", "at most 200 characters")
        if self.allocator is None:
            raise NotFound("shards", "this broker has no chip shards")
        topo = {0: Topology.NONE, 1: Topology.NONE, 2: Topology.SAME_DOMAIN, 3: Topology.CONTIGUOUS}.get(topology)
        if topo is None:
            raise InvalidArgument("topology", "allowed: TOPOLOGY_CONSTRAINT_NONE, _SAME_DOMAIN, _CONTIGUOUS")
        if devices is not None and not actor.privileged:
            raise PermissionDenied("only the admin or a service names exact devices", reason="ADMIN_ONLY")
        if devices is not None and len(devices) != count:
            raise InvalidArgument("devices", f"names {len(devices)} devices but count is {count}")
        iid = f"i-{next(self._ids)}"
        try:
            alloc = (self.allocator.allocate_exact(tid, iid, chip_type, devices) if devices is not None
                     else self.allocator.allocate(tid, iid, chip_type, int(count), topo))
        except Exception:
            self._log(actor, "instance.allocate", f"instances/{iid}", "failed")
            raise
        rec = InstanceRecord(alloc, time.time(), purpose, 1.0)
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
            raise NotFound(name)
        return rec

    def list_instances(self, actor: Principal) -> list[InstanceRecord]:
        return [r for r in self.instances.values()
                if actor.privileged or actor.tenant == f"tenants/{r.alloc.tenant}"]

    def release(self, actor: Principal, name: str) -> InstanceRecord:
        rec = self.get_instance(actor, name)
        assert self.allocator is not None
        self.allocator.release(rec.alloc.instance)
        self.verifier.revoke(rec.alloc.instance, time.time())
        del self.instances[rec.alloc.instance]
        self._log(actor, "instance.release", rec.name, "ok")
        return rec

    def shards_of(self, rec: InstanceRecord) -> list[ShardInfo]:
        """The shards holding any of the instance's devices (compared range by range, no id arrays)."""
        d = rec.alloc.devices
        return [s for s in self.shards
                if ((d.starts < s.end) & (d.stops > s.start)).any()]
