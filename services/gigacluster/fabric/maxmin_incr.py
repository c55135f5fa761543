"""Incremental max-min: after flows start or finish, replay progressive filling only where it changes.

Progressive filling raises one level ``t``; a flow freezes at the lowest level at which one of its
links fills. After a change, the new filling equals the old one except where the change reaches,
and it reaches a link only through a flow whose level moved. So the new process is replayed, in
level order, on *dirty* links only:

- a link becomes dirty when the change touches it (a new flow: at level 0; a finished flow: at that
  flow's old level, below which the link could not fill either way) or when a flow on it freezes at a
  level different from its old one (at the lower of the two levels, where the difference starts);
- a clean link fills at its old level ``T_l`` (its flows behave as before), so a flow on dirty links
  freezes at ``min(c_f, fill of its dirty links)``, where ``c_f`` is the lowest ``T_l`` of its clean
  links; a flow whose ``c_f`` rose above its old level (its old bottleneck became dirty) *diverges*
  at its old level, and its clean links become dirty there;
- a dirty link joins with its exact state at the level it joins: flows whose old level is below it
  are frozen at their old rates, the rest are tracked (their freezing drives the link's fill level).

Every flow not tracked keeps its rate; every clean link keeps its fill level and carried rate. The
work is proportional to the links and flows whose state changes (a few hundred for one collective
among 100k random flows), not to the component the change is connected to (most of a random pool).
A level within ``eq_tol`` of the old one counts as unchanged, which stops round-off from spreading.
Checked against a full solve and the plain-Python reference in tests (equal to 1e-9).
"""

from __future__ import annotations

import numpy as np

from gigacluster.fabric import maxmin_kernel
from gigacluster.fabric.maxmin_kernel import _csr, _csr_append, _pop, _push

_LINK, _CAP, _DIVERGE = 0, 1, 2  # event kinds, in the low 2 bits of a heap value
# flow float state columns: old level, clean bound c_f, new rate; flow int state: 0 untouched, 1 tracked, 2 frozen
_OLD, _BOUND, _NEW, _RAW = 0, 1, 2, 3  # _RAW: the clean bound before clamping to the frontier
# link float state columns: frozen use, unfrozen weighted load, current fill level, fill level reached
_FROZEN, _SLOPE, _CUR, _FILL = 0, 1, 2, 3


@maxmin_kernel.jit
def _fill_at(lk: int, t: float, lf: np.ndarray, lcount: np.ndarray, cap: np.ndarray, hk: np.ndarray,
             hv: np.ndarray, hn: int) -> int:
    """Recompute a dirty link's fill level (never below the frontier ``t``) and push it."""
    if lcount[lk] > 0 and lf[lk, _SLOPE] > 0:
        lev = max(max(cap[lk] - lf[lk, _FROZEN], 0.0) / lf[lk, _SLOPE], t)
        lf[lk, _CUR] = lev
        return _push(hk, hv, hn, lev, lk * 4 + _LINK)  # type: ignore[no-any-return]
    lf[lk, _CUR] = np.inf
    return hn


@maxmin_kernel.jit
def _rebound(f: int, t: float, lk: int, fresh: bool, st: tuple, hn: int) -> int:  # type: ignore[type-arg]
    """A tracked flow's clean bound after its link ``lk`` became dirty (``fresh``: it just became tracked):
    push its cap and divergence events. The bound is the lowest fill level of its clean links; it is
    rescanned only when ``lk`` held the last entry at that level (a count of them is kept), so a flow
    with many links (a ring sprayed over many paths) costs its entries a few times, not once per join."""
    f_ptr, f_ord, e_link, new, link_lvl, eq_tol = st[0], st[1], st[4], st[8], st[10], st[11]
    ff, fdiv, dirty, hk, hv, fi = st[12], st[14], st[17], st[21], st[22], st[23]
    if fdiv[f] > 0:
        return hn
    if not fresh:
        if fi[f, 1] == lk or link_lvl[lk] > ff[f, _RAW]:
            return hn  # already excluded by the scan at this join, or not at the minimum: bound unchanged
        fi[f, 0] -= 1
        if fi[f, 0] > 0:
            return hn
    b = np.inf
    c = 0
    for q in range(f_ptr[f], f_ptr[f + 1]):
        m = e_link[f_ord[q]]
        if not dirty[m]:
            v = link_lvl[m]
            if v < b:
                b = v
                c = 1
            elif v == b:
                c += 1
    ff[f, _RAW] = b
    fi[f, 0] = c
    fi[f, 1] = lk
    b = max(b, t)
    if b != ff[f, _BOUND]:
        ff[f, _BOUND] = b
        if b < np.inf:
            hn = _push(hk, hv, hn, b, f * 4 + _CAP)
    if not new[f] and fdiv[f] == 0 and b > ff[f, _OLD] * (1.0 + eq_tol):
        fdiv[f] = -1  # divergence pending at its old level
        hn = _push(hk, hv, hn, max(ff[f, _OLD], t), f * 4 + _DIVERGE)
    return hn


