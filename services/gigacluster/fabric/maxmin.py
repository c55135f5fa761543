"""Weighted max-min fair rates by progressive filling, vectorised over flows and links.

The flow x link incidence is a sparse matrix in coordinate form: entry ``i`` says flow
``e_flow[i]`` puts ``e_coef[i]`` of its rate on link ``e_link[i]`` (1 for a single path; a
fraction when a flow is sprayed over several paths). Progressive filling raises a common
*level* ``t``; every unfrozen flow runs at ``weight * t``. When a link fills, every flow crossing
it freezes at its current rate. Each round is a handful of numpy passes over the remaining
entries (bincount per link, a minimum, a mask), and frozen flows' entries are dropped, so the
work shrinks as flows freeze. The number of rounds is the number of distinct bottleneck levels.

Strict priority: classes are solved from the highest priority down, each on the capacity the
levels above left over. Within a priority level, weights give weighted max-min fairness.

:func:`progressive_filling_py` is the same algorithm in plain Python (dicts and loops), kept as
the correctness reference and the benchmark baseline.
"""

from __future__ import annotations

import numpy as np

_REL_TOL = 1e-9


def _fill_level(
    n_flows: int, e_flow: np.ndarray, e_link: np.ndarray, e_coef: np.ndarray, rem_Bps: np.ndarray,
    weight: np.ndarray, rate: np.ndarray,
) -> None:
    """Progressive filling of the flows named in ``e_flow`` on ``rem_Bps`` (both updated in place)."""
    if e_flow.size == 0:
        return
    # compact the links used to 0..k-1 so each round's bincount is over used links only
    used, e_l = np.unique(e_link, return_inverse=True)
    rem = rem_Bps[used].copy()
    cap0 = np.maximum(rem, 0.0)
    e_f = e_flow
    e_w = e_coef * weight[e_f]
    active = np.unique(e_f)
    frozen = np.zeros(n_flows, dtype=bool)
    while e_f.size:
        load = np.bincount(e_l, weights=e_w, minlength=used.size)
        live = np.flatnonzero(load > 0)
        t = np.maximum(rem[live], 0.0) / load[live]
        k = int(np.argmin(t))
        tmin = float(t[k])
        rate[active] += weight[active] * tmin
        rem[live] -= load[live] * tmin
        rem[live[k]] = 0.0
        sat = np.zeros(used.size, dtype=bool)
        sat[live[rem[live] <= _REL_TOL * cap0[live] + 1e-12]] = True
        frozen[e_f[sat[e_l]]] = True
        keep = ~frozen[e_f]
        e_f, e_l, e_w = e_f[keep], e_l[keep], e_w[keep]
        active = active[~frozen[active]]
    rem_Bps[used] = np.maximum(rem, 0.0)


def maxmin_rates(
    n_flows: int,
    e_flow: np.ndarray,
    e_link: np.ndarray,
    e_coef: np.ndarray | None,
    capacity_Bps: np.ndarray,
    *,
    weight: np.ndarray | None = None,
    priority: np.ndarray | None = None,
) -> np.ndarray:
    """Rates (bytes/s) of ``n_flows`` flows under weighted max-min fairness with strict priority.

    Flows without any incidence entry are unconstrained and get ``inf``. ``weight`` defaults to 1,
    ``priority`` to 0 (higher is served first).
    """
    e_flow = np.asarray(e_flow, dtype=np.int64)
    e_link = np.asarray(e_link, dtype=np.int64)
    coef = np.ones(e_flow.size) if e_coef is None else np.asarray(e_coef, dtype=np.float64)
    w = np.ones(n_flows) if weight is None else np.asarray(weight, dtype=np.float64)
    rate = np.zeros(n_flows)
    has = np.zeros(n_flows, dtype=bool)
    has[e_flow] = True
    rate[~has] = np.inf
    rem = np.asarray(capacity_Bps, dtype=np.float64).copy()
    if priority is None:
        _fill_level(n_flows, e_flow, e_link, coef, rem, w, rate)
        return rate
    prio = np.asarray(priority)
    for level in np.unique(prio)[::-1]:
        m = prio[e_flow] == level
        _fill_level(n_flows, e_flow[m], e_link[m], coef[m], rem, w, rate)
    return rate


def progressive_filling_py(
    paths: list[list[tuple[int, float]]],
    capacity_Bps: list[float],
    weight: list[float] | None = None,
) -> list[float]:
    """Plain-Python weighted max-min (no numpy): ``paths[f]`` is a list of (link, coef).

    The reference implementation the vectorised solver is tested and benchmarked against.
    """
    n = len(paths)
    w = weight if weight is not None else [1.0] * n
    rate = [0.0] * n
    rem = dict(enumerate(capacity_Bps))
    active = {f for f in range(n) if paths[f]}
    for f in range(n):
        if not paths[f]:
            rate[f] = float("inf")
    cap0 = dict(rem)
    while active:
        load: dict[int, float] = {}
        for f in active:
            for link, c in paths[f]:
                load[link] = load.get(link, 0.0) + c * w[f]
        tmin = min(max(rem[link], 0.0) / ld for link, ld in load.items() if ld > 0)
        for f in active:
            rate[f] += w[f] * tmin
        sat = set()
        for link, ld in load.items():
            rem[link] -= ld * tmin
            if rem[link] <= _REL_TOL * cap0[link] + 1e-12:
                sat.add(link)
        frozen = {f for f in active if any(link in sat for link, _ in paths[f])}
        if not frozen:  # float round-off: freeze the tightest link's flows
            tight = min(load, key=lambda link: rem[link])
            frozen = {f for f in active if any(link == tight for link, _ in paths[f])}
        active -= frozen
    return rate


__all__ = ["maxmin_rates", "progressive_filling_py"]
