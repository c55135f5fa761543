"""Shortest paths through a :class:`~gigacluster.fabric.topology.Topology`, vectorised over flows.

Inside a scale-up domain a flow takes the domain's own path: chip -> switch -> chip on a
switched system, the direct link on a full mesh, dimension-order routing on a torus (ring hops
first, then X, then Y, each the short way round; Y before X is the alternative when a link of
the first path is down). If every scale-up path is down, the flow falls back to the NICs.

Between domains a flow goes up the fat-tree only as far as it must (leaf, then spine or
aggregation switch, then core) and straight down. The equal-cost choice is made by **ECMP on a
flow hash**: ``h = splitmix64(src, dst, label)``, where ``label`` plays the part of the RoCE
UDP source port (the simulator gives every flow its own label, so the flows of one collective
spread over the spines as queue pairs do). Tier-2 switch ``j = h mod A`` among the live choices
(``A`` = spines, or aggregation switches per pod), then core ``c = h' mod C`` in plane ``j``.
Only choices whose every link is up are eligible, so a link fault reroutes by construction.

``mode="spray"`` models packet spraying: a flow is spread evenly over every live tier-2 choice
(incidence coefficient ``1/A`` on each), with the core hop in each plane still chosen by hash.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from gigacluster.fabric.topology import Topology

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_G = np.uint64(0x9E3779B97F4A7C15)
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


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrap-around arithmetic is intended)."""
    x = x + _G
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def flow_hash(src: np.ndarray, dst: np.ndarray, label: np.ndarray) -> np.ndarray:
    """Deterministic 64-bit hash of (src, dst, label) per flow: the ECMP key."""
    s = np.asarray(src, dtype=np.int64).astype(np.uint64)
    d = np.asarray(dst, dtype=np.int64).astype(np.uint64)
    lab = np.asarray(label, dtype=np.int64).astype(np.uint64)
    return _mix(_mix(_mix(s) ^ d) ^ lab)


