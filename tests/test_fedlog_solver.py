"""Tests of FedLog's exact server solve (algorithms/fedlog_solver.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize
from threadpoolctl import threadpool_limits

from algorithms.fedlog_solver import (
    FedLogSolveError,
    gradient,
    objective,
    posterior_map,
    predict_logits,
    solve_map,
)
from secagg.errors import SecaggError


def realistic_statistics(
    n_classes: int, dim: int, n: int, bound: float, seed: int
) -> tuple[np.ndarray, int]:
    """Summed FedLog statistics like a real round: multinomial class counts (skewed by a
    Dirichlet draw), per-class feature sums of non-negative features clamped to [0, bound],
    so every sum lies in [0, count * bound]. Returns ((C, dim + 1) with counts in column 0, n).
    """
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, rng.dirichlet(np.full(n_classes, 2.0)))
    means = np.clip(rng.gamma(1.0, 0.4, size=(n_classes, dim)), 0.0, bound)
    noise = rng.standard_normal((n_classes, dim)) * np.sqrt(counts)[:, None] * 0.3
    sums = np.clip(counts[:, None] * means + noise, 0.0, counts[:, None] * bound)
    assert np.all(sums <= counts[:, None] * bound) and np.all(sums >= 0.0)
    return np.column_stack([counts, sums]).astype(np.float64), n


def lbfgs_solve(S: np.ndarray, N: float, x0: np.ndarray | None = None) -> np.ndarray:
    """scipy's L-BFGS-B on the same objective (divided by N), analytic gradient, tight tolerances."""

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        eta = x.reshape(S.shape)
        return -objective(eta, S, N) / N, -gradient(eta, S, N).ravel() / N

    start = np.zeros(S.size) if x0 is None else x0.ravel()
    # single-threaded BLAS: L-BFGS-B's vector operations are small, and threads only contend
    with threadpool_limits(limits=1, user_api="blas"):
        res = minimize(
            fun,
            start,
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 20000, "maxfun": 40000, "ftol": 0.0, "gtol": 1e-12, "maxcor": 10},
        )
    return res.x.reshape(S.shape)


def rel_grad(eta: np.ndarray, S: np.ndarray, N: float) -> float:
    return float(np.linalg.norm(gradient(eta, S, N)) / np.linalg.norm(S))


# ----------------------------------------------------------------------------- acceptance 6


@pytest.mark.parametrize(("n_classes", "dim", "n"), [(10, 128, 60000), (100, 512, 50000)])
def test_exact_solve_gradient_and_lbfgs_agreement(n_classes: int, dim: int, n: int) -> None:
    S, n = realistic_statistics(n_classes, dim, n, bound=3.0, seed=n_classes)
    N = n + 1.0
    res = solve_map(S, N)
    assert res.eta.shape == (n_classes, dim + 1) and res.eta.dtype == np.float64
    # stationarity to near machine precision
    assert res.grad_norm / np.linalg.norm(S) <= 1e-9
    assert rel_grad(res.eta, S, N) <= 1e-9
    assert res.objective == pytest.approx(objective(res.eta, S, N), rel=1e-15)
    # an independent generic optimiser on the same objective lands on the same point
    eta_lb = lbfgs_solve(S, N)
    assert np.linalg.norm(eta_lb - res.eta) / np.linalg.norm(res.eta) <= 1e-6
    f_lb = objective(eta_lb, S, N)
    assert res.objective >= f_lb - 1e-13 * abs(f_lb)
    # and the exact solve is strictly more stationary than L-BFGS's answer
    assert res.grad_norm < np.linalg.norm(gradient(eta_lb, S, N))


def test_objective_matches_direct_formula() -> None:
    rng = np.random.default_rng(1)
    eta = rng.normal(size=(4, 3))
    S = rng.normal(size=(4, 3))
    direct = float(np.sum(eta * S) - 7.5 * np.log(np.sum(np.exp(np.sum(eta**2, axis=1) / 4))))
    assert objective(eta, S, 7.5) == pytest.approx(direct, rel=1e-14)


def test_gradient_matches_central_differences() -> None:
    rng = np.random.default_rng(2)
    eta = rng.normal(size=(5, 4))
    S = rng.normal(size=(5, 4)) * 3.0
    N = 11.0
    g = gradient(eta, S, N)
    h = 1e-6
    for _ in range(5):
        v = rng.normal(size=eta.shape)
        fd = (objective(eta + h * v, S, N) - objective(eta - h * v, S, N)) / (2 * h)
        assert fd == pytest.approx(float(np.sum(g * v)), rel=1e-6, abs=1e-8)


def test_solution_is_a_maximum_under_perturbation() -> None:
    S, n = realistic_statistics(6, 20, 3000, bound=2.0, seed=3)
    res = solve_map(S, n + 1.0)
    rng = np.random.default_rng(3)
    for scale in (1e-1, 1e-3):
        for _ in range(10):
            other = res.eta + scale * rng.normal(size=res.eta.shape)
            assert objective(other, S, n + 1.0) < res.objective


