"""The offline goodput of a training job under a failure table (no gRPC; formerly ``scheduler.failures``).

:func:`simulate_goodput` runs one job for a wall time under the failures of ``faults.draw`` (the same
seeded draw the live injector, ``gigacluster faults run``, injects into the chips and links) with the
checkpoint and restart costs the live scheduler charges (:mod:`scheduler.checkpoint`), and reports
effective training time / wall time. The caller passes the costs from
:mod:`scheduler.checkpoint` (as ``faults.replay`` does). By default the failure table is the Llama 3 mix
(``faults.table.llama3``: 419 unexpected interruptions in 54 days on 16,384 H100).

The scheduler itself draws no failures: they reach a live job only through the injector, as a step
that fails (docs/architecture.md "Failures").
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

from gigacluster.faults.draw import Fault, draw, hits
from gigacluster.faults.table import RateTable


def young_daly_interval_s(checkpoint_pause_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that minimises pause plus lost work: sqrt(2 C M) (Young 1974, Daly 2006)."""
    return math.sqrt(2.0 * checkpoint_pause_s * mtbf_s)


@dataclasses.dataclass(frozen=True)
class GoodputResult:
    """Where a job's wall time went: useful steps, lost work, restarts, checkpoint pauses; causes counted."""

    wall_s: float
    useful_s: float
    interruptions: int
    lost_s: float
    restart_s: float
    checkpoint_pause_s: float
    causes: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def goodput(self) -> float:
        return self.useful_s / self.wall_s if self.wall_s else 0.0


@dataclasses.dataclass(frozen=True)
class Mesh:
    """Where the job runs: ``chips`` of a mesh of ``mesh_chips`` (spares for quarantined chips), hosts of
    ``domain_size`` chips. The failures are drawn over the whole mesh, as the injector draws them."""

    mesh_chips: int
    domain_size: int = 8
    job_offset: int = 0


def _striking(table: RateTable, chips: int, mesh: Mesh, seed: int) -> Iterator[Fault]:
    job = range(mesh.job_offset, mesh.job_offset + chips)
    return (f for f in draw(table, n_chips=mesh.mesh_chips, seed=seed) if hits(f, mesh.domain_size, job))


def simulate_goodput(*, chips: int, wall_s: float, step_s: float, checkpoint_interval_steps: int,
                     checkpoint_pause_s: float, checkpoint_write_s: float, restart_s: float,
                     table: RateTable, seed: int = 0, mesh: Mesh | None = None) -> GoodputResult:
    """Run one job for ``wall_s`` under ``table``'s failures; returns goodput and where the rest went.

    Time goes to steps, checkpoint pauses, restarts (relaunch + checkpoint read) and lost work. A
    checkpoint becomes durable ``checkpoint_write_s`` after its pause (asynchronous write); one write at
    a time, as the live scheduler does (``checkpoint.AsyncCheckpoints``): a checkpoint that falls due
    while a write is in flight waits for the first step after it ends. A failure striking the job loses
    every step since the last durable checkpoint. A failure that strikes during a
    restart interrupts the job again when the restart ends, unless its repair is over by then (a
    transient or network fault the relaunched job never sees).
    """
    faults = _striking(table, chips, mesh or Mesh(chips), seed)
    nxt = next(faults, None)
    t = useful = lost = restarts = pauses = 0.0
    n_int = 0
    causes: dict[str, int] = {}
    seg = checkpoint_interval_steps * step_s  # useful time between checkpoints
    durable = 0.0  # useful time safe in the last durable checkpoint
    pending: tuple[float, float] | None = None  # (durable at, useful time it holds)
    run_since = 0.0  # useful time since the last checkpoint pause
    while t < wall_s:
        fail_t = nxt.t_s if nxt is not None else math.inf
        ckpt_t = t + (seg - run_since)  # the next checkpoint falls due
        if pending is not None and pending[0] > ckpt_t:  # one write at a time: defer to the step after it ends
            ckpt_t += math.ceil((pending[0] - ckpt_t) / step_s) * step_s
        if fail_t < min(ckpt_t, wall_s):
            run_since += max(fail_t - t, 0.0)
            t = max(fail_t, t)
            if pending is not None and pending[0] <= t:
                durable = pending[1]
            lost += useful + run_since - durable
            useful, run_since, pending = durable, 0.0, None
            while nxt is not None and nxt.t_s <= t:  # this failure, and any again during the restart
                n_int += 1
                causes[nxt.cause] = causes.get(nxt.cause, 0) + 1
                end = min(t + restart_s, wall_s)
                restarts += end - t
                t = end
                nxt = next(faults, None)
                while nxt is not None and nxt.t_s < t and nxt.t_s + nxt.repair_s <= t:
                    nxt = next(faults, None)  # repaired before the relaunched job would see it
                if nxt is not None and nxt.t_s < t:
                    nxt = dataclasses.replace(nxt, t_s=t)  # still broken when the restart ends
            continue
        if ckpt_t >= wall_s:
            run_since += wall_s - t
            t = wall_s
            break
        if pending is not None and pending[0] <= ckpt_t:
            durable = pending[1]
        useful += run_since + (ckpt_t - t)
        run_since = 0.0
        t = ckpt_t + checkpoint_pause_s
        pauses += checkpoint_pause_s
        pending = (t + checkpoint_write_s, useful)
    useful += run_since
    over = max(t - wall_s, 0.0)  # a last checkpoint pause past the end
    return GoodputResult(wall_s=wall_s, useful_s=useful, interruptions=n_int, lost_s=lost, restart_s=restarts,
                         checkpoint_pause_s=pauses - over, causes=causes)
