"""The dispatcher's decisions: admission by quota, fair-share order, placement, preemption and
backfill, as one pure function over arrays and small records (no gRPC, no clock).

Each pass (:func:`decide`) takes the queued jobs, the running gangs and the free devices, and
returns which jobs to place (with their devices), which gangs to evict, and why every other job
waits. The rules, after Kueue, Volcano and Slurm:

1. **Order**: higher priority first; within a priority, the tenant with the least weighted usage
   first (chip-seconds run plus chip-seconds committed to its running gangs, divided by the
   tenant's weight), so saturated tenants converge to chip-hours in proportion to their weights;
   then submission order.
2. **Quota**: a job whose queue is defined runs within the queue's nominal quota per chip type,
   or borrows idle quota of its cohort (the cohort's total is never exceeded). A job within its
   own nominal quota may reclaim borrowed quota by evicting borrowing gangs of its cohort. A job
   held by quota does not block others.
3. **Gang placement** by the configured policy (:mod:`scheduler.placement`): all chips or none.
4. **Preemption**: the first job that does not fit may evict whole gangs of strictly lower
   priority (lowest priority, then youngest first, pruned to a minimal set).
5. **Backfill (EASY)**: otherwise the first job that does not fit gets a reservation: the earliest
   time enough running gangs end (by their estimated ends) and the devices it would get then.
   Later jobs may start now only if they avoid those devices or end before the reserved start.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from gigacluster.scheduler.placement import Layout, PlacementPolicy


@dataclasses.dataclass(frozen=True)
class QueueSpec:
    """A tenant's queue: nominal quota per chip type and an optional cohort."""

    tenant: str
    queue: str
    cohort: str = ""
    quota: tuple[tuple[str, int], ...] = ()

    def nominal(self, chip: str) -> int:
        return dict(self.quota).get(chip, 0)


@dataclasses.dataclass(frozen=True)
class Pending:
    """A queued job as the dispatcher sees it."""

    job_id: str
    tenant: str
    queue: str
    priority: int
    seq: int
    chip: str
    count: int
    tp: int
    duration_s: float  # estimated run time left (for backfill and committed usage)


@dataclasses.dataclass(frozen=True)
class Running:
    """A placed gang."""

    job_id: str
    tenant: str
    queue: str
    priority: int
    chip: str
    devices: np.ndarray
    end_s: float  # estimated end
    started_s: float
    borrowing: bool = False
    draining: bool = False  # being preempted: its devices free up at end_s
    restart_s: float = 0.0  # modelled cost of evicting it (checkpoint write)


@dataclasses.dataclass
class Decision:
    place: list[tuple[str, np.ndarray, bool]] = dataclasses.field(default_factory=list)
    preempt: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (victim, reason)
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)
    reserved: dict[str, float] = dataclasses.field(default_factory=dict)  # job -> reserved start


def _key(queue: QueueSpec | None) -> str:
    return queue.cohort if queue is not None and queue.cohort else ""


class _Quota:
    """Chips in use per (tenant, queue, chip) and per (cohort, chip), updated as the pass places."""

    def __init__(self, queues: dict[tuple[str, str], QueueSpec], running: list[Running]) -> None:
        self.queues = queues
        self.used: dict[tuple[str, str, str], int] = {}
        self.cohort_nominal: dict[tuple[str, str], int] = {}
        self.cohort_used: dict[tuple[str, str], int] = {}
        for q in queues.values():
            if q.cohort:
                for chip, n in q.quota:
                    self.cohort_nominal[(q.cohort, chip)] = self.cohort_nominal.get((q.cohort, chip), 0) + n
        for r in running:
            self.add(r.tenant, r.queue, r.chip, int(r.devices.size))

    def add(self, tenant: str, queue: str, chip: str, n: int) -> None:
        k = (tenant, queue, chip)
        self.used[k] = self.used.get(k, 0) + n
        q = self.queues.get((tenant, queue))
        if q is not None and q.cohort:
            ck = (q.cohort, chip)
            self.cohort_used[ck] = self.cohort_used.get(ck, 0) + n

    def check(self, tenant: str, queue: str, chip: str, n: int) -> tuple[str, bool, int]:
        """('ok'|'borrow'|'reclaim'|'held', borrowing, chips to reclaim) for ``n`` more chips."""
        q = self.queues.get((tenant, queue))
        if q is None:
            return "ok", False, 0
        used = self.used.get((tenant, queue, chip), 0)
        nominal = q.nominal(chip)
        if not q.cohort:
            return ("ok", False, 0) if used + n <= nominal else ("held", False, 0)
        ck = (q.cohort, chip)
        c_used, c_nom = self.cohort_used.get(ck, 0), self.cohort_nominal.get(ck, 0)
        if used + n <= nominal:
            over = c_used + n - c_nom
            return ("ok", False, 0) if over <= 0 else ("reclaim", False, over)
        if c_used + n <= c_nom:
            return "borrow", True, 0
        return "held", False, 0

    def reason(self, tenant: str, queue: str, chip: str, n: int) -> str:
        q = self.queues[(tenant, queue)]
        used = self.used.get((tenant, queue, chip), 0)
        msg = (f"queue {queue} quota: needs {n} {chip}, uses {used} of its nominal {q.nominal(chip)}")
        if q.cohort:
            ck = (q.cohort, chip)
            idle = self.cohort_nominal.get(ck, 0) - self.cohort_used.get(ck, 0)
            msg += f"; cohort {q.cohort} has {max(idle, 0)} idle to lend"
        return msg