# ----------------------------------------------------------------------------- closed forms


def test_single_class_closed_form() -> None:
    # C = 1: w = 1 for any eta, so the optimum is eta = 2 S / N exactly
    S = np.array([[40.0, 12.5, -3.0, 7.0]])
    res = solve_map(S, 41.0)
    np.testing.assert_allclose(res.eta, 2.0 * S / 41.0, rtol=1e-14)
    assert res.class_weights == pytest.approx([1.0])


def test_identical_rows_closed_form() -> None:
    # by symmetry w_y = 1/C, so eta_y = 2 C a / N
    a = np.array([5.0, 1.0, 2.0, 0.5])
    S = np.tile(a, (7, 1))
    res = solve_map(S, 35.0)
    np.testing.assert_allclose(res.eta, np.tile(2 * 7 * a / 35.0, (7, 1)), rtol=1e-13)
    np.testing.assert_allclose(res.class_weights, np.full(7, 1 / 7), rtol=1e-13)


def test_all_zero_statistics_give_zero_head() -> None:
    res = solve_map(np.zeros((5, 9)), 3.0)
    assert np.all(res.eta == 0.0)
    assert res.objective == pytest.approx(-3.0 * math.log(5))
    assert res.grad_norm == 0.0


# ----------------------------------------------------------------------------- edge cases


def test_zero_rows_get_zero_eta_and_match_lbfgs() -> None:
    S, n = realistic_statistics(8, 30, 4000, bound=2.0, seed=4)
    S[[1, 5]] = 0.0
    n = int(S[:, 0].sum())
    res = solve_map(S, n + 1.0)
    assert np.all(res.eta[[1, 5]] == 0.0)
    assert np.all(res.class_weights[[1, 5]] > 0.0)
    assert rel_grad(res.eta, S, n + 1.0) <= 1e-9
    eta_lb = lbfgs_solve(S, n + 1.0)
    assert np.linalg.norm(eta_lb - res.eta) / np.linalg.norm(res.eta) <= 1e-6


def test_single_class_present() -> None:
    S = np.zeros((10, 17))
    rng = np.random.default_rng(5)
    S[3] = np.concatenate([[500.0], rng.uniform(0, 500.0 * 2.0, 16)])
    res = solve_map(S, 501.0)
    assert rel_grad(res.eta, S, 501.0) <= 1e-9
    assert np.count_nonzero(np.any(res.eta != 0.0, axis=1)) == 1
    # eta_3 is a positive multiple of S_3
    cos = res.eta[3] @ S[3] / (np.linalg.norm(res.eta[3]) * np.linalg.norm(S[3]))
    assert cos == pytest.approx(1.0, abs=1e-14)
    eta_lb = lbfgs_solve(S, 501.0)
    assert np.linalg.norm(eta_lb - res.eta) / np.linalg.norm(res.eta) <= 1e-6


def test_prior_count_nu_zero_versus_one() -> None:
    S, n = realistic_statistics(5, 12, 800, bound=2.0, seed=6)
    r0 = posterior_map(S, n, nu=0.0)
    r1 = posterior_map(S, n, nu=1.0)
    np.testing.assert_array_equal(r0.eta, solve_map(S, float(n)).eta)
    np.testing.assert_array_equal(r1.eta, solve_map(S, n + 1.0).eta)
    assert rel_grad(r0.eta, S, n) <= 1e-9 and rel_grad(r1.eta, S, n + 1.0) <= 1e-9
    # a larger prior count shrinks the head toward 0 (slightly, at this n)
    assert 0 < np.linalg.norm(r0.eta - r1.eta) < 1e-2 * np.linalg.norm(r0.eta)
    assert np.linalg.norm(r1.eta) < np.linalg.norm(r0.eta)
    chi = np.full_like(S, 0.5)
    np.testing.assert_array_equal(
        posterior_map(S, n, nu=2.0, chi=chi).eta, solve_map(S + chi, n + 2.0).eta
    )
    with pytest.raises(FedLogSolveError):
        posterior_map(np.zeros((3, 4)), 0, nu=0.0)


def test_noisy_statistics_with_negative_entries() -> None:
    # DP noise can make sums (and counts) negative; the MAP still exists for N > 0
    S, n = realistic_statistics(10, 40, 2000, bound=2.0, seed=7)
    S = S + np.random.default_rng(7).normal(scale=60.0, size=S.shape)
    res = solve_map(S, n + 1.0)
    assert rel_grad(res.eta, S, n + 1.0) <= 1e-9