def _pick(mask: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row, the (h mod count)-th True column of ``mask``; and whether any was True."""
    count = mask.sum(axis=1)
    ok = count > 0
    k = np.zeros(mask.shape[0], dtype=np.int64)
    k[ok] = (h[ok] % count[ok].astype(np.uint64)).astype(np.int64)
    col = np.argmax(np.cumsum(mask, axis=1) > k[:, None], axis=1)
    return col, ok


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
    topo: Topology, s: np.ndarray, d: np.ndarray, h: np.ndarray, alive: np.ndarray | None, spray: bool
) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """Entries (local flow idx, link, coef), latency and ok for flows that cross the fat-tree."""
    k = s.size
    idx = np.arange(k, dtype=np.int64)
    lat_of = topo.link_latency_s
    nu, nd = topo.nic_up[s], topo.nic_down[d]
    ls, ld = topo.chip_leaf[s], topo.chip_leaf[d]
    ok = np.ones(k, dtype=bool) if alive is None else alive[nu] & alive[nd]
    ents: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [(idx, nu, np.ones(k)), (idx, nd, np.ones(k))]
    latency = lat_of[nu] + lat_of[nd]
    a = topo.t2_per_pod
    c_n = topo.up3.shape[1]
    cross = np.flatnonzero(ls != ld)
    if cross.size == 0:
        return ents, latency, ok
    lsx, ldx, hx = ls[cross], ld[cross], h[cross]
    pod_s, pod_d = topo.leaf_pod[lsx], topo.leaf_pod[ldx]
    other_pod = pod_s != pod_d
    faulty = alive is not None and not alive[topo.link_tier >= 2].all()
    h2 = _mix(hx ^ np.uint64(0xA5A5A5A5))

    def core_choice(rows: np.ndarray, j: np.ndarray, hh: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        agg_s = pod_s[rows] * a + j
        agg_d = pod_d[rows] * a + j
        if not faulty:
            return (hh % np.uint64(c_n)).astype(np.int64), np.ones(rows.size, dtype=bool)
        assert alive is not None
        mask = alive[topo.up3[agg_s]] & alive[topo.down3[agg_d]]
        return _pick(mask, hh)

    # eligible tier-2 choices per crossing flow
    if faulty:
        assert alive is not None
        mask = alive[topo.up2[lsx]] & alive[topo.down2[ldx]]
        op = np.flatnonzero(other_pod)
        if op.size and c_n:
            agg_s = pod_s[op, None] * a + np.arange(a)[None, :]
            agg_d = pod_d[op, None] * a + np.arange(a)[None, :]
            core_ok = (alive[topo.up3[agg_s]] & alive[topo.down3[agg_d]]).any(axis=2)
            mask[op] &= core_ok
    else:
        mask = None

    if not spray:
        if mask is None:
            j = (hx % np.uint64(a)).astype(np.int64)
            okj = np.ones(cross.size, dtype=bool)
        else:
            j, okj = _pick(mask, hx)
        ok[cross] &= okj
        up, dn = topo.up2[lsx, j], topo.down2[ldx, j]
        ents += [(cross, up, np.ones(cross.size)), (cross, dn, np.ones(cross.size))]
        latency[cross] += lat_of[up] + lat_of[dn]
        op = np.flatnonzero(other_pod)
        if op.size:
            c, okc = core_choice(op, j[op], h2[op])
            ok[cross[op]] &= okc
            agg_s, agg_d = pod_s[op] * a + j[op], pod_d[op] * a + j[op]
            u3, d3 = topo.up3[agg_s, c], topo.down3[agg_d, c]
            ents += [(cross[op], u3, np.ones(op.size)), (cross[op], d3, np.ones(op.size))]
            latency[cross[op]] += lat_of[u3] + lat_of[d3]
        return ents, latency, ok

    # packet spraying over every eligible tier-2 choice
    full = np.ones((cross.size, a), dtype=bool) if mask is None else mask
    cnt = full.sum(axis=1)
    ok[cross] &= cnt > 0
    rows, cols = np.nonzero(full)
    coef = 1.0 / cnt[rows]
    ents += [(cross[rows], topo.up2[lsx[rows], cols], coef), (cross[rows], topo.down2[ldx[rows], cols], coef)]
    j0 = np.argmax(full, axis=1)
    latency[cross] += lat_of[topo.up2[lsx, j0]] + lat_of[topo.down2[ldx, j0]]
    sel = other_pod[rows]
    if sel.any():
        r, cl = rows[sel], cols[sel]
        hh = _mix(hx[r] ^ cl.astype(np.uint64))
        c, okc = core_choice(r, cl, hh)
        agg_s, agg_d = pod_s[r] * a + cl, pod_d[r] * a + cl
        ents += [(cross[r], topo.up3[agg_s, c], coef[sel]), (cross[r], topo.down3[agg_d, c], coef[sel])]
        op = np.flatnonzero(other_pod)
        agg0 = pod_s[op] * a + j0[op]
        latency[cross[op]] += 2 * lat_of[topo.up3[agg0, 0]]
        del okc  # core_choice only offers planes whose mask passed above
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
    spray = (mode or topo.config.routing) == "spray"
    h = flow_hash(src, dst, np.broadcast_to(np.asarray(label, dtype=np.int64), src.shape))
    latency = np.zeros(n)
    ok = np.ones(n, dtype=bool)
    flows: list[np.ndarray] = []
    links: list[np.ndarray] = []
    coefs: list[np.ndarray] = []

    intra = np.flatnonzero((topo.chip_domain[src] == topo.chip_domain[dst]) & (src != dst))
    to_out = np.flatnonzero(topo.chip_domain[src] != topo.chip_domain[dst])
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
    if to_out.size:
        ents, lat, ok_out = _scaleout(topo, src[to_out], dst[to_out], h[to_out], alive, spray)
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
        keep = ok[e_flow]
        e_flow, e_link, e_coef = e_flow[keep], e_link[keep], e_coef[keep]
    else:
        e_flow = np.zeros(0, dtype=np.int64)
        e_link = np.zeros(0, dtype=np.int64)
        e_coef = np.zeros(0)
    return Routes(e_flow=e_flow, e_link=e_link, e_coef=e_coef, latency_s=latency, ok=ok)


__all__ = ["MAX_HOPS", "Routes", "flow_hash", "route"]