def committed_usage(now: float, usage: dict[str, float], running: list[Running]) -> dict[str, float]:
    """Each tenant's chip-seconds for fair share: ``usage`` (run so far) plus what its running gangs
    have committed until their estimated ends, each counted once."""
    use = dict(usage)
    for r in running:
        use[r.tenant] = use.get(r.tenant, 0.0) + r.devices.size * max(r.end_s - now, 0.0)
    return use


def _order(pending: list[Pending], usage: dict[str, float], weights: dict[str, float]) -> list[Pending]:
    """Priority desc; within a priority, repeatedly the tenant with least weighted usage (then
    submission order), each pick charging the tenant its job's chip-seconds.

    A heap of tenants keyed by weighted usage, each with its jobs in submission order: O(n log T)
    for n jobs of T tenants, where picking the minimum over all remaining jobs was O(n^2).
    """
    out: list[Pending] = []
    use = dict(usage)
    by_prio: dict[int, dict[str, list[Pending]]] = {}
    for p in pending:
        by_prio.setdefault(p.priority, {}).setdefault(p.tenant, []).append(p)
    for prio in sorted(by_prio, reverse=True):
        queues = by_prio[prio]
        heap: list[tuple[float, int, str, int]] = []  # (weighted usage, head seq, tenant, head index)
        for tenant, jobs in queues.items():
            jobs.sort(key=lambda p: p.seq)
            heap.append((use.get(tenant, 0.0) / max(weights.get(tenant, 1.0), 1e-9), jobs[0].seq, tenant, 0))
        heapq.heapify(heap)
        while heap:
            _, _, tenant, i = heapq.heappop(heap)
            jobs = queues[tenant]
            best = jobs[i]
            out.append(best)
            use[tenant] = use.get(tenant, 0.0) + best.count * best.duration_s
            if i + 1 < len(jobs):
                heapq.heappush(heap, (use[tenant] / max(weights.get(tenant, 1.0), 1e-9), jobs[i + 1].seq, tenant,
                                      i + 1))
    return out


class _Fits:
    """Placement answers within one pass, remembered where they cannot change.

    Free masks only lose devices during a pass and the evicted set only grows, so once ``count``
    chips in TP groups of ``tp`` do not fit a mask, no larger count fits it either: later jobs of
    that shape are answered from here instead of searching the layout again (with 10,000 queued
    jobs most are identical shapes that cannot fit).
    """

    def __init__(self, policy: PlacementPolicy) -> None:
        self.policy = policy
        self.no: dict[tuple[str, str, int], int] = {}  # (chip, mask kind, tp) -> smallest count that failed

    def place(self, kind: str, job: Pending, lay: Layout, mask: np.ndarray) -> np.ndarray | None:
        key = (job.chip, kind, job.tp)
        if job.count >= self.no.get(key, 1 << 62):
            return None
        devs = self.policy.place(lay, mask, job.count, job.tp)
        if devs is None and job.count % job.tp == 0:  # whole TP groups: more of them never fit better
            self.no[key] = min(job.count, self.no.get(key, 1 << 62))
        return devs


def decide(now: float, pending: list[Pending], running: list[Running], *, layouts: dict[str, Layout],
           free: dict[str, np.ndarray], policy: PlacementPolicy, queues: dict[tuple[str, str], QueueSpec],
           weights: dict[str, float], usage: dict[str, float], preemption: bool = True,
           backfill: bool = True) -> Decision:
    """One dispatch pass. ``free`` masks are per layout device (False = held or unhealthy);
    ``usage`` is each tenant's chip-seconds run so far (without what running gangs have committed:
    this function adds that, once). The masks are not modified."""
    dp = _Pass(now, running, layouts=layouts, free=free, policy=policy, queues=queues, preemption=preemption,
               backfill=backfill)
    for job in _order(pending, committed_usage(now, usage, running), weights):
        dp.consider(job)
    return dp.out


