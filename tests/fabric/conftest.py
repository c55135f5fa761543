"""Shared small topologies for the fabric tests (built once per session: they are immutable)."""

from __future__ import annotations

import pytest

from gigacluster.fabric.topology import Topology, TopologyConfig, build_topology


@pytest.fixture(scope="session")
def hgx16() -> Topology:
    """Two HGX H100 nodes on a two-tier fat-tree with 400G NICs."""
    return build_topology(TopologyConfig(chip="h100-sxm", count=16))


@pytest.fixture(scope="session")
def oversub_spray() -> Topology:
    """1,536 H100 (192 nodes, two leaf groups) at 3:1 oversubscription with packet spraying."""
    return build_topology(TopologyConfig(chip="h100-sxm", count=1536, oversubscription=3.0, routing="spray"))


@pytest.fixture(scope="session")
def two_groups() -> Topology:
    """1,024 H100 (128 nodes, two leaf groups) at 1:1 with ECMP: rail-0 chips of node 0 and 64 cross the spine."""
    return build_topology(TopologyConfig(chip="h100-sxm", count=1024))
