"""Incremental max-min: after flows start or finish, re-solve only the flows the change can reach.

Two cuts, both exact:

1. **Level.** Progressive filling processes bottleneck levels in increasing order. Let ``tau`` be
   the lowest level at which the new process can differ from the old one: for a link that gained
   flows, the level where its load under the old rates plus the new flows' load first reaches its
   capacity (its old load at level ``t`` is ``sum min(rate_f, w_f t)``, known from the old rates);
   for a flow that left, its own old level (a link it crossed cannot have filled below it). Below
   ``tau`` both processes freeze the same flows at the same levels, so every old flow whose level
   ``rate / weight`` is below ``tau`` keeps its rate.
2. **Component.** Among the flows not kept, only those connected to the change (through links they
   share, in the flow-link graph of the flows not kept) can move; the others keep their rates too.

The flows left are solved from scratch on what the kept flows leave of their links' capacity. When
one collective starts among 100k flows, that is usually its own domain or its own links, not the
whole pool. Checked against a full solve in tests (equal to 1e-9).
"""

from __future__ import annotations

import numpy as np

from gigacluster.fabric import maxmin_kernel
from gigacluster.fabric.maxmin import compact

_KEEP_REL = 1e-9  # a flow is kept only if its level is below tau by more than this (rounding margin)


@maxmin_kernel.jit
def _find(parent: np.ndarray, x: int) -> int:
    root = x
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:
        parent[x], x = root, parent[x]
    return root


@maxmin_kernel.jit
def _reached(e_flow: np.ndarray, e_l: np.ndarray, n_flows: int, n_links: int, seeds: np.ndarray) -> np.ndarray:
    """Flows (of ``0..n_flows-1``) connected to any link in ``seeds`` through shared links (union-find)."""
    parent = np.arange(n_links)
    first = np.full(n_flows, -1, dtype=np.int64)
    for i in range(e_flow.size):
        f = e_flow[i]
        if first[f] < 0:
            first[f] = e_l[i]
        else:
            a, b = _find(parent, first[f]), _find(parent, e_l[i])
            if a != b:
                parent[a] = b
    hit = np.zeros(n_links, dtype=np.bool_)
    for s in seeds:
        hit[_find(parent, s)] = True
    out = np.zeros(n_flows, dtype=np.bool_)
    for f in range(n_flows):
        if first[f] >= 0 and hit[_find(parent, first[f])]:
            out[f] = True
    return out


def add_level(e_link: np.ndarray, e_coef: np.ndarray, e_pos: np.ndarray, is_new: np.ndarray, rate: np.ndarray,
              w: np.ndarray, cap: np.ndarray, n_links: int) -> float:
    """The lowest level at which a link that gained flows can fill (``inf`` if none gained any).

    Per link, entries sorted by their old level (new flows last): between two knees the load is
    linear in the level, so each segment gives one candidate; the link's level is the candidate that
    falls inside its own segment (every link here has a new flow, so its last segment rises).
    """
    new_e = is_new[e_pos]
    links = np.unique(e_link[new_e])
    if links.size == 0:
        return float("inf")
    mark = np.zeros(n_links, dtype=bool)
    mark[links] = True
    on = mark[e_link]
    el, ep, ec, en = e_link[on], e_pos[on], e_coef[on], new_e[on]
    slope = ec * w[ep]  # usage per unit of level while the flow is unfrozen
    knee = np.where(en, np.inf, rate[ep] / w[ep])  # old level; new flows never freeze below tau
    order = np.lexsort((knee, el))
    el, slope, knee = el[order], slope[order], knee[order]
    frozen_use = np.where(np.isfinite(knee), slope * knee, 0.0)
    starts = np.flatnonzero(np.r_[True, el[1:] != el[:-1]])
    grp = np.cumsum(np.r_[True, el[1:] != el[:-1]]) - 1
    # before the i-th knee of a link: the flows before it are frozen, the rest still rise
    frozen_before = np.cumsum(frozen_use) - frozen_use
    frozen_before -= frozen_before[starts][grp]
    tot_slope = np.add.reduceat(slope, starts)[grp]
    slope_before = np.cumsum(slope) - slope
    slope_before -= slope_before[starts][grp]
    rising = tot_slope - slope_before
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(rising > 0, (cap[el] - frozen_before) / rising, np.inf)
    # the segment's solution counts if it lies between the previous knee and this one (with a rounding
    # margin: a candidate a hair off only lowers tau, which keeps more flows in the re-solve)
    prev_knee = np.r_[0.0, knee[:-1]]
    prev_knee[starts] = 0.0
    valid = (t <= knee * (1 + 1e-9)) & (t >= prev_knee * (1 - 1e-9))
    return float(np.where(valid, np.maximum(t, 0.0), np.inf).min(initial=np.inf))

def affected(e_pos: np.ndarray, e_link: np.ndarray, n_flows: int, keep: np.ndarray, seeds: np.ndarray,
             n_links: int) -> np.ndarray:
    """Flows not in ``keep`` connected to a link in ``seeds`` through links shared by flows not kept."""
    free_e = ~keep[e_pos]
    ep, el = e_pos[free_e], e_link[free_e]
    used, el_c = compact(np.concatenate([el, seeds]), n_links)
    return _reached(ep, el_c[:ep.size], n_flows, used.size, el_c[ep.size:]) & ~keep


def warm_up() -> None:
    """Compile (or load from numba's cache) the solver kernels now: a service calls this before it
    answers, so its first solve does not stall the event loop for the seconds a compile takes."""
    one = np.zeros(1, dtype=np.int64)
    maxmin_kernel.fill(1, one, one, np.ones(1), np.ones(1), np.ones(1), np.zeros(1), 1e-9)
    _reached(one, one, 1, 1, one)


__all__ = ["add_level", "affected", "warm_up"]