@maxmin_kernel.jit
def _join(lk: int, t: float, st: tuple, hn: int) -> int:  # type: ignore[type-arg]
    """Make link ``lk`` dirty at level ``t`` with its exact state there; track its flows not yet frozen."""
    lix, w, rate, new, cap, eq_tol = st[2], st[6], st[7], st[8], st[9], st[11]
    ff, fstate, lf, lcount, dirty = st[12], st[13], st[15], st[16], st[17]
    tracked, dirty_list, counts, hk, hv = st[18], st[19], st[20], st[21], st[22]
    l_ptr, l_flow, l_coef, x_link, x_flow, x_coef = lix
    dirty[lk] = True
    dirty_list[counts[1]] = lk
    counts[1] += 1
    frozen = 0.0
    slope = 0.0
    cnt = 0
    a0, n_a = l_ptr[lk], l_ptr[lk + 1] - l_ptr[lk]
    b0 = np.searchsorted(x_link, lk)
    n_b = np.searchsorted(x_link, lk + 1) - b0
    counts[2] += n_a + n_b
    for j in range(n_a + n_b):
        if j < n_a:
            f, c = l_flow[a0 + j], l_coef[a0 + j]
        else:
            f, c = x_flow[b0 + j - n_a], x_coef[b0 + j - n_a]
        s = fstate[f]
        if s == 2:
            frozen += c * ff[f, _NEW]
        elif s == 0 and not new[f] and rate[f] < w[f] * t * (1.0 - eq_tol):  # a tie at ``t`` stays tracked
            frozen += c * rate[f]
        else:
            slope += c * w[f]
            cnt += 1
            if s == 0:
                fstate[f] = 1
                ff[f, _OLD] = rate[f] / w[f]
                ff[f, _BOUND] = -1.0
                tracked[counts[0]] = f
                counts[0] += 1
            hn = _rebound(f, t, lk, s == 0, st, hn)
    lf[lk, _FROZEN] = frozen
    lf[lk, _SLOPE] = slope
    lf[lk, _FILL] = np.inf
    lcount[lk] = cnt
    return _fill_at(lk, t, lf, lcount, cap, hk, hv, hn)  # type: ignore[no-any-return]


@maxmin_kernel.jit
def _freeze(f: int, s: float, st: tuple, hn: int) -> int:  # type: ignore[type-arg]
    """Freeze tracked flow ``f`` at level ``s``; if that is not its old level, its clean links join at ``s``."""
    f_ptr, f_ord, e_link, e_coef, w, rate = st[0], st[1], st[4], st[5], st[6], st[7]
    new, cap, eq_tol = st[8], st[9], st[11]
    ff, fstate, lf, lcount, dirty, hk, hv = st[12], st[13], st[15], st[16], st[17], st[21], st[22]
    fstate[f] = 2
    st[20][2] += f_ptr[f + 1] - f_ptr[f]
    old = ff[f, _OLD]
    moved = new[f] or abs(s - old) > eq_tol * old
    r = w[f] * s if moved else rate[f]
    ff[f, _NEW] = r
    for q in range(f_ptr[f], f_ptr[f + 1]):
        e = f_ord[q]
        m = e_link[e]
        if dirty[m]:
            lf[m, _FROZEN] += e_coef[e] * r
            lf[m, _SLOPE] -= e_coef[e] * w[f]
            lcount[m] -= 1
            if lf[m, _CUR] < np.inf:
                hn = _fill_at(m, s, lf, lcount, cap, hk, hv, hn)
    if moved:
        for q in range(f_ptr[f], f_ptr[f + 1]):
            m = e_link[f_ord[q]]
            if not dirty[m]:
                hn = _join(m, s, st, hn)
    return hn


