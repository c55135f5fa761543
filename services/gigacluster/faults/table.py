"""Failure-rate tables: which component fails, how often per chip, and how long its repair takes (no gRPC).

A table is a list of rows ``{cause, component, rate_per_chip_hour, repair_s}``. ``component`` says what
the failure breaks on the real path (:data:`COMPONENTS`); ``cause`` is a free label for reports. The
built-in ``llama3`` table is the Llama 3 paper's Table 5 (Dubey et al. 2024): 419 unexpected
interruptions in 54 days of pre-training on 16,384 H100, i.e. one per 50,700 GPU-hours, by root cause.

A user's table (YAML) is validated row by row: a missing field, a negative or non-finite rate or repair
time, an unknown component or an unknown key is refused as InvalidArgument naming the field
(``failures[2].rate_per_chip_hour``).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from gigacluster import safeyaml
from gigacluster.errors import InvalidArgument
from gigacluster.hw.catalog import failure_repair_s
from gigacluster.registry import Registry

COMPONENTS: dict[str, str] = {
    "gpu": "the chip fails (ChipService.InjectFault FAILED); quarantined until repaired",
    "hbm": "an uncorrectable HBM error fails the chip (InjectFault HBM); quarantined until repaired",
    "switch_cable": "the chip's NIC-leaf cable goes down both ways (FabricService.InjectLinkFault DOWN)",
    "nic": "the chip's NIC goes down: its NIC-leaf links both ways (InjectLinkFault DOWN)",
    "host": "every chip of the host (its scale-up domain) fails (InjectFault FAILED on the domain)",
    "software": "a transient fault on one chip (InjectFault FAILED, cleared after repair_s): the step running "
                "on it fails and the job restarts; the hardware is healthy again",
}
"""Components a table row may name, and what a failure of each does on the real path."""

EFFECTS: dict[str, str] = {"gpu": "device", "hbm": "device", "switch_cable": "network", "nic": "network",
                           "host": "host", "software": "software"}
"""The scheduler's view of each component (``StepFailed.effect``)."""

DEFAULT_REPAIR_S: dict[str, float] = failure_repair_s()
"""Repair times of the built-in table, from the catalog's ``failures`` section with their sources and
assumptions. The Llama 3 paper gives none: hardware is assumed swapped within the hour; a software fault is
restarted, not repaired (the 30 s is how long the transient chip fault that stands for it is held, so the step
in flight fails); a network fault is assumed a 30 s flap (the scheduler keeps jobs off the chips behind it
meanwhile)."""

FIELDS = ("cause", "component", "rate_per_chip_hour", "repair_s")
REQUIRED = ("component", "rate_per_chip_hour", "repair_s")
MAX_ROWS = 256

# Llama 3 paper, Table 5: root-cause categories of the 419 unexpected interruptions, and the component each breaks.
LLAMA3_COUNTS: dict[str, tuple[int, str]] = {
    "faulty GPU": (148, "gpu"),
    "GPU HBM3 memory": (72, "hbm"),
    "software bug": (54, "software"),
    "network switch or cable": (35, "switch_cable"),
    "host maintenance (unplanned)": (32, "host"),
    "GPU SRAM": (19, "gpu"),
    "GPU system processor": (17, "gpu"),
    "NIC": (7, "nic"),
    "NCCL watchdog timeout": (7, "software"),
    "silent data corruption": (6, "gpu"),
    "GPU thermal interface or sensor": (6, "gpu"),
    "SSD": (3, "host"),
    "power supply": (3, "host"),
    # calibration.md lists causes down to 3 each (409); the other 10 of the 419 are smaller host-level
    # categories of the paper's table (chassis, IO board, CPU, system memory, dependency).
    "other host components": (10, "host"),
}
LLAMA3_INTERRUPTIONS = 419
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54
LLAMA3_CHIP_HOURS = LLAMA3_GPUS * LLAMA3_DAYS * 24.0


@dataclasses.dataclass(frozen=True)
class Row:
    """One cause: a component failing at ``rate_per_chip_hour`` per chip, repaired after ``repair_s``."""

    cause: str
    component: str
    rate_per_chip_hour: float
    repair_s: float


