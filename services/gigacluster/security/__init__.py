"""Pure security modules of the Nitro-like isolation broker: identities and API keys, signed
capabilities, rate limits, per-allocation device memory with scrubbing, the instance allocator,
telemetry (MQTT) credentials and ACLs, the audit log and the modelled cost of virtualisation.

No gRPC, no network: the broker, chip and fabric services call these and map the exceptions to
status codes in one function each (``exc.code`` is the name of the ``grpc.StatusCode`` member,
``exc.reason`` an UPPER_SNAKE_CASE reason for ``google.rpc.ErrorInfo``).

Exceptions::

    SecurityError (Exception)
    ├── Unauthenticated     missing, malformed, forged, expired, wrong-cluster, revoked or replayed credential
    ├── PermissionDenied    a valid principal acting outside its scope (tenant, instance, devices, actions)
    ├── RateLimited         a token bucket is empty; ``retry_after_s`` says when to retry
    ├── ResourceExhausted   not enough free devices or device memory; carries the numbers
    ├── NotFound            no such tenant, instance or allocation (visible to the caller)
    ├── FailedPrecondition  the action is illegal in the current state (e.g. instance already exists)
    └── InvalidArgument     a request field is invalid; also a gigacluster.model.SpecError (``field``)
"""

from __future__ import annotations

from gigacluster.model import SpecError


class SecurityError(Exception):
    """Base of the security package's errors; ``code`` names the gRPC status, ``reason`` the cause."""

    code = "UNKNOWN"

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or type(self).__name__.upper()


class Unauthenticated(SecurityError):
    """The caller's credential is missing or not valid (maps to UNAUTHENTICATED)."""

    code = "UNAUTHENTICATED"


class PermissionDenied(SecurityError):
    """A valid credential used outside its scope (maps to PERMISSION_DENIED)."""

    code = "PERMISSION_DENIED"


class RateLimited(SecurityError):
    """A tenant's token bucket is empty; retry after ``retry_after_s`` (maps to RESOURCE_EXHAUSTED)."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, *, retry_after_s: float, reason: str = "RATE_LIMITED") -> None:
        super().__init__(message, reason=reason)
        self.retry_after_s = retry_after_s


class ResourceExhausted(SecurityError):
    """Not enough free devices or memory; ``requested`` and ``available`` give the numbers."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, *, requested: int, available: int, reason: str = "") -> None:
        super().__init__(message, reason=reason or "RESOURCE_EXHAUSTED")
        self.requested = requested
        self.available = available


class NotFound(SecurityError):
    """The named tenant, instance or allocation does not exist (maps to NOT_FOUND)."""

    code = "NOT_FOUND"


class FailedPrecondition(SecurityError):
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