@maxmin_kernel.jit
def _fill_round(t: float, lk: int, st: tuple, rel_tol: float, hn: int) -> int:  # type: ignore[type-arg]
    """One bottleneck level: ``lk`` and every dirty link within ``rel_tol`` of ``t`` fill; their flows freeze."""
    l_ptr, l_flow, _, x_link, x_flow, _ = st[2]
    fstate, lf, lcount, hk, hv = st[13], st[15], st[16], st[21], st[22]
    sat = [lk]
    lim = t * (1.0 + rel_tol)
    while hn > 0 and hk[0] <= lim and (hv[0] & 3) == _LINK:
        k2, l2 = hk[0], hv[0] >> 2
        hn = _pop(hk, hv, hn)
        if lf[l2, _CUR] == k2 and lcount[l2] > 0:
            sat.append(l2)
    for m in sat:
        lf[m, _CUR] = np.inf
        lf[m, _FILL] = t
    for m in sat:
        for j in range(l_ptr[m], l_ptr[m + 1]):
            if fstate[l_flow[j]] == 1:
                hn = _freeze(l_flow[j], t, st, hn)
        for j in range(np.searchsorted(x_link, m), np.searchsorted(x_link, m + 1)):
            if fstate[x_flow[j]] == 1:
                hn = _freeze(x_flow[j], t, st, hn)
    return hn


@maxmin_kernel.jit
def replay(n_flows: int, e_pos: np.ndarray, e_link: np.ndarray, e_coef: np.ndarray, lix: tuple,  # type: ignore[type-arg]
           fix: tuple, scratch: tuple, w: np.ndarray, rate: np.ndarray, new: np.ndarray,  # type: ignore[type-arg]
           cap: np.ndarray, link_lvl: np.ndarray, link_rate: np.ndarray,
           seed_links: np.ndarray, seed_lvl: np.ndarray, rel_tol: float, eq_tol: float, budget: int) -> int:
    """Re-solve after a change (see the module docstring), updating ``rate``, ``link_lvl`` and ``link_rate``
    in place. ``lix`` and ``fix`` are the link-major and flow-major views of the incidence (:meth:`LinkIndex.view`,
    :meth:`FlowIndex.view`) and ``scratch`` per-link work arrays (:func:`scratch`: ``dirty`` all False, left so on
    return).
    ``seed_links`` become dirty at ``seed_lvl`` (sorted ascending). Returns the number of flows tracked, or
    -1, having changed nothing, once the replay has visited more than ``budget`` incidence entries (a
    change that reaches most of the pool: a solve from scratch is cheaper)."""
    n_links = cap.size
    n_e = e_pos.size
    f_ptr, f_ord = fix
    ff = np.empty((n_flows, 4))
    fi = np.empty((n_flows, 2), dtype=np.int64)  # per tracked flow: entries at its clean minimum, last scan's link
    fstate = np.zeros(n_flows, dtype=np.int8)
    fdiv = np.zeros(n_flows, dtype=np.int8)
    lf, lcount, dirty = scratch
    tracked = np.empty(n_flows, dtype=np.int64)
    dirty_list = np.empty(n_links, dtype=np.int64)
    counts = np.zeros(3, dtype=np.int64)  # flows tracked, links dirty, entries visited
    size = 4 * n_e + 2 * n_flows + 16
    hk = np.empty(size)
    hv = np.empty(size, dtype=np.int64)
    st = (f_ptr, f_ord, lix, e_pos, e_link, e_coef, w, rate, new, cap, link_lvl, eq_tol,
          ff, fstate, fdiv, lf, lcount, dirty, tracked, dirty_list, counts, hk, hv, fi)
    hn = 0
    si = 0  # seeds join before any event at or above their level (ties first: a finished flow's links together)
    while hn > 0 or si < seed_links.size:
        if counts[2] > budget:
            for i in range(counts[1]):
                dirty[dirty_list[i]] = False
            return -1
        if si < seed_links.size and (hn == 0 or seed_lvl[si] <= hk[0]):
            if not dirty[seed_links[si]]:
                hn = _join(seed_links[si], seed_lvl[si], st, hn)
            si += 1
            continue
        t, code = hk[0], hv[0]
        hn = _pop(hk, hv, hn)
        kind, x = code & 3, code >> 2
        if kind == _LINK:
            if lf[x, _CUR] == t and lcount[x] > 0:
                hn = _fill_round(t, x, st, rel_tol, hn)
        elif kind == _CAP:
            if fstate[x] == 1 and ff[x, _BOUND] == t:
                hn = _freeze(x, t, st, hn)
        elif fstate[x] == 1 and fdiv[x] < 0:  # divergence: its clean links join at its old level
            fdiv[x] = 1
            ff[x, _BOUND] = np.inf
            for q in range(f_ptr[x], f_ptr[x + 1]):
                m = e_link[f_ord[q]]
                if not dirty[m]:
                    hn = _join(m, t, st, hn)
    for i in range(counts[0]):
        f = tracked[i]
        rate[f] = ff[f, _NEW] if fstate[f] == 2 else w[f] * ff[f, _BOUND]
    for i in range(counts[1]):
        lk = dirty_list[i]
        link_lvl[lk] = lf[lk, _FILL]
        link_rate[lk] = lf[lk, _FROZEN]
        dirty[lk] = False
    return counts[0]  # type: ignore[no-any-return]


