"""Pure performance models: no gRPC, no I/O. The live services and the offline ``estimate``
commands call the same functions here.

Training and hardware: ``roofline`` (work timing, shape-aware efficiency), ``comm`` (CommModel,
alpha-beta default), ``training`` (plan_step / compose_step / estimate_train), ``power``,
``thermal``, ``cost`` and ``planning`` (compare, power budgets). Parameters live in the hardware
catalog (sections ``chips``, ``efficiency``, ``thermal``, ``facility``); see docs/validation.md.

Exceptions (part of the one tree rooted in :mod:`gigacluster.errors`)::

    DomainError
    └── ModelError (also ValueError)  INTERNAL unless a subclass says otherwise
        ├── SpecError         InvalidArgument: a user spec field is missing, negative or not allowed (``field``)
        └── DoesNotFitError   FailedPrecondition (DOES_NOT_FIT): needs more HBM than the chip has (the numbers)
"""

from __future__ import annotations

from gigacluster.errors import DomainError, FailedPrecondition, InvalidArgument


class ModelError(DomainError, ValueError):
    """Base of the model package's errors (a ``ValueError`` too, as before the tree was joined)."""


class SpecError(InvalidArgument, ModelError):
    """A spec field is invalid; ``field`` names it, the message says what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)


class DoesNotFitError(FailedPrecondition, ModelError):
    """The configuration does not fit in HBM (FAILED_PRECONDITION, reason DOES_NOT_FIT, the numbers)."""

    def __init__(self, message: str, *, need_bytes: float, have_bytes: float) -> None:
        super().__init__(message, reason="DOES_NOT_FIT", need_bytes=f"{need_bytes:.0f}", have_bytes=f"{have_bytes:.0f}")
        self.need_bytes = need_bytes
        self.have_bytes = have_bytes
