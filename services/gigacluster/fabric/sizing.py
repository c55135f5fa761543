"""The scale-out fat-tree a cluster size needs: the smallest that holds the chips.

Two tiers of Tomahawk 5 if they fit, else three tiers of Tomahawk 5, else three of Tomahawk 6; a
tier count or switch given explicitly is kept, and a size no tree holds is refused with the trees
tried. Only the tree's sizes are computed (numpy over the chips, milliseconds at a million), not
its links. ``gigacluster up`` and the fabric service use it, so no size needs a hidden setting.
"""

from __future__ import annotations

import dataclasses

from gigacluster.fabric.builders import SCALEOUT_BUILDERS, context
from gigacluster.fabric.topology import TopologyConfig
from gigacluster.hw import catalog
from gigacluster.model import SpecError

#: Scale-out trees tried in order, smallest first: (tiers, switch).
SCALEOUT_ORDER: tuple[tuple[int, str], ...] = ((2, "tomahawk5"), (3, "tomahawk5"), (3, "tomahawk6"))


@dataclasses.dataclass(frozen=True)
class Scaleout:
    """The scale-out fat-tree of a cluster: tiers, switch, NIC (``""`` = the chip's own catalog NIC)."""

    tiers: int
    switch: str
    nic: str = ""


def choose_scaleout(chip: str, count: int, *, system: str = "", nic: str = "", tiers: int = 0, switch: str = "",
                    oversubscription: float = 1.0) -> Scaleout:
    """The smallest fat-tree that holds ``count`` chips; ``tiers`` / ``switch`` given (non-zero, non-empty) are kept.

    Only the tree's sizes are computed (numpy over the chips, milliseconds at a million), not its links.
    """
    if tiers not in (0, 2, 3):
        raise SpecError("tiers", f"allowed: 2, 3 (or 0 = chosen from the size); got {tiers!r}")
    switches = sorted(catalog.network()["switches"])
    if switch and switch not in switches:
        raise SpecError("switch", f"unknown switch {switch!r}; allowed: {', '.join(switches)}")
    order = [(t, s) for t, s in SCALEOUT_ORDER if (not tiers or t == tiers) and (not switch or s == switch)]
    if not order:  # both given explicitly, or a switch the default order does not try
        order = [(tiers or 3, switch)]
    last: SpecError | None = None
    for t, s in order:
        cfg = TopologyConfig(chip=chip, count=count, system=system or None, nic=nic or None, switch=s, tiers=t,
                             oversubscription=oversubscription)
        try:
            SCALEOUT_BUILDERS[t](context(cfg))
        except SpecError as err:
            last = err
            continue
        return Scaleout(t, s, nic)
    assert last is not None
    why = last.message.removeprefix(f"{last.field}: ")
    raise SpecError(last.field, f"{why} (tried {', '.join(f'{t} tiers of {s}' for t, s in order)})")


__all__ = ["SCALEOUT_ORDER", "Scaleout", "choose_scaleout"]
