"""Domain errors shared by every service, with no gRPC import.

The root of the one error tree: the model package's errors (``ModelError``, ``SpecError`` an
``InvalidArgument``, ``DoesNotFitError`` a ``FailedPrecondition``, the fabric errors) and the security
package's (``SecurityError``, each also the class of its status below, ``RateLimited`` a
``ResourceExhausted``) subclass these. Each class names the canonical status it maps to;
``runtime.errors`` turns any of them into a gRPC status with a ``google.rpc.ErrorInfo`` and
``router.http`` into an HTTP status, in one place each. Messages say what to fix.

    DomainError
    ├── InvalidArgument      INVALID_ARGUMENT  (``field`` names the bad request field)
    ├── NotFound             NOT_FOUND
    ├── AlreadyExists        ALREADY_EXISTS
    ├── PermissionDenied     PERMISSION_DENIED
    ├── Unauthenticated      UNAUTHENTICATED
    ├── ResourceExhausted    RESOURCE_EXHAUSTED (``retry_after_s`` when known)
    ├── FailedPrecondition   FAILED_PRECONDITION
    └── Unavailable          UNAVAILABLE (a dependency is down; retry)

A ``DomainError`` whose code stays INTERNAL (e.g. a fabric ``NoPathError``) is ours, not the
caller's: it is logged and answered INTERNAL with no detail.
"""

from __future__ import annotations

from typing import Any

#: ErrorInfo reason of a steady-state window refused because the devices no longer run the step as the caller's
#: reference did (a slow or throttled chip): the caller runs the step through the per-step path instead.
WINDOW_NOT_STEADY = "WINDOW_NOT_STEADY"


class DomainError(Exception):
    """Base class: ``code`` is a grpc.StatusCode name, ``reason`` an UPPER_SNAKE_CASE tag."""

    code = "INTERNAL"
    default_reason = "INTERNAL"

    def __init_subclass__(cls, *, code: str | None = None, **kwargs: Any) -> None:
        """``class X(DomainError, code="NOT_FOUND")`` names the status, which is also the default reason."""
        super().__init_subclass__(**kwargs)
        if code is not None:
            cls.code = cls.default_reason = code

    def __init__(self, message: str, *, reason: str | None = None, **metadata: Any) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason or self.default_reason
        self.metadata = {k: str(v) for k, v in metadata.items() if v is not None}


class InvalidArgument(DomainError, code="INVALID_ARGUMENT"):
    def __init__(self, field: str, message: str, **metadata: Any) -> None:
        super().__init__(f"{field}: {message}", reason="INVALID_FIELD", field=field, **metadata)
        self.field = field


class NotFound(DomainError, code="NOT_FOUND"):
    def __init__(self, resource: str, message: str | None = None) -> None:
        super().__init__(message or f"{resource} not found", resource=resource)
        self.resource = resource


class AlreadyExists(DomainError, code="ALREADY_EXISTS"):
    pass


class PermissionDenied(DomainError, code="PERMISSION_DENIED"):
    pass


class Unauthenticated(DomainError, code="UNAUTHENTICATED"):
    pass


class ResourceExhausted(DomainError, code="RESOURCE_EXHAUSTED"):
    def __init__(self, message: str, *, retry_after_s: float | None = None, **metadata: Any) -> None:
        super().__init__(message, retry_after_s=None if retry_after_s is None else f"{retry_after_s:.3f}", **metadata)
        self.retry_after_s = retry_after_s


class FailedPrecondition(DomainError, code="FAILED_PRECONDITION"):
    pass


class Unavailable(DomainError, code="UNAVAILABLE"):
    pass
