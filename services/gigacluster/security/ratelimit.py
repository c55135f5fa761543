"""Per-tenant token buckets on RPCs and fabric bandwidth, with Firecracker's parameters.

A bucket is defined exactly as Firecracker's ``TokenBucket`` (``src/rate_limiter``):

- ``size``: capacity in tokens; the bucket starts full and never refills above it;
- ``one_time_burst``: extra initial tokens on top of ``size`` that are spent first and never
  replenish;
- ``refill_time_s``: time to refill from empty to ``size``, so the rate is ``size / refill_time_s``.

A request larger than ``size`` is let through once (Firecracker's "over-consumption"): it empties
the bucket and blocks the bucket for ``(excess / size) * refill_time_s``. One deviation, on
purpose: a refused request leaves the one-time burst untouched (Firecracker spends the part of
the burst it had taken before failing).

Everything is driven by the caller's clock (``now_s``), so the model is pure and repeatable.
Each tenant has its own buckets, so one tenant draining its budget cannot delay another.

Refusing an over-limit call still costs the service CPU (a refused call costs about as much as
a served one on the emulator), so a tenant flooding at full speed would slow its neighbours even
while throttled. Two additions make the limit cheap to enforce:

- :meth:`TokenBucket.reserve` paces instead of refusing: a call that finds the bucket empty may
  borrow its token from the near future and is told how long to wait for it (up to ``max_wait_s``),
  so a closed-loop client is slowed to its rate with its calls parked, costing nothing;
- :meth:`TenantRateLimiter.tenant_of` maps a caller's credential (a digest of it, learned only
  after the credential was verified: :data:`CALLER_KEY` is set by the transport for each call) to
  its tenant, so the transport can pace or shed a known tenant before decoding or verifying.
"""

from __future__ import annotations

import contextvars
import enum
from collections import OrderedDict
from dataclasses import dataclass

from gigacluster.security import InvalidArgument, RateLimited

# Set by the transport for each call: a digest of the caller's credential (None when it sent none)
# and the limiter that already charged the call while pacing it (so ``check`` does not charge twice).
CALLER_KEY: contextvars.ContextVar[bytes | None] = contextvars.ContextVar("gigacluster_caller_key", default=None)
PREPAID: contextvars.ContextVar[object | None] = contextvars.ContextVar("gigacluster_prepaid", default=None)
MAX_LEARNED_CREDENTIALS = 65_536


@dataclass(frozen=True)
class BucketSpec:
    """Firecracker token-bucket parameters (``refill_time`` in seconds instead of milliseconds)."""

    size: float
    one_time_burst: float = 0.0
    refill_time_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.size > 0:
            raise InvalidArgument("size", f"must be > 0 tokens, got {self.size}")
        if self.one_time_burst < 0:
            raise InvalidArgument("one_time_burst", f"must be >= 0 tokens, got {self.one_time_burst}")
        if not self.refill_time_s > 0:
            raise InvalidArgument("refill_time_s", f"must be > 0 s, got {self.refill_time_s}")

    @property
    def rate_per_s(self) -> float:
        """Sustained refill rate in tokens per second."""
        return self.size / self.refill_time_s


class TokenBucket:
    """One Firecracker-style token bucket on an injected clock."""

    def __init__(self, size: float, one_time_burst: float = 0.0, refill_time_s: float = 1.0, *,
                 start_s: float = 0.0) -> None:
        self.spec = BucketSpec(size, one_time_burst, refill_time_s)
        self._budget = float(size)
        self._burst = float(one_time_burst)
        self._last_s = float(start_s)
        self._blocked_until_s = float("-inf")

    @classmethod
    def from_spec(cls, spec: BucketSpec, *, start_s: float = 0.0) -> TokenBucket:
        """A full bucket with ``spec``'s parameters."""
        return cls(spec.size, spec.one_time_burst, spec.refill_time_s, start_s=start_s)

    def _refill(self, now_s: float) -> None:
        if now_s > self._last_s:
            self._budget = min(self.spec.size, self._budget + (now_s - self._last_s) * self.spec.rate_per_s)
            self._last_s = now_s

    def available(self, now_s: float) -> float:
        """Tokens that could be consumed at ``now_s`` (budget plus remaining one-time burst)."""
        self._refill(now_s)
        if now_s < self._blocked_until_s:
            return 0.0
        return max(0.0, self._budget + self._burst)

    def consume(self, n: float, now_s: float) -> bool:
        """Take ``n`` tokens at ``now_s``; False (and nothing taken) if there are not enough."""
        if n < 0:
            raise InvalidArgument("n", f"must be >= 0 tokens, got {n}")
        self._refill(now_s)
        if now_s < self._blocked_until_s:
            return False
        if n <= self._burst:
            self._burst -= n
            return True
        rest = n - self._burst
        if rest <= self._budget:
            self._burst = 0.0
            self._budget -= rest
            return True
        if rest > self.spec.size:
            # Over-consumption: let it through, empty the bucket, block until the excess is repaid.
            self._burst = 0.0
            excess = rest - self._budget
            self._budget = 0.0
            self._blocked_until_s = now_s + excess / self.spec.size * self.spec.refill_time_s
            return True
        return False

    def reserve(self, n: float, now_s: float, max_wait_s: float) -> float | None:
        """Take ``n`` tokens, borrowing from the future if need be: the seconds the caller must wait
        before using them (0 when they were there), or None (nothing taken) if that wait would
        exceed ``max_wait_s``. A borrowed token leaves the budget negative until refilled."""
        if n < 0:
            raise InvalidArgument("n", f"must be >= 0 tokens, got {n}")
        if n > self.spec.size:  # over-consumption: exactly as consume() (no borrowing beyond a bucket)
            return 0.0 if self.consume(n, now_s) else None
        if self.consume(n, now_s):
            return 0.0
        if now_s < self._blocked_until_s:
            return None
        rest = n - self._burst
        wait_s = (rest - self._budget) / self.spec.rate_per_s
        if wait_s > max_wait_s:
            return None
        self._burst = 0.0
        self._budget -= rest
        return wait_s

    def time_until(self, n: float, now_s: float) -> float:
        """Seconds from ``now_s`` until ``consume(n)`` would succeed (0 if it would now)."""
        self._refill(now_s)
        wait_block = max(0.0, self._blocked_until_s - now_s)
        rest = n - self._burst
        if rest <= 0 or rest > self.spec.size:
            return wait_block
        budget_then = min(self.spec.size, self._budget + wait_block * self.spec.rate_per_s)
        return wait_block + max(0.0, rest - budget_then) / self.spec.rate_per_s


