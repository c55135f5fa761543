"""Caller identity for every service except the broker (which owns identities).

Two credentials travel in call metadata:

- ``authorization: Bearer <api key>``: a tenant's, the admin's or the mesh's own service key.
  Checked by the broker's ``Authenticate`` RPC, cached for a short time (never per chip).
- ``x-gigacluster-capability: <token>``: a short-lived Ed25519-signed capability from the broker,
  scoped to tenant, instance, devices and actions; verified locally with the broker's public
  keys, with revocations pulled from the broker every ``refresh_s`` seconds.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections import OrderedDict
from typing import Any

import grpc
import structlog

from gigacluster.broker.v1 import broker_pb2, broker_pb2_grpc
from gigacluster.errors import PermissionDenied, Unauthenticated, Unavailable
from gigacluster.runtime import clock
from gigacluster.runtime.channels import open_channel
from gigacluster.security.apikeys import Principal  # the one Principal; services import it from here too
from gigacluster.security.capability import Capability, CapabilityVerifier, DeviceSet
from gigacluster.security.ratelimit import BucketSpec, RateLimitSpec, TenantRateLimiter

CAPABILITY_HEADER = "x-gigacluster-capability"
log = structlog.get_logger()


def rate_limiter(ops_per_s: float, burst: float = 0.0, bytes_per_s: float = 0.0) -> TenantRateLimiter | None:
    """Per-tenant token buckets as Firecracker defines them (size, one-time burst, refill time)."""
    if ops_per_s <= 0 and bytes_per_s <= 0:
        return None
    return TenantRateLimiter(RateLimitSpec(
        ops=BucketSpec(size=ops_per_s, one_time_burst=burst, refill_time_s=1.0) if ops_per_s > 0 else None,
        bandwidth=BucketSpec(size=bytes_per_s, refill_time_s=1.0) if bytes_per_s > 0 else None,
    ))


def metadata_value(context: grpc.aio.ServicerContext, key: str) -> str | None:
    for k, v in context.invocation_metadata() or ():
        if k == key:
            return v if isinstance(v, str) else v.decode()
    return None


def bearer_token(context: grpc.aio.ServicerContext) -> str | None:
    value = metadata_value(context, "authorization")
    if value and value.lower().startswith("bearer "):
        return value[7:].strip() or None
    return None


def call_metadata(*, api_key: str | None = None, capability: str | None = None) -> tuple[tuple[str, str], ...]:
    """Metadata for an outgoing call."""
    md: list[tuple[str, str]] = []
    if api_key:
        md.append(("authorization", f"Bearer {api_key}"))
    if capability:
        md.append((CAPABILITY_HEADER, capability))
    return tuple(md)


class BrokerAuth:
    """Authenticates callers against the broker, with bounded caches."""

    def __init__(self, broker_endpoint: str, *, cluster: str, service_key: str, cache_ttl_s: float = 10.0,
                 refresh_s: float = 1.0, limiter: TenantRateLimiter | None = None) -> None:
        self.endpoint = broker_endpoint
        self.cluster = cluster
        self.service_key = service_key
        self.cache_ttl_s = cache_ttl_s
        self.refresh_s = refresh_s
        self._channel: grpc.aio.Channel | None = None
        self._stub: broker_pb2_grpc.BrokerServiceStub | None = None
        self._keys_cache: OrderedDict[str, tuple[float, Principal]] = OrderedDict()
        self._verifier: CapabilityVerifier | None = None
        self._lock = asyncio.Lock()
        self._last_refresh = 0.0
        self.limiter = limiter

    @property
    def stub(self) -> broker_pb2_grpc.BrokerServiceStub:
        if self._stub is None:
            self._channel = open_channel(self.endpoint)
            self._stub = broker_pb2_grpc.BrokerServiceStub(self._channel)
        return self._stub

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = self._stub = None

    def _md(self) -> tuple[tuple[str, str], ...]:
        return call_metadata(api_key=self.service_key)

    async def principal(self, context: grpc.aio.ServicerContext) -> Principal:
        """The caller's principal from its API key; UNAUTHENTICATED without a valid one."""
        key = bearer_token(context)
        if not key:
            raise Unauthenticated("missing credentials: send 'authorization: Bearer <api key>'", reason="NO_API_KEY")
        if self.service_key and hmac.compare_digest(key, self.service_key):
            # The mesh's own key is known locally: no broker round trip (and no start-up deadlock
            # while the broker is still discovering the shards that ask it).
            return Principal("service")
        now = time.monotonic()
        hit = self._keys_cache.get(key)
        if hit and hit[0] > now:
            self.charge(hit[1])
            return hit[1]
        try:
            resp = await self.stub.Authenticate(broker_pb2.AuthenticateRequest(api_key=key), metadata=self._md(),
                                                timeout=15)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise Unauthenticated("invalid API key", reason="BAD_API_KEY") from err
            raise Unavailable(f"isolation broker unavailable ({err.code().name}); retry") from err
        if resp.admin:
            p = Principal("admin")
        elif resp.principal == "service":
            p = Principal("service")
        else:
            p = Principal("tenant", resp.principal)
        self._keys_cache[key] = (now + self.cache_ttl_s, p)
        if len(self._keys_cache) > 10_000:
            self._keys_cache.popitem(last=False)
        self.charge(p)
        return p

    def charge(self, p: Principal) -> None:
        """Take one call from a tenant's RPC bucket (RESOURCE_EXHAUSTED with retry-after when empty)."""
        if self.limiter is not None and p.kind == "tenant":
            self.limiter.check(p.tenant, time.monotonic(), ops=1.0)

    async def require_privileged(self, context: grpc.aio.ServicerContext) -> Principal:
        p = await self.principal(context)
        if not p.privileged:
            raise PermissionDenied("this call needs the admin key", reason="ADMIN_ONLY")
        return p

    async def refresh(self, *, force: bool = False) -> None:
        """Pull verification keys and revocations from the broker."""
        now = time.monotonic()
        if not force and now - self._last_refresh < self.refresh_s and self._verifier is not None:
            return
        async with self._lock:
            resp = await self.stub.GetVerificationKeys(broker_pb2.GetVerificationKeysRequest(), metadata=self._md(),
                                                       timeout=15)
            keys = {k: v.encode() for k, v in resp.public_keys.items()}
            if self._verifier is None:
                self._verifier = CapabilityVerifier(keys, cluster=self.cluster)
            else:
                for k, v in keys.items():
                    self._verifier.add_key(k, v)
            self._verifier.load_revocations((r.instance, r.revoked_s) for r in resp.revocations)
            self._last_refresh = now

    async def capability(self, context: grpc.aio.ServicerContext, action: str,
                         devices: DeviceSet | Any | None = None) -> Capability:
        """Verify the call's capability token and that it allows ``action`` on ``devices``."""
        token = metadata_value(context, CAPABILITY_HEADER)
        if not token:
            raise Unauthenticated(f"missing capability: send '{CAPABILITY_HEADER}' from the broker's AllocateInstance",
                                  reason="NO_CAPABILITY")
        for attempt in range(5):
            if self._verifier is not None:
                break
            # The pull is outside the event clock (runtime/clock_wire.py, UNCOUNTED) and this call waits on it, so
            # hold the mesh's time meanwhile: with the call open at both ends and this process idle the mesh
            # looked quiet, and time could jump past the step this call books (the first step of a shard's first job).
            with clock.busy():
                try:
                    await self.refresh(force=True)
                except grpc.aio.AioRpcError as err:
                    log.warning("cannot fetch verification keys", code=err.code().name, attempt=attempt)
                    if attempt == 4:
                        raise Unavailable("isolation broker unavailable to verify capabilities; retry") from err
                    await asyncio.sleep(0.2 * 2**attempt)
        assert self._verifier is not None
        cap = self._verifier.verify(token, time.time())
        cap.require(action, devices)
        self.charge(Principal("tenant", f"tenants/{cap.tenant}"))
        return cap

    def is_revoked(self, instance: str) -> bool:
        """Whether the broker has revoked ``instance`` (released it), as of the last pull."""
        return self._verifier is not None and self._verifier.is_revoked(instance)

    def revoke(self, instance: str) -> None:
        """Reject the instance's tokens from now on (before the next pull from the broker)."""
        if self._verifier is not None:
            self._verifier.revoke(instance, time.time())

    async def run_refresh(self) -> None:
        """Background loop keeping revocations fresh."""
        while True:
            try:
                await self.refresh(force=True)
            except grpc.aio.AioRpcError as err:
                log.debug("broker refresh failed", code=err.code().name)
            await asyncio.sleep(self.refresh_s)
