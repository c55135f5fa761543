"""Shortest paths through a :class:`~gigacluster.fabric.topology.Topology`, vectorised over flows.

Inside a scale-up domain a flow takes the domain's own path: chip -> switch -> chip on a
switched system, the direct link on a full mesh, dimension-order routing on a torus (ring hops
first, then X, then Y, each the short way round; Y before X is the alternative when a link of
the first path is down). If every scale-up path is down, the flow falls back to the NICs.

Between domains a flow goes up the fat-tree only as far as it must (leaf, then spine or
aggregation switch, then core) and straight down. The equal-cost choice is made by **ECMP on a
flow hash**: ``h = splitmix64(src, dst, label)``, where ``label`` plays the part of the RoCE
UDP source port (the simulator gives every sub-flow its own label, `phase_labels`, so the flows of one collective
spread over the spines as queue pairs do). Tier-2 switch ``j = h mod A`` among the live choices
(``A`` = spines, or aggregation switches per pod), then core ``c = h' mod C`` in plane ``j``.
Only choices whose every link is up are eligible, so a link fault reroutes by construction.

``mode="spray"`` models packet spraying: a flow is spread evenly over every live tier-2 choice
(incidence coefficient ``1/A`` on each), with the core hop in each plane still chosen by hash.
The modes are the registry :data:`~gigacluster.fabric.routing_modes.ROUTING_MODES`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Protocol

import numpy as np

from gigacluster.fabric.routing_modes import ROUTING_MODES, Crossing, SpreadFn, _mix
from gigacluster.fabric.topology import Topology

MAX_HOPS = 8


@dataclasses.dataclass(frozen=True, eq=False)
class Routes:
    """Routes of a batch of flows: COO incidence plus per-flow latency and reachability."""

    e_flow: np.ndarray
    e_link: np.ndarray
    e_coef: np.ndarray
    latency_s: np.ndarray
    ok: np.ndarray

    @property
    def n_flows(self) -> int:
        return int(self.ok.size)


class _Labelled(Protocol):
    tag: str
    kind: str
    op: str
    algorithm: str
    n_ranks: int
    phase_idx: int


def phase_labels(group: _Labelled, k: int) -> np.ndarray:
    """The ECMP labels of a phase's ``k`` sub-flows, from what the flows are and never from when they arrived.

    A NIC's queue pairs keep their UDP source port for the communicator's life, so the same job's same
    collective phase hashes onto the same paths every time it runs (persistent ECMP collisions, as on real
    fabrics), and two collectives that start at one virtual instant get the same paths whatever order their
    calls reach the fabric in. The key is the caller's tag (the job), the kind, operation, algorithm, rank count
    and phase; sub-flows are numbered from the key's 56-bit digest, and ``flow_hash`` mixes in each sub-flow's
    source and destination.
    """
    key = f"{group.tag}\0{group.kind}\0{group.op}\0{group.algorithm}\0{group.n_ranks}\0{group.phase_idx}"
    base = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=7).digest(), "little")
    return np.arange(base, base + k, dtype=np.int64)


def flow_hash(src: np.ndarray, dst: np.ndarray, label: np.ndarray) -> np.ndarray:
    """Deterministic 64-bit hash of (src, dst, label) per flow: the ECMP key."""
    s = np.asarray(src, dtype=np.int64).astype(np.uint64)
    d = np.asarray(dst, dtype=np.int64).astype(np.uint64)
    lab = np.asarray(label, dtype=np.int64).astype(np.uint64)
    return _mix(_mix(_mix(s) ^ d) ^ lab)


def _alive_path(path: np.ndarray, alive: np.ndarray | None) -> np.ndarray:
    """Rows of a padded path matrix (-1 = no hop, -2 = invalid) whose links are all up."""
    valid = (path != -2).all(axis=1)
    if alive is None:
        return valid
    safe = np.where(path >= 0, path, 0)
    up = np.where(path >= 0, alive[safe], True)
    return valid & up.all(axis=1)


def _scaleup_candidates(topo: Topology, s: np.ndarray, d: np.ndarray) -> list[np.ndarray]:
    """Padded path matrices (k, hops) for intra-domain flows, best first."""
    k = s.size
    if topo.scaleup == "switch":
        return [np.stack([topo.su_up[s], topo.su_down[d]], axis=1)]
    if topo.scaleup == "full_mesh":
        dom = topo.chips_per_domain
        ls, ld = topo.chip_local[s], topo.chip_local[d]
        cands = [topo.mesh_link[s, ld][:, None]]
        first = topo.chip_domain[s] * dom
        for off in range(1, dom):
            peer_local = (ls + off) % dom
            peer = first + peer_local
            p = np.stack([topo.mesh_link[s, peer_local], topo.mesh_link[peer, ld]], axis=1)
            p[peer_local == ld] = -2
            cands.append(p)
        return cands
    # torus (and ring of tori)
    sysm_dims = topo.torus_dims
    nx, ny, n_inst = sysm_dims
    per_inst = nx * ny
    ls, ld = topo.chip_local[s], topo.chip_local[d]
    is_, id_ = ls // per_inst, ld // per_inst
    xs, ys = (ls % per_inst) % nx, (ls % per_inst) // nx
    xd, yd = (ld % per_inst) % nx, (ld % per_inst) // nx

    def moves(delta: np.ndarray, size: int, plus: int, minus: int) -> tuple[np.ndarray, np.ndarray]:
        fwd = delta % size
        go_plus = fwd <= size // 2
        return np.where(go_plus, plus, minus), np.where(go_plus, fwd, size - fwd)

    dims = {
        "ring": moves(id_ - is_, n_inst, 4, 5) if n_inst > 1 else (np.full(k, 4), np.zeros(k, dtype=np.int64)),
        "x": moves(xd - xs, nx, 0, 1),
        "y": moves(yd - ys, ny, 2, 3),
    }
    out = []
    for order in (("ring", "x", "y"), ("ring", "y", "x")):
        path = np.full((k, MAX_HOPS), -1, dtype=np.int64)
        hop = np.zeros(k, dtype=np.int64)
        cur = s.copy()
        for dim in order:
            direction, count = dims[dim]
            for step in range(int(count.max(initial=0))):
                m = np.flatnonzero(count > step)
                link = topo.torus_link[cur[m], direction[m]]
                path[m, hop[m]] = link
                hop[m] += 1
                cur[m] = topo.link_dst[link]
        out.append(path)
    return out


def _scaleout(
    topo: Topology, s: np.ndarray, d: np.ndarray, h: np.ndarray, alive: np.ndarray | None, spread: SpreadFn
) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """Entries (local flow idx, link, coef), latency and ok for flows that cross the fat-tree.

    The NIC hops are common to every mode; ``spread`` (the routing mode) adds the tier-2 and
    tier-3 hops of the flows that cross leaves.
    """
    k = s.size
    idx = np.arange(k, dtype=np.int64)
    lat_of = topo.link_latency_s
    nu, nd = topo.nic_up[s], topo.nic_down[d]
    ls, ld = topo.chip_leaf[s], topo.chip_leaf[d]
    ok = np.ones(k, dtype=bool) if alive is None else alive[nu] & alive[nd]
    ents: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [(idx, nu, np.ones(k)), (idx, nd, np.ones(k))]
    latency = lat_of[nu] + lat_of[nd]
    cross = np.flatnonzero(ls != ld)
    if cross.size == 0:
        return ents, latency, ok
    spread(Crossing(topo, cross, ls[cross], ld[cross], h[cross], alive, ok, latency, ents))
    return ents, latency, ok


def route(
    topo: Topology,
    src: np.ndarray,
    dst: np.ndarray,
    label: np.ndarray,
    *,
    alive: np.ndarray | None = None,
    mode: str | None = None,
) -> Routes:
    """Routes for flows ``src[i] -> dst[i]`` (chip ids), honouring dead links in ``alive``.

    ``alive`` is a bool per link (``None``: all up). ``mode`` overrides the topology's routing
    mode (``ecmp`` or ``spray``). Unreachable flows have ``ok == False`` and no entries.
    """
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    n = src.size
    spread = ROUTING_MODES.lookup(mode or topo.config.routing)
    latency = np.zeros(n)
    ok = np.ones(n, dtype=bool)
    flows: list[np.ndarray] = []
    links: list[np.ndarray] = []
    coefs: list[np.ndarray] = []

    same = topo.chip_domain[src] == topo.chip_domain[dst]
    intra = np.flatnonzero(same & (src != dst))
    to_out = np.flatnonzero(~same)
    if intra.size and topo.scaleup == "switch":
        # through the domain's switch: two hops; when every one is up the entries are the path matrix row by row
        # (the general branch below gives the same entries, in the same order, with more work)
        path = _scaleup_candidates(topo, src[intra], dst[intra])[0]
        if (path >= 0).all() and (alive is None or alive[path].all()):
            flows.append(np.repeat(intra, 2))
            links.append(path.ravel())
            coefs.append(np.ones(path.size))
            lat2 = topo.link_latency_s[path]
            latency[intra] = lat2[:, 0] + lat2[:, 1]
            intra = intra[:0]
    if intra.size:
        cands = _scaleup_candidates(topo, src[intra], dst[intra])
        chosen = np.full(intra.size, -1, dtype=np.int64)
        for ci, path in enumerate(cands):
            good = _alive_path(path, alive) & (chosen < 0)
            chosen[good] = ci
            if (chosen >= 0).all():
                break
        for ci, path in enumerate(cands):
            rows = np.flatnonzero(chosen == ci)
            if not rows.size:
                continue
            sub = path[rows]
            r, col = np.nonzero(sub >= 0)
            lk = sub[r, col]
            flows.append(intra[rows][r])
            links.append(lk)
            coefs.append(np.ones(lk.size))
            latency[intra[rows]] = np.bincount(r, weights=topo.link_latency_s[lk], minlength=rows.size)
        to_out = np.concatenate([to_out, intra[chosen < 0]])
    if to_out.size:  # the ECMP key only for the flows that leave their domain
        lab = np.broadcast_to(np.asarray(label, dtype=np.int64), src.shape)[to_out]
        h = flow_hash(src[to_out], dst[to_out], lab)
        ents, lat, ok_out = _scaleout(topo, src[to_out], dst[to_out], h, alive, spread)
        latency[to_out] = lat
        ok[to_out] = ok_out
        for fi, lk, cf in ents:
            flows.append(to_out[fi])
            links.append(lk)
            coefs.append(cf)
    if flows:
        e_flow = np.concatenate(flows)
        e_link = np.concatenate(links)
        e_coef = np.concatenate(coefs)
        if not ok.all():
            keep = ok[e_flow]
            e_flow, e_link, e_coef = e_flow[keep], e_link[keep], e_coef[keep]
    else:
        e_flow = np.zeros(0, dtype=np.int64)
        e_link = np.zeros(0, dtype=np.int64)
        e_coef = np.zeros(0)
    return Routes(e_flow=e_flow, e_link=e_link, e_coef=e_coef, latency_s=latency, ok=ok)


__all__ = ["MAX_HOPS", "Routes", "flow_hash", "route"]
