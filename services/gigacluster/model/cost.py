"""Dollar cost of a job: chip-hours at the catalog price plus facility energy at $/kWh."""

from __future__ import annotations

import dataclasses

from gigacluster.hw.catalog import Chip, facility
from gigacluster.model import SpecError
from gigacluster.model.power import J_PER_KWH


@dataclasses.dataclass(frozen=True)
class JobCost:
    """Cost split of one job, US dollars."""

    chip_hours: float
    chip_usd: float
    energy_kwh: float
    energy_usd: float

    @property
    def total_usd(self) -> float:
        """Chip rental plus energy."""
        return self.chip_usd + self.energy_usd


def job_cost(
    chip: Chip,
    chips: int,
    duration_s: float,
    facility_energy_j: float,
    *,
    energy_price_usd_per_kwh: float | None = None,
) -> JobCost:
    """Cost of ``chips`` of ``chip`` for ``duration_s`` drawing ``facility_energy_j``.

    The catalog price per chip-hour is an assumed cloud rate (override with
    ``GIGACLUSTER_PRICE_<CHIP>``); energy defaults to the catalog facility price.
    """
    price = facility().energy_price_usd_per_kwh if energy_price_usd_per_kwh is None else energy_price_usd_per_kwh
    if price < 0:
        raise SpecError("energy_price_usd_per_kwh", f"must be >= 0, got {price!r}")
    if chips < 0 or duration_s < 0 or facility_energy_j < 0:
        raise SpecError("cost", "chips, duration and energy must be >= 0")
    chip_hours = chips * duration_s / 3600.0
    kwh = facility_energy_j / J_PER_KWH
    return JobCost(chip_hours, chip_hours * chip.price_per_hour_usd, kwh, kwh * price)
