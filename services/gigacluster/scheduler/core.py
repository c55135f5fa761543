"""Job records and their lifecycle, with no gRPC.

States and the only legal transitions (anything else is FAILED_PRECONDITION)::

    QUEUED -> PLACING -> RUNNING <-> CHECKPOINTING
                 |          |  \\-> RESTARTING -> RUNNING | QUEUED
                 v          v
              QUEUED     PREEMPTED -> QUEUED
    any non-terminal -> CANCELLED | FAILED;  RUNNING | CHECKPOINTING -> SUCCEEDED
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
from typing import Any

from gigacluster.errors import FailedPrecondition, InvalidArgument
from gigacluster.model import SpecError, moe
from gigacluster.model.training import StepPlan, TrainEstimate, TrainSpec, plan_step
from gigacluster.planning import estimate_train


class State(enum.IntEnum):
    """Mirrors ``scheduler.v1.Job.State``."""

    QUEUED = 1
    PLACING = 2
    RUNNING = 3
    CHECKPOINTING = 4
    RESTARTING = 5
    PREEMPTED = 6
    SUCCEEDED = 7
    FAILED = 8
    CANCELLED = 9


TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})
LEGAL: dict[State, frozenset[State]] = {
    State.QUEUED: frozenset({State.PLACING, State.CANCELLED, State.FAILED}),
    State.PLACING: frozenset({State.RUNNING, State.QUEUED, State.CANCELLED, State.FAILED}),
    State.RUNNING: frozenset({State.CHECKPOINTING, State.RESTARTING, State.PREEMPTED, State.SUCCEEDED,
                              State.CANCELLED, State.FAILED}),
    State.CHECKPOINTING: frozenset({State.RUNNING, State.PREEMPTED, State.SUCCEEDED, State.CANCELLED,
                                    State.FAILED}),
    State.RESTARTING: frozenset({State.RUNNING, State.QUEUED, State.CANCELLED, State.FAILED}),
    State.PREEMPTED: frozenset({State.QUEUED, State.CANCELLED, State.FAILED}),
    State.SUCCEEDED: frozenset(),
    State.FAILED: frozenset(),
    State.CANCELLED: frozenset(),
}

MAX_STEPS = 100_000_000
MAX_PRIORITY = 1000


@dataclasses.dataclass
class JobRecord:
    """Everything the scheduler knows of one job (the servicer renders it as a Job message)."""

    job_id: str
    tenant: str
    display_name: str
    queue: str
    priority: int
    spec_dict: dict[str, Any]
    spec: TrainSpec
    plan: StepPlan
    steps_total: int
    checkpoint_interval_steps: int
    max_restarts: int
    created_s: float
    state: State = State.QUEUED
    reason: str = ""
    step: int = 0
    tokens: float = 0.0
    last_step_time_s: float = 0.0
    predicted_step_time_s: float = 0.0
    mfu: float = 0.0
    energy_it_j: float = 0.0
    energy_facility_j: float = 0.0
    chip_hours: float = 0.0
    cost_usd: float = 0.0
    started_s: float = 0.0
    finished_s: float = 0.0
    instance: str = ""
    restarts: int = 0
    last_checkpoint_step: int = 0
    run_s: float = 0.0  # virtual seconds in steps (for means and goodput)
    compute_s_sum: float = 0.0
    exposed_comm_s_sum: float = 0.0
    bubble_s_sum: float = 0.0
    preemptions: int = 0
    failures: int = 0
    lost_steps: int = 0
    lost_s: float = 0.0
    checkpoint_pause_s: float = 0.0
    restart_s: float = 0.0
    borrowing: bool = False
    placement_domains: int = 0
    placement_leaf_groups: int = 0
    dp_spine_crossings: int = 0
    reserved_start_s: float = 0.0
    resume_pending: bool = False  # the next placement pays the restart cost (relaunch + checkpoint read)
    performance_alert: str = ""  # likely cause while steps run slower than the model (scheduler/diagnose.py)
    slowdown: float = 0.0
    preempt_reason: str = ""  # set by the dispatcher: evict after the current step

    @property
    def name(self) -> str:
        return f"jobs/{self.job_id}"

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    def transition(self, to: State, reason: str = "") -> None:
        if to not in LEGAL[self.state]:
            raise FailedPrecondition(f"{self.name} is {self.state.name}; it cannot become {to.name}",
                                     reason="ILLEGAL_TRANSITION", state=self.state.name)
        self.state = to
        self.reason = reason

    @property
    def eta_s(self) -> float:
        if self.terminal or self.step >= self.steps_total:
            return 0.0
        per = self.last_step_time_s or self.predicted_step_time_s
        return (self.steps_total - self.step) * per

    def goodput_at(self, now_s: float) -> float:
        """Effective training time / wall time since the first start: step time of the steps that
        were kept (lost work, checkpoint pauses, restarts, preemption and waits count as wall)."""
        if not self.started_s:
            return 0.0
        wall = (self.finished_s or now_s) - self.started_s
        if wall <= 0:
            return 0.0
        return max(0.0, min(1.0, (self.run_s - self.lost_s) / wall))

    def mean_step_s(self) -> float:
        return self.last_step_time_s or self.predicted_step_time_s

    def charge_lost_work(self) -> int:
        """Count the steps since the last durable checkpoint as lost work (they will be redone); returns how many."""
        lost = self.step - self.last_checkpoint_step
        self.lost_steps += lost
        self.lost_s += lost * self.mean_step_s()
        return lost

    def rewind(self) -> None:
        """Back to the last durable checkpoint: step and tokens as they were when it was written."""
        self.step = self.last_checkpoint_step
        self.tokens = self.step * self.spec.tokens_per_step


def validate_submission(spec_dict: dict[str, Any], *, priority: int, checkpoint_interval_steps: int,
                        max_restarts: int, cluster_chips: dict[str, int]) -> tuple[TrainSpec, StepPlan, int]:
    """Check a submission; returns the parsed spec, its step plan and the number of steps.

    Raises SpecError/InvalidArgument (INVALID_ARGUMENT), DoesNotFitError or FailedPrecondition
    (FAILED_PRECONDITION: more chips than the cluster has).
    """
    if abs(priority) > MAX_PRIORITY:
        raise InvalidArgument("priority", f"must be in [-{MAX_PRIORITY}, {MAX_PRIORITY}], got {priority}")
    if max_restarts > 1000:
        raise InvalidArgument("max_restarts", f"must be <= 1000, got {max_restarts}")
    hw = spec_dict.get("hardware") or {}
    if not hw.get("chip"):
        raise InvalidArgument("spec.hardware.chip", "required (e.g. h100-sxm)")
    if not hw.get("count"):
        raise InvalidArgument("spec.hardware.count", "required: the number of chips (> 0)")
    try:
        spec = parse_spec(json.dumps(spec_dict, sort_keys=True))
    except SpecError as exc:
        raise InvalidArgument(f"spec.{exc.field}", str(exc).split(": ", 1)[-1]) from exc
    have = cluster_chips.get(spec.chip, 0)
    if spec.count > have:
        raise FailedPrecondition(
            f"spec.hardware.count: the job needs {spec.count} {spec.chip} chips but the cluster has {have}"
            + (f" ({', '.join(f'{n} {c}' for c, n in cluster_chips.items())})" if cluster_chips else ""),
            reason="CLUSTER_TOO_SMALL", need=spec.count, have=have,
        )
    steps = spec.total_steps()
    if steps is None:
        raise InvalidArgument("spec.steps", "give steps or tokens: how long the job trains")
    if steps > MAX_STEPS:
        raise InvalidArgument("spec.steps", f"must be <= {MAX_STEPS}, got {steps}")
    if checkpoint_interval_steps > steps:
        checkpoint_interval_steps = steps
    plan = cached_plan(spec)  # DoesNotFitError with the numbers
    return spec, plan, steps


# Submissions repeat the same few specs (a sweep, a retried job): parse and plan each once. The
# results are frozen values, so sharing them is safe; failures are not cached.
@functools.lru_cache(maxsize=1024)
def parse_spec(spec_json: str) -> TrainSpec:
    """``TrainSpec.from_dict`` of a canonical JSON spec (cached)."""
    return TrainSpec.from_dict(json.loads(spec_json))


@functools.lru_cache(maxsize=1024)
def cached_plan(spec: TrainSpec) -> StepPlan:
    """``plan_step`` of a spec (cached)."""
    return plan_step(spec)


@functools.lru_cache(maxsize=1024)
def cached_estimate(spec: TrainSpec) -> TrainEstimate:
    """``estimate_train`` of a spec (cached): the model's step for the job on an idle cluster."""
    return estimate_train(spec)