@maxmin_kernel.jit
def _link_index(e_pos: np.ndarray, e_link: np.ndarray, e_coef: np.ndarray,
                n_links: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    l_ptr, l_ord = _csr(e_link, n_links)
    return l_ptr, e_pos[l_ord], e_coef[l_ord]


@maxmin_kernel.jit
def _drop_flows(l_ptr: np.ndarray, l_flow: np.ndarray, l_coef: np.ndarray,
                newpos: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The link-major view without the flows that went (``newpos`` -1), renumbered; compacted in place (every write
    lands at or before its read), so a finish allocates and faults in no new arrays of the incidence's size."""
    k = 0
    lo = l_ptr[0]
    for lk in range(l_ptr.size - 1):
        hi = l_ptr[lk + 1]
        l_ptr[lk] = k
        for j in range(lo, hi):
            p = newpos[l_flow[j]]
            if p >= 0:
                l_flow[k] = p
                l_coef[k] = l_coef[j]
                k += 1
        lo = hi
    l_ptr[l_ptr.size - 1] = k
    return l_ptr, l_flow[:k], l_coef[:k]


def scratch(n_links: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-link work arrays of :func:`replay`, allocated once per pool: only the dirty links' entries are
    touched (and ``dirty`` is left all False), so a replay costs nothing per link of the topology."""
    return np.empty((n_links, 4)), np.empty(n_links, dtype=np.int64), np.zeros(n_links, dtype=bool)


class FlowIndex:
    """Flow-major view of a pool's incidence (each flow's entries), kept across solves: built with a solve from
    scratch or at the first replay after flows went (a counting sort over every entry), then extended by the
    entries of the flows added since (a counting sort of theirs only); a replay sorted the whole incidence by flow
    every time before (1.7 ms of a start among 100k flows). Entries appended after the build belong to flows added
    after it, as :meth:`FlowPool.add` appends them (otherwise the view sorts every entry again). A finish drops
    it: compacting it on every finish cost a 100k-chip training step more than the sorts it saved."""

    def __init__(self, e_pos: np.ndarray, n_flows: int) -> None:
        # with headroom, as the pool's own arrays (FlowPool.flush): the next starts extend it in place
        self.ptr = np.zeros(n_flows + n_flows // 4 + 16, dtype=np.int64)
        self.order = np.empty(e_pos.size + e_pos.size // 4 + 64, dtype=np.int64)
        self.n_flows = self.n_e = 0
        self.view(e_pos, n_flows)

    def view(self, e_pos: np.ndarray, n_flows: int) -> tuple[np.ndarray, np.ndarray]:
        """(ptr, order) over ``n_flows`` flows and the entries ``e_pos``: entries ``order[ptr[f]:ptr[f+1]]`` are
        flow f's."""
        if n_flows > self.n_flows or e_pos.size > self.n_e:
            if e_pos.size > self.n_e and int(e_pos[self.n_e:].min()) < self.n_flows:
                self.n_flows = self.n_e = 0  # entries for flows it holds (not a pool's append): sort them all again
            if self.ptr.size < n_flows + 1:
                self.ptr = np.concatenate([self.ptr[:self.n_flows + 1],
                                           np.empty(max(n_flows + 1, 2 * self.ptr.size) - self.n_flows - 1,
                                                    dtype=np.int64)])
            if self.order.size < e_pos.size:
                self.order = np.concatenate([self.order[:self.n_e],
                                             np.empty(max(e_pos.size, 2 * self.order.size) - self.n_e, dtype=np.int64)])
            _csr_append(e_pos, self.n_e, self.n_flows, n_flows, self.ptr, self.order)
            self.n_flows, self.n_e = n_flows, int(e_pos.size)
        return self.ptr[:n_flows + 1], self.order[:e_pos.size]


class LinkIndex:
    """Link-major view of a pool's incidence (flows and coefficients per link), kept across solves.

    Built once (a counting sort over every link, the costly part) for the entries ``[0, n_base)``;
    entries appended later are *extras*, sorted by link at each replay (few: the flows started since);
    a removal drops the removed flows' entries in one sequential pass instead of a rebuild."""

    def __init__(self, e_pos: np.ndarray, e_link: np.ndarray, e_coef: np.ndarray, n_links: int) -> None:
        self.base = _link_index(e_pos, e_link, e_coef, n_links)
        self.n_base = int(e_pos.size)
        self.n_flows = int(e_pos.max()) + 1 if e_pos.size else 0  # flows the base covers: 0 .. n_flows-1

    def drop(self, newpos: np.ndarray, kept_base: int) -> None:
        """Flows were removed (``newpos``: new position of each old flow, -1 if removed)."""
        first = int(np.argmin(newpos >= 0)) if (newpos < 0).any() else newpos.size
        if first < self.n_flows:  # else only flows added since the build went: the base is unchanged
            self.base = _drop_flows(*self.base, newpos)
            self.n_flows = int((newpos[:self.n_flows] >= 0).sum())
        self.n_base = kept_base

    def view(self, e_pos: np.ndarray, e_link: np.ndarray, e_coef: np.ndarray,
             n_links: int) -> tuple:  # type: ignore[type-arg]
        """The tuple :func:`replay` reads: the base plus the extras (entries from ``n_base`` on) sorted by link;
        ``n_links`` may have grown since the build (links the base does not hold have no base entries)."""
        l_ptr = self.base[0]
        if l_ptr.size < n_links + 1:
            self.base = (np.concatenate([l_ptr, np.full(n_links + 1 - l_ptr.size, l_ptr[-1])]), *self.base[1:])
        xl = e_link[self.n_base:]
        order = np.argsort(xl, kind="stable")
        return (*self.base, xl[order], e_pos[self.n_base:][order], e_coef[self.n_base:][order])


@maxmin_kernel.jit
def link_levels(e_pos: np.ndarray, e_link: np.ndarray, level: np.ndarray, link_rate: np.ndarray, cap: np.ndarray,
                full_rel: float, out: np.ndarray) -> None:
    """Fill level of each link in use: the highest level of its flows if it carries within ``full_rel`` of its
    capacity, else ``inf``. Work over the entries only (a link out of use keeps a stale level, which is never read:
    a flow that comes to use it makes it dirty first)."""
    for i in range(e_pos.size):
        out[e_link[i]] = -1.0
    for i in range(e_pos.size):
        lk = e_link[i]
        if link_rate[lk] > 0 and link_rate[lk] >= cap[lk] * (1.0 - full_rel):
            v = level[e_pos[i]]
            if v > out[lk]:
                out[lk] = v
    for i in range(e_pos.size):
        if out[e_link[i]] < 0:
            out[e_link[i]] = np.inf


def warm_up() -> None:
    """Compile (or load from numba's cache) the solver kernels now: a service calls this before it
    answers, so its first solve does not stall the event loop for the seconds a compile takes."""
    one = np.zeros(1, dtype=np.int64)
    maxmin_kernel.fill(1, one, one, np.ones(1), np.ones(1), np.ones(1), np.zeros(1), 1e-9)
    lvl = np.full(1, np.inf)
    lix = LinkIndex(one, one, np.ones(1), 1)
    lix.drop(np.zeros(1, dtype=np.int64), 1)
    fix = FlowIndex(one, 1)
    replay(1, one, one, np.ones(1), lix.view(one, one, np.ones(1), 1), fix.view(one, 1), scratch(1), np.ones(1),
           np.zeros(1),
           np.ones(1, dtype=np.bool_), np.ones(1), lvl,
           np.zeros(1), one, np.zeros(1), 1e-9, 1e-10, 1 << 40)
    link_levels(one, one, np.ones(1), np.ones(1), np.ones(1), 1e-8, lvl)


__all__ = ["FlowIndex", "LinkIndex", "link_levels", "replay", "scratch", "warm_up"]