@dataclasses.dataclass(frozen=True)
class RateTable:
    """A failure-rate table (validated rows)."""

    rows: tuple[Row, ...]

    def __post_init__(self) -> None:
        if not self.rows:
            raise InvalidArgument("failures", "a failure table needs at least one row")

    @property
    def rate_per_chip_s(self) -> float:
        """Failures per chip-second, all causes."""
        return sum(r.rate_per_chip_hour for r in self.rows) / 3600.0

    def shares(self) -> list[float]:
        """Each row's share of all failures."""
        total = sum(r.rate_per_chip_hour for r in self.rows)
        return [r.rate_per_chip_hour / total if total else 1.0 / len(self.rows) for r in self.rows]

    def scaled(self, factor: float) -> RateTable:
        """The same mix at ``factor`` times every rate (a what-if, or a short test with many failures)."""
        if not 0 <= factor < math.inf:
            raise InvalidArgument("scale", f"must be a finite number >= 0, got {factor!r}")
        return RateTable(tuple(dataclasses.replace(r, rate_per_chip_hour=r.rate_per_chip_hour * factor)
                               for r in self.rows))

    def with_repair(self, **repair_s: float) -> RateTable:
        """The same table with other repair times per component (``gpu=600``)."""
        for comp, v in repair_s.items():
            _component(comp, "repair")
            _non_negative(v, f"repair.{comp}")
        return RateTable(tuple(dataclasses.replace(r, repair_s=repair_s.get(r.component, r.repair_s))
                               for r in self.rows))


def llama3() -> RateTable:
    """The Llama 3 405B pre-training mix at its published rate (419 in 54 days on 16,384 GPUs)."""
    return RateTable(tuple(Row(cause, comp, n / LLAMA3_CHIP_HOURS, DEFAULT_REPAIR_S[comp])
                           for cause, (n, comp) in LLAMA3_COUNTS.items()))


def _component(v: Any, field: str) -> str:
    if not isinstance(v, str) or v not in COMPONENTS:
        raise InvalidArgument(field, f"unknown component {str(v)[:40]!r}; allowed: {', '.join(COMPONENTS)}")
    return v


def _non_negative(v: Any, field: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InvalidArgument(field, f"must be a number, got {str(v)[:40]!r}")
    if not 0 <= float(v) < math.inf:
        raise InvalidArgument(field, f"must be a finite number >= 0, got {v!r}")
    return float(v)


def parse_row(d: Any, where: str) -> Row:
    """One row of a user's table, or InvalidArgument naming the bad field (``failures[2].component``)."""
    if not isinstance(d, Mapping):
        raise InvalidArgument(where, "each row must be a mapping with " + ", ".join(REQUIRED))
    unknown = sorted(str(k)[:40] for k in d if k not in FIELDS)
    if unknown:
        raise InvalidArgument(f"{where}.{unknown[0]}", f"unknown field; allowed: {', '.join(FIELDS)}")
    for name in REQUIRED:
        if name not in d:
            raise InvalidArgument(f"{where}.{name}", "missing")
    comp = _component(d["component"], f"{where}.component")
    cause = d.get("cause", comp)
    if not isinstance(cause, str) or not 0 < len(cause) <= 80:
        raise InvalidArgument(f"{where}.cause", "must be a string of 1 to 80 characters")
    return Row(cause, comp, _non_negative(d["rate_per_chip_hour"], f"{where}.rate_per_chip_hour"),
               _non_negative(d["repair_s"], f"{where}.repair_s"))


def parse_table(data: Any) -> RateTable:
    """A table from parsed YAML: ``{failures: [row, ...]}`` or the list itself."""
    rows = data.get("failures") if isinstance(data, Mapping) else data
    if isinstance(data, Mapping) and set(data) - {"failures"}:
        extra = sorted(str(k)[:40] for k in data if k != "failures")[0]
        raise InvalidArgument(extra, "unknown key; a failure table has one key, failures")
    if not isinstance(rows, list) or not rows:
        raise InvalidArgument("failures", "must be a non-empty list of rows (cause, component, "
                                          "rate_per_chip_hour, repair_s)")
    if len(rows) > MAX_ROWS:
        raise InvalidArgument("failures", f"at most {MAX_ROWS} rows, got {len(rows)}")
    return RateTable(tuple(parse_row(r, f"failures[{i}]") for i, r in enumerate(rows)))


TableFactory = Callable[[], RateTable]
TABLES: Registry[TableFactory] = Registry("failure table", field="table", group="gigacluster.failures")
"""Built-in failure tables by name (the injector's ``table``, when it is not a YAML file)."""
TABLES.register("llama3", llama3)


def load_table(name_or_path: str) -> RateTable:
    """A built-in table by name (``llama3``) or a YAML file's."""
    if name_or_path in TABLES.names() or not name_or_path.endswith((".yaml", ".yml")):
        return TABLES.lookup(name_or_path)()
    path = pathlib.Path(name_or_path)
    if not path.is_file():
        raise InvalidArgument("table", f"no failure table file {name_or_path[:80]!r}")
    try:
        data = safeyaml.load_file(path)
    except safeyaml.YamlError as exc:
        raise InvalidArgument("table", str(exc)[:160]) from None
    return parse_table(data)
