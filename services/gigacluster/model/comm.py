"""Collective communication time: the :class:`CommModel` interface and the alpha-beta default.

The training model asks for the time of one collective of one parallel group, described by a
:class:`GroupLayout` (how many ranks, how many of them share a scale-up domain, how many such
groups run at once in one domain). The flow-level fabric model (``gigacluster.fabric``) provides
another implementation of the same protocol.

:class:`AlphaBetaCommModel` (the default) is the textbook ring model, made hierarchical when a
group spans several scale-up domains (reduce-scatter inside the domain, the cross-domain part on
the NICs, all-gather inside the domain)::

    t = steps x alpha + bus_factor(op, n) x bytes_ / bus_bandwidth

with ``bus_factor`` the nccl-tests bus-bandwidth factor (all-reduce 2(n-1)/n; reduce-scatter,
all-gather, all-to-all (n-1)/n; broadcast, send_recv 1) and the bus bandwidth the per-rank link
rate times a measured bus fraction (catalog ``efficiency.comm``; a chip's own scale-up fraction under
``efficiency.comm.chips`` where it has one, e.g. A100, MI300X). ``bytes_`` is the per-rank
message size as nccl-tests counts it (for all-gather, the gathered output).

All-reduce on chips whose NVSwitch reduces is also priced as NCCL's NVLink SHARP algorithms and the
cheaper of the two taken, as NCCL's tuner takes the cheaper: NVLS inside one domain (``(1 + 1/n) S`` per
GPU link, 2 steps) and NVLSTree across domains (NVLS inside each, NCCL's double binary tree between the
domains' heads, bounded by NCCL's per-channel ceiling, with NCCL's latency). The rules (3+ ranks per
domain, all-reduce only, which chips) and constants are :mod:`gigacluster.model.nvls`, the same code the
flow model's ``nvls`` and ``nvls_tree`` run.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Protocol, runtime_checkable

from gigacluster.hw.catalog import Chip, _raw, get_system
from gigacluster.model import SpecError
from gigacluster.model.nvls import nvls_runs, nvls_time_s, nvls_tree_runs, nvls_tree_time_s

OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv")
"""The collective operations, the one table every model and wire mapping is built from."""


def check_op(op: str) -> None:
    """Raise ``SpecError('op')`` listing :data:`OPS` unless ``op`` is one of them."""
    if op not in OPS:
        raise SpecError("op", f"unknown collective {op!r}; allowed: {', '.join(OPS)}")


@dataclasses.dataclass(frozen=True)
class GroupLayout:
    """Shape of one parallel group on the machine."""

    size: int  # ranks in one group
    ranks_per_domain: int  # ranks of one group inside one scale-up domain
    groups_sharing_domain: int = 1  # groups of this kind that run at once and share a domain's NICs

    def __post_init__(self) -> None:
        if self.size < 1:
            raise SpecError("layout.size", f"must be >= 1, got {self.size!r}")
        if not 1 <= self.ranks_per_domain <= self.size:
            raise SpecError(
                "layout.ranks_per_domain", f"must be in [1, size={self.size}], got {self.ranks_per_domain!r}"
            )
        if self.groups_sharing_domain < 1:
            raise SpecError("layout.groups_sharing_domain", "must be >= 1")

    @property
    def domains(self) -> int:
        """Scale-up domains the group spans."""
        return -(-self.size // self.ranks_per_domain)


@runtime_checkable
class CommModel(Protocol):
    """Seconds for one collective of one group."""

    def collective_time_s(self, chip: Chip, system: str, op: str, bytes_: float, layout: GroupLayout) -> float:
        """Time of one ``op`` of ``bytes_`` (per rank, nccl-tests convention) over ``layout``."""
        ...


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor: busbw = algbw * bus_factor(op, n), and the bytes each
    rank moves per byte of message in the ring model.

    As nccl-tests defines it (src/*.cu ``*GetBw``): all-reduce 2(n-1)/n; reduce-scatter, all-gather,
    all-to-all (n-1)/n; broadcast and send/recv 1 for every n, including n = 1.
    """
    check_op(op)
    if n < 1:
        raise SpecError("count", f"must be >= 1, got {n}")
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


volume_factor = bus_factor
"""The same factor under the name the training model's docs use."""


def ring_steps(op: str, n: int) -> int:
    """Latency terms of a ring algorithm."""
    if n <= 1:
        return 0
    if op == "all_reduce":
        return 2 * (n - 1)
    if op in ("send_recv", "broadcast"):
        return 1 if op == "send_recv" else n - 1
    return n - 1


