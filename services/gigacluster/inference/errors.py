"""Errors of the inference plane (see the package docstring for the hierarchy)."""

from __future__ import annotations


class InferenceError(RuntimeError):
    """Base of the inference plane's runtime errors (bad input raises ``SpecError`` instead)."""


class AdmissionError(InferenceError):
    """A replica cannot take the request now; retry after ``retry_after_s`` seconds.

    ``reason`` is ``queue_full`` (rejected on arrival) or ``shed`` (evicted from the queue by a
    higher-priority arrival). The gRPC layer maps it to RESOURCE_EXHAUSTED, HTTP to 429.
    """

    def __init__(self, retry_after_s: float, *, reason: str = "queue_full", detail: str = "") -> None:
        msg = f"{reason}: retry after {retry_after_s:.3f} s"
        super().__init__(f"{msg} ({detail})" if detail else msg)
        self.retry_after_s = float(retry_after_s)
        self.reason = reason


class EngineStateError(InferenceError):
    """The engine was driven out of order (e.g. a second iteration while one is in flight)."""
