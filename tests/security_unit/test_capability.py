"""Capability tokens, device sets and the replay cache, including the adversarial cases."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gigacluster.security import InvalidArgument, PermissionDenied, Unauthenticated
from gigacluster.security.capability import (
    MAX_TOKEN_CHARS,
    CapabilityIssuer,
    CapabilityVerifier,
    DeviceSet,
    ReplayCache,
    new_nonce,
)

READ = frozenset({"memory.read"})


@pytest.fixture
def issuer() -> CapabilityIssuer:
    return CapabilityIssuer(Ed25519PrivateKey.generate(), cluster="gc1", key_id="k1")


@pytest.fixture
def verifier(issuer: CapabilityIssuer) -> CapabilityVerifier:
    return CapabilityVerifier({"k1": issuer.public_key_pem()}, cluster="gc1")


def _reason(exc: pytest.ExceptionInfo[BaseException]) -> str:
    return getattr(exc.value, "reason", "")


# -- DeviceSet ---------------------------------------------------------------------------------


def test_device_set_from_ids_merges_ranges() -> None:
    """Unsorted ids with duplicates become sorted, merged half-open ranges."""
    d = DeviceSet.from_ids([9, 1, 2, 3, 5, 10, 2])
    assert d.starts.tolist() == [1, 5, 9]
    assert d.stops.tolist() == [4, 6, 11]
    assert len(d) == 6
    assert d.ids().tolist() == [1, 2, 3, 5, 9, 10]


def test_device_set_wire_round_trip_and_compact_for_100k() -> None:
    """The wire form round-trips, and 100k contiguous devices take a few characters."""
    d = DeviceSet.from_ids([1, 2, 3, 5, 9, 10, 1_000_000])
    assert DeviceSet.from_wire(d.to_wire()) == d
    big = DeviceSet.from_range(200_000, 300_000)
    assert len(big) == 100_000
    assert len(big.to_wire()) <= 12
    assert DeviceSet.from_wire(big.to_wire()) == big


def test_device_set_membership_is_exact_at_range_edges() -> None:
    """contains() is true inside ranges and false just outside both ends."""
    d = DeviceSet.from_ids([10, 11, 12, 20])
    assert d.contains([9, 10, 12, 13, 19, 20, 21]).tolist() == [False, True, True, False, False, True, False]
    assert d.contains_all([10, 11, 20])
    assert not d.contains_all([10, 13])
    assert DeviceSet.from_range(10, 13).issubset(d)
    assert not DeviceSet.from_range(10, 14).issubset(d)


def test_device_set_from_mask_matches_from_ids() -> None:
    """from_mask over a random million-device mask equals from_ids of its true indices."""
    rng = np.random.default_rng(7)
    mask = rng.random(1_000_000) < 0.3
    assert DeviceSet.from_mask(mask) == DeviceSet.from_ids(np.flatnonzero(mask))


@pytest.mark.parametrize("wire", ["", "!!", "AQ", "Ag", "AgEBAAE", "/////////////w"])
def test_device_set_rejects_malformed_wire(wire: str) -> None:
    """Garbage, truncated, non-canonical (zero gap) or out-of-range wire forms are refused."""
    with pytest.raises(InvalidArgument) as exc:
        DeviceSet.from_wire(wire)
    assert exc.value.field == "devices"


def test_device_set_rejects_overlapping_ranges() -> None:
    """Constructed ranges must be sorted and disjoint."""
    with pytest.raises(InvalidArgument):
        DeviceSet(np.array([0, 5]), np.array([6, 8]))


# -- issue and verify --------------------------------------------------------------------------


def test_round_trip_gives_the_issued_scope(issuer: CapabilityIssuer, verifier: CapabilityVerifier) -> None:
    """A fresh token verifies and carries tenant, instance, devices, actions and expiry."""
    devs = DeviceSet.from_range(0, 100_000)
    tok = issuer.issue("acme", "i-1", devs, {"memory.read", "memory.write"}, ttl_s=60, now_s=1000.0)
    cap = verifier.verify(tok, now_s=1001.0)
    assert (cap.tenant, cap.instance, cap.cluster, cap.key_id) == ("acme", "i-1", "gc1", "k1")
    assert cap.devices == devs
    assert cap.actions == {"memory.read", "memory.write"}
    assert cap.expires_s == 1060.0
    assert len(tok) < 400


def test_missing_and_malformed_tokens_are_unauthenticated(verifier: CapabilityVerifier) -> None:
    """No token, junk, a wrong prefix and an oversize token are all UNAUTHENTICATED."""
    for tok, reason in [(None, "TOKEN_MISSING"), ("", "TOKEN_MISSING"), ("abc", "TOKEN_MALFORMED"),
                        ("jwt.k1.a.b", "TOKEN_MALFORMED"), ("gc1." + "a" * MAX_TOKEN_CHARS, "TOKEN_MALFORMED")]:
        with pytest.raises(Unauthenticated) as exc:
            verifier.verify(tok, now_s=0.0)
        assert _reason(exc) == reason


def test_forged_signature_with_another_key_is_rejected(verifier: CapabilityVerifier) -> None:
    """A token signed by an attacker's key under the trusted key id does not verify."""
    forger = CapabilityIssuer(Ed25519PrivateKey.generate(), cluster="gc1", key_id="k1")
    tok = forger.issue("acme", "i-1", [0], READ, ttl_s=60, now_s=0.0)
    with pytest.raises(Unauthenticated) as exc:
        verifier.verify(tok, now_s=1.0)
    assert _reason(exc) == "TOKEN_BAD_SIGNATURE"