@dataclasses.dataclass(frozen=True)
class CommParams:
    """Bus fractions and per-step latencies (catalog ``efficiency.comm``)."""

    scaleup_bus_fraction: float
    scaleout_bus_fraction: float
    scaleup_alpha_s: float
    scaleout_alpha_s: float

    def __post_init__(self) -> None:
        for f in ("scaleup_bus_fraction", "scaleout_bus_fraction"):
            if not 0 < getattr(self, f) <= 1:
                raise SpecError(f"efficiency.comm.{f}", "must be in (0, 1]")
        if self.scaleup_alpha_s < 0 or self.scaleout_alpha_s < 0:
            raise SpecError("efficiency.comm.alpha", "must be >= 0")


@functools.cache
def default_comm_params() -> CommParams:
    """The catalog's communication parameters."""
    c = _raw()["efficiency"]["comm"]
    return CommParams(*(float(c[f.name]) for f in dataclasses.fields(CommParams)))


def scaleup_bus_fraction(chip: str) -> float | None:
    """The chip's own scale-up bus fraction (catalog ``efficiency.comm.chips``), or None if it has none."""
    v = (_raw()["efficiency"]["comm"].get("chips") or {}).get(chip, {}).get("scaleup_bus_fraction")
    return None if v is None else float(v)


@dataclasses.dataclass(frozen=True)
class AlphaBetaCommModel:
    """Hierarchical ring alpha-beta model (see module docstring)."""

    params: CommParams = dataclasses.field(default_factory=default_comm_params)
    chip_overrides: bool = True  # apply the chip's own scale-up bus fraction (catalog efficiency.comm.chips)
    nvls: bool = True  # all-reduce also as NCCL's NVLS / NVLSTree where NCCL runs them, the cheaper one taken

    def scaleup_Bps(self, chip: Chip, system: str) -> float:
        """Per-rank, per-direction scale-up bandwidth inside one domain."""
        per_device = get_system(system).params.get("per_device_Bps")
        return min(float(per_device), chip.scaleup_Bps) if per_device is not None else chip.scaleup_Bps

    def collective_time_s(self, chip: Chip, system: str, op: str, bytes_: float, layout: GroupLayout) -> float:
        """Time of one collective (see module docstring)."""
        if bytes_ < 0:
            raise SpecError("bytes", f"must be >= 0, got {bytes_!r}")
        n = layout.size
        if n <= 1 or bytes_ == 0:
            return 0.0
        p = self.params
        frac = scaleup_bus_fraction(chip.name) if self.chip_overrides else None
        if frac is not None:
            p = dataclasses.replace(p, scaleup_bus_fraction=frac)
        sysd = get_system(system)
        r = min(layout.ranks_per_domain, n)
        d = layout.domains
        b_up = self.scaleup_Bps(chip, system) * p.scaleup_bus_fraction
        # Each rank drives its own NIC; when more ranks of concurrent groups sit in a domain than
        # it has NICs, they share them.
        nic_share = min(1.0, sysd.chips / (r * layout.groups_sharing_domain))
        b_out = chip.nic_Bps * nic_share * p.scaleout_bus_fraction
        if op == "send_recv":
            if d > 1:
                return p.scaleout_alpha_s + bytes_ / b_out
            return p.scaleup_alpha_s + bytes_ / b_up
        if d == 1:
            t_ring = ring_steps(op, n) * p.scaleup_alpha_s + bus_factor(op, n) * bytes_ / b_up
            if op == "all_reduce" and self.nvls and nvls_runs(chip.name, sysd.scaleup, n):
                # NVLS: the switch reduces, (1 + 1/n) S per GPU link, in NCCL's chunks (model.nvls)
                return min(t_ring, nvls_time_s(bytes_, n, chip.name, b_up))
            return t_ring
        # Hierarchical: the inner reduce-scatter/all-gather on scale-up, then the cross-domain
        # ring on 1/r of the data per rank over the domain's r NICs.
        t_inner = 0.0
        if r > 1:
            inner_op = "all_reduce" if op == "all_reduce" else op
            t_inner = ring_steps(inner_op, r) * p.scaleup_alpha_s + bus_factor(inner_op, r) * bytes_ / b_up
        outer_bytes = bytes_ / r
        t_outer = ring_steps(op, d) * p.scaleout_alpha_s + bus_factor(op, d) * outer_bytes / b_out
        if op == "all_to_all":
            # all-to-all: a fraction (n - r) / n of every rank's data leaves the domain.
            t_outer = (d - 1) * p.scaleout_alpha_s + bytes_ * (n - r) / n / b_out
        t = t_inner + t_outer
        if op == "all_reduce" and self.nvls and n == r * d and nvls_tree_runs(chip.name, sysd.scaleup, d, r):
            # NVLSTree (NCCL's default across NVLS nodes): each of the r ranks heads one channel on its own NIC
            t = min(t, nvls_tree_time_s(chip.name, d, r, bytes_, link_Bps=b_up, nic_Bps=b_out, heads=r))
        return t
