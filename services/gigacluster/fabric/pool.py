"""The simulator's pool of active flows: per-flow arrays, their link incidence, and their max-min rates.

A pool *flow* is what the max-min solver sees (one per lockstep phase copy, or per independent
sub-flow); a *sub-flow* is one src -> dst route of it, kept so a fault can reroute it. Rates are
recomputed lazily (:meth:`FlowPool.solve`) after the pool or the capacities changed: from scratch
after a change of capacities or routes (or with mixed priorities), otherwise incrementally, replaying
the filling only on the links and flows a start or finish changes (:mod:`gigacluster.fabric.maxmin_incr`).
"""

from __future__ import annotations

import numpy as np

from gigacluster.fabric import maxmin_incr
from gigacluster.fabric.maxmin import maxmin_rates
from gigacluster.fabric.routing import Routes

_FLOW_FIELDS = ("gseq", "rem", "bytes_", "w", "prio", "rate", "drain", "new")
_REL_TOL = 1e-9  # links within this of the lowest level fill together (as in the solve from scratch)
_EQ_REL = 1e-10  # a flow whose new level is within this of its old one keeps its old rate (stops round-off spreading)
_BUDGET_DIV = 8  # an incremental solve gives up (for one from scratch) after visiting 1/8 of the incidence
_BUDGET_MIN = 200_000  # ... but never below this many entries (a small pool's solve from scratch is cheap anyway)
_BACKOFF_MAX = 64  # longest run of solves from scratch between two replays that gave up
_FULL_REL = 1e-8  # a link carrying this close to its capacity after a solve from scratch counts as filled
_ALL = (*_FLOW_FIELDS, "e_pos", "e_link", "e_loc", "e_coef", "s_pos", "s_src", "s_dst", "s_label", "s_w")


def _kept_ranges(gone: np.ndarray, n: int, max_runs: int = 64) -> list[tuple[int, int]] | None:
    """The ranges ``[a, b)`` of ``0..n-1`` left when the sorted indices ``gone`` are taken out, or None when those
    form more than ``max_runs`` runs (then a mask is cheaper)."""
    if gone.size == 0:
        return [(0, n)]
    brk = np.flatnonzero(np.diff(gone) != 1)
    if brk.size >= max_runs:
        return None
    lo = np.r_[0, gone[brk] + 1, gone[-1] + 1]  # each kept range starts after a run that goes ...
    hi = np.r_[gone[0], gone[brk + 1], n]  # ... and ends where the next run starts
    return [(a, b) for a, b in zip(lo.tolist(), hi.tolist(), strict=True) if b > a]


def _compact(arr: np.ndarray, ranges: list[tuple[int, int]] | None, mask: np.ndarray) -> np.ndarray:
    """``arr[mask]`` (a new array), copied as a few slices when ``ranges`` (:func:`_kept_ranges`) holds them: a
    finished group's entries are a block of the pool's, and copying around it is 3-4x faster than masking."""
    if ranges is None:
        return arr[mask]
    if not ranges:
        return arr[:0].copy()
    return np.concatenate([arr[a:b] for a, b in ranges])


