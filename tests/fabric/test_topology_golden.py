"""Golden hashes of built topologies: a refactor of the builders must leave every array identical.

The hashes were computed with the single ``build_topology`` function as it was before it was split
into one builder per topology family (issue 12); any change to a node, link, index table or
attribute of these configurations changes a hash.
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
    "hgx-2tier": "bb33b8637157fde3761893858513f4ae69693d758d1bc9846e611c22696a2fde",
    "hgx-3tier-oversub": "0ccab36fd1926322ac068315fed26c3d4bbcd746f1281a73f2990c67eb17c478",
    "hgx-small": "c87f737fa1cc6002e41f2110c23d116ba18ec21539e64eab2baf65d48843a0eb",
    "hgx-thor-th6": "463322669600b376c53b069efadee9e941b60d26618bc04211c89ecb892b5564",
    "mesh": "7eb5967fe4c0012c221c5723b5ed1f6673044cbc381869ea5a5ad8e5d12e9cc6",
    "mesh-partial": "92da26f0a83274d3a1b162cbd234a38aa38500b3426cf76e14b6889ed54360fc",
    "switch-144": "4dc5c806e1f17d2da8d814825f2bf8492a8a16ad2ff1b20ec8e8b665b659d825",
    "torus": "7559d8ca9b0e22df0d6eaf1ba9e6002055efcd4a2cc8d159584c53fd6d533791",
    "torus-ring": "b05a3fdfdb0a7d8ef629a9e58d2083ded7d33eaca03658a51e03ddcc6449c70d",
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
