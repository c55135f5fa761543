"""Collective protocols: LL, LL128 and Simple, as NCCL and RCCL run them.

A protocol decides how much of what crosses the wire is payload, what each algorithm step costs
and what one call costs before its first step (catalog ``efficiency.comm.protocols``, sourced
there: NCCL's tuning model)::

    ll      8-byte lines, 4 bytes data + 4 bytes flag: half the wire is payload, the cheapest step
    ll128   128-byte lines, 120 bytes data: 15/16 payload, a mid-cost step
    simple  payload only, chunked with a barrier per step: full bandwidth, the costliest step

A plan's phases carry their protocol (:attr:`Phase.proto`): the wire bytes of a phase are its
payload bytes over the protocol's wire efficiency, so the flow solver sees the flag bytes too; each
step pays the larger of the protocol's ``step_s`` and the path latency (NCCL's per-hop figure holds
the link's own traversal), and a call pays the protocol's ``base_s`` once. The collective policy
costs every (algorithm, protocol) pair the chip runs and keeps the fastest, so small messages run
LL, mid-size ones LL128 and large ones Simple, which is what NCCL's tuner does. A protocol lists
the chips whose library does not run it (``unsupported_chips``: RCCL has no LL128 before gfx950).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from gigacluster.hw.catalog import _raw
from gigacluster.model import SpecError

DEFAULT_PROTOCOL = "simple"


class Protocol(NamedTuple):
    """One protocol: the payload share of wire bytes, the cost of one algorithm step and of one call,
    and the chips whose collective library does not run it."""

    name: str
    wire_efficiency: float
    step_s: float
    base_s: float
    unsupported_chips: frozenset[str]

    def runs_on(self, chip: str) -> bool:
        """Whether the collective library of ``chip`` runs this protocol."""
        return chip not in self.unsupported_chips


def _checked(name: str, entry: dict[str, Any]) -> Protocol:
    """The catalog entry of protocol ``name``, its values in range (SpecError naming the field otherwise)."""
    p = Protocol(name, float(entry["wire_efficiency"]), float(entry["step_s"]), float(entry["base_s"]),
                 frozenset(str(c) for c in entry.get("unsupported_chips", ())))
    if not 0 < p.wire_efficiency <= 1:
        raise SpecError(f"efficiency.comm.protocols.{name}.wire_efficiency", "must be in (0, 1]")
    for field in ("step_s", "base_s"):
        if getattr(p, field) < 0:
            raise SpecError(f"efficiency.comm.protocols.{name}.{field}", "must be >= 0")
    return p


@functools.cache
def protocols() -> dict[str, Protocol]:
    """The catalog's protocols by name, fastest step first."""
    table = _raw()["efficiency"]["comm"]["protocols"]
    out = {n: _checked(n, v) for n, v in table.items()}
    if DEFAULT_PROTOCOL not in out:
        raise SpecError("efficiency.comm.protocols", f"must define {DEFAULT_PROTOCOL!r}")
    if out[DEFAULT_PROTOCOL].unsupported_chips:
        raise SpecError(f"efficiency.comm.protocols.{DEFAULT_PROTOCOL}.unsupported_chips", "must be empty")
    return dict(sorted(out.items(), key=lambda kv: kv[1].step_s))


def get_protocol(name: str) -> Protocol:
    """The protocol ``name``; SpecError('protocol') listing the allowed ones otherwise."""
    table = protocols()
    if name not in table:
        raise SpecError("protocol", f"unknown protocol {name!r}; allowed: {', '.join(table)}")
    return table[name]


def protocols_for(chip: str) -> tuple[str, ...]:
    """The protocols the collective library of ``chip`` runs, fastest step first."""
    return tuple(n for n, p in protocols().items() if p.runs_on(chip))


__all__ = ["DEFAULT_PROTOCOL", "Protocol", "get_protocol", "protocols", "protocols_for"]
