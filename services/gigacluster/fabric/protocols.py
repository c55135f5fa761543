"""Collective protocols: LL, LL128 and Simple, as NCCL and RCCL run them.

A protocol decides how much of what crosses the wire is payload and what each algorithm step
costs in software (catalog ``efficiency.comm.protocols``, sourced there)::

    ll      8-byte lines, 4 bytes data + 4 bytes flag: half the wire is payload, the cheapest step
    ll128   128-byte lines, 120 bytes data: 15/16 payload, a mid-cost step
    simple  payload only, chunked with a barrier per step: full bandwidth, the costliest step

A plan's phases carry their protocol (:attr:`Phase.proto`): the wire bytes of a phase are its
payload bytes over the protocol's wire efficiency, so the flow solver sees the flag bytes too, and
each step pays the protocol's ``step_s`` on top of the path latency. The collective policy costs
every (algorithm, protocol) pair and keeps the fastest, so small messages run LL, mid-size ones
LL128 and large ones Simple, which is what NCCL's tuner does.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from gigacluster.hw import catalog
from gigacluster.hw.catalog import _raw
from gigacluster.model import SpecError

DEFAULT_PROTOCOL = "simple"


class Protocol(NamedTuple):
    """One protocol: the payload share of wire bytes and the software cost of one algorithm step."""

    name: str
    wire_efficiency: float
    step_s: float


def _checked(name: str, entry: dict[str, Any]) -> Protocol:
    """The catalog entry of protocol ``name``, its values in range (SpecError naming the field otherwise)."""
    p = Protocol(name, float(entry["wire_efficiency"]), float(entry["step_s"]))
    if not 0 < p.wire_efficiency <= 1:
        raise SpecError(f"efficiency.comm.protocols.{name}.wire_efficiency", "must be in (0, 1]")
    if p.step_s < 0:
        raise SpecError(f"efficiency.comm.protocols.{name}.step_s", "must be >= 0")
    return p


@functools.cache
def protocols() -> dict[str, Protocol]:
    """The catalog's protocols by name, fastest step first."""
    table = _raw()["efficiency"]["comm"]["protocols"]
    out = {n: _checked(n, v) for n, v in table.items()}
    if DEFAULT_PROTOCOL not in out:
        raise SpecError("efficiency.comm.protocols", f"must define {DEFAULT_PROTOCOL!r}")
    return dict(sorted(out.items(), key=lambda kv: kv[1].step_s))


def get_protocol(name: str) -> Protocol:
    """The protocol ``name``; SpecError('protocol') listing the allowed ones otherwise."""
    table = protocols()
    if name not in table:
        raise SpecError("protocol", f"unknown protocol {name!r}; allowed: {', '.join(table)}")
    return table[name]


def launch_s() -> float:
    """The fixed cost of one collective call (catalog ``network.collective_launch_s``)."""
    return float(catalog.network().get("collective_launch_s", 0.0))


__all__ = ["DEFAULT_PROTOCOL", "Protocol", "get_protocol", "launch_s", "protocols"]
