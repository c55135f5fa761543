"""The fabric's link faults, durable across ``kill -9`` (no gRPC).

``<state_dir>/fabric-link-faults.json`` names the links that are down and the degraded ones with their
capacity factor (a switch fault is its links). It is rewritten atomically by every ``InjectLinkFault`` and
``ClearLinkFault`` before the call answers, so a fault the caller was told about is never lost: a fabric
restarted on the same state directory takes the same links down again before it serves, and chips behind
them stay cut off (``GetLinkStats.cut_off_chips``). Without a state directory nothing is persisted.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import structlog

from gigacluster.durable import write_json_atomic
from gigacluster.errors import FailedPrecondition
from gigacluster.fabric.sim import FlowSim

log = structlog.get_logger()
VERSION = 1


class LinkStore:
    """The link-fault file of one fabric (``path`` None: nothing is persisted)."""

    def __init__(self, path: pathlib.Path | None) -> None:
        self.path = path

    @classmethod
    def for_state_dir(cls, state_dir: str) -> LinkStore:
        return cls(pathlib.Path(state_dir) / "fabric-link-faults.json" if state_dir else None)

    def save(self, sim: FlowSim) -> None:
        """Persist which links are down or degraded now (the whole state, never a delta)."""
        if self.path is None:
            return
        alive, factor = sim.link_alive, sim.link_factor
        name = sim.topo.link_name
        write_json_atomic(self.path, {
            "version": VERSION, "down": [name(i) for i in np.flatnonzero(~alive).tolist()],
            "degraded": [[name(i), float(factor[i])] for i in np.flatnonzero(alive & (factor < 1.0)).tolist()]})

    def restore(self, sim: FlowSim) -> int:
        """Take the persisted faults down again on ``sim`` (before it serves); returns the links affected. A
        link this topology does not have is skipped with a warning (the fabric was started with another size)."""
        if self.path is None or not self.path.is_file():
            return 0
        try:
            raw: Any = json.loads(self.path.read_text())
            if raw.get("version") != VERSION:
                raise ValueError(f"version {str(raw.get('version'))[:20]!r}, expected {VERSION}")
            down = [str(n) for n in raw["down"]]
            degraded = [(str(n), float(f)) for n, f in raw["degraded"]]
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise FailedPrecondition(f"{self.path} is not a link-fault file this fabric can read ({str(exc)[:80]}): "
                                     "restore it or remove it (the fabric then starts with every link up)") from None
        n = 0
        for link, factor in [(d, 0.0) for d in down] + degraded:
            try:
                lid = sim.topo.link_id_by_name(link)
                if factor == 0.0:
                    sim.fail_link(lid)
                else:
                    sim.degrade_link(lid, factor)
            except Exception as exc:  # noqa: BLE001 - an unknown link or a bad factor: skip it, say so
                log.warning("persisted link fault not restored", link=link[:80], error=str(exc)[:120])
                continue
            n += 1
        return n
