"""The one error tree: model and security errors are DomainErrors, mapped in one place for gRPC and HTTP."""

from __future__ import annotations

import json

import pytest

from gigacluster import errors as E
from gigacluster import security as S
from gigacluster.fabric import NoPathError, UnknownFlowGroupError
from gigacluster.model import DoesNotFitError, ModelError, SpecError
from gigacluster.router.http import domain_error_response
from gigacluster.runtime.errors import classify

SECURITY_CASES = [
    (S.Unauthenticated("bad key"), E.Unauthenticated, "UNAUTHENTICATED", "UNAUTHENTICATED", {}),
    (S.PermissionDenied("not yours"), E.PermissionDenied, "PERMISSION_DENIED", "PERMISSIONDENIED", {}),
    (S.RateLimited("slow down", retry_after_s=0.25), E.ResourceExhausted, "RESOURCE_EXHAUSTED", "RATE_LIMITED",
     {"retry_after_s": "0.250"}),
    (S.ResourceExhausted("no chips", requested=8, available=2), E.ResourceExhausted, "RESOURCE_EXHAUSTED",
     "RESOURCE_EXHAUSTED", {}),
    (S.NotFound("no such instance"), E.NotFound, "NOT_FOUND", "NOTFOUND", {}),
    (S.FailedPrecondition("exists"), E.FailedPrecondition, "FAILED_PRECONDITION", "FAILEDPRECONDITION", {}),
    (S.InvalidArgument("devices", "too many"), E.InvalidArgument, "INVALID_ARGUMENT", "INVALID_ARGUMENT",
     {"field": "devices"}),
]


@pytest.mark.parametrize(("exc", "base", "code", "reason", "meta"), SECURITY_CASES)
def test_security_errors_are_domain_errors_with_their_status(
        exc: S.SecurityError, base: type, code: str, reason: str, meta: dict[str, str]) -> None:
    """Each security error is the DomainError of its status and keeps its code, reason and metadata."""
    assert isinstance(exc, S.SecurityError) and isinstance(exc, base)
    assert classify(exc) == (code, reason, str(exc), meta)


def test_model_errors_are_domain_errors() -> None:
    """SpecError is an InvalidArgument with its field; DoesNotFitError a FailedPrecondition with the numbers."""
    spec = SpecError("model.preset", "unknown")
    assert isinstance(spec, E.InvalidArgument) and isinstance(spec, ValueError) and spec.field == "model.preset"
    assert classify(spec) == ("INVALID_ARGUMENT", "INVALID_FIELD", "model.preset: unknown", {"field": "model.preset"})
    big = DoesNotFitError("too big", need_bytes=2e11, have_bytes=8e10)
    assert isinstance(big, E.FailedPrecondition) and isinstance(big, ModelError)
    assert classify(big) == ("FAILED_PRECONDITION", "DOES_NOT_FIT", "too big",
                             {"need_bytes": "200000000000", "have_bytes": "80000000000"})


def test_fabric_errors_stay_internal_on_the_wire() -> None:
    """A fabric model error is ours, not the caller's: INTERNAL with no detail, as before the tree joined."""
    for exc in (NoPathError("no path 1 -> 2"), UnknownFlowGroupError("unknown flow group 'x'")):
        assert isinstance(exc, E.DomainError)
        code, reason, message, meta = classify(exc)
        assert (code, reason, meta) == ("INTERNAL", "INTERNAL", {}) and "see the service log" in message
    assert isinstance(UnknownFlowGroupError("x"), KeyError) and str(UnknownFlowGroupError("x")) == "x"


def test_http_maps_the_rate_limit_to_429_with_retry_after() -> None:
    """router/http.py maps a security RateLimited through the same tree: 429, Retry-After rounded up."""
    resp = domain_error_response(S.RateLimited("tenant over its RPC rate", retry_after_s=1.2))
    body = json.loads(resp.text or "{}")
    assert resp.status == 429 and resp.headers["Retry-After"] == "2" and resp.headers["retry-after-ms"] == "1200"
    assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "rate_limit_exceeded"


def test_http_maps_each_family_once() -> None:
    """Model errors are 400 invalid_value; security and plain domain errors answer the status of their code."""
    assert domain_error_response(SpecError("max_tokens", "must be > 0")).status == 400
    assert json.loads(domain_error_response(SpecError("f", "x")).text or "{}")["error"]["code"] == "invalid_value"
    assert domain_error_response(S.Unauthenticated("bad key")).status == 401
    assert domain_error_response(S.PermissionDenied("no")).status == 403
    assert domain_error_response(E.NotFound("models/x")).status == 404
    unavailable = domain_error_response(E.Unavailable("restoring"))
    assert unavailable.status == 503 and unavailable.headers["Retry-After"] == "1"