class FlowPool:
    """Active flows (``gseq``: owning group, ``rem``/``bytes_``: bytes left/at start, ``w``, ``prio``),
    their incidence (``e_pos``, ``e_link``, ``e_coef``) and sub-flows (``s_pos``, ``s_src``, ``s_dst``,
    ``s_label``, ``s_w``: the sub-flow's share of its flow's bytes, kept for rerouting); after :meth:`solve`:
    ``rate``, ``drain`` (absolute end time), ``link_rate`` and ``grp_drain`` (latest drain per group).

    Links are numbered locally, in the order the pool first meets them (``e_loc``; ``e_link`` keeps the
    topology's ids): every per-link array of the solvers is as long as the links the pool's flows use, not as
    the topology (a step of a 100k-chip job uses 0.7M of a 2 GW site's 11M links), and the numbering starts
    again whenever the pool is empty."""

    def __init__(self, n_links: int) -> None:
        self.n_links = n_links
        self.gseq = np.zeros(0, dtype=np.int64)
        self.rem = np.zeros(0)
        self.bytes_ = np.zeros(0)
        self.w = np.zeros(0)
        self.prio = np.zeros(0, dtype=np.int64)
        self.rate = np.zeros(0)
        self.drain = np.zeros(0)
        self.e_pos = np.zeros(0, dtype=np.int64)
        self.e_link = np.zeros(0, dtype=np.int64)
        self.e_loc = np.zeros(0, dtype=np.int64)  # e_link in the pool's local link numbering
        self.e_coef = np.zeros(0)
        self.s_pos = np.zeros(0, dtype=np.int64)
        self.s_src = np.zeros(0, dtype=np.int64)
        self.s_dst = np.zeros(0, dtype=np.int64)
        self.s_label = np.zeros(0, dtype=np.int64)
        self.s_w = np.zeros(0)
        self._g2l = np.zeros(n_links, dtype=np.int32)  # local id + 1 of each topology link met (0: not met)
        self._l2g = np.zeros(16, dtype=np.int64)  # topology id of each local link (capacity-doubled, as below)
        self.n_local = 0
        self._lr = np.zeros(16)  # carried rate per local link, after a solve
        self._lvl = np.full(16, np.inf)  # level at which each local link filled in the last solve
        self._cap_loc = np.zeros(16)  # capacity of each local link (its first _cap_n gathered from _cap_of)
        self._cap_of: np.ndarray | None = None
        self._cap_n = 0
        self._used: np.ndarray | None = None  # the local links with a non-zero rate, made when first asked
        self.generation = 0  # bumped by every solve that sets rates: what is derived from the rates keys on it
        self.grp_drain: dict[int, float] = {}
        self.dirty = False
        self.incremental = True
        self.new = np.zeros(0, dtype=bool)  # added since the last solve (no rate yet)
        self._full = True  # next solve from scratch (capacities or routes changed)
        self._scratch: tuple[np.ndarray, ...] | None = None  # the replay's per-link work arrays (allocated once)
        self._lix: maxmin_incr.LinkIndex | None = None  # link-major incidence for incremental solves
        self._fix: maxmin_incr.FlowIndex | None = None  # flow-major incidence for incremental solves
        self.tracked = -1  # flows the last incremental solve re-solved (-1: the last solve was from scratch)
        self._skip = 0  # solves from scratch to run before trying a replay again
        self._backoff = 1
        self._seeds: list[tuple[np.ndarray, np.ndarray]] = []  # (links, old levels) of flows removed since
        self._bufs: dict[str, np.ndarray] = {}  # growable buffers behind the arrays of _ALL (flush)
        self._chunks: list[tuple[np.ndarray, ...]] = []  # added since the last flush, in _ALL order
        self._n_pending = 0

    @property
    def size(self) -> int:
        return int(self.rem.size) + self._n_pending

    @property
    def link_rate(self) -> np.ndarray:
        """Carried rate of every link of the topology (a new array: for statistics; the hot paths read
        :meth:`used_links` and :meth:`used_rates`)."""
        out = np.zeros(self.n_links)
        out[self._l2g[:self.n_local]] = self._lr[:self.n_local]
        return out

    def _local(self, links: np.ndarray) -> np.ndarray:
        """Local ids of topology ``links``, numbering the links not met yet."""
        loc = self._g2l[links]
        miss = loc == 0
        if miss.any():
            cand = links[miss]
            mark = -np.arange(1, cand.size + 1, dtype=np.int32)  # one write per candidate; the last of a link wins
            self._g2l[cand] = mark
            new = cand[self._g2l[cand] == mark]  # each link once (no sort: O(candidates))
            n0, n1 = self.n_local, self.n_local + new.size
            if n1 > self._l2g.size:  # grow by doubling: links are met a few at a time, phase by phase
                # with headroom past n1 (at most every link of the topology): a pool that met most links at once
                # (100k flows) would otherwise grow, and drop the replay's work arrays, for every link it meets next
                size = min(self.n_links, max(n1 + n1 // 4, 2 * self._l2g.size))
                self._l2g = np.concatenate([self._l2g, np.zeros(size - self._l2g.size, dtype=np.int64)])
                self._lr = np.concatenate([self._lr, np.zeros(size - self._lr.size)])
                self._lvl = np.concatenate([self._lvl, np.full(size - self._lvl.size, np.inf)])
                self._scratch = None
            self._l2g[n0:n1] = new
            self._g2l[new] = np.arange(n0 + 1, n1 + 1, dtype=np.int32)
            self.n_local = n1
            loc = self._g2l[links]
        return loc.astype(np.int64) - 1

    def _renumber(self) -> None:
        """Forget the local numbering (the pool is empty): the next flows number their links from 0."""
        self._g2l[self._l2g[:self.n_local]] = 0
        self.n_local = 0
        self._lr[:] = 0.0
        self._lvl[:] = np.inf
        self._used, self._lix, self._fix, self._seeds, self._full = None, None, None, [], True

    def flush(self) -> None:
        """Append the flows added since the last flush. Each array is a prefix view of a buffer with room to
        grow (doubling), so a batch costs its own size, not a copy of the pool: 100k flows' 600k incidence
        entries copied for a collective of 8 were most of an incremental start."""
        if not self._chunks:
            return
        cols = list(zip(*self._chunks, strict=True))
        for name, col in zip(_ALL, cols, strict=True):
            cur = getattr(self, name)
            k = sum(c.size for c in col)
            n = cur.size
            buf = self._bufs.get(name)
            if (buf is None or cur.base is not buf or cur.ctypes.data != buf.ctypes.data
                    or n + k > buf.size or buf.dtype != cur.dtype):
                buf = np.empty(max(2 * (n + k), 1024), dtype=np.result_type(cur, *col))
                buf[:n] = cur
                self._bufs[name] = buf
            at = n
            for c in col:
                buf[at:at + c.size] = c
                at += c.size
            setattr(self, name, buf[:n + k])
        self._chunks.clear()
        self._n_pending = 0

    def add(self, gseq: int, n_new: int, bytes_: float, w: float, prio: int, sub_flow: np.ndarray, r: Routes,
            src: np.ndarray, dst: np.ndarray, labels: np.ndarray, sub_w: np.ndarray | None = None) -> None:
        """Append ``n_new`` flows of group ``gseq``; routed sub-flow ``i`` belongs to flow ``sub_flow[i]`` and
        carries ``sub_w[i]`` (default 1) times its flow's bytes (:attr:`Phase.weight`)."""
        if self.size == 0 and self.n_local:
            self._renumber()
        sub_pos = self.size + sub_flow
        w_sub = np.ones(src.size) if sub_w is None else np.asarray(sub_w, dtype=np.float64)
        coef = r.e_coef if sub_w is None else r.e_coef * w_sub[r.e_flow]
        self._chunks.append((
            np.full(n_new, gseq, dtype=np.int64), np.full(n_new, bytes_), np.full(n_new, bytes_), np.full(n_new, w),
            np.full(n_new, prio, dtype=np.int64), np.zeros(n_new), np.full(n_new, np.inf), np.ones(n_new, dtype=bool),
            sub_pos[r.e_flow], r.e_link, self._local(r.e_link), coef, sub_pos, src, dst, labels, w_sub,
        ))
        self._n_pending += n_new
        self.dirty = True

    def remove_group(self, gseq: int) -> None:
        """Drop every flow of group ``gseq``."""
        self.flush()
        self.remove(self.gseq == gseq)

    def remove(self, remove: np.ndarray) -> None:
        """Drop the flows where ``remove`` is True (and their incidence and sub-flows)."""
        self.flush()
        keep = ~remove
        newpos = np.cumsum(keep) - 1
        ek = keep[self.e_pos]
        sk = keep[self.s_pos]
        out = np.flatnonzero(~ek)  # the entries that go: a finished group's are one run, or a few
        er, sr = _kept_ranges(out, ek.size), _kept_ranges(np.flatnonzero(~sk), sk.size)
        solved = remove & ~self.new
        if solved.any() and not self._full:
            gone = out[solved[self.e_pos[out]]] if (remove & self.new).any() else out
            pos = self.e_pos[gone]
            self._seeds.append((self.e_loc[gone], self.rate[pos] / self.w[pos]))
        if self._lix is not None:
            n_base = self._lix.n_base
            self._lix.drop(np.where(keep, newpos, -1), n_base - int(np.searchsorted(out, n_base)))
        self._fix = None  # flows renumbered: the next replay sorts the incidence by flow again (FlowIndex)
        for name in _FLOW_FIELDS:
            setattr(self, name, getattr(self, name)[keep])
        self.e_pos = newpos[_compact(self.e_pos, er, ek)]
        self.e_link, self.e_loc, self.e_coef = (_compact(a, er, ek) for a in (self.e_link, self.e_loc, self.e_coef))
        self.s_pos = newpos[_compact(self.s_pos, sr, sk)]
        self.s_src, self.s_dst, self.s_label, self.s_w = (_compact(a, sr, sk)
                                                           for a in (self.s_src, self.s_dst, self.s_label, self.s_w))
        self.dirty = True

    def replace_incidence(self, keep_e: np.ndarray, e_pos: np.ndarray, e_link: np.ndarray, e_coef: np.ndarray) -> None:
        """Keep the entries where ``keep_e`` holds and append new ones (rerouted sub-flows); flush first."""
        self.e_pos = np.concatenate([self.e_pos[keep_e], e_pos])
        self.e_link = np.concatenate([self.e_link[keep_e], e_link])
        self.e_loc = np.concatenate([self.e_loc[keep_e], self._local(e_link)])
        self.e_coef = np.concatenate([self.e_coef[keep_e], e_coef])
        self.invalidate()

    def invalidate(self) -> None:
        """Capacities or routes changed: the next solve starts from scratch."""
        self.dirty = True
        self._full = True
        self._lix = self._fix = None

    def solve(self, capacity_Bps: np.ndarray, t_ref: float) -> None:
        """Max-min rates of every flow, per-link carried rate, and drain times from ``t_ref``."""
        if not self.dirty:
            return
        self.flush()
        n = self.size
        cap = self._local_capacity(capacity_Bps)
        prio = self.prio if n and self.prio.min() != self.prio.max() else None
        if self._full or prio is not None or not self.incremental or not self._resolve(cap):
            rate = maxmin_rates(n, self.e_pos, self.e_loc, self.e_coef, cap, weight=self.w, priority=prio)
            self.rate, self.tracked = rate, -1
            fin = np.isfinite(rate[self.e_pos])
            self._lr[:cap.size] = np.bincount(self.e_loc[fin], weights=self.e_coef[fin] * rate[self.e_pos[fin]],
                                              minlength=cap.size)
            if self.incremental and prio is None:
                maxmin_incr.link_levels(self.e_pos, self.e_loc, rate / self.w, self._lr, cap, _FULL_REL, self._lvl)
                if self._skip == 0 and self._backoff == 1:  # the next start skips the sort
                    self._lix = maxmin_incr.LinkIndex(self.e_pos, self.e_loc, self.e_coef, cap.size)
                    self._fix = maxmin_incr.FlowIndex(self.e_pos, n)
        else:
            rate = self.rate
        self.new[:] = False
        # rates under strict priority are not one water-filling: the incremental replay does not apply to them
        self._full, self._seeds = prio is not None, []
        with np.errstate(divide="ignore", invalid="ignore"):
            dt = np.where(np.isinf(rate), 0.0, np.where(rate > 0, self.rem / rate, np.inf))
        self.drain = t_ref + dt
        self.grp_drain = {}
        if n:
            order = np.argsort(self.gseq, kind="stable")
            gs = self.gseq[order]
            starts = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
            mx = np.maximum.reduceat(self.drain[order], starts)
            self.grp_drain = dict(zip(gs[starts].tolist(), mx.tolist(), strict=True))
        self._used = None
        self.generation += 1
        self.dirty = False

    def _local_capacity(self, capacity_Bps: np.ndarray) -> np.ndarray:
        """Capacity of each local link, gathered only for the links met since the last solve: capacities change
        only through :meth:`invalidate` (or a new array), after which the gather starts again. A start among 100k
        flows otherwise gathered all 600k links' capacities again (2 ms of an incremental solve)."""
        nl = self.n_local
        if self._full or capacity_Bps is not self._cap_of or self._cap_n > nl:
            self._cap_of, self._cap_n = capacity_Bps, 0
        if self._cap_loc.size < nl:
            self._cap_loc = np.concatenate([self._cap_loc[:self._cap_n], np.empty(self._l2g.size - self._cap_n)])
        if self._cap_n < nl:
            self._cap_loc[self._cap_n:nl] = capacity_Bps[self._l2g[self._cap_n:nl]]
            self._cap_n = nl
        return self._cap_loc[:nl]

    def _resolve(self, cap: np.ndarray) -> bool:
        """Incremental solve: replay progressive filling only where the starts and finishes since the last
        solve change it (:func:`gigacluster.fabric.maxmin_incr.replay`).

        Returns False, having changed nothing, when most of the pool is new or the replay reaches too much of it
        (a solve from scratch is cheaper)."""
        n = self.size
        if 2 * int(self.new.sum()) > n:
            return False
        if self._skip:  # the last replays reached most of the pool: skip some, with exponential backoff
            self._skip -= 1
            return False
        ent_new = self.new[self.e_pos]
        has = np.zeros(n, dtype=bool)  # new flows with no link (a transfer to itself) run at once
        has[self.e_pos[ent_new]] = True
        self.rate[self.new & ~has] = np.inf
        new_links = self.e_loc[ent_new]
        links = np.concatenate([new_links, *(lk for lk, _ in self._seeds)])
        levels = np.concatenate([np.zeros(new_links.size), *(lv for _, lv in self._seeds)])
        if links.size == 0:
            return True
        order = np.argsort(levels, kind="stable")
        if self._lix is None or 4 * (self.e_pos.size - self._lix.n_base) > self.e_pos.size:
            self._lix = maxmin_incr.LinkIndex(self.e_pos, self.e_loc, self.e_coef, self.n_local)
        lix = self._lix.view(self.e_pos, self.e_loc, self.e_coef, self.n_local)
        if self._fix is None:
            self._fix = maxmin_incr.FlowIndex(self.e_pos, n)
        fix = self._fix.view(self.e_pos, n)
        if self._scratch is None:
            self._scratch = maxmin_incr.scratch(self._l2g.size)
        self.tracked = maxmin_incr.replay(n, self.e_pos, self.e_loc, self.e_coef, lix, fix, self._scratch, self.w,
                                          self.rate, self.new, cap, self._lvl, self._lr, links[order],
                                          levels[order], _REL_TOL, _EQ_REL,
                                          max(self.e_pos.size // _BUDGET_DIV, _BUDGET_MIN))
        if self.tracked < 0:
            self._backoff = min(2 * self._backoff, _BACKOFF_MAX)
            self._skip, self._lix = self._backoff, None
            return False
        self._backoff = 1
        return True

    def crosses(self, links: np.ndarray) -> bool:
        """Whether a flow of the pool crosses one of the topology's ``links`` (``np.isin(e_link, links).any()``
        through the local numbering: two scatters and a gather instead of sorting every incidence entry and the
        links, for a window request of 600k links against millions of entries)."""
        if not self.size or not links.size:
            return False
        self.flush()
        loc = self._g2l[links]
        loc = loc[loc > 0] - 1  # links the pool met (local id + 1)
        if not loc.size:
            return False
        crossed = np.zeros(self.n_local, dtype=bool)
        crossed[self.e_loc] = True
        return bool(crossed[loc].any())

    def _used_local(self) -> np.ndarray:
        if self._used is None:
            self._used = np.flatnonzero(self._lr[:self.n_local])
        return self._used

    def used_links(self) -> np.ndarray:
        """The topology's links that carry traffic at the current rates (unique; kept until the next solve)."""
        return self._l2g[self._used_local()]

    def used_rates(self) -> np.ndarray:
        """The carried rate of each of :meth:`used_links`."""
        return self._lr[self._used_local()]

    def move(self, dt: float) -> tuple[np.ndarray, np.ndarray]:
        """Drain ``dt`` seconds at the current rates; returns (links, bytes each carried meanwhile) for the links
        that carry traffic."""
        if self.size:
            moved = np.where(np.isinf(self.rate), self.rem, self.rate * dt)
            self.rem = np.maximum(self.rem - moved, 0.0)
        return self.used_links(), self.used_rates() * dt


__all__ = ["FlowPool"]
