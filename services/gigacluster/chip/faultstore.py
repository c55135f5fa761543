"""A chip shard's injected faults, durable across ``kill -9`` (no gRPC).

``<state_dir>/chip-<chip>-<offset>-faults.json`` holds the shard's faulted devices as runs of equal
(kind, clock factor, repair time) (:meth:`ChipShard.fault_runs`): a few records whatever the shard's
size. It is rewritten atomically (temporary file, fsync, rename) by every ``InjectFault`` and
``ClearFault`` before the call answers, so a fault the caller was told about is never lost: a shard
restarted on the same state directory is faulted again at start, with the same repair times, and a
repair that fell due while it was down applies at its first call. Repairs themselves are not written:
the stored repair time replays them. Without a state directory the faults live in memory only.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

from gigacluster.chip.shard import FAULT_FAILED, FAULT_HBM, FAULT_SLOW, FaultRun
from gigacluster.durable import write_json_atomic
from gigacluster.errors import FailedPrecondition

VERSION = 1


class FaultStore:
    """The fault file of one shard (``path`` None: nothing is persisted)."""

    def __init__(self, path: pathlib.Path | None) -> None:
        self.path = path

    @classmethod
    def for_shard(cls, state_dir: str, chip: str, offset: int) -> FaultStore:
        """The store of the shard of ``chip`` devices from ``offset`` under ``state_dir`` (empty: in memory)."""
        return cls(pathlib.Path(state_dir) / f"chip-{chip}-{offset}-faults.json" if state_dir else None)

    def save(self, runs: list[FaultRun]) -> None:
        """Persist the shard's faults (all of them: the file is the whole state, never a delta)."""
        if self.path is None:
            return
        write_json_atomic(self.path, {"version": VERSION, "faults": [
            [r.start, r.end, r.kind, r.clock_factor, None if math.isinf(r.repair_at_s) else r.repair_at_s]
            for r in runs]})

    def load(self) -> list[FaultRun]:
        """The persisted runs (none without a file); a file this version cannot read is refused, naming it."""
        if self.path is None or not self.path.is_file():
            return []
        try:
            raw: Any = json.loads(self.path.read_text())
            if raw.get("version") != VERSION:
                raise ValueError(f"version {str(raw.get('version'))[:20]!r}, expected {VERSION}")
            return [_run(rec) for rec in raw["faults"]]
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise FailedPrecondition(f"{self.path} is not a fault file this shard can read ({str(exc)[:80]}): "
                                     "restore it or remove it (the shard then starts with no faults)") from None


def _run(rec: Any) -> FaultRun:
    start, end, kind, factor, repair = rec
    if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end):
        raise ValueError(f"bad device range {str(rec)[:40]}")
    if kind not in (FAULT_FAILED, FAULT_HBM, FAULT_SLOW):
        raise ValueError(f"bad fault kind {str(kind)[:20]}")
    if not (isinstance(factor, int | float) and 0 < factor <= 1):
        raise ValueError(f"bad clock factor {str(factor)[:20]}")
    if repair is not None and not (isinstance(repair, int | float) and math.isfinite(repair)):
        raise ValueError(f"bad repair time {str(repair)[:20]}")
    return FaultRun(start, end, int(kind), float(factor), math.inf if repair is None else float(repair))
