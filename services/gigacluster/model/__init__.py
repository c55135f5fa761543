"""Pure performance models: no gRPC, no I/O. The live services and the offline ``estimate``
commands call the same functions here.

Training and hardware: ``roofline`` (work timing, shape-aware efficiency), ``comm`` (CommModel,
alpha-beta default), ``training`` (plan_step / compose_step / estimate_train), ``power``,
``thermal``, ``cost`` and ``planning`` (compare, power budgets). Parameters live in the hardware
catalog (sections ``chips``, ``efficiency``, ``thermal``, ``facility``); see docs/validation.md.

Exceptions::

    ModelError (ValueError)
    ├── SpecError         a user spec field is missing, negative or not allowed (names the field)
    └── DoesNotFitError   a configuration needs more HBM than the chip has (gives the numbers)
"""


class ModelError(ValueError):
    """Base of the model package's errors."""


class SpecError(ModelError):
    """A spec field is invalid; ``field`` names it, the message says what is allowed."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class DoesNotFitError(ModelError):
    """The configuration does not fit in HBM."""

    def __init__(self, message: str, *, need_bytes: float, have_bytes: float) -> None:
        super().__init__(message)
        self.need_bytes = need_bytes
        self.have_bytes = have_bytes