def rank_groups(spec: TrainSpec, name: str) -> tuple[int, int, int, list[int]]:
    """(group size, rank stride, copies, copy offsets) of a collective demand in Megatron order.

    Ranks are laid out tp fastest, then cp, dp and pp; a group of ``size`` ranks spaced ``stride``
    apart repeats at every offset in the returned list (all copies run at once).
    """
    tp, cp, dp, pp = spec.tp, spec.cp, spec.dp, spec.pp
    stage = tp * cp * dp
    if name == "tp":
        return tp, 1, spec.count // tp, [k * tp for k in range(spec.count // tp)]
    if name == "cp":
        return cp, tp, tp, list(range(tp))
    if name == "pp":
        return 2, stage, stage, list(range(stage))
    if name in ("dp_grad", "dp_param"):
        return dp * cp, tp, tp * pp, [s * stage + r for s in range(pp) for r in range(tp)]
    if name in ("ep_a2a", "ep_grad", "ep_param"):
        return moe.moe_rank_groups(spec, name)
    if name in ("fsdp_ag", "fsdp_ag_bwd", "fsdp_rs", "fsdp_ar"):
        # Each shard group is a block of consecutive dp x cp ranks (the replicas of HSDP outermost, as
        # torchtitan's mesh); the replica groups join the same position of every block.
        shard = spec.shard_group
        reps = dp * cp // shard
        if name == "fsdp_ar":
            return reps, tp * shard, tp * shard * pp, [s * stage + k * tp + r for s in range(pp)
                                                       for k in range(shard) for r in range(tp)]
        return shard, tp, tp * reps * pp, [s * stage + q * tp * shard + r for s in range(pp)
                                            for q in range(reps) for r in range(tp)]
    raise ValueError(f"unknown collective demand {name!r}")
