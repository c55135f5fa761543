"""Golden hashes of routes: the routing modes, moved from an ``if`` on a string into registered
functions (issue 12), route every flow exactly as before, with and without dead links.

The hashes were computed with ``fabric/routing.py`` as it was before the change.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from gigacluster.fabric.routing import route
from gigacluster.fabric.topology import TopologyConfig, build_topology

CASES = [(tiers, mode, dead) for tiers in (2, 3) for mode in ("ecmp", "spray") for dead in (0, 40)]
GOLDEN: dict[str, str] = {
    "2-ecmp-0": "ab713d31e26900aba6a7da9b4e81ed0f4e295383613414c0dafe2597f9308471",
    "2-ecmp-40": "3fb8e2b058354d37a67ac45cc2a5914024a8cfe41a85f48dc5dc55680306fd94",
    "2-spray-0": "fb538cd7003f8624223dc043c425159abdc49baddd80a7d25acd93314f51ec74",
    "2-spray-40": "b9f309a7bda504e98efe16785da15cf233f2b62040315e99e1130db6cec6c824",
    "3-ecmp-0": "a13d34e0b1f6031d04c01f3d1deedd2cef8d03648d8fea8bb1904923130a540e",
    "3-ecmp-40": "f8364ff1a82d4f4558a3a09f63c03ff990926b66d165abd28423af40d13e2be0",
    "3-spray-0": "38bbb7d6458b2cfd1b598be656ce40b1d360b25d0a78092dd0abe67de5f92bd1",
    "3-spray-40": "9bddb64390427e13eefad7fe2b119fde63815213eff620fab346b51fa9757b45",
}


def route_digest(tiers: int, mode: str, dead: int) -> str:
    """SHA-256 of every array of the routes of 5,000 random flows (seeded) on an H100 fat-tree."""
    topo = build_topology(TopologyConfig(chip="h100-sxm", count=4096 if tiers == 3 else 1024, tiers=tiers))
    rng = np.random.default_rng(7)
    s, d = rng.integers(0, topo.n_chips, 5000), rng.integers(0, topo.n_chips, 5000)
    alive = None
    if dead:
        alive = np.ones(topo.n_links, dtype=bool)
        alive[rng.choice(np.flatnonzero(topo.link_tier >= 2), dead, replace=False)] = False
    r = route(topo, s, d, np.arange(5000), alive=alive, mode=mode)
    h = hashlib.sha256()
    for a in (r.e_flow, r.e_link, r.e_coef, r.latency_s, r.ok):
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize(("tiers", "mode", "dead"), CASES)
def test_routes_unchanged(tiers: int, mode: str, dead: int) -> None:
    """ECMP and spraying give the same incidence, latency and reachability as before the registry."""
    assert route_digest(tiers, mode, dead) == GOLDEN[f"{tiers}-{mode}-{dead}"]