class TokenType(enum.Enum):
    """What a bucket counts, as in Firecracker's ``TokenType``."""

    OPS = "ops"
    BYTES = "bytes"


@dataclass(frozen=True)
class RateLimitSpec:
    """A tenant's limits: RPCs (``ops``) and fabric bytes (``bandwidth``); None disables one."""

    ops: BucketSpec | None = BucketSpec(size=1000.0, refill_time_s=1.0)
    bandwidth: BucketSpec | None = None


class TenantRateLimiter:
    """Independent ops and bandwidth buckets per tenant; raises RateLimited with a retry time."""

    def __init__(self, default: RateLimitSpec, *, overrides: dict[str, RateLimitSpec] | None = None) -> None:
        self.default = default
        self._overrides = dict(overrides or {})
        self._buckets: dict[tuple[str, TokenType], TokenBucket | None] = {}
        self._learned: OrderedDict[bytes, str] = OrderedDict()

    def tenant_of(self, caller_key: bytes) -> str | None:
        """The tenant a verified credential (by digest) belongs to, if this limiter has charged it."""
        return self._learned.get(caller_key)

    def _learn(self, caller_key: bytes, tenant: str) -> None:
        if self._learned.get(caller_key) != tenant:
            self._learned[caller_key] = tenant
            if len(self._learned) > MAX_LEARNED_CREDENTIALS:
                self._learned.popitem(last=False)

    def pace(self, tenant: str, now_s: float, max_wait_s: float) -> float:
        """Charge one call, borrowing up to ``max_wait_s`` ahead: the seconds to wait before serving
        it. Raises RateLimited (nothing charged) when even that wait would not do."""
        bucket = self._bucket(tenant, TokenType.OPS, now_s)
        if bucket is None:
            return 0.0
        wait_s = bucket.reserve(1.0, now_s, max_wait_s)
        if wait_s is None:
            raise RateLimited(f"tenant {tenant!r} over its RPC rate", retry_after_s=bucket.time_until(1.0, now_s),
                              reason="RPC_RATE_LIMITED")
        return wait_s

    def set_limits(self, tenant: str, spec: RateLimitSpec, now_s: float) -> None:
        """Change one tenant's limits; its buckets restart full (as Firecracker's update does)."""
        self._overrides[tenant] = spec
        for tt in TokenType:
            self._buckets.pop((tenant, tt), None)
        self._bucket(tenant, TokenType.OPS, now_s)
        self._bucket(tenant, TokenType.BYTES, now_s)

    def forget(self, tenant: str) -> None:
        """Drop a deleted tenant's buckets."""
        self._overrides.pop(tenant, None)
        for tt in TokenType:
            self._buckets.pop((tenant, tt), None)
        for key in [k for k, t in self._learned.items() if t == tenant]:
            del self._learned[key]

    def _bucket(self, tenant: str, token_type: TokenType, now_s: float) -> TokenBucket | None:
        key = (tenant, token_type)
        if key not in self._buckets:
            spec = self._overrides.get(tenant, self.default)
            b = spec.ops if token_type is TokenType.OPS else spec.bandwidth
            self._buckets[key] = TokenBucket.from_spec(b, start_s=now_s) if b is not None else None
        return self._buckets[key]

    def consume(self, tenant: str, n: float, token_type: TokenType, now_s: float) -> bool:
        """Take ``n`` tokens from the tenant's bucket of ``token_type``; True when allowed."""
        bucket = self._bucket(tenant, token_type, now_s)
        return True if bucket is None else bucket.consume(n, now_s)

    def check(self, tenant: str, now_s: float, *, ops: float = 1.0, bytes_: float = 0.0) -> None:
        """Charge one call (``ops``) and its fabric bytes, or raise RateLimited with ``retry_after_s``.

        Nothing is taken unless both buckets have room, so a refused call costs the tenant nothing.
        A call the transport already charged through :meth:`pace` is not charged again; the call's
        credential digest (:data:`CALLER_KEY`) is remembered as the tenant's.
        """
        if ops:
            key = CALLER_KEY.get()
            if key is not None:
                self._learn(key, tenant)
            if PREPAID.get() is self:
                ops = 0.0
        ob = self._bucket(tenant, TokenType.OPS, now_s) if ops else None
        bb = self._bucket(tenant, TokenType.BYTES, now_s) if bytes_ else None
        if bb is not None and (wait_s := bb.time_until(bytes_, now_s)) > 0:
            raise RateLimited(f"tenant {tenant!r} over its fabric bandwidth", retry_after_s=wait_s,
                              reason="BANDWIDTH_RATE_LIMITED")
        if ob is not None and not ob.consume(ops, now_s):
            raise RateLimited(f"tenant {tenant!r} over its RPC rate", retry_after_s=ob.time_until(ops, now_s),
                              reason="RPC_RATE_LIMITED")
        if bb is not None:
            bb.consume(bytes_, now_s)  # cannot fail: time_until was 0 at this same instant
