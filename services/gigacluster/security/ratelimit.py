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
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gigacluster.security import InvalidArgument, RateLimited


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
        return self._budget + self._burst

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
        """
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
