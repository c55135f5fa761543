"""Progressive filling compiled with numba: one bottleneck level at a time, from a binary heap.

The numpy solver (:func:`gigacluster.fabric.maxmin._fill_level`) pays two scans over every used
link per bottleneck level (an argmin and a ``level <= t`` mask), which at a million flows and
~20,000 distinct levels is most of its 160 s. Here the links' fill levels sit in a binary heap
with lazy deletion: a round pops the lowest level, pops every other link within the same relative
tolerance (they fill together), freezes their flows and pushes the new levels of only the links
those flows touch. A link's level never decreases when flows freeze (a frozen flow ran at or below
it), so the heap order stays valid. Cost: O((links + entries) log links).

The arithmetic is that of the numpy solver (same level formula, same tolerance, same order of
freezing within a round), so the two agree to rounding; both are checked against the plain-Python
:func:`~gigacluster.fabric.maxmin.progressive_filling_py`.

``AVAILABLE`` is False when numba cannot be imported; :mod:`gigacluster.fabric.maxmin` then uses the
numpy solver.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

try:
    import numba
except ImportError:  # pragma: no cover - numba is a dependency; this keeps the numpy path usable
    numba = None  # type: ignore[assignment]

AVAILABLE = numba is not None


def jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """numba's njit, cached on disk where a cache directory is writable (else compiled per process)."""
    if numba is None:
        return fn
    try:
        return numba.njit(cache=True, nogil=True)(fn)  # type: ignore[no-any-return]
    except RuntimeError:  # no writable cache location (a read-only install without a home directory)
        return numba.njit(nogil=True)(fn)  # type: ignore[no-any-return]


@jit
def _push(hk: np.ndarray, hv: np.ndarray, n: int, key: float, val: int) -> int:
    i = n
    hk[i] = key
    hv[i] = val
    while i > 0:
        p = (i - 1) >> 1
        if hk[p] <= hk[i]:
            break
        hk[p], hk[i] = hk[i], hk[p]
        hv[p], hv[i] = hv[i], hv[p]
        i = p
    return n + 1


@jit
def _sift_down(hk: np.ndarray, hv: np.ndarray, n: int, i: int) -> None:
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and hk[c + 1] < hk[c]:
            c += 1
        if hk[i] <= hk[c]:
            break
        hk[c], hk[i] = hk[i], hk[c]
        hv[c], hv[i] = hv[i], hv[c]
        i = c


@jit
def _pop(hk: np.ndarray, hv: np.ndarray, n: int) -> int:
    """Remove the root (read it first); returns the new size."""
    n -= 1
    hk[0] = hk[n]
    hv[0] = hv[n]
    _sift_down(hk, hv, n, 0)
    return n


@jit
def _csr_append(keys: np.ndarray, i0: int, k0: int, n: int, ptr: np.ndarray, order: np.ndarray) -> None:
    """A stable counting sort of entries ``i0..`` (keys ``k0..n-1``) appended to a view whose keys below ``k0``
    hold the entries below ``i0``: fills ``ptr[k0+1..n]`` and ``order[i0..]`` (entry indices)."""
    for k in range(k0 + 1, n + 1):
        ptr[k] = 0
    for i in range(i0, keys.size):
        ptr[keys[i] + 1] += 1
    for k in range(k0, n):
        ptr[k + 1] += ptr[k]
    fill = ptr[k0:n].copy()
    for i in range(i0, keys.size):
        k = keys[i] - k0
        order[fill[k]] = i
        fill[k] += 1


@jit
def _csr(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, order): entries ``order[ptr[k]:ptr[k+1]]`` have key k (a stable counting sort)."""
    ptr = np.zeros(n + 1, dtype=np.int64)
    order = np.empty(keys.size, dtype=np.int64)
    _csr_append(keys, 0, 0, n, ptr, order)
    return ptr, order


@jit
def fill(n_flows: int, e_flow: np.ndarray, e_l: np.ndarray, e_w: np.ndarray, cap: np.ndarray, weight: np.ndarray,
         rate: np.ndarray, rel_tol: float) -> tuple[np.ndarray, int]:
    """Progressive filling over links ``0..cap.size-1`` (entry i: flow ``e_flow[i]`` puts weighted load
    ``e_w[i]`` on link ``e_l[i]``); adds each flow's rate to ``rate``. Returns (frozen use per link, rounds)."""
    n_used = cap.size
    n_e = e_flow.size
    l_ptr, l_ord = _csr(e_l, n_used)
    f_ptr, f_ord = _csr(e_flow, n_flows)
    load = np.zeros(n_used)
    count = np.zeros(n_used, dtype=np.int64)
    for i in range(n_e):
        load[e_l[i]] += e_w[i]
        count[e_l[i]] += 1
    used = np.zeros(n_used)
    level = np.full(n_used, np.inf)
    hk = np.empty(n_used + n_e + 1)
    hv = np.empty(n_used + n_e + 1, dtype=np.int64)
    hn = 0
    for lk in range(n_used):
        if count[lk] > 0 and load[lk] > 0:
            level[lk] = cap[lk] / load[lk]
            hk[hn] = level[lk]
            hv[hn] = lk
            hn += 1
    for i in range(hn // 2 - 1, -1, -1):  # heapify: O(links), not O(links log links)
        _sift_down(hk, hv, hn, i)
    frozen = np.zeros(n_flows, dtype=np.bool_)
    stamp = np.full(n_used, -1, dtype=np.int64)
    sat = np.empty(n_used, dtype=np.int64)
    touched = np.empty(n_e, dtype=np.int64)
    rounds = 0
    while hn > 0:
        t = hk[0]
        lk = hv[0]
        hn = _pop(hk, hv, hn)
        if level[lk] != t:
            continue  # stale entry: the link was updated or is done
        rounds += 1
        ns = 0
        sat[ns] = lk
        ns += 1
        level[lk] = np.inf
        lim = t * (1.0 + rel_tol)
        while hn > 0 and hk[0] <= lim:
            k2, l2 = hk[0], hv[0]
            hn = _pop(hk, hv, hn)
            if level[l2] == k2:
                level[l2] = np.inf
                sat[ns] = l2
                ns += 1
        nt = 0
        for s in range(ns):
            ls = sat[s]
            for j in range(l_ptr[ls], l_ptr[ls + 1]):
                f = e_flow[l_ord[j]]
                if frozen[f]:
                    continue
                frozen[f] = True
                rate[f] += weight[f] * t
                for q in range(f_ptr[f], f_ptr[f + 1]):
                    e = f_ord[q]
                    m = e_l[e]
                    load[m] -= e_w[e]
                    used[m] += e_w[e] * t
                    count[m] -= 1
                    if stamp[m] != rounds:
                        stamp[m] = rounds
                        touched[nt] = m
                        nt += 1
        for j in range(nt):
            m = touched[j]
            if count[m] <= 0:
                level[m] = np.inf
            elif level[m] < np.inf:
                level[m] = max(cap[m] - used[m], 0.0) / load[m] if load[m] > 0 else np.inf
                if level[m] < np.inf:
                    hn = _push(hk, hv, hn, level[m], m)
    return used, rounds


__all__ = ["AVAILABLE", "fill", "jit"]