@pytest.mark.parametrize(
    ("scale", "N"),
    [(1e-200, 1.0), (1e-200, 1e-198), (1.0, 1e12), (1e150, 1e148), (1e3, 1.0)],
)
def test_extreme_scales(scale: float, N: float) -> None:
    rng = np.random.default_rng(8)
    S = rng.uniform(0.0, 1.0, size=(6, 5)) * scale
    res = solve_map(S, N)
    assert np.all(np.isfinite(res.eta)) and np.all(res.eta != 0.0)
    # stationarity S_y = N w_y eta_y / 2, checked in extended precision on rescaled values
    e = res.eta.astype(np.longdouble)
    q = np.sum(e * e, axis=1) / 4
    w = np.exp(q - q.max())
    w /= w.sum()
    resid = (np.longdouble(N) * w / 2)[:, None] * (e / scale) - S.astype(np.longdouble) / scale
    rel = float(np.max(np.abs(resid)) / np.max(S / scale))
    # documented floor: rounding eta to float64 moves ||eta_y||^2/4 by about eps * q
    assert rel <= max(1e-12, 8 * np.finfo(np.float64).eps * float(q.max()))


def test_unrepresentable_optimum_raises() -> None:
    with pytest.raises(FedLogSolveError, match="not representable"):
        solve_map(np.full((3, 4), 1e300), 1e-300)
    with pytest.raises(FedLogSolveError, match="not representable"):
        solve_map(np.arange(12.0).reshape(3, 4) * 1e6, 1e-3)


@settings(max_examples=40, derandomize=True, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(1, 10),
    st.floats(0.01, 1e5),
    st.integers(0, 2**31 - 1),
)
def test_random_problems_are_stationary(c: int, d: int, N: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    S = rng.normal(size=(c, d)) * rng.uniform(0.0, 3.0) * N
    S[rng.random(c) < 0.3] = 0.0
    res = solve_map(S, N)
    norm = np.linalg.norm(S)
    if norm == 0.0:
        assert np.all(res.eta == 0.0)
    else:
        assert res.grad_norm / norm <= 1e-9
    assert res.class_weights.sum() == pytest.approx(1.0, abs=1e-12)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "bad_S",
    [
        np.array([[1.0, np.nan]]),
        np.array([[1.0, np.inf]]),
        np.ones(4),
        np.ones((2, 3, 4)),
        np.ones((0, 3)),
        np.ones((2, 0)),
        np.ones((2, 2), dtype=complex),
        np.ones((2, 2), dtype=bool),
        np.array([["a", "b"]]),
        "not an array",
    ],
)
def test_bad_statistics_raise_typed_error(bad_S: object) -> None:
    with pytest.raises(FedLogSolveError) as info:
        solve_map(bad_S, 10.0)  # type: ignore[arg-type]
    assert isinstance(info.value, SecaggError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("bad_N", [0.0, -1.0, math.nan, math.inf, True, "ten", None])
def test_bad_count_raises_typed_error(bad_N: object) -> None:
    with pytest.raises(FedLogSolveError):
        solve_map(np.ones((2, 3)), bad_N)  # type: ignore[arg-type]
    with pytest.raises(FedLogSolveError):
        objective(np.zeros((2, 3)), np.ones((2, 3)), bad_N)  # type: ignore[arg-type]


def test_bad_options_and_shapes_raise_typed_error() -> None:
    S = np.ones((2, 3))
    for kwargs in ({"tol": 0.0}, {"tol": math.nan}, {"max_iter": 0}, {"max_iter": 2.5}):
        with pytest.raises(FedLogSolveError):
            solve_map(S, 5.0, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(FedLogSolveError):
        gradient(np.zeros((2, 4)), S, 5.0)
    with pytest.raises(FedLogSolveError):
        posterior_map(S, 4, chi=np.zeros((3, 3)))
    with pytest.raises(FedLogSolveError):
        posterior_map(S, -2, nu=5.0)


def test_max_iter_too_small_raises() -> None:
    S, n = realistic_statistics(10, 20, 3000, bound=2.0, seed=9)
    with pytest.raises(FedLogSolveError, match="did not reach"):
        solve_map(S, n + 1.0, max_iter=1)


# ----------------------------------------------------------------------------- prediction


def test_predict_logits_is_the_papers_conditional() -> None:
    # Eq. 9 joint: log Pr(phi, y) = eta_y . phi - phi . phi - (m/2) log pi - A(eta); the
    # conditional Pr(y | phi) computed from it must equal softmax(predict_logits).
    rng = np.random.default_rng(10)
    eta = rng.normal(size=(4, 6))
    feats = rng.normal(size=(9, 5))
    phi = np.column_stack([np.ones(9), feats])
    A = math.log(np.sum(np.exp(np.sum(eta**2, axis=1) / 4)))
    log_joint = phi @ eta.T - np.sum(phi**2, axis=1, keepdims=True) - 3 * math.log(math.pi) - A
    cond = np.exp(log_joint) / np.exp(log_joint).sum(axis=1, keepdims=True)
    logits = predict_logits(eta, feats)
    soft = np.exp(logits - logits.max(axis=1, keepdims=True))
    soft /= soft.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(soft, cond, rtol=1e-12)
    np.testing.assert_allclose(predict_logits(eta, feats[0]), logits[0], rtol=1e-13)
    with pytest.raises(FedLogSolveError):
        predict_logits(eta, rng.normal(size=(3, 6)))  # constant 1 must not be included
    with pytest.raises(FedLogSolveError):
        predict_logits(eta, np.full((2, 5), np.nan))
