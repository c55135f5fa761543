"""The injector's durable state: where in its seeded sequence it is and which faults await repair (no gRPC).

``faults-state.json`` (rewritten atomically after every injection and repair) holds the run's settings
(seed, table, start time), the index of the next failure to inject and the faults still to clear;
``faults-log.jsonl`` gets one line per action. A killed injector started again on the same state
directory regenerates the same sequence, skips what it had injected, clears what is due and injects
what fell due while it was down: nothing it had accepted is lost, and nothing is injected twice
(an injection whose record did not reach the disk is repeated, which the chips and links take as a
no-op). Without a state directory the state lives in memory only.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Any

from gigacluster.durable import write_json_atomic
from gigacluster.errors import FailedPrecondition

STATE_FILE = "faults-state.json"
LOG_FILE = "faults-log.jsonl"


@dataclasses.dataclass
class Active:
    """An injected fault awaiting repair at virtual ``t_end_s``: chip ``devices`` or fabric ``links``."""

    index: int
    t_end_s: float
    cause: str
    component: str
    devices: list[int] = dataclasses.field(default_factory=list)
    links: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Journal:
    """The injector's progress, persisted under ``directory`` (None: in memory)."""

    directory: pathlib.Path | None
    seed: int
    table: str
    scale: float
    start_s: float | None = None
    next_index: int = 0
    active: list[Active] = dataclasses.field(default_factory=list)

    @classmethod
    def open(cls, directory: str | os.PathLike[str] | None, *, seed: int, table: str, scale: float) -> Journal:
        """The journal of ``directory``, or a fresh one; a directory holding another run's state is refused."""
        d = pathlib.Path(directory) if directory else None
        j = cls(d, seed, table, scale)
        if d is None or not (d / STATE_FILE).is_file():
            return j
        raw: dict[str, Any] = json.loads((d / STATE_FILE).read_text())
        for name in ("seed", "table", "scale"):
            if raw.get(name) != getattr(j, name):
                raise FailedPrecondition(f"{d / STATE_FILE} holds a run with {name} {str(raw.get(name))[:60]!r}, not "
                                         f"{str(getattr(j, name))[:60]!r}: use another state_dir for another run")
        j.start_s = raw.get("start_s")
        j.next_index = int(raw.get("next_index", 0))
        j.active = [Active(**a) for a in raw.get("active", [])]
        return j

    def save(self) -> None:
        """Write the state atomically (a temporary file, fsync, rename)."""
        if self.directory is None:
            return
        write_json_atomic(self.directory / STATE_FILE, {
            "seed": self.seed, "table": self.table, "scale": self.scale, "start_s": self.start_s,
            "next_index": self.next_index, "active": [dataclasses.asdict(a) for a in self.active]})

    def log(self, event: dict[str, Any]) -> None:
        """Append one action to the log (fsynced)."""
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / LOG_FILE).open("a") as f:
            f.write(json.dumps(event) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_log(directory: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every action of the log under ``directory`` (empty if none)."""
    path = pathlib.Path(directory) / LOG_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
