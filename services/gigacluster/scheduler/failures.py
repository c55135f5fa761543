"""A failure model for training jobs and the goodput it leaves (no gRPC).

By default the Llama 3 mix: 419 unexpected interruptions in 54 days of pre-training on up to
16,384 H100 (Llama 3 paper, Dubey et al. 2024, Table 5; ``calibration.md`` section 4), i.e. one
interruption per ``16,384 x 54 x 24 / 419`` = 50,700 GPU-hours, split by cause as published.
Each cause has an *effect* on the scheduler: a device cause (GPU, HBM, SRAM, ...) takes one chip
out; a host cause (maintenance, SSD, power supply) takes the chip's whole scale-up domain out; a
network cause fails the step and the job restarts anywhere; a software cause restarts in place.

:func:`simulate_goodput` is the offline companion: a 54-day, 16k-GPU run under that failure
process with the same checkpoint and restart costs the live scheduler charges
(:mod:`scheduler.checkpoint`), reporting effective training time / wall time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from gigacluster.registry import Registry

# Llama 3 paper, Table 5 (root-cause categories of the 419 unexpected interruptions): count, effect.
LLAMA3_MIX: dict[str, tuple[int, str]] = {
    "faulty GPU": (148, "device"),
    "GPU HBM3 memory": (72, "device"),
    "software bug": (54, "software"),
    "network switch or cable": (35, "network"),
    "host maintenance (unplanned)": (32, "host"),
    "GPU SRAM": (19, "device"),
    "GPU system processor": (17, "device"),
    "NIC": (7, "device"),
    "NCCL watchdog timeout": (7, "software"),
    "silent data corruption": (6, "device"),
    "GPU thermal interface or sensor": (6, "device"),
    "SSD": (3, "host"),
    "power supply": (3, "host"),
    # calibration.md lists causes down to 3 each (409); the other 10 of the 419 are smaller
    # host-level categories in the paper's table (chassis, IO board, CPU, system memory, dependency).
    "other host components": (10, "host"),
}
LLAMA3_INTERRUPTIONS = 419
LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54
LLAMA3_RATE_PER_CHIP_S = LLAMA3_INTERRUPTIONS / (LLAMA3_GPUS * LLAMA3_DAYS * 86_400.0)
"""Unexpected interruptions per chip-second in the Llama 3 run."""
EFFECTS = ("device", "host", "network", "software")


@dataclasses.dataclass(frozen=True)
class FailureModel:
    """Interruptions at ``rate_per_chip_s`` per chip-second, causes drawn from ``mix``."""

    rate_per_chip_s: float = LLAMA3_RATE_PER_CHIP_S
    mix: tuple[tuple[str, int, str], ...] = tuple((k, n, e) for k, (n, e) in LLAMA3_MIX.items())

    def __post_init__(self) -> None:
        if not self.rate_per_chip_s >= 0 or not math.isfinite(self.rate_per_chip_s):
            raise ValueError(f"rate_per_chip_s must be finite and >= 0, got {self.rate_per_chip_s}")
        if not self.mix or any(n < 0 or e not in EFFECTS for _, n, e in self.mix):
            raise ValueError("mix must list (cause, count >= 0, effect in device/host/network/software)")

    @classmethod
    def llama3(cls, scale: float = 1.0) -> FailureModel:
        """The Llama 3 mix at ``scale`` times its published rate."""
        return cls(rate_per_chip_s=LLAMA3_RATE_PER_CHIP_S * scale)

    def p_interrupt(self, chips: int, seconds: float) -> float:
        """Probability that a job of ``chips`` is interrupted within ``seconds`` (Poisson)."""
        return -math.expm1(-self.rate_per_chip_s * chips * seconds)

    def draw_cause(self, rng: np.random.Generator) -> tuple[str, str]:
        """(cause, effect) of one interruption, in the mix's proportions."""
        counts = np.array([n for _, n, _ in self.mix], dtype=float)
        i = int(rng.choice(len(self.mix), p=counts / counts.sum()))
        return self.mix[i][0], self.mix[i][2]


FailureFactory = Callable[[float], "FailureModel | None"]
FAILURE_MODELS: Registry[FailureFactory] = Registry("failure model", field="failure_model",
                                                   group="gigacluster.failures")
"""Failure models by name (scheduler config ``failure_model``): each a function of the config's
``failure_rate_scale`` returning the model, or None for no injected interruptions."""
FAILURE_MODELS.register("off", lambda scale: None)
FAILURE_MODELS.register("llama3", FailureModel.llama3)


def young_daly_interval_s(checkpoint_pause_s: float, mtbf_s: float) -> float:
    """The checkpoint interval that minimises pause plus lost work: sqrt(2 C M) (Young 1974, Daly 2006)."""
    return math.sqrt(2.0 * checkpoint_pause_s * mtbf_s)


@dataclasses.dataclass(frozen=True)
class GoodputResult:
    wall_s: float
    useful_s: float
    interruptions: int
    lost_s: float
    restart_s: float
    checkpoint_pause_s: float
    causes: dict[str, int]

    @property
    def goodput(self) -> float:
        return self.useful_s / self.wall_s if self.wall_s else 0.0


def simulate_goodput(*, chips: int, wall_s: float, step_s: float, checkpoint_interval_steps: int,
                     checkpoint_pause_s: float, checkpoint_write_s: float, restart_s: float,
                     model: FailureModel, seed: int = 0) -> GoodputResult:
    """Run one job for ``wall_s`` under ``model``; returns goodput and where the rest went.

    Time goes to steps, checkpoint pauses, restarts (relaunch + checkpoint read) and lost work.
    A checkpoint becomes durable ``checkpoint_write_s`` after its pause (asynchronous write); an
    interruption loses every step since the last durable one. Interruptions are a Poisson process
    over the job's wall time (failures happen whether or not the job is stepping).
    """
    rng = np.random.default_rng(seed)
    lam = model.rate_per_chip_s * chips
    t = 0.0
    useful = lost = restarts = pauses = 0.0
    n_int = 0
    causes: dict[str, int] = {}
    next_fail = rng.exponential(1.0 / lam) if lam > 0 else math.inf
    seg = checkpoint_interval_steps * step_s  # steps between checkpoints
    durable_steps_s = 0.0  # useful time safe in the last durable checkpoint
    pending: tuple[float, float] | None = None  # (durable at, useful time it holds)
    run_since = 0.0  # useful time since the last checkpoint pause
    while t < wall_s:
        # next event: a segment of steps ends, or a failure
        seg_end = t + (seg - run_since)
        if next_fail < min(seg_end, wall_s):
            run_since += next_fail - t
            t = next_fail
            if pending is not None and pending[0] <= t:
                durable_steps_s = pending[1]
            lost += useful + run_since - durable_steps_s
            useful = durable_steps_s
            run_since = 0.0
            pending = None
            n_int += 1
            cause, _ = model.draw_cause(rng)
            causes[cause] = causes.get(cause, 0) + 1
            t += restart_s
            restarts += restart_s
            next_fail = t + rng.exponential(1.0 / lam)
            continue
        if seg_end >= wall_s:
            run_since += wall_s - t
            t = wall_s
            break
        if pending is not None and pending[0] <= seg_end:
            durable_steps_s = pending[1]
        useful += seg
        run_since = 0.0
        t = seg_end + checkpoint_pause_s
        pauses += checkpoint_pause_s
        pending = (t + checkpoint_write_s, useful)
    useful += run_since
    return GoodputResult(wall_s=wall_s, useful_s=useful, interruptions=n_int, lost_s=lost, restart_s=restarts,
                         checkpoint_pause_s=pauses, causes=causes)
