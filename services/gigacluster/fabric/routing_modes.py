"""Fabric routing modes: how a flow that crosses leaves is spread over the tier-2 (and core) choices.

A mode is a function of a :class:`Crossing` that appends the tier-2/tier-3 incidence entries of
the crossing flows and adds their latency, registered in :data:`ROUTING_MODES` (fabric config
``routing``, topology field ``routing``):

* ``ecmp``: one tier-2 switch per flow, ``j = h mod A`` among the live choices, then core
  ``c = h' mod C`` in plane ``j`` (equal-cost multi-path on a flow hash);
* ``spray``: packet spraying, the flow spread evenly over every live tier-2 choice (coefficient
  ``1/A`` on each), the core hop in each plane still chosen by hash;
* ``adaptive``: adaptive routing (NVIDIA Spectrum-X, Broadcom Tomahawk 5 cognitive routing, Thor
  Ultra): each packet or flowlet takes the least-loaded tier-2 choice. In a fluid flow model that
  balance is the even spread, so it is computed as ``spray``; the two differ on real fabrics in
  reordering and in reaction time, which this model does not represent.

This module holds no import of the topology builder at run time, so the topology's config can
check its ``routing`` name here without a cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gigacluster.registry import Registry

if TYPE_CHECKING:
    from gigacluster.fabric.topology import Topology

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_G = np.uint64(0x9E3779B97F4A7C15)

Entries = list[tuple[np.ndarray, np.ndarray, np.ndarray]]


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrap-around arithmetic is intended)."""
    x = x + _G
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _pick(mask: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the (h mod count)-th True column of ``mask``; and whether any was True."""
    count = mask.sum(axis=1)
    ok = count > 0
    k = np.zeros(mask.shape[0], dtype=np.int64)
    k[ok] = (h[ok] % count[ok].astype(np.uint64)).astype(np.int64)
    col = np.argmax(np.cumsum(mask, axis=1) > k[:, None], axis=1)
    return col, ok


class Crossing:
    """The flows of one ``route`` call that cross leaves: their leaves, pods, hashes, the live
    tier-2 choices, and the ``ok``/``latency``/``ents`` outputs (indexed by local flow) a mode fills."""

    def __init__(self, topo: Topology, cross: np.ndarray, lsx: np.ndarray, ldx: np.ndarray, hx: np.ndarray,
                 alive: np.ndarray | None, ok: np.ndarray, latency: np.ndarray, ents: Entries) -> None:
        self.topo, self.cross, self.lsx, self.ldx, self.hx, self.alive = topo, cross, lsx, ldx, hx, alive
        self.ok, self.latency, self.ents = ok, latency, ents
        self.a = topo.t2_per_pod
        self.c_n = topo.up3.shape[1]
        self.pod_s, self.pod_d = topo.leaf_pod[lsx], topo.leaf_pod[ldx]
        self.other_pod = self.pod_s != self.pod_d
        self.faulty = alive is not None and not alive[topo.link_tier >= 2].all()
        self.h2 = _mix(hx ^ np.uint64(0xA5A5A5A5))
        self.mask = self._tier2_mask()

    def _tier2_mask(self) -> np.ndarray | None:
        """Eligible tier-2 choices per crossing flow (None: all, no tier-2+ link is down)."""
        if not self.faulty:
            return None
        alive, topo, a = self.alive, self.topo, self.a
        assert alive is not None
        mask: np.ndarray = alive[topo.up2[self.lsx]] & alive[topo.down2[self.ldx]]
        op = np.flatnonzero(self.other_pod)
        if op.size and self.c_n:
            agg_s = self.pod_s[op, None] * a + np.arange(a)[None, :]
            agg_d = self.pod_d[op, None] * a + np.arange(a)[None, :]
            core_ok = (alive[topo.up3[agg_s]] & alive[topo.down3[agg_d]]).any(axis=2)
            mask[op] &= core_ok
        return mask

    def core_choice(self, rows: np.ndarray, j: np.ndarray, hh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Core switch (within plane ``j``) of crossing rows ``rows``, and whether a live one exists."""
        if not self.faulty:
            return (hh % np.uint64(self.c_n)).astype(np.int64), np.ones(rows.size, dtype=bool)
        assert self.alive is not None
        agg_s = self.pod_s[rows] * self.a + j
        agg_d = self.pod_d[rows] * self.a + j
        mask = self.alive[self.topo.up3[agg_s]] & self.alive[self.topo.down3[agg_d]]
        return _pick(mask, hh)


SpreadFn = Callable[[Crossing], None]
ROUTING_MODES: Registry[SpreadFn] = Registry("routing mode", field="routing", group="gigacluster.fabric_routing")
"""Fabric routing modes by name (fabric config ``routing``)."""


@ROUTING_MODES.register("ecmp")
def ecmp(c: Crossing) -> None:
    """One tier-2 switch per flow by hash among the live choices, then one core by hash."""
    topo, cross, a, lat_of = c.topo, c.cross, c.a, c.topo.link_latency_s
    if c.mask is None:
        j = (c.hx % np.uint64(a)).astype(np.int64)
        okj = np.ones(cross.size, dtype=bool)
    else:
        j, okj = _pick(c.mask, c.hx)
    c.ok[cross] &= okj
    up, dn = topo.up2[c.lsx, j], topo.down2[c.ldx, j]
    c.ents += [(cross, up, np.ones(cross.size)), (cross, dn, np.ones(cross.size))]
    c.latency[cross] += lat_of[up] + lat_of[dn]
    op = np.flatnonzero(c.other_pod)
    if op.size:
        core, okc = c.core_choice(op, j[op], c.h2[op])
        c.ok[cross[op]] &= okc
        agg_s, agg_d = c.pod_s[op] * a + j[op], c.pod_d[op] * a + j[op]
        u3, d3 = topo.up3[agg_s, core], topo.down3[agg_d, core]
        c.ents += [(cross[op], u3, np.ones(op.size)), (cross[op], d3, np.ones(op.size))]
        c.latency[cross[op]] += lat_of[u3] + lat_of[d3]


@ROUTING_MODES.register("adaptive")
@ROUTING_MODES.register("spray")
def spray(c: Crossing) -> None:
    """Packet spraying: every eligible tier-2 choice carries 1/count of the flow."""
    topo, cross, a, lat_of = c.topo, c.cross, c.a, c.topo.link_latency_s
    full = np.ones((cross.size, a), dtype=bool) if c.mask is None else c.mask
    cnt = full.sum(axis=1)
    c.ok[cross] &= cnt > 0
    rows, cols = np.nonzero(full)
    coef = 1.0 / cnt[rows]
    c.ents += [(cross[rows], topo.up2[c.lsx[rows], cols], coef), (cross[rows], topo.down2[c.ldx[rows], cols], coef)]
    j0 = np.argmax(full, axis=1)
    c.latency[cross] += lat_of[topo.up2[c.lsx, j0]] + lat_of[topo.down2[c.ldx, j0]]
    sel = c.other_pod[rows]
    if sel.any():
        r, cl = rows[sel], cols[sel]
        hh = _mix(c.hx[r] ^ cl.astype(np.uint64))
        core, _ = c.core_choice(r, cl, hh)  # only planes whose mask passed above are offered
        agg_s, agg_d = c.pod_s[r] * a + cl, c.pod_d[r] * a + cl
        c.ents += [(cross[r], topo.up3[agg_s, core], coef[sel]), (cross[r], topo.down3[agg_d, core], coef[sel])]
        op = np.flatnonzero(c.other_pod)
        agg0 = c.pod_s[op] * a + j0[op]
        c.latency[cross[op]] += 2 * lat_of[topo.up3[agg0, 0]]


__all__ = ["ROUTING_MODES", "Crossing", "SpreadFn", "ecmp", "spray"]
