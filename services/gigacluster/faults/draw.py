"""The seeded draw of failures over a mesh, and what each one breaks (no gRPC).

Failures are a Poisson process over the mesh's chips: at ``table.rate_per_chip_s x n_chips`` per
second, each one a row of the table in proportion to its rate, landing on a chip drawn uniformly. The
same seed gives the same sequence, so the injector regenerates it after a restart and resumes at the
first failure it had not injected, and the offline goodput model (``faults.goodput``) sees exactly
the failures the live run is given.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np

from gigacluster.errors import InvalidArgument
from gigacluster.faults.table import EFFECTS, RateTable


@dataclasses.dataclass(frozen=True)
class Fault:
    """One drawn failure: the ``index``-th of its sequence, at virtual ``t_s``, landing on ``device``."""

    index: int
    t_s: float
    cause: str
    component: str
    device: int
    repair_s: float

    @property
    def effect(self) -> str:
        """What the scheduler makes of it (device, host, network or software)."""
        return EFFECTS[self.component]


def draw(table: RateTable, *, n_chips: int, seed: int, start_s: float = 0.0) -> Iterator[Fault]:
    """The failures of a mesh of ``n_chips`` from virtual time ``start_s`` on (an endless iterator; empty
    when every rate is 0)."""
    if n_chips < 1:
        raise InvalidArgument("n_chips", f"must be >= 1, got {n_chips}")
    lam = table.rate_per_chip_s * n_chips
    if not lam > 0:
        return
    rng = np.random.default_rng(seed)
    p = np.asarray(table.shares())
    t = start_s
    i = 0
    while True:
        t += float(rng.exponential(1.0 / lam))
        row = table.rows[int(rng.choice(len(p), p=p))]
        dev = int(rng.integers(n_chips))
        yield Fault(i, t, row.cause, row.component, dev, row.repair_s)
        i += 1


@dataclasses.dataclass(frozen=True)
class Target:
    """What a fault breaks: chip ``devices`` (``chip_kind`` failed or hbm), or the NIC links of ``nic_of``."""

    devices: tuple[int, ...] = ()
    chip_kind: str = "failed"
    nic_of: int = -1

    @property
    def is_link(self) -> bool:
        return self.nic_of >= 0


def target(fault: Fault, domain_size: int) -> Target:
    """The chips or links ``fault`` breaks; a host is the chip's scale-up domain of ``domain_size`` chips."""
    comp = fault.component
    if comp in ("switch_cable", "nic"):
        return Target(nic_of=fault.device)
    if comp == "host":
        first = fault.device // domain_size * domain_size
        return Target(devices=tuple(range(first, first + domain_size)))
    return Target(devices=(fault.device,), chip_kind="hbm" if comp == "hbm" else "failed")


def hits(fault: Fault, domain_size: int, job: range) -> bool:
    """Whether ``fault`` strikes a job running on the chips of ``job``."""
    tg = target(fault, domain_size)
    return (tg.nic_of in job) if tg.is_link else any(d in job for d in tg.devices)


def mean_time_between_s(table: RateTable, chips: int) -> float:
    """Mean seconds between failures striking a job of ``chips`` (inf with no failures)."""
    lam = table.rate_per_chip_s * chips
    return 1.0 / lam if lam > 0 else math.inf
