"""Token buckets with Firecracker's size / one_time_burst / refill_time semantics, per tenant."""

from __future__ import annotations

import pytest

from gigacluster.security import InvalidArgument, RateLimited
from gigacluster.security.ratelimit import BucketSpec, RateLimitSpec, TenantRateLimiter, TokenBucket, TokenType


def test_bucket_starts_full_and_spends_one_time_burst_first() -> None:
    """Firecracker: budget starts at size; the one-time burst is extra and spent before the budget."""
    b = TokenBucket(size=100, one_time_burst=50, refill_time_s=1.0)
    assert b.available(0.0) == 150
    assert b.consume(120, 0.0)  # 50 from the burst, 70 from the budget
    assert b.available(0.0) == 30


def test_refused_consume_takes_nothing_and_refill_is_linear() -> None:
    """A refused request leaves the bucket unchanged; it refills at size / refill_time_s."""
    b = TokenBucket(size=100, one_time_burst=50, refill_time_s=1.0)
    assert b.consume(120, 0.0)
    assert not b.consume(40, 0.0)
    assert b.available(0.0) == 30
    assert b.consume(40, 0.1)  # 30 + 0.1 s * 100/s
    assert b.available(0.1) == pytest.approx(0.0)
    assert b.available(0.35) == pytest.approx(25.0)


def test_burst_never_replenishes_and_budget_caps_at_size() -> None:
    """After a long idle the bucket holds size tokens, not size + one_time_burst."""
    b = TokenBucket(size=100, one_time_burst=50, refill_time_s=2.0)
    assert b.consume(150, 0.0)
    assert b.available(1000.0) == 100


def test_time_until_is_exact() -> None:
    """time_until(n) is the shortfall divided by the refill rate, and 0 when consume would succeed."""
    b = TokenBucket(size=100, refill_time_s=4.0)  # 25 tokens/s
    assert b.consume(100, 0.0)
    assert b.time_until(50, 0.0) == pytest.approx(2.0)
    assert not b.consume(50, 1.999)
    assert b.consume(50, 2.0)
    assert b.time_until(10, 2.0) == pytest.approx(0.4)


def test_over_consumption_passes_once_then_blocks_for_excess_over_rate() -> None:
    """Firecracker's OverConsumption: a request above size passes, then the bucket blocks (excess/size)*refill_time."""
    b = TokenBucket(size=100, refill_time_s=1.0)
    assert b.consume(250, 0.0)  # budget 100, excess 150 -> blocked 1.5 s
    assert b.time_until(1, 1.0) == pytest.approx(0.5)
    assert not b.consume(1, 1.49)
    assert b.consume(100, 1.5)  # refill accrued while blocked, capped at size


def test_bucket_spec_validates() -> None:
    """Zero size or refill time, or a negative burst, are INVALID_ARGUMENT naming the field."""
    for kw, field in [({"size": 0}, "size"), ({"size": 1, "refill_time_s": 0}, "refill_time_s"),
                      ({"size": 1, "one_time_burst": -1}, "one_time_burst")]:
        with pytest.raises(InvalidArgument) as exc:
            BucketSpec(**kw)
        assert exc.value.field == field


def test_one_tenant_cannot_starve_another() -> None:
    """Draining one tenant's RPC bucket leaves another tenant's untouched."""
    lim = TenantRateLimiter(RateLimitSpec(ops=BucketSpec(size=10, refill_time_s=1.0)))
    for _ in range(10):
        lim.check("acme", 0.0)
    with pytest.raises(RateLimited) as exc:
        lim.check("acme", 0.0)
    assert exc.value.reason == "RPC_RATE_LIMITED"
    assert exc.value.retry_after_s == pytest.approx(0.1)
    for _ in range(10):
        lim.check("beta", 0.0)


def test_bandwidth_refusal_costs_no_rpc_token() -> None:
    """A call refused for bandwidth does not spend the tenant's RPC token."""
    spec = RateLimitSpec(ops=BucketSpec(size=2, refill_time_s=1.0),
                         bandwidth=BucketSpec(size=1e9, refill_time_s=1.0))
    lim = TenantRateLimiter(spec)
    lim.check("acme", 0.0, bytes_=1e9)
    with pytest.raises(RateLimited) as exc:
        lim.check("acme", 0.0, bytes_=5e8)
    assert exc.value.reason == "BANDWIDTH_RATE_LIMITED"
    assert exc.value.retry_after_s == pytest.approx(0.5)
    lim.check("acme", 0.0)  # the second RPC token is still there
    assert not lim.consume("acme", 1, TokenType.OPS, 0.0)


def test_overrides_and_disabled_buckets() -> None:
    """A per-tenant override applies to that tenant only; a None bucket never limits."""
    lim = TenantRateLimiter(RateLimitSpec(ops=None), overrides={"small": RateLimitSpec(ops=BucketSpec(size=1))})
    for _ in range(1000):
        lim.check("big", 0.0)
    lim.check("small", 0.0)
    with pytest.raises(RateLimited):
        lim.check("small", 0.0)
    lim.set_limits("small", RateLimitSpec(ops=BucketSpec(size=5)), now_s=0.0)
    for _ in range(5):
        lim.check("small", 0.0)


def test_reserve_paces_by_borrowing_up_to_the_max_wait() -> None:
    """An empty bucket lends tokens from the next max_wait_s: waits grow by 1/rate each, then refusal."""
    b = TokenBucket(size=10, refill_time_s=1.0)
    assert [b.reserve(1, 0.0, 0.25) for _ in range(10)] == [0.0] * 10
    waits = [b.reserve(1, 0.0, 0.25) for _ in range(3)]
    assert waits == [pytest.approx(0.1), pytest.approx(0.2), None]
    assert b.available(0.0) == 0.0
    assert b.reserve(1, 0.3, 0.25) == pytest.approx(0.0)  # the debt of 2 was repaid by 0.2 s; 1 token back


def test_pace_refuses_with_retry_after_and_charges_nothing() -> None:
    """pace() raises RateLimited once the wait would pass max_wait_s, leaving the bucket as it was."""
    lim = TenantRateLimiter(RateLimitSpec(ops=BucketSpec(size=2, refill_time_s=1.0)))
    assert lim.pace("acme", 0.0, 0.5) == 0.0
    assert lim.pace("acme", 0.0, 0.5) == 0.0
    assert lim.pace("acme", 0.0, 0.5) == pytest.approx(0.5)
    with pytest.raises(RateLimited) as exc:
        lim.pace("acme", 0.0, 0.5)
    assert exc.value.reason == "RPC_RATE_LIMITED"
    assert lim.pace("beta", 0.0, 0.5) == 0.0  # another tenant is untouched


def test_check_learns_the_verified_credential_and_skips_prepaid_calls() -> None:
    """check() maps the call's credential digest to the tenant it charged, and never charges a prepaid call twice."""
    from gigacluster.security.ratelimit import CALLER_KEY, PREPAID

    lim = TenantRateLimiter(RateLimitSpec(ops=BucketSpec(size=1, refill_time_s=1.0)))
    assert lim.tenant_of(b"k1") is None
    t1 = CALLER_KEY.set(b"k1")
    try:
        lim.check("acme", 0.0)
        assert lim.tenant_of(b"k1") == "acme"
        t2 = PREPAID.set(lim)
        lim.check("acme", 0.0)  # bucket empty, but the transport already charged this call
        PREPAID.reset(t2)
        with pytest.raises(RateLimited):
            lim.check("acme", 0.0)
    finally:
        CALLER_KEY.reset(t1)
    lim.forget("acme")
    assert lim.tenant_of(b"k1") is None
