"""The max-min solver against textbook cases and the pure-Python reference."""

from __future__ import annotations

import numpy as np
import pytest

from gigacluster.fabric.maxmin import maxmin_rates, progressive_filling_py


def _coo(paths: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    f = np.concatenate([np.full(len(p), i) for i, p in enumerate(paths)])
    lk = np.concatenate([np.asarray(p) for p in paths])
    return f.astype(np.int64), lk.astype(np.int64)


def test_textbook_parking_lot() -> None:
    """Parking lot: a long flow over links 0,1 and one short flow per link, capacity 1 -> all get 1/2."""
    f, lk = _coo([[0, 1], [0], [1]])
    rates = maxmin_rates(3, f, lk, None, np.array([1.0, 1.0]))
    np.testing.assert_allclose(rates, [0.5, 0.5, 0.5])


def test_bottleneck_leftover_goes_to_unconstrained_flow() -> None:
    """Link 0 (cap 1) holds flows A, B; link 1 (cap 3) holds B, C: A=B=1/2, C takes the rest 5/2."""
    f, lk = _coo([[0], [0, 1], [1]])
    rates = maxmin_rates(3, f, lk, None, np.array([1.0, 3.0]))
    np.testing.assert_allclose(rates, [0.5, 0.5, 2.5])


def test_weights_split_in_proportion() -> None:
    """Weights 3:1 on one link of capacity 4 give rates 3 and 1."""
    f, lk = _coo([[0], [0]])
    rates = maxmin_rates(2, f, lk, None, np.array([4.0]), weight=np.array([3.0, 1.0]))
    np.testing.assert_allclose(rates, [3.0, 1.0])


def test_strict_priority_starves_lower_class_on_a_shared_link() -> None:
    """Priority 1 takes the whole shared link; priority 0 gets only what is left on its other links."""
    f, lk = _coo([[0], [0], [1]])
    rates = maxmin_rates(3, f, lk, None, np.array([2.0, 5.0]), priority=np.array([1, 0, 0]))
    np.testing.assert_allclose(rates, [2.0, 0.0, 5.0])


def test_fractional_coefficients_model_spraying() -> None:
    """A flow sprayed half/half over two links of capacity 1 reaches rate 2."""
    rates = maxmin_rates(1, np.array([0, 0]), np.array([0, 1]), np.array([0.5, 0.5]), np.array([1.0, 1.0]))
    np.testing.assert_allclose(rates, [2.0])


def test_flow_without_links_is_unconstrained() -> None:
    """A flow with no incidence entries (same chip) gets an infinite rate."""
    rates = maxmin_rates(2, np.array([0]), np.array([0]), None, np.array([1.0]))
    assert rates[0] == pytest.approx(1.0) and np.isinf(rates[1])


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_vectorised_solver_matches_python_reference(seed: int) -> None:
    """On random instances (paths of 1-6 links, random weights) both solvers agree to 1e-9."""
    rng = np.random.default_rng(seed)
    n_flows, n_links = 300, 60
    paths = [sorted(set(rng.integers(0, n_links, rng.integers(1, 7)).tolist())) for _ in range(n_flows)]
    cap = rng.uniform(1.0, 10.0, n_links)
    w = rng.choice([1.0, 2.0, 4.0], n_flows)
    f, lk = _coo(paths)
    fast = maxmin_rates(n_flows, f, lk, None, cap, weight=w)
    ref = progressive_filling_py([[(link, 1.0) for link in p] for p in paths], cap.tolist(), w.tolist())
    np.testing.assert_allclose(fast, ref, rtol=1e-9)
    load = np.bincount(lk, weights=fast[f], minlength=n_links)
    assert (load <= cap * (1 + 1e-9)).all()
    # max-min: every flow crosses at least one saturated link
    sat = load >= cap * (1 - 1e-9)
    assert np.all(np.bincount(f, weights=sat[lk].astype(float), minlength=n_flows) > 0)