@dataclasses.dataclass(eq=False)
class _Pass:
    """One pass's working state, and the steps each queued job goes through in priority and fair-share
    order: quota (held, or reclaim from borrowers), place now (or backfill around the reservation),
    wait for draining gangs, preempt lower priorities, or reserve from running gangs' estimated ends."""

    now: float
    running: list[Running]
    _: dataclasses.KW_ONLY
    layouts: dict[str, Layout]
    free: dict[str, np.ndarray]  # a copy of the caller's masks: the pass marks devices as it places
    policy: PlacementPolicy
    queues: dict[tuple[str, str], QueueSpec]
    preemption: bool
    backfill: bool

    def __post_init__(self) -> None:
        self.out = Decision()
        self.free = {c: m.copy() for c, m in self.free.items()}
        self.quota = _Quota(self.queues, self.running)
        self.fits = _Fits(self.policy)
        # Shapes that found neither victims nor a reservation (chip, tp) -> (smallest count, highest priority).
        self.hopeless: dict[tuple[str, int], tuple[int, int]] = {}
        # per chip type: (head job, reserved start, reserved device mask)
        self.reservation: dict[str, tuple[str, float, np.ndarray]] = {}
        self.live = [r for r in self.running if not r.draining]
        self.draining = [r for r in self.running if r.draining]
        self.evicted: set[str] = set()

    def consider(self, job: Pending) -> None:
        """Decide one queued job: placed, preempting, reserved, or waiting with a reason."""
        out = self.out
        lay = self.layouts.get(job.chip)
        if lay is None:
            out.reasons[job.job_id] = f"no {job.chip} chips in this cluster"
            return
        verdict, borrowing, reclaim = self.quota.check(job.tenant, job.queue, job.chip, job.count)
        if verdict == "held":
            out.reasons[job.job_id] = self.quota.reason(job.tenant, job.queue, job.chip, job.count)
            return
        if verdict == "reclaim":
            self._reclaim(job, reclaim)
            return
        if self._place_now(job, lay, borrowing):
            return
        seen = self.hopeless.get((job.chip, job.tp))
        if seen is not None and job.count >= seen[0] and job.priority <= seen[1]:
            out.reasons[job.job_id] = seen_reason(job, self.free, self.running)
            return
        # The job does not fit now: preempt, or reserve.
        hyp = self.free[job.chip].copy()
        if self._after_draining(job, lay, hyp):
            return
        if self.preemption and self._preempt(job, lay, hyp):
            return
        self._reserve_at_ends(job, lay, hyp)

    def _reclaim(self, job: Pending, reclaim: int) -> None:
        """Within its nominal quota but the cohort's chips are lent out: evict borrowers to get them back."""
        cohort = self.queues[(job.tenant, job.queue)].cohort
        lenders = sorted((r for r in self.live if r.borrowing and r.chip == job.chip and r.job_id not in self.evicted
                          and _key(self.queues.get((r.tenant, r.queue))) == cohort),
                         key=lambda r: (r.priority, -r.started_s))
        reclaimed = 0
        for r in lenders:
            if reclaimed >= reclaim:
                break
            self.out.preempt.append((r.job_id, f"quota reclaimed by {job.job_id} (cohort {cohort})"))
            self.evicted.add(r.job_id)
            reclaimed += int(r.devices.size)
        self.out.reasons[job.job_id] = (f"reclaiming {reclaim} {job.chip} of its nominal quota from borrowers in "
                                        f"cohort {cohort}" if reclaimed >= reclaim else
                                        f"cohort {cohort} quota is in use by non-borrowing jobs")

    def _place_now(self, job: Pending, lay: Layout, borrowing: bool) -> bool:
        """Place on free devices (around the chip's reservation, by backfill); True if the job is decided
        (placed, or waiting behind the reservation)."""
        mask = self.free[job.chip]
        res = self.reservation.get(job.chip)
        devs: np.ndarray | None
        if res is not None:
            head, start, rmask = res
            devs = self.fits.place("hole", job, lay, mask & ~rmask) if self.backfill else None
            if devs is None and self.backfill and self.now + job.duration_s <= start:
                devs = self.fits.place("free", job, lay, mask)
            if devs is None:
                # No moving figures in a waiting job's reason: it is re-published only when it changes,
                # and thousands of jobs behind one reservation must not change on every pass.
                self.out.reasons[job.job_id] = (f"waiting behind {head}, which holds the reservation; "
                                                f"no backfill hole for {job.count} {job.chip}")
                return True
        else:
            devs = self.fits.place("free", job, lay, mask)
        if devs is None:
            return False
        mask[devs - lay.offset] = False
        self.quota.add(job.tenant, job.queue, job.chip, job.count)
        self.out.place.append((job.job_id, devs, borrowing))
        return True

    def _after_draining(self, job: Pending, lay: Layout, hyp: np.ndarray) -> bool:
        """Reserve where the job fits once the gangs being preempted have released (adds their devices to ``hyp``)."""
        ends = sorted(self.draining, key=lambda r: r.end_s)
        for r in ends:
            if r.chip == job.chip:
                hyp[r.devices - lay.offset] = True
        later = self.policy.place(lay, hyp, job.count, job.tp) if ends else None
        if later is None:
            return False
        start = max(r.end_s for r in ends if r.chip == job.chip)
        self.out.reasons[job.job_id] = "waiting for preempted gangs to checkpoint and release their chips"
        _reserve(self.reservation, self.out, job, start, later, lay)
        return True

    def _preempt(self, job: Pending, lay: Layout, hyp: np.ndarray) -> bool:
        """Evict a minimal set of lower-priority gangs the job fits in place of; True if there is one."""
        victims = _victims(job, [r for r in self.live if r.job_id not in self.evicted], hyp, lay, self.policy)
        if not victims:
            return False
        for r in victims:
            self.out.preempt.append((r.job_id, f"preempted by {job.job_id} (priority {job.priority} > "
                                               f"{r.priority})"))
            self.evicted.add(r.job_id)
        vmask = hyp.copy()
        for r in victims:
            vmask[r.devices - lay.offset] = True
        taken = self.policy.place(lay, vmask, job.count, job.tp)
        start = self.now + max(r.restart_s for r in victims)
        self.out.reasons[job.job_id] = (f"preempting {', '.join(r.job_id for r in victims)}; starts when they "
                                        f"have checkpointed")
        if taken is not None:
            _reserve(self.reservation, self.out, job, start, taken, lay)
        return True

    def _reserve_at_ends(self, job: Pending, lay: Layout, hyp: np.ndarray) -> None:
        """Reserve from the estimated ends of running gangs, or say the cluster cannot hold the job."""
        out = self.out
        start_at: float | None = None
        got = None
        for r in sorted((r for r in self.live if r.chip == job.chip and r.job_id not in self.evicted),
                        key=lambda r: r.end_s):
            hyp[r.devices - lay.offset] = True
            got = self.policy.place(lay, hyp, job.count, job.tp)
            if got is not None:
                start_at = max(r.end_s, self.now)
                break
        if got is None or start_at is None:
            out.reasons[job.job_id] = seen_reason(job, self.free, self.running)
            if not self.draining:
                prev = self.hopeless.get((job.chip, job.tp), (1 << 62, -(1 << 62)))
                self.hopeless[(job.chip, job.tp)] = (min(prev[0], job.count), max(prev[1], job.priority))
            return
        out.reasons[job.job_id] = (f"waiting for {job.count} {job.chip} chips; reserved start t={start_at:.0f}s "
                                   f"(when {r.job_id} ends)")
        _reserve(self.reservation, out, job, start_at, got, lay)


