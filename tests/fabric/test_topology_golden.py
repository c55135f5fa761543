"""Golden hashes of built topologies: a refactor of the builders must leave every array identical.

The hashes were computed with the single ``build_topology`` function as it was before it was split
into one builder per topology family (issue 12); any change to a node, link, index table or
attribute of these configurations changes a hash.

Re-computed once in issue 15, for two deliberate changes only: ``TopologyConfig`` gained
``nics_per_node`` (its repr is hashed; every other array of the non-mesh families was checked
identical against the old hashes), and MI300X-platform links are built at the MI300X's own
scale-up efficiency (0.75, catalog ``efficiency.comm.chips``) instead of HGX's 0.82.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

from gigacluster.fabric.topology import Topology, TopologyConfig, build_topology

CONFIGS: dict[str, dict[str, object]] = {
    "hgx-2tier": {"chip": "h100-sxm", "count": 64},
    "hgx-small": {"chip": "h100-sxm", "count": 4},
    "hgx-3tier-oversub": {"chip": "h100-sxm", "count": 1536, "tiers": 3, "oversubscription": 3.0},
    "hgx-thor-th6": {"chip": "b200", "count": 256, "nic": "thor-ultra", "switch": "tomahawk6"},
    "mesh": {"chip": "mi300x", "count": 64},
    "mesh-partial": {"chip": "mi300x", "count": 5},
    "torus": {"chip": "trainium2", "count": 64},
    "torus-ring": {"chip": "trainium2", "system": "trn2-ultraserver", "count": 128, "tiers": 3},
    "switch-144": {"chip": "trainium3", "system": "trn3-ultraserver-144", "count": 288},
}

GOLDEN: dict[str, str] = {
    "hgx-2tier": "bebdaac7f763dd17bd7e89903f9b06f024da2b05c1c1f9fcd4fd802a9a2ef666",
    "hgx-3tier-oversub": "d356fb35c1e5eb6da9632d85bea6510e9d845ec5789473e07aba4a64216fc004",
    "hgx-small": "8ec53ddb78451a67bf4577975a821f2e12a442c47601d4aae430e75efac2f6bf",
    "hgx-thor-th6": "5698096bf459417c97dd848c99ff42d83439a548644025069ed813ad59e2a3d6",
    "mesh": "51f0ecd4a0869452dc43aecab2f18eba4b63254693a520a8cf700d8ef54b9762",
    "mesh-partial": "1c78d6cc16ea28289a9ae7bae97526221cb08d7bf96ed47d2bbe526527e964b4",
    "switch-144": "f251ee431486ff4c43c3bf73b80fe0908dcc9531ccd31b2bc81a37bb4ef843ea",
    "torus": "e9f2566e226e9bab9a7b6389948f08e6349b4e939da5ece6693b60fbfb208db7",
    "torus-ring": "d28c3d98ce65441908e59788f6f13b1cefe67b39dadd5e15062cf9d16e35e895",
}


def topology_digest(topo: Topology) -> str:
    """SHA-256 over every field of ``topo`` (arrays by dtype, shape and bytes; the rest by repr)."""
    h = hashlib.sha256()
    for f in dataclasses.fields(topo):
        v = getattr(topo, f.name)
        h.update(f.name.encode())
        if isinstance(v, np.ndarray):
            h.update(f"{v.dtype.str}{v.shape}".encode())
            h.update(np.ascontiguousarray(v).tobytes())
        elif isinstance(v, dict):
            h.update(repr(sorted(v.items())).encode())
        else:
            h.update(repr(v).encode())
    return h.hexdigest()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_topology_arrays_unchanged(name: str) -> None:
    """Each topology family builds exactly the arrays it built before the builders were split."""
    topo = build_topology(TopologyConfig(**CONFIGS[name]))  # type: ignore[arg-type]
    assert topology_digest(topo) == GOLDEN[name]
