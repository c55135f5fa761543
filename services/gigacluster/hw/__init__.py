"""Hardware catalog: chips, scale-up systems, network parts and facility constants.

Exceptions::

    CatalogError (ValueError)
    └── UnknownHardwareError   a chip, system or part name not in the catalog
"""

from gigacluster.hw.catalog import (
    CatalogError,
    Chip,
    Facility,
    System,
    UnknownHardwareError,
    chip_names,
    default_system,
    facility,
    get_chip,
    get_system,
    network,
    system_names,
)

__all__ = [
    "CatalogError",
    "Chip",
    "Facility",
    "System",
    "UnknownHardwareError",
    "chip_names",
    "default_system",
    "facility",
    "get_chip",
    "get_system",
    "network",
    "system_names",
]