def seen_reason(job: Pending, free: dict[str, np.ndarray], running: list[Running]) -> str:
    """Why a job can neither start, preempt nor reserve: the cluster's healthy chips cannot hold it."""
    healthy = int(free[job.chip].sum()) + sum(int(r.devices.size) for r in running if r.chip == job.chip)
    return (f"needs {job.count} {job.chip} chips in whole TP groups of {job.tp}; "
            f"{healthy} are healthy and schedulable")


def _reserve(reservation: dict[str, tuple[str, float, np.ndarray]], out: Decision, job: Pending, start: float,
             devs: np.ndarray, lay: Layout) -> None:
    if job.chip in reservation:
        return
    rmask = np.zeros(lay.n_devices, dtype=bool)
    rmask[devs - lay.offset] = True
    reservation[job.chip] = (job.job_id, start, rmask)
    out.reserved[job.job_id] = start


def _victims(job: Pending, live: list[Running], base: np.ndarray, lay: Layout,
             policy: PlacementPolicy) -> list[Running]:
    """A minimal set of strictly lower-priority gangs whose devices make ``job`` fit, or []."""
    cand = sorted((r for r in live if r.chip == job.chip and r.priority < job.priority),
                  key=lambda r: (r.priority, -r.started_s))
    hyp = base.copy()
    chosen: list[Running] = []
    for r in cand:
        hyp[r.devices - lay.offset] = True
        chosen.append(r)
        if policy.place(lay, hyp, job.count, job.tp) is not None:
            break
    else:
        return []
    # prune: drop any victim the job fits without (most valuable first)
    for r in sorted(chosen, key=lambda r: (-r.priority, r.started_s)):
        trial = base.copy()
        for o in chosen:
            if o is not r:
                trial[o.devices - lay.offset] = True
        if policy.place(lay, trial, job.count, job.tp) is not None:
            chosen.remove(r)
    return chosen
