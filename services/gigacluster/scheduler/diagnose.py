"""Performance-loss detection: a step slower than the model predicts, and its likely cause.

Pure: the scheduler passes the model's expectation, the measured step and what the chip and
fabric services say about the job's devices and links; :func:`diagnose` says whether the job is
losing performance and names the most likely cause.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

THRESHOLD = 0.05  # 5% over the model: beyond the live mesh's agreement with it on an idle cluster

CAUSES = ("throttled_or_faulty_chip", "degraded_link", "fabric_contention", "chip_contention", "unknown")


@dataclasses.dataclass(frozen=True)
class Expected:
    """The model's step on an idle cluster (``estimate_train``)."""

    step_s: float
    compute_s: float
    comm_s: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class Observed:
    """One live step, and the state of the job's devices and of the fabric."""

    step_s: float
    compute_s: float
    comm_s: Mapping[str, float]
    devices: int
    slow_devices: int  # below nominal clock (thermal throttling or a slow fault)
    min_clock: float
    degraded_links: Mapping[str, int]  # tier -> links down or degraded


@dataclasses.dataclass(frozen=True)
class Diagnosis:
    slowdown: float  # observed / expected - 1
    cause: str
    detail: str


def diagnose(exp: Expected, obs: Observed, *, threshold: float = THRESHOLD) -> Diagnosis | None:
    """None while the step is within ``threshold`` of the model; else the likely cause."""
    if exp.step_s <= 0 or obs.step_s <= exp.step_s * (1 + threshold):
        return None
    slowdown = obs.step_s / exp.step_s - 1
    compute_excess = obs.compute_s - exp.compute_s
    comm_excess = {k: obs.comm_s.get(k, 0.0) - v for k, v in exp.comm_s.items()}
    worst = max(comm_excess, key=lambda k: comm_excess[k], default="")
    comm_worse = bool(worst) and comm_excess[worst] > threshold * exp.comm_s.get(worst, 0.0)
    if compute_excess > threshold * exp.compute_s and obs.slow_devices:
        return Diagnosis(slowdown, "throttled_or_faulty_chip",
                         f"{obs.slow_devices} of {obs.devices} chips below nominal clock (slowest at "
                         f"{obs.min_clock:.2f}); compute {obs.compute_s:.3f} s vs {exp.compute_s:.3f} s modelled")
    if comm_worse and any(obs.degraded_links.values()):
        tiers = ", ".join(f"{n} {t}" for t, n in obs.degraded_links.items() if n)
        return Diagnosis(slowdown, "degraded_link",
                         f"links down or degraded ({tiers}); {worst} {obs.comm_s.get(worst, 0):.3f} s vs "
                         f"{exp.comm_s[worst]:.3f} s modelled")
    if comm_worse:
        return Diagnosis(slowdown, "fabric_contention",
                         f"{worst} collectives took {obs.comm_s.get(worst, 0):.3f} s vs {exp.comm_s[worst]:.3f} s "
                         "alone: other jobs or tenants share its links")
    if compute_excess > threshold * exp.compute_s:
        return Diagnosis(slowdown, "chip_contention",
                         f"compute {obs.compute_s:.3f} s vs {exp.compute_s:.3f} s: the chips were busy with other work")
    return Diagnosis(slowdown, "unknown", f"step {obs.step_s:.3f} s vs {exp.step_s:.3f} s modelled")
