"""Pure security modules of the Nitro-like isolation broker: identities and API keys, signed
capabilities, rate limits, per-allocation device memory with scrubbing, the instance allocator,
telemetry (MQTT) credentials and ACLs, the audit log and the modelled cost of virtualisation.

No gRPC, no network. The errors are part of the one tree rooted in :mod:`gigacluster.errors`:
each also subclasses the domain error of its status, so ``runtime.errors`` (gRPC) and
``router.http`` (HTTP) map them with every other ``DomainError`` (``exc.code`` is the name of the
``grpc.StatusCode`` member, ``exc.reason`` an UPPER_SNAKE_CASE reason for ``google.rpc.ErrorInfo``).

Exceptions::

    DomainError
    └── SecurityError
        ├── Unauthenticated     (errors.Unauthenticated) missing, malformed, forged, expired, wrong-cluster,
        │                       revoked or replayed credential
        ├── PermissionDenied    (errors.PermissionDenied) a valid principal acting outside its scope
        ├── RateLimited         (errors.ResourceExhausted) a token bucket is empty; ``retry_after_s`` says when
        ├── ResourceExhausted   (errors.ResourceExhausted) not enough free devices or device memory; the numbers
        ├── NotFound            (errors.NotFound) no such tenant, instance or allocation (visible to the caller)
        ├── FailedPrecondition  (errors.FailedPrecondition) the action is illegal in the current state
        └── InvalidArgument     (model.SpecError, so errors.InvalidArgument) a request field is invalid (``field``)
"""

from __future__ import annotations

from typing import Any

from gigacluster import errors as E
from gigacluster.model import SpecError


class SecurityError(E.DomainError):
    """Base of the security package's errors; ``code`` names the gRPC status, ``reason`` the cause."""

    code = "UNKNOWN"

    def __init__(self, message: str, *, reason: str = "", **metadata: Any) -> None:
        E.DomainError.__init__(self, message, reason=reason or type(self).__name__.upper(), **metadata)


class Unauthenticated(SecurityError, E.Unauthenticated):
    """The caller's credential is missing or not valid (maps to UNAUTHENTICATED)."""

    code = "UNAUTHENTICATED"


class PermissionDenied(SecurityError, E.PermissionDenied):
    """A valid credential used outside its scope (maps to PERMISSION_DENIED)."""

    code = "PERMISSION_DENIED"


class RateLimited(SecurityError, E.ResourceExhausted):
    """A tenant's token bucket is empty; retry after ``retry_after_s`` (maps to RESOURCE_EXHAUSTED)."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, *, retry_after_s: float, reason: str = "RATE_LIMITED") -> None:
        shown = f"{retry_after_s:.3f}" if isinstance(retry_after_s, float) else str(retry_after_s)
        super().__init__(message, reason=reason, retry_after_s=shown)
        self.retry_after_s = retry_after_s


class ResourceExhausted(SecurityError, E.ResourceExhausted):
    """Not enough free devices or memory; ``requested`` and ``available`` give the numbers."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, *, requested: int, available: int, reason: str = "") -> None:
        super().__init__(message, reason=reason or "RESOURCE_EXHAUSTED")
        self.retry_after_s = None
        self.requested = requested
        self.available = available


class NotFound(SecurityError, E.NotFound):
    """The named tenant, instance or allocation does not exist (maps to NOT_FOUND)."""

    code = "NOT_FOUND"


class FailedPrecondition(SecurityError, E.FailedPrecondition):
    """The action is not allowed in the current state (maps to FAILED_PRECONDITION)."""

    code = "FAILED_PRECONDITION"


class InvalidArgument(SecurityError, SpecError):
    """A request field is invalid; ``field`` names it and the message lists what is allowed."""

    code = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str, *, reason: str = "INVALID_ARGUMENT") -> None:
        SpecError.__init__(self, field, message)
        self.reason = reason


__all__ = [
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "RateLimited",
    "ResourceExhausted",
    "SecurityError",
    "Unauthenticated",
]
