"""Weighted max-min fair rates by progressive filling, vectorised over flows and links.

Two engines run the same rounds: a numba-compiled kernel with a heap of link levels
(:mod:`gigacluster.fabric.maxmin_kernel`, the default when numba is installed) and the numpy
rounds below.

The flow x link incidence is a sparse matrix in coordinate form: entry ``i`` says flow
``e_flow[i]`` puts ``e_coef[i]`` of its rate on link ``e_link[i]`` (1 for a single path; a
fraction when a flow is sprayed over several paths). Progressive filling raises a common
*level* ``t``; every unfrozen flow runs at ``weight * t``. When a link fills, every flow crossing
it freezes at its current rate. Each round is one argmin over the links plus numpy work
proportional to the flows that froze and the links they touch (see :func:`_fill_level`); the
number of rounds is the number of distinct bottleneck levels.

Strict priority: classes are solved from the highest priority down, each on the capacity the
levels above left over. Within a priority level, weights give weighted max-min fairness.

:func:`progressive_filling_py` is the same algorithm in plain Python (dicts and loops), kept as
the correctness reference and the benchmark baseline.
"""

from __future__ import annotations

import numpy as np

from gigacluster.arrays import distinct
from gigacluster.fabric import maxmin_kernel

_REL_TOL = 1e-9


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(starts[i], starts[i] + lengths[i])`` for all i, without a loop."""
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offs = np.cumsum(lengths) - lengths
    return np.repeat(starts - offs, lengths) + np.arange(total, dtype=np.int64)


def compact(e_link: np.ndarray, n_links: int) -> tuple[np.ndarray, np.ndarray]:
    """(used link ids, entry -> index into them): a lookup table when the entries are many, else a sort."""
    if e_link.size * 8 < n_links:
        used, inv = np.unique(e_link, return_inverse=True)
        return used, inv.ravel()
    seen = np.zeros(n_links, dtype=bool)
    seen[e_link] = True
    used = np.flatnonzero(seen)
    index = np.zeros(n_links, dtype=np.int64)
    index[used] = np.arange(used.size)
    return used, index[e_link]


def _fill_level_compiled(
    n_flows: int, e_flow: np.ndarray, e_link: np.ndarray, e_coef: np.ndarray, rem_Bps: np.ndarray,
    weight: np.ndarray, rate: np.ndarray,
) -> int:
    """:func:`_fill_level` by the compiled heap kernel (:mod:`gigacluster.fabric.maxmin_kernel`)."""
    if e_flow.size == 0:
        return 0
    used, e_l = compact(e_link, rem_Bps.size)
    cap = np.maximum(rem_Bps[used], 0.0)
    e_w = e_coef * weight[e_flow]
    frozen_use, rounds = maxmin_kernel.fill(n_flows, e_flow, e_l, e_w, cap, np.asarray(weight, dtype=np.float64),
                                            rate, _REL_TOL)
    rem_Bps[used] = np.maximum(cap - frozen_use, 0.0)
    return int(rounds)


def _fill_level(
    n_flows: int, e_flow: np.ndarray, e_link: np.ndarray, e_coef: np.ndarray, rem_Bps: np.ndarray,
    weight: np.ndarray, rate: np.ndarray,
) -> int:
    """Progressive filling of the flows named in ``e_flow`` on ``rem_Bps`` (both updated in place).

    Level form: every unfrozen flow runs at ``weight * T``, so link ``l`` fills at
    ``T_l = (cap_l - frozen_l) / load_l`` (``frozen_l``: rate of its frozen flows, ``load_l``:
    weighted count of its unfrozen ones). Each round takes the smallest ``T_l``, freezes the flows
    on the links that fill there and updates ``T`` only on the links those flows touch (through
    flow-major and link-major CSR views of the incidence), so a round costs one argmin over the
    links plus work proportional to what froze. Returns the number of rounds.
    """
    if e_flow.size == 0:
        return 0
    used, e_l = np.unique(e_link, return_inverse=True)
    n_used = used.size
    cap = np.maximum(rem_Bps[used], 0.0)
    e_w = e_coef * weight[e_flow]
    by_flow = np.argsort(e_flow, kind="stable")
    f_sorted = e_flow[by_flow]
    f_ptr = np.searchsorted(f_sorted, np.arange(n_flows + 1))
    fl_link, fl_w = e_l[by_flow], e_w[by_flow]
    by_link = np.argsort(e_l, kind="stable")
    l_ptr = np.searchsorted(e_l[by_link], np.arange(n_used + 1))
    lk_flow = e_flow[by_link]
    load = np.bincount(e_l, weights=e_w, minlength=n_used)
    count = np.bincount(e_l, minlength=n_used)
    frozen_use = np.zeros(n_used)
    with np.errstate(divide="ignore"):
        level = np.where(count > 0, cap / np.where(load > 0, load, 1.0), np.inf)
    level[(count > 0) & (load <= 0)] = np.inf
    frozen = np.zeros(n_flows, dtype=bool)
    rounds = 0
    while True:
        k = int(np.argmin(level))
        t = float(level[k])
        if not np.isfinite(t):
            break
        rounds += 1
        sat = np.flatnonzero(level <= t * (1.0 + _REL_TOL))
        level[sat] = np.inf
        cand = lk_flow[_ranges(l_ptr[sat], l_ptr[sat + 1] - l_ptr[sat])]
        flows = distinct(cand[~frozen[cand]])
        if flows.size == 0:
            continue
        frozen[flows] = True
        rate[flows] += weight[flows] * t
        ent = _ranges(f_ptr[flows], f_ptr[flows + 1] - f_ptr[flows])
        dl, dw = fl_link[ent], fl_w[ent]
        touched = dl  # duplicates are harmless below (ufunc.at accumulates, assignments repeat)
        np.subtract.at(load, dl, dw)
        np.add.at(frozen_use, dl, dw * t)
        np.subtract.at(count, dl, 1)
        live = touched[(count[touched] > 0) & (level[touched] < np.inf)]
        dead = touched[count[touched] <= 0]
        level[dead] = np.inf
        ld = load[live]
        level[live] = np.where(ld > 0, np.maximum(cap[live] - frozen_use[live], 0.0) / np.where(ld > 0, ld, 1.0),
                               np.inf)
    rem_Bps[used] = np.maximum(cap - frozen_use, 0.0)
    return rounds


def maxmin_rates(
    n_flows: int,
    e_flow: np.ndarray,
    e_link: np.ndarray,
    e_coef: np.ndarray | None,
    capacity_Bps: np.ndarray,
    *,
    weight: np.ndarray | None = None,
    priority: np.ndarray | None = None,
    compiled: bool | None = None,
) -> np.ndarray:
    """Rates (bytes/s) of ``n_flows`` flows under weighted max-min fairness with strict priority.

    Flows without any incidence entry are unconstrained and get ``inf``. ``weight`` defaults to 1,
    ``priority`` to 0 (higher is served first). ``compiled`` picks the numba kernel (default: when
    numba is installed) or the numpy rounds.
    """
    use_kernel = maxmin_kernel.AVAILABLE if compiled is None else compiled
    fill = _fill_level_compiled if use_kernel else _fill_level
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
        fill(n_flows, e_flow, e_link, coef, rem, w, rate)
        return rate
    prio = np.asarray(priority)
    for level in distinct(prio)[::-1]:
        m = prio[e_flow] == level
        fill(n_flows, e_flow[m], e_link[m], coef[m], rem, w, rate)
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


__all__ = ["compact", "maxmin_rates", "progressive_filling_py"]
