"""The virtualisation overhead model: small, configurable, and visible in times."""

from __future__ import annotations

import pytest

from gigacluster.hw.catalog import get_chip
from gigacluster.model.roofline import Work, work_time_s
from gigacluster.security import InvalidArgument
from gigacluster.security.overhead import VirtualizationOverhead


def test_defaults_are_small_and_every_default_has_a_reason() -> None:
    """Defaults cost between 0 and a few percent, and each carries a stated source or assumption."""
    ov = VirtualizationOverhead()
    assert 0.95 <= ov.compute_throughput_factor < 1.0
    assert 0 < ov.per_call_s <= 1e-4
    assert set(ov.sources) == {"per_call_s", "compute_throughput_factor", "fabric_bandwidth_factor",
                               "scrub_bandwidth_fraction"}


def test_isolation_has_a_measurable_cost_through_the_roofline() -> None:
    """A compute-bound kernel runs 1/0.99 as long under the default overhead, exactly 1x with none()."""
    chip = get_chip("trainium2")
    work = Work(flops=1e15, bytes_=1e6, precision="bf16", kind="matmul", count=1, shape=(8192, 8192, 8192))
    bare = work_time_s(chip, work)
    iso = work_time_s(chip, work, clock_factor=VirtualizationOverhead().clock_factor())
    assert iso / bare == pytest.approx(1 / 0.99)
    assert work_time_s(chip, work, clock_factor=VirtualizationOverhead.none().clock_factor()) == bare


def test_compute_and_transfer_times() -> None:
    """compute_time_s and transfer_time_s stretch by the factors and add per-call latency."""
    ov = VirtualizationOverhead(per_call_s=1e-5, compute_throughput_factor=0.5, fabric_bandwidth_factor=0.8)
    assert ov.compute_time_s(1.0, n_calls=10) == pytest.approx(2.0 + 1e-4)
    assert ov.transfer_time_s(8e9, 1e10, n_calls=2) == pytest.approx(1.0 + 2e-5)


@pytest.mark.parametrize(("kw", "field"), [({"per_call_s": -1}, "per_call_s"),
                                           ({"compute_throughput_factor": 0}, "compute_throughput_factor"),
                                           ({"scrub_bandwidth_fraction": 1.5}, "scrub_bandwidth_fraction")])
def test_invalid_overheads(kw: dict[str, float], field: str) -> None:
    """Negative latency or factors outside (0, 1] are INVALID_ARGUMENT naming the field."""
    with pytest.raises(InvalidArgument) as exc:
        VirtualizationOverhead(**kw)
    assert exc.value.field == field
