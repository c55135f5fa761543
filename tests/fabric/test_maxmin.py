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


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_vectorised_solver_matches_python_reference(seed: int, compiled: bool) -> None:
    """On random instances (paths of 1-6 links, random weights) both engines agree with the reference to 1e-9."""
    rng = np.random.default_rng(seed)
    n_flows, n_links = 300, 60
    paths = [sorted(set(rng.integers(0, n_links, rng.integers(1, 7)).tolist())) for _ in range(n_flows)]
    cap = rng.uniform(1.0, 10.0, n_links)
    w = rng.choice([1.0, 2.0, 4.0], n_flows)
    f, lk = _coo(paths)
    fast = maxmin_rates(n_flows, f, lk, None, cap, weight=w, compiled=compiled)
    ref = progressive_filling_py([[(link, 1.0) for link in p] for p in paths], cap.tolist(), w.tolist())
    np.testing.assert_allclose(fast, ref, rtol=1e-9)
    load = np.bincount(lk, weights=fast[f], minlength=n_links)
    assert (load <= cap * (1 + 1e-9)).all()
    # max-min: every flow crosses at least one saturated link
    sat = load >= cap * (1 - 1e-9)
    assert np.all(np.bincount(f, weights=sat[lk].astype(float), minlength=n_flows) > 0)


@pytest.mark.parametrize("seed", range(8))
def test_compiled_kernel_matches_reference_with_spraying_and_ties(seed: int) -> None:
    """Fractional coefficients, equal capacities (many ties) and idle links: kernel = plain Python to 1e-9."""
    rng = np.random.default_rng(100 + seed)
    n_flows, n_links = int(rng.integers(50, 400)), int(rng.integers(20, 120))
    paths = []
    for _ in range(n_flows):
        links = sorted(set(rng.integers(0, n_links, rng.integers(1, 6)).tolist()))
        paths.append([(link, float(rng.choice([1.0, 0.5, 0.25]))) for link in links])
    cap = rng.choice([1.0, 2.0, 4.0], n_links) * 1e9
    w = rng.choice([1.0, 4.0], n_flows)
    f = np.array([i for i, p in enumerate(paths) for _ in p], dtype=np.int64)
    lk = np.array([link for p in paths for link, _ in p], dtype=np.int64)
    cf = np.array([c for p in paths for _, c in p])
    fast = maxmin_rates(n_flows, f, lk, cf, cap, weight=w, compiled=True)
    ref = progressive_filling_py(paths, cap.tolist(), w.tolist())
    np.testing.assert_allclose(fast, ref, rtol=1e-9)


def test_compiled_kernel_honours_strict_priority() -> None:
    """Two priority classes on one link: the kernel serves the higher one first, as the numpy rounds do."""
    args = (2, np.array([0, 1]), np.array([0, 0]), None, np.array([10.0]))
    kw = {"weight": np.array([1.0, 1.0]), "priority": np.array([1, 0])}
    for compiled in (True, False):
        assert maxmin_rates(*args, compiled=compiled, **kw).tolist() == [10.0, 0.0]
