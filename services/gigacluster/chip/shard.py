"""A shard of emulated accelerators: pure state and behaviour, no gRPC.

All per-device state is numpy arrays indexed by local id (global id - offset), so a shard of a
million devices is a few tens of MB and every operation is vectorised. Work runs in lock step on
a device group: it starts at ``max(not_before, busy_until of the group)`` and lasts the roofline
time of its items at the slowest device's clock, so the caller's RPC latency never enters the
result. Energy is booked exactly: idle power x elapsed time plus, per work item, the energy the
power model says it draws above idle (the same functions ``estimate train`` uses).

Temperature is exact too (model/thermal.py): each device keeps its temperature at one instant and the run of
work booked since (one item, or a window's repetitions), and its temperature at any later time is the RC
model's closed form over that history. Work takes the clock its devices' temperature gives at the virtual time
it starts, so a run's step times depend on the virtual-time history of work alone, never on when a telemetry
tick ran (:meth:`ChipShard.tick` only reads the model).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np

from gigacluster.arrays import distinct
from gigacluster.errors import WINDOW_NOT_STEADY, FailedPrecondition, InvalidArgument, NotFound
from gigacluster.hw.catalog import Chip, System
from gigacluster.model import power, thermal
from gigacluster.model.cadence import Cadence, cadence
from gigacluster.model.roofline import Work, work_time_s
from gigacluster.security.overhead import VirtualizationOverhead

HEALTHY, THROTTLED, FAILED = 1, 2, 3  # match chip.v1.Device.State
FAULT_NONE, FAULT_FAILED, FAULT_HBM, FAULT_SLOW = 0, 1, 2, 3  # match chip.v1.FaultKind


@dataclasses.dataclass(frozen=True)
class ExecResult:
    start_s: float
    end_s: float
    energy_j: float
    clock_factor: float


@dataclasses.dataclass
class WorkWindow:
    """Repetitions of one work on devices ``idx``: rep j runs ``[cadence.start(j), + dur_s)``."""

    idx: np.ndarray
    cadence: Cadence
    repeat: int
    dur_s: float
    above_j: float  # per device and repetition
    power_w: float = 0.0  # each device's mean power while a repetition runs (its thermal history)
    throttle_at_s: float = math.inf  # where the devices' temperature would change the clock: cut there

    def rep_end_s(self, n: int) -> float:
        """End of the first ``n`` repetitions (the window's start when n is 0)."""
        return self.cadence.end(n, self.dur_s)

    def reps_before(self, at_s: float) -> int:
        """Repetitions that start before ``at_s`` (a float-noise margin keeps a cut at a step boundary exact)."""
        return min(self.cadence.started_before(at_s), self.repeat)


@dataclasses.dataclass(frozen=True)
class FaultRun:
    """Devices ``start .. end-1`` (global ids) with one fault ``kind``, clock factor and repair time (inf: none)."""

    start: int
    end: int
    kind: int
    clock_factor: float
    repair_at_s: float


@dataclasses.dataclass(frozen=True)
class ShardSnapshot:
    """Aggregates published as telemetry (one message per shard, never per chip)."""

    now_s: float
    devices: int
    healthy: int
    throttled: int
    failed: int
    mean_utilization: float
    power_w: float
    energy_j: float
    busy_s: float
    max_temperature_c: float
    mean_clock_factor: float


def _shared(runs: np.ndarray) -> int | None:
    """The one thermal run id every device of ``runs`` has, else None."""
    return int(runs[0]) if runs.size and (runs == runs[0]).all() else None


class ChipShard:
    """Devices ``offset .. offset+count-1`` of one chip type."""

    def __init__(self, chip: Chip, system: System, *, offset: int, count: int, start_s: float,
                 overhead: VirtualizationOverhead | None = None) -> None:
        self.chip = chip
        # Isolation has a cost: a Nitro-like layer takes a share of compute and a per-call latency.
        self.overhead = overhead or VirtualizationOverhead.none()
        self.system = system
        self.offset = offset
        self.count = count
        self.start_s = start_s
        self.thermal = thermal.ThermalParams.for_chip(chip)
        n = count
        self.busy_until_s = np.full(n, start_s)
        self.busy_s = np.zeros(n)
        self.above_idle_j = np.zeros(n)
        self.fault = np.zeros(n, dtype=np.int8)
        self.fault_factor = np.ones(n)
        # Virtual time each fault is repaired (inf: until ClearFault); the earliest, so a check is one compare.
        self.repair_at_s = np.full(n, math.inf)
        self._next_repair_s = math.inf
        # Each device's thermal history: its temperature at _th_t0_s, then the run of work booked since (id into
        # _runs; 0 = idle). Reads at any time are the closed form over it (temperature_at).
        self._th_t0_s = np.full(n, start_s)
        self._th_temp0_c = np.full(n, float(self.thermal.inlet_c))
        self._th_run = np.zeros(n, dtype=np.int64)
        self._runs: dict[int, thermal.Run] = {}
        self._run_refs: dict[int, int] = {}
        self._run_ids = itertools.count(1)
        # Telemetry: temperature and thermal clock as of the last tick (reads of the model, never inputs to it).
        self.temp_c = np.full(n, float(self.thermal.inlet_c))
        self.thermal_clock = np.ones(n)
        self.power_w = np.full(n, chip.idle_w)
        self.utilization = np.zeros(n)
        # The last booked work item per device: work is booked when scheduled (possibly ahead of the
        # clock), and these let busy time and energy be reported as accrued up to a given time.
        self._item_start_s = np.full(n, start_s)
        self._item_end_s = np.full(n, start_s)
        self._item_above_j = np.zeros(n)
        self._item_busy_s = np.zeros(n)  # busy time of that item (a window's: all its repetitions)
        self.windows: dict[int, WorkWindow] = {}  # steady-state windows not yet over
        self._window_ids = itertools.count(1)
        self._last_tick_s = start_s
        self._last_busy_s = np.zeros(n)
        self._last_above_j = np.zeros(n)
        # HBM each device's instance holds as modelled state (a job's weights, optimizer state and
        # activations; a replica's weights and KV cache in use), reported by the caller, not allocated
        # byte by byte; 0 once the instance is released.
        self.held_bytes = np.zeros(n, dtype=np.int64)

    # -- addressing -------------------------------------------------------------------------------
    @property
    def end(self) -> int:
        return self.offset + self.count

    def local(self, ranges: Sequence[tuple[int, int]], field: str = "devices") -> np.ndarray:
        """Local indices of the global ranges [start, end); NOT_FOUND outside this shard."""
        if not ranges:
            raise InvalidArgument(field, "must name at least one device range")
        parts = []
        for i, (start, end) in enumerate(ranges):
            if end <= start:
                raise InvalidArgument(f"{field}[{i}]", f"end ({end}) must be > start ({start})")
            if start < self.offset or end > self.end:
                raise NotFound(
                    f"devices/{start}-{end - 1}",
                    f"{field}[{i}]: devices {start}..{end - 1} are not on this shard "
                    f"(it hosts {self.offset}..{self.end - 1})",
                )
            parts.append(np.arange(start - self.offset, end - self.offset))
        return distinct(np.concatenate(parts))

    @property
    def clock(self) -> np.ndarray:
        return self.thermal_clock * self.fault_factor

    def state(self) -> np.ndarray:
        st = np.full(self.count, HEALTHY, dtype=np.int8)
        st[self.clock < 0.999] = THROTTLED
        st[(self.fault == FAULT_FAILED) | (self.fault == FAULT_HBM)] = FAILED
        return st

    # -- thermal history ----------------------------------------------------------------------------
    def temperature_at(self, idx: np.ndarray, t_s: float) -> np.ndarray:
        """Temperatures of devices ``idx`` at ``t_s`` (not before their last booking's start), from their history."""
        runs = self._th_run[idx]
        if (rid := _shared(runs)) is not None:  # a group that works together shares its history: one closed form
            return thermal.temperature_at(self.thermal, self._th_temp0_c[idx], self._th_t0_s[idx],
                                          self._runs.get(rid), self.chip.idle_w, t_s)
        out = np.empty(idx.size)
        for rid in distinct(runs):
            m = runs == rid
            sel = idx[m]
            out[m] = thermal.temperature_at(self.thermal, self._th_temp0_c[sel], self._th_t0_s[sel],
                                            self._runs.get(int(rid)), self.chip.idle_w, t_s)
        return out

    def _rebase(self, idx: np.ndarray, t_s: float, run: thermal.Run | None, temps: np.ndarray | None = None) -> None:
        """Fold the history of devices ``idx`` up to ``t_s`` into their temperature then (``temps`` when the caller
        has it; a device whose last booking starts later keeps its temperature there); ``run`` (starting at or
        after that) is what they do next (None: idle)."""
        self._th_temp0_c[idx] = self.temperature_at(idx, t_s) if temps is None else temps
        self._th_t0_s[idx] = np.maximum(self._th_t0_s[idx], t_s)
        runs = self._th_run[idx]
        if (rid := _shared(runs)) is not None:
            old, counts = [rid], [int(idx.size)]
        else:
            u, n = np.unique(runs, return_counts=True)
            old, counts = u.tolist(), n.tolist()
        for rid, c in zip(old, counts, strict=True):
            if rid and (left := self._run_refs[rid] - c) <= 0:
                del self._run_refs[rid], self._runs[rid]
            elif rid:
                self._run_refs[rid] = left
        if run is None:
            self._th_run[idx] = 0
            return
        rid = next(self._run_ids)
        self._runs[rid], self._run_refs[rid] = run, int(idx.size)
        self._th_run[idx] = rid

    def _replace_run(self, idx: np.ndarray, run: thermal.Run | None) -> None:
        """Devices ``idx`` (rebased at their run's start) run ``run`` instead of what was booked."""
        self._rebase(idx, float(self._th_t0_s[idx].min()) if idx.size else 0.0, run)

    def thermal_clock_at(self, idx: np.ndarray, t_s: float) -> np.ndarray:
        """The clock factor the temperature of devices ``idx`` gives at ``t_s``."""
        return thermal.clock_factor(self.thermal, self.temperature_at(idx, t_s))

    def _item_power_w(self, above_j: float, duration_s: float) -> float:
        """A device's mean power over one booked item (the tick's cap at TDP kept)."""
        return min(self.chip.idle_w + (above_j / duration_s if duration_s > 0 else 0.0), self.chip.tdp_w)

    # -- work -------------------------------------------------------------------------------------
    def execute(self, idx: np.ndarray, works: Sequence[Work], *, not_before_s: float, now_s: float) -> ExecResult:
        """Run ``works`` back to back on devices ``idx`` in lock step."""
        return self.execute_many(idx, [(works, not_before_s)], now_s=now_s)[0]

    def execute_many(self, idx: np.ndarray, plan: Sequence[tuple[Sequence[Work], float]], *,
                     now_s: float) -> list[ExecResult]:
        """Run each ``(works, not_before_s)`` of ``plan`` in turn on devices ``idx`` in lock step, each after
        the one before (a replica's iterations reported together): the per-device arrays are read and
        written once for the whole plan, and each item is priced once per process (model/roofline.py memo)."""
        if not plan or any(not works for works, _ in plan):
            raise InvalidArgument("items", "must contain at least one work item")
        f = self.fault[idx]
        failed = idx[(f == FAULT_FAILED) | (f == FAULT_HBM)]
        if failed.size:
            raise FailedPrecondition(
                f"device {int(failed[0]) + self.offset} has failed ({failed.size} failed in the group); "
                "the work cannot run", reason="DEVICE_FAILED", device=int(failed[0]) + self.offset,
            )
        busy_until = float(self.busy_until_s[idx].max())
        first_start = max(plan[0][1] if plan[0][1] > 0 else now_s, busy_until)
        # The clock of the group's slowest device at the virtual time the work starts: its temperature then,
        # from the work booked before (exact, whenever this call runs), times any slow fault.
        temps0 = self.temperature_at(idx, first_start)
        slowest = float((thermal.clock_factor(self.thermal, temps0) * self.fault_factor[idx]).min())
        clock = slowest * self.overhead.compute_throughput_factor
        out: list[ExecResult] = []
        busy = above_total = 0.0
        start = end = duration = above = 0.0
        heat: thermal.Affine = (1.0, 0.0)  # the entries before the last, as one map of temperature
        for k, (works, not_before_s) in enumerate(plan):
            start = max(not_before_s if not_before_s > 0 else now_s, busy_until)
            duration = self.overhead.per_call_s
            above = 0.0
            for w in works:
                duration += work_time_s(self.chip, w, clock_factor=clock)
                above += power.work_energy_above_idle_j(self.chip, w, clock_factor=clock)
            if k < len(plan) - 1:
                nxt = max(plan[k + 1][1] if plan[k + 1][1] > 0 else now_s, start + duration)
                item = thermal.BusyRun.item(start, duration, self._item_power_w(above, duration))
                heat = thermal._then(heat, thermal.run_affine(self.thermal, item, self.chip.idle_w, nxt))
            end = busy_until = start + duration
            busy += duration
            above_total += above
            out.append(ExecResult(start, end, above * idx.size, clock))
        # Thermal history: the temperature at the first entry's start, the entries before the last folded in,
        # and the last entry as the run the devices are in (one entry: straight from the first start).
        last = thermal.BusyRun.item(start, duration, self._item_power_w(above, duration))
        if len(plan) == 1:
            self._rebase(idx, first_start, last, temps0)
        else:
            self._rebase(idx, first_start, None, temps0)
            if heat != (1.0, 0.0):
                self._th_temp0_c[idx] = heat[0] * self._th_temp0_c[idx] + heat[1]
                self._th_t0_s[idx] = start
            self._rebase(idx, start, last)
        self.busy_until_s[idx] = end
        self.busy_s[idx] += busy
        self.above_idle_j[idx] += above_total
        # The last item booked (what accrual up to a time takes back when it has not run yet).
        self._item_start_s[idx] = start
        self._item_end_s[idx] = end
        self._item_above_j[idx] = above
        self._item_busy_s[idx] = duration
        return out

    # -- steady-state windows ---------------------------------------------------------------------
    def execute_window(self, idx: np.ndarray, works: Sequence[Work], *, not_before_s: float, now_s: float,
                       period_s: float, repeat: int, pause_after: Sequence[int] = (),
                       pause_s: float = 0.0) -> tuple[int, ExecResult]:
        """Book ``repeat`` repetitions of ``works`` every ``period_s`` (plus ``pause_s`` after each repetition
        listed in ``pause_after``: model/cadence.py); returns (window id, first repetition).

        Busy time and energy are booked exactly (``repeat`` x one repetition's) at once; ``cut_windows``
        takes back the repetitions that do not run. The clock factor is the one at the window's start.
        """
        if repeat < 1:
            raise InvalidArgument("repeat", f"must be >= 1, got {repeat}")
        if not (math.isfinite(period_s) and period_s > 0):
            raise InvalidArgument("period_s", f"must be a finite number > 0, got {period_s}")
        cad = cadence(0.0, period_s, repeat, pause_after, pause_s, max_pauses=repeat)  # checked before booking
        self.prune_windows(now_s)
        first = self.execute(idx, works, not_before_s=not_before_s, now_s=now_s)
        dur = first.end_s - first.start_s
        if dur > period_s * (1 + 1e-9):
            # The devices as they are now (a slow or throttled chip) run the work longer than the caller's step:
            # the window's state does not hold, not a malformed request, so the caller falls back to single steps.
            self.cut_booked(idx, first.start_s, dur, first.energy_j / idx.size, 1)
            self._replace_run(idx, None)  # the refused repetition never heats the devices either
            raise FailedPrecondition(f"the work takes {dur:.6g} s on these devices now, longer than period_s "
                                     f"{period_s:g}: not a steady state (a slow or throttled chip?)",
                                     reason=WINDOW_NOT_STEADY, duration_s=f"{dur:.6g}")
        win = WorkWindow(idx, dataclasses.replace(cad, start_s=first.start_s), repeat, dur, first.energy_j / idx.size,
                         power_w=self._item_power_w(first.energy_j / idx.size, dur))
        self._replace_run(idx, win)  # the whole window is the devices' thermal history from its start
        # The window holds the clock of its start; where the devices' temperature would move that clock (a chip
        # heating past its throttle point), single steps would no longer come out alike: the window is cut there.
        ff = self.fault_factor[idx]
        win.throttle_at_s = thermal.throttle_change_s(
            self.thermal, win, self.chip.idle_w, self._th_temp0_c[idx], ff,
            float((self.thermal_clock_at(idx, first.start_s) * ff).min()))
        more = repeat - 1
        self.busy_s[idx] += more * dur
        self.above_idle_j[idx] += more * win.above_j
        self.busy_until_s[idx] = win.rep_end_s(repeat)
        self._item_end_s[idx] = win.rep_end_s(repeat)
        self._item_busy_s[idx] = repeat * dur
        self._item_above_j[idx] = repeat * win.above_j
        wid = next(self._window_ids)
        self.windows[wid] = win
        return wid, first

    def cut_booked(self, idx: np.ndarray, start_s: float, dur_s: float, above_j: float, n: int) -> None:
        """Take ``n`` repetitions of ``dur_s`` / ``above_j`` off the books of devices ``idx``."""
        self.busy_s[idx] -= n * dur_s
        self.above_idle_j[idx] -= n * above_j
        self._item_busy_s[idx] = np.maximum(self._item_busy_s[idx] - n * dur_s, 0.0)
        self._item_above_j[idx] = np.maximum(self._item_above_j[idx] - n * above_j, 0.0)
        self.busy_until_s[idx] = np.minimum(self.busy_until_s[idx], start_s)
        self._item_end_s[idx] = np.minimum(self._item_end_s[idx], np.maximum(start_s, self._item_start_s[idx]))

    def cut_windows(self, idx: np.ndarray, at_s: float) -> dict[int, int]:
        """Unbook the repetitions of windows on any of devices ``idx`` that start at or after ``at_s``.

        Returns {window id: repetitions kept} for every window cut; a window left with none is dropped.
        """
        hit = np.zeros(self.count, dtype=bool)
        hit[idx] = True
        out: dict[int, int] = {}
        for wid, w in list(self.windows.items()):
            keep = w.reps_before(at_s)
            if keep >= w.repeat or not hit[w.idx].any():
                continue
            self.cut_booked(w.idx, w.rep_end_s(keep), w.dur_s, w.above_j, w.repeat - keep)
            w.repeat = keep
            out[wid] = keep
            if keep == 0:
                del self.windows[wid]
        return out

    def prune_windows(self, now_s: float) -> None:
        """Forget windows that ended by ``now_s`` (nothing of them can be cut any more)."""
        for wid in [k for k, w in self.windows.items() if w.rep_end_s(w.repeat) <= now_s]:
            del self.windows[wid]

    def reset_timing(self, idx: np.ndarray, now_s: float, scrub_s: float = 0.0) -> None:
        """Give devices ``idx`` back with no timing state: free from ``now_s + scrub_s``.

        Called when an instance is released or scrubbed, so work its tenant booked ahead (however
        far) never delays the next tenant. Work booked beyond ``now_s`` is cancelled: its busy
        time and energy are taken off the books, as if it had never been scheduled.
        """
        if idx.size == 0:
            return
        self.cut_windows(idx, now_s)
        # Work booked beyond now never runs: the devices' temperature is their history up to now, then idle.
        self._rebase(idx, now_s, None)
        pending = self._pending_fraction(now_s)[idx]
        self.busy_s[idx] -= pending * self._item_busy_s[idx]
        self.above_idle_j[idx] -= pending * self._item_above_j[idx]
        self._item_start_s[idx] = now_s
        self._item_end_s[idx] = now_s
        self._item_above_j[idx] = 0.0
        self._item_busy_s[idx] = 0.0
        self.busy_until_s[idx] = now_s + max(scrub_s, 0.0)

    # -- memory in use ---------------------------------------------------------------------------
    def hold_memory(self, idx: np.ndarray, bytes_per_device: int, field: str = "memory_in_use_bytes") -> None:
        """Record that each device of ``idx`` holds ``bytes_per_device`` of modelled HBM (replacing the
        last report; 0 frees it). More than a device's HBM is refused, as an out-of-memory would be."""
        if not 0 <= bytes_per_device <= self.chip.hbm_bytes:
            raise InvalidArgument(field, f"must be 0..{self.chip.hbm_bytes} bytes (the {self.chip.name}'s HBM), "
                                         f"got {bytes_per_device}")
        self.held_bytes[idx] = bytes_per_device

    def release_memory(self, idx: np.ndarray) -> None:
        """Devices ``idx`` went back to the pool: nothing of their last instance stays in use."""
        self.held_bytes[idx] = 0

    # -- faults -----------------------------------------------------------------------------------
    def inject_fault(self, idx: np.ndarray, kind: int, clock_factor: float = 0.5,
                     repair_at_s: float = math.inf) -> int:
        """Fault devices ``idx`` (FAILED, HBM or SLOW at ``clock_factor``) until ``repair_at_s`` (inf: until
        :meth:`clear_fault`). A later fault on a device replaces its earlier one, repair time included."""
        if kind not in (FAULT_FAILED, FAULT_HBM, FAULT_SLOW):
            raise InvalidArgument("kind", "must be FAULT_KIND_FAILED, FAULT_KIND_HBM or FAULT_KIND_SLOW")
        if math.isnan(repair_at_s):
            raise InvalidArgument("repair_after_s", "must be a number")
        if kind == FAULT_SLOW:
            if not 0 < clock_factor < 1:
                raise InvalidArgument("clock_factor", f"must be in (0, 1) for a slow fault, got {clock_factor}")
            self.fault_factor[idx] = clock_factor
        else:
            self.fault_factor[idx] = 1.0
        self.fault[idx] = kind
        self.repair_at_s[idx] = repair_at_s
        self._next_repair_s = min(self._next_repair_s, repair_at_s)
        return int(idx.size)

    def clear_fault(self, idx: np.ndarray) -> int:
        n = int(np.count_nonzero(self.fault[idx]))
        self.fault[idx] = FAULT_NONE
        self.fault_factor[idx] = 1.0
        self.repair_at_s[idx] = math.inf
        return n

    def repair_due(self, now_s: float) -> np.ndarray:
        """Clear the faults whose repair time has come by ``now_s``; returns their devices (local ids).

        One comparison while nothing is due, so every call path may ask first."""
        if now_s < self._next_repair_s:
            return np.empty(0, np.int64)
        due = np.flatnonzero(self.repair_at_s <= now_s)
        self.clear_fault(due)
        self._next_repair_s = float(self.repair_at_s.min()) if self.count else math.inf
        return due

    def fault_runs(self) -> list[FaultRun]:
        """The faulted devices as runs of equal (kind, clock factor, repair time), in global ids: the shard's
        fault state in a few records, whatever its size (what :mod:`chip.faultstore` persists)."""
        on = self.fault != FAULT_NONE
        if not on.any():
            return []
        change = np.ones(self.count, dtype=bool)
        change[1:] = ((self.fault[1:] != self.fault[:-1]) | (self.fault_factor[1:] != self.fault_factor[:-1])
                      | (self.repair_at_s[1:] != self.repair_at_s[:-1]))
        starts = np.flatnonzero(change)
        ends = np.r_[starts[1:], self.count]
        keep = on[starts]
        return [FaultRun(int(a) + self.offset, int(b) + self.offset, int(self.fault[a]), float(self.fault_factor[a]),
                         float(self.repair_at_s[a]))
                for a, b in zip(starts[keep], ends[keep], strict=True)]

    def restore_faults(self, runs: Sequence[FaultRun]) -> int:
        """Re-apply persisted runs (the parts on this shard); returns the devices faulted again. Repairs
        already due are applied at the first :meth:`repair_due`."""
        n = 0
        for r in runs:
            a, b = max(r.start, self.offset), min(r.end, self.end)
            if a < b:
                n += self.inject_fault(np.arange(a - self.offset, b - self.offset), r.kind, r.clock_factor,
                                       r.repair_at_s)
        return n

    # -- time -------------------------------------------------------------------------------------
    def _pending_fraction(self, now_s: float) -> np.ndarray:
        """Share of each device's last booked item still ahead of ``now_s`` (0 when done)."""
        dur = self._item_end_s - self._item_start_s
        ahead = np.clip(self._item_end_s - now_s, 0.0, None)
        return np.divide(ahead, dur, out=np.zeros_like(dur), where=dur > 0).clip(0.0, 1.0)

    def accrued(self, now_s: float) -> tuple[np.ndarray, np.ndarray]:
        """(busy seconds, energy above idle) of each device accrued up to ``now_s``: booked work minus
        the part of the last item that lies in the future."""
        pending = self._pending_fraction(now_s)
        return (self.busy_s - pending * self._item_busy_s, self.above_idle_j - pending * self._item_above_j)

    def energy_j(self, now_s: float) -> np.ndarray:
        """Energy drawn by each device up to ``now_s`` (idle floor plus work above idle, as accrued)."""
        return self.chip.idle_w * max(now_s - self.start_s, 0.0) + self.accrued(now_s)[1]

    def refresh_thermal(self, now_s: float) -> None:
        """Bring the telemetry's temperatures and thermal clocks to ``now_s`` (devices with work booked ahead of
        ``now_s`` read at their last booking's start at the earliest)."""
        self.temp_c = self.temperature_at(np.arange(self.count), now_s)
        self.thermal_clock = thermal.clock_factor(self.thermal, self.temp_c)

    def tick(self, now_s: float) -> ShardSnapshot:
        """The shard's aggregates at ``now_s``: temperatures and clocks read from the thermal history (the tick
        changes nothing the model uses), utilisation and power averaged since the last tick."""
        self.refresh_thermal(now_s)
        dt = now_s - self._last_tick_s
        busy_s, above_j = self.accrued(now_s)  # once: each pass over the shard's devices counts at 100k of them
        if dt > 0:
            busy = np.clip((busy_s - self._last_busy_s) / dt, 0.0, 1.0)
            above_w = np.clip((above_j - self._last_above_j) / dt, 0.0, None)
            self.utilization = busy
            self.power_w = np.minimum(self.chip.idle_w + above_w, self.chip.tdp_w)
            self._last_tick_s = now_s
            self._last_busy_s = busy_s
            self._last_above_j = above_j
        st = self.state()
        return ShardSnapshot(
            now_s=now_s,
            devices=self.count,
            healthy=int(np.count_nonzero(st == HEALTHY)),
            throttled=int(np.count_nonzero(st == THROTTLED)),
            failed=int(np.count_nonzero(st == FAILED)),
            mean_utilization=float(self.utilization.mean()),
            power_w=float(self.power_w.sum()),
            energy_j=float(self.chip.idle_w * max(now_s - self.start_s, 0.0) * self.count + above_j.sum()),
            busy_s=float(busy_s.sum()),
            max_temperature_c=float(self.temp_c.max()),
            mean_clock_factor=float(self.clock.mean()),
        )