def test_tampered_payload_is_rejected(issuer: CapabilityIssuer, verifier: CapabilityVerifier) -> None:
    """Widening the device range inside a signed token breaks the signature."""
    tok = issuer.issue("acme", "i-1", DeviceSet.from_range(0, 8), READ, ttl_s=60, now_s=0.0)
    prefix, kid, body, sig = tok.split(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload["dev"] = DeviceSet.from_range(0, 1_000_000).to_wire()
    payload["sub"] = "beta"
    forged_body = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    with pytest.raises(Unauthenticated) as exc:
        verifier.verify(".".join([prefix, kid, forged_body, sig]), now_s=1.0)
    assert _reason(exc) == "TOKEN_BAD_SIGNATURE"


def test_tampered_signature_and_unknown_key_are_rejected(issuer: CapabilityIssuer,
                                                         verifier: CapabilityVerifier) -> None:
    """Flipping a signature character or naming an unknown key id fails."""
    tok = issuer.issue("acme", "i-1", [0], READ, ttl_s=60, now_s=0.0)
    prefix, kid, body, sig = tok.split(".")
    flipped = sig[:5] + ("A" if sig[5] != "A" else "B") + sig[6:]
    with pytest.raises(Unauthenticated) as exc:
        verifier.verify(".".join([prefix, kid, body, flipped]), now_s=1.0)
    assert _reason(exc) == "TOKEN_BAD_SIGNATURE"
    with pytest.raises(Unauthenticated) as exc:
        verifier.verify(".".join([prefix, "k2", body, sig]), now_s=1.0)
    assert _reason(exc) == "TOKEN_UNKNOWN_KEY"


def test_expired_and_not_yet_valid(issuer: CapabilityIssuer, verifier: CapabilityVerifier) -> None:
    """A token fails at its expiry instant and before its issue time minus the leeway."""
    tok = issuer.issue("acme", "i-1", [0], READ, ttl_s=60, now_s=100.0)
    assert verifier.verify(tok, now_s=159.999).instance == "i-1"
    with pytest.raises(Unauthenticated) as exc:
        verifier.verify(tok, now_s=160.0)
    assert _reason(exc) == "TOKEN_EXPIRED"
    with pytest.raises(Unauthenticated) as exc:
        verifier.verify(tok, now_s=98.0)  # leeway is 1 s
    assert _reason(exc) == "TOKEN_NOT_YET_VALID"


def test_wrong_cluster_is_rejected(issuer: CapabilityIssuer) -> None:
    """A verifier of another cluster trusting the same key refuses the token (audience check)."""
    other = CapabilityVerifier({"k1": issuer.public_key_pem()}, cluster="gc2")
    tok = issuer.issue("acme", "i-1", [0], READ, ttl_s=60, now_s=0.0)
    with pytest.raises(Unauthenticated) as exc:
        other.verify(tok, now_s=1.0)
    assert _reason(exc) == "WRONG_CLUSTER"


def test_revocation_on_release_and_shipping(issuer: CapabilityIssuer, verifier: CapabilityVerifier) -> None:
    """A revoked instance's earlier tokens fail here and in a verifier fed the shipped list; later ones pass."""
    old = issuer.issue("acme", "i-1", [0], READ, ttl_s=60, now_s=10.0)
    assert verifier.verify(old, now_s=11.0).tenant == "acme"  # now cached
    verifier.revoke("i-1", at_s=12.0)
    with pytest.raises(Unauthenticated) as exc:
        verifier.verify(old, now_s=13.0)
    assert _reason(exc) == "TOKEN_REVOKED"
    remote = CapabilityVerifier({"k1": issuer.public_key_pem()}, cluster="gc1")
    remote.load_revocations(json.loads(json.dumps(verifier.revocations())))
    with pytest.raises(Unauthenticated):
        remote.verify(old, now_s=13.0)
    new = issuer.issue("acme", "i-1", [0], READ, ttl_s=60, now_s=20.0)
    assert remote.verify(new, now_s=21.0).issued_s == 20.0


def test_prune_drops_only_revocations_older_than_any_token(verifier: CapabilityVerifier) -> None:
    """Revocations are forgotten only once every token they could match has expired."""
    verifier.revoke("i-old", at_s=0.0)
    verifier.revoke("i-new", at_s=3000.0)
    assert verifier.prune(now_s=3600.0) == 0  # max ttl 3600 s + 1 s leeway not yet passed
    assert verifier.prune(now_s=3601.5) == 1
    assert verifier.revocations() == [("i-new", 3000.0)]


def test_key_rotation_and_removal(issuer: CapabilityIssuer, verifier: CapabilityVerifier) -> None:
    """Tokens of a second trusted key verify; after remove_key the first key's tokens fail."""
    second = CapabilityIssuer(Ed25519PrivateKey.generate(), cluster="gc1", key_id="k2")
    verifier.add_key("k2", second.public_key_pem())
    t1 = issuer.issue("acme", "i-1", [0], READ, ttl_s=60, now_s=0.0)
    t2 = second.issue("acme", "i-1", [0], READ, ttl_s=60, now_s=0.0)
    assert verifier.verify(t1, now_s=1.0).key_id == "k1"
    assert verifier.verify(t2, now_s=1.0).key_id == "k2"
    verifier.remove_key("k1")
    with pytest.raises(Unauthenticated):
        verifier.verify(t1, now_s=1.0)


# -- scope --------------------------------------------------------------------------------------


def test_out_of_scope_device_and_action_are_permission_denied(issuer: CapabilityIssuer,
                                                               verifier: CapabilityVerifier) -> None:
    """Devices outside the token, an action not granted and another instance are PERMISSION_DENIED."""
    tok = issuer.issue("acme", "i-1", DeviceSet.from_range(16, 32), READ, ttl_s=60, now_s=0.0)
    cap = verifier.verify(tok, now_s=1.0)
    cap.require("memory.read", np.arange(16, 32))
    cap.require("memory.read", DeviceSet.from_range(20, 24), tenant="acme", instance="i-1")
    cases = [
        (("memory.read", [15]), {}, "DEVICE_OUT_OF_SCOPE"),
        (("memory.read", DeviceSet.from_range(30, 33)), {}, "DEVICE_OUT_OF_SCOPE"),
        (("memory.write", [16]), {}, "ACTION_NOT_GRANTED"),
        (("memory.read", [16]), {"instance": "i-2"}, "WRONG_INSTANCE"),
        (("memory.read", [16]), {"tenant": "beta"}, "WRONG_TENANT"),
    ]
    for args, kw, reason in cases:
        with pytest.raises(PermissionDenied) as exc:
            cap.require(*args, **kw)
        assert _reason(exc) == reason


def test_issue_validates_its_inputs(issuer: CapabilityIssuer) -> None:
    """Bad names, no actions, no devices and a ttl beyond the maximum are INVALID_ARGUMENT."""
    bad = [
        (("Acme", "i-1", [0], READ, 60), "tenant"),
        (("acme", "i/1", [0], READ, 60), "instance"),
        (("acme", "i-1", [0], set(), 60), "actions"),
        (("acme", "i-1", [0], {"memory read"}, 60), "actions"),
        (("acme", "i-1", [], READ, 60), "devices"),
        (("acme", "i-1", [0], READ, 3601), "ttl_s"),
        (("acme", "i-1", [0], READ, 0), "ttl_s"),
    ]
    for args, field in bad:
        with pytest.raises(InvalidArgument) as exc:
            issuer.issue(*args, now_s=0.0)
        assert exc.value.field == field


def test_too_fragmented_device_set_is_refused(issuer: CapabilityIssuer) -> None:
    """A device set that would not fit gRPC metadata is refused with advice, not silently truncated."""
    with pytest.raises(InvalidArgument) as exc:
        issuer.issue("acme", "i-1", np.arange(0, 200_000, 2), READ, ttl_s=60, now_s=0.0)
    assert exc.value.field == "devices"
    assert "contiguous" in str(exc.value)


# -- replay cache -------------------------------------------------------------------------------


def test_replayed_nonce_is_rejected_and_fresh_one_accepted() -> None:
    """The same (token, nonce) is accepted once; a second use is NONCE_REPLAYED."""
    rc = ReplayCache(capacity=100, window_s=30.0)
    n = new_nonce()
    rc.check("jti-1", n, request_time_s=100.0, now_s=100.5)
    with pytest.raises(Unauthenticated) as exc:
        rc.check("jti-1", n, request_time_s=100.0, now_s=101.0)
    assert _reason(exc) == "NONCE_REPLAYED"
    rc.check("jti-2", n, request_time_s=100.0, now_s=101.0)  # other token: a different request
    rc.check("jti-1", new_nonce(), request_time_s=101.0, now_s=101.0)


def test_stale_missing_and_malformed_nonces() -> None:
    """Requests outside the window, without a nonce or with a short nonce are refused."""
    rc = ReplayCache(capacity=100, window_s=30.0)
    for nonce, t, reason in [(new_nonce(), 60.0, "REQUEST_STALE"), (new_nonce(), 140.0, "REQUEST_STALE"),
                             (None, 100.0, "NONCE_MISSING"), ("short", 100.0, "NONCE_MALFORMED")]:
        with pytest.raises(Unauthenticated) as exc:
            rc.check("jti-1", nonce, request_time_s=t, now_s=100.0)
        assert _reason(exc) == reason


def test_replay_cache_stays_bounded_without_reopening_replays() -> None:
    """Past capacity the oldest nonce is evicted, and replaying it is still refused (as stale)."""
    rc = ReplayCache(capacity=10, window_s=30.0)
    nonces = [new_nonce() for _ in range(25)]
    for i, n in enumerate(nonces):
        rc.check("jti", n, request_time_s=100.0 + i * 0.01, now_s=100.5)
    assert len(rc) == 10
    with pytest.raises(Unauthenticated) as exc:
        rc.check("jti", nonces[0], request_time_s=100.0, now_s=100.5)
    assert _reason(exc) == "REQUEST_STALE"
    with pytest.raises(Unauthenticated) as exc:
        rc.check("jti", nonces[-1], request_time_s=100.24, now_s=100.5)
    assert _reason(exc) == "NONCE_REPLAYED"


def test_replay_cache_expires_entries_after_the_window() -> None:
    """Entries older than the window are dropped, so memory follows the request rate."""
    rc = ReplayCache(capacity=1000, window_s=10.0)
    for i in range(50):
        rc.check("jti", new_nonce(), request_time_s=float(i), now_s=float(i))
    assert len(rc) == 11  # requests of the last 10 s, inclusive
