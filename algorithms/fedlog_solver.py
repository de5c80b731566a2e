"""FedLog's server solve: the exact MAP of the conjugate posterior, in float64.

FedLog (Yu, Zhang, Poupart; arXiv 2407.08337, Eqs. 8-15) models the pair (phi, y), with
phi = [1, body(x)] in R^D, as an exponential family whose natural parameter is the head
``eta`` (a ``C x D`` matrix, row y = eta_y, column 0 = bias) and whose log-partition is
``A(eta) = log sum_y exp(||eta_y||^2 / 4)``. Each round the server receives the summed
per-class statistics ``Phi`` (row y = sum over class-y records of [1, phi]) and the record
count ``n`` and sets eta to the MAP of the conjugate posterior (Eq. 15)::

    eta* = argmax_eta  f(eta),   f(eta) = sum_y eta_y . S_y  -  N * log sum_y exp(||eta_y||^2/4)

with ``S = chi + Phi`` and ``N = nu + n`` (prior chi = 0; the paper suggests nu = 1, the
reference code uses nu = 0).

Structure of the optimum (what makes the solve exact). Stationarity reads
``S_y = N * w_y * eta_y / 2`` with ``w = softmax(||eta_y||^2 / 4)``, so eta_y is a positive
multiple of S_y: ``eta_y = 2 S_y / (N w_y)``. Write ``r_y = ||S_y|| / N``,
``t_y = ||eta_y||^2 / 4`` and ``L = log sum_y exp(t_y)``. Then ``t_y = r_y^2 / w_y^2`` and
``w_y = exp(t_y - L)``; eliminating w_y gives ``2 t_y + log(2 t_y) = 2 (L + log r_y) + log 2``,
whose solution is the Wright omega function: ``t_y = omega(2 (L + log r_y) + log 2) / 2``. Every
t_y, hence every w_y, is thus an explicit increasing function of the single unknown L, and L is
the root of ``G(L) = log sum_y w_y(L) = 0``. G is strictly decreasing and convex in L
(d log w_y / dL = -1/(2 t_y + 1), increasing in L), so Newton's method started left of the
root climbs to it monotonically and quadratically, and one step from the right lands left of
it. The start is the guess ``L = (sum_y r_y)^2 + log C`` (exact when all t_y are equal), never
below the lower bound ``log sum_y exp(r_y^2) <= L*`` (because t_y >= r_y^2); a bracket guards
against rounding. Typical solves take 4 Newton steps.

Existence and uniqueness. For N > 0 the objective is strictly concave (the Hessian of the
log-partition term is at least ``(N/2) diag(w_y I)``) and coercive (``log sum exp(t_y) >=
max_y ||eta_y||^2/4`` grows quadratically, the linear term only linearly), so the maximum
exists and is unique for *every* finite S, including S = 0 (then eta* = 0). For N <= 0 the
objective is linear or convex and unbounded above unless S = 0, so no unique maximum exists:
N > 0 is enforced. Rows with S_y = 0 get eta_y = 0 (they still carry class weight w_y).

The predictive rule is Eq. 10 of the paper: ``Pr(y | phi, eta) = softmax_y(eta_y . [1, phi])``;
the terms -phi.phi of the base measure and the log-partition do not depend on y and cancel.

Noised statistics (:func:`shrink_statistics`). Under a DP layer the server receives
``Phi + E`` with E i.i.d. Gaussian of a known std sigma per entry, and a noised count can be
zero or negative (the solve then has no unique optimum, or gives that class a head far from
its data). Before the solve the noised statistics are replaced by their posterior mean
given the release (an empirical-Bayes plug-in); see :func:`shrink_statistics`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
from scipy.special import erfcx, wrightomega

from secagg.errors import SecaggError

__all__ = [
    "FedLogSolveError",
    "SolveResult",
    "gradient",
    "objective",
    "posterior_map",
    "predict_logits",
    "shrink_statistics",
    "solve_map",
    "ShrunkStatistics",
]

_LOG2 = math.log(2.0)
# Above this, ||eta_y||^2 / 4 is resolved in float64 to no better than ~0.25, so the class
# weights softmax(||eta_y||^2 / 4) of any float64 head are off by tens of percent.
_Q_MAX = 2.0**50
_EPS = float(np.finfo(np.float64).eps)
_TINY = float(np.finfo(np.float64).tiny)


class FedLogSolveError(SecaggError, ValueError):
    """The FedLog server solve was given invalid input, or its optimum is not representable."""


@dataclass(frozen=True)
class SolveResult:
    """The MAP head and diagnostics of one FedLog server solve.

    Attributes:
        eta: the ``(C, D)`` float64 head; row y is eta_y, column 0 multiplies the constant 1.
        objective: f(eta) = sum_y eta_y . S_y - N log sum_y exp(||eta_y||^2/4) at ``eta``.
        grad_norm: Euclidean norm of the gradient of f at ``eta`` (0 at the exact optimum).
        iterations: Newton iterations of the outer one-dimensional root-find in L.
        log_partition: L = log sum_y exp(||eta_y||^2 / 4) at the optimum.
        class_weights: w = softmax(||eta_y||^2 / 4), the model's class prior at the optimum.
    """

    eta: np.ndarray
    objective: float
    grad_norm: float
    iterations: int
    log_partition: float
    class_weights: np.ndarray


# ----------------------------------------------------------------------------- validation


def _as_matrix(x: object, name: str) -> np.ndarray:
    """``x`` as a finite 2-D float64 array with at least one row and column, or a typed error."""
    if isinstance(x, np.ndarray):
        arr = x
    else:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as exc:
            raise FedLogSolveError(f"{name} is not an array: {exc}") from exc
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise FedLogSolveError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise FedLogSolveError(
            f"{name} must be a non-empty 2-D (C, D) array, got shape {arr.shape}"
        )
    out = np.asarray(arr, dtype=np.float64)
    if not np.all(np.isfinite(out)):
        raise FedLogSolveError(f"{name} contains NaN or infinite entries")
    return out


def _as_count(n: object, name: str = "N") -> float:
    """``n`` as a finite float > 0, or a typed error explaining why the MAP needs it."""
    if isinstance(n, (bool, np.bool_)):
        raise FedLogSolveError(f"{name} must be a real number, got a bool")
    try:
        value = float(n)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise FedLogSolveError(f"{name} must be a real number, got {n!r}") from exc
    if not math.isfinite(value):
        raise FedLogSolveError(f"{name} must be finite, got {value}")
    if value <= 0.0:
        raise FedLogSolveError(
            f"{name} = nu + n must be > 0 (got {value}): for N <= 0 the posterior has no unique "
            "maximum (the objective is unbounded above or constant)"
        )
    return value


def _check_pair(eta: object, S: object, N: object) -> tuple[np.ndarray, np.ndarray, float]:
    e = _as_matrix(eta, "eta")
    s = _as_matrix(S, "S")
    if e.shape != s.shape:
        raise FedLogSolveError(f"eta has shape {e.shape} but S has shape {s.shape}")
    return e, s, _as_count(N)


# ----------------------------------------------------------------------------- objective


def objective(eta: np.ndarray, S: np.ndarray, N: float) -> float:
    """The log posterior kernel f(eta) = sum_y eta_y . S_y - N log sum_y exp(||eta_y||^2 / 4).

    ``eta`` and ``S`` are ``(C, D)`` arrays, ``N > 0``. Evaluated in float64 with a shifted
    log-sum-exp (no overflow for any finite eta whose squared norms are finite).
    """
    e, s, n = _check_pair(eta, S, N)
    q = 0.25 * np.einsum("ij,ij->i", e, e)
    return float(np.einsum("ij,ij->", e, s) - n * _logsumexp(q))


def gradient(eta: np.ndarray, S: np.ndarray, N: float) -> np.ndarray:
    """The gradient of :func:`objective` (an ascent direction): ``S_y - N w_y eta_y / 2``.

    ``w = softmax_y(||eta_y||^2 / 4)``. Returns a ``(C, D)`` float64 array.
    """
    e, s, n = _check_pair(eta, S, N)
    q = 0.25 * np.einsum("ij,ij->i", e, e)
    w = np.exp(q - _logsumexp(q))
    return s - (0.5 * n) * w[:, None] * e


# ----------------------------------------------------------------------------- the solve


def _logsumexp(x: np.ndarray) -> float:
    """log sum exp(x) of a 1-D float64 array, shifted by its maximum (no overflow)."""
    top = float(np.max(x))
    if not math.isfinite(top):
        return top
    return top + math.log(float(np.sum(np.exp(x - top))))


def _norm(x: np.ndarray) -> float:
    """Euclidean (Frobenius) norm of a 2-D array without overflow or underflow of the squares.

    (einsum, not BLAS: the solve stays single-threaded and fast on oversubscribed machines.)
    """
    m = float(np.max(np.abs(x))) if x.size else 0.0
    if m == 0.0 or not math.isfinite(m):
        return m
    y = x / m
    return m * math.sqrt(float(np.einsum("ij,ij->", y, y)))


def _row_terms(L: float, log_r: np.ndarray, n_zero: int) -> tuple[float, float, np.ndarray]:
    """For the outer unknown L: G(L) = log sum_y w_y(L), G'(L), and log w_y of nonzero rows.

    om_y = 2 t_y solves om + log(om) = z_y = 2 (L + log r_y) + log 2 (Wright omega), and
    w_y = r_y / sqrt(t_y); zero rows have t_y = 0 and w_y = exp(-L).
    """
    z = 2.0 * (L + log_r) + _LOG2
    om = wrightomega(z)
    if om.min() >= 1.0:  # common case; one Newton step polishes scipy's value to ~1 ulp
        om = om - (om + np.log(om) - z) * om / (om + 1.0)
        log_t = np.log(om) - _LOG2
    else:  # tiny om (possibly underflowed): log t = z - om - log 2 needs no log of om
        pos = om > 0.0
        om_safe = np.where(pos, om, 1.0)
        om = np.where(pos, om - (om_safe + np.log(om_safe) - z) * om / (om + 1.0), om)
        big = om >= 1.0
        log_t = np.where(big, np.log(np.where(big, om, 1.0)), z - om) - _LOG2
    log_w_nz = log_r - 0.5 * log_t
    slope_w = 1.0 / (om + 1.0)  # -d log w_y / dL = 1 / (2 t_y + 1)
    log_w = log_w_nz
    if n_zero:
        # n_zero rows, each with w = exp(-L) and t = 0: one entry of weight n_zero
        log_w = np.append(log_w_nz, math.log(n_zero) - L)
        slope_w = np.append(slope_w, 1.0)
    top = float(log_w.max())
    e = np.exp(log_w - top)
    total = float(e.sum())
    G = top + math.log(total)
    dG = -float(np.dot(e, slope_w)) / total
    return G, dG, log_w_nz


def solve_map(S: np.ndarray, N: float, *, tol: float = 1e-13, max_iter: int = 200) -> SolveResult:
    """The exact MAP head of FedLog's conjugate posterior (paper Eq. 15), in float64.

    Maximises ``f(eta) = sum_y eta_y . S_y - N log sum_y exp(||eta_y||^2 / 4)`` over
    ``(C, D)`` matrices eta, for statistics ``S = chi + Phi`` (``(C, D)``, column 0 is the
    per-class count plus prior) and ``N = nu + n > 0``. The maximum exists and is unique for
    every finite S when N > 0 (see the module docstring); the solve reduces it to Newton's
    method on one scalar, L = log-partition at the optimum, and reconstructs
    ``eta_y = 2 S_y / (N w_y)`` (``eta_y = 0`` where ``S_y = 0``).

    Args:
        S: posterior statistics, ``(C, D)``, finite, any real numeric dtype.
        N: posterior count nu + n, finite and > 0.
        tol: stop when the normalisation residual ``|log sum_y w_y(L)|`` is <= tol (the
            iteration also stops when L stops moving at machine precision).
        max_iter: maximum Newton iterations on L (typically fewer than 10 are used).

    Raises:
        FedLogSolveError: non-finite or mis-shaped S, N <= 0 or non-finite, bad tol/max_iter,
            an optimum too large for float64 (``||eta_y||^2/4 > 2^50``), or no convergence
            within max_iter.

    Precision: the root-find works with log-weights, so eta is accurate to a few ulp. The
    gradient of f at the float64 eta is, relative to ||S||, about eps * max_y ||eta_y||^2/4
    (merely rounding eta to float64 moves the exponents that much); ``grad_norm`` reports
    it. For sums of features clamped to [-b, b], ||S_y|| <= n_y sqrt(1 + d b^2), and when
    w_y is near the class frequency n_y / N (the usual case) ||eta_y||^2/4 = r_y^2 / w_y^2 is
    about ||S_y / n_y||^2 <= 1 + d b^2 (at most ~170 in the tests), so the relative gradient
    is ~1e-13; it would exceed 1e-9 only beyond ||eta_y||^2/4 ~ 1e6.
    """
    s = _as_matrix(S, "S")
    n = _as_count(N)
    if isinstance(tol, bool) or not (
        isinstance(tol, numbers.Real) and math.isfinite(tol) and tol > 0.0
    ):
        raise FedLogSolveError(f"tol must be a finite number > 0, got {tol!r}")
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise FedLogSolveError(f"max_iter must be an integer >= 1, got {max_iter!r}")
    C = s.shape[0]

    # row norms without overflow: ||S_y|| = m_y * ||S_y / m_y||, m_y = max |S_y|
    amax = np.max(np.abs(s), axis=1)
    nz = amax > 0.0
    n_zero = int(C - np.count_nonzero(nz))
    if n_zero == C:  # S = 0: eta = 0 is stationary, hence the unique maximum
        eta = np.zeros_like(s)
        L = math.log(C)
        return SolveResult(eta, float(-n * L), 0.0, 0, L, np.full(C, 1.0 / C))
    scaled = s[nz] / amax[nz, None]
    half_log_ss = 0.5 * np.log(np.einsum("ij,ij->i", scaled, scaled))
    # log r_y = log(max|S_y| / N) + log ||S_y / max|S_y|||: one rounding in the ratio (a
    # difference of two large logarithms would cost eps * |log N| in r, i.e. in eta)
    with np.errstate(over="ignore", under="ignore"):
        ratio = amax[nz] / n
    normal = np.isfinite(ratio) & (ratio >= _TINY)
    log_ratio = np.where(
        normal, np.log(np.where(normal, ratio, 1.0)), np.log(amax[nz]) - math.log(n)
    )
    log_r = log_ratio + half_log_ss

    # L0 = log sum_y exp(r_y^2) <= L* (since t_y >= r_y^2), so G(L0) >= 0
    with np.errstate(over="ignore"):
        r2 = np.exp(2.0 * log_r)
    if not np.all(np.isfinite(r2)):
        raise FedLogSolveError(
            "the optimum is not representable in float64: ||S_y|| / N is too large"
        )
    lo = float(_logsumexp(np.concatenate([r2, np.zeros(n_zero)])))
    hi = math.inf  # bracket: G(lo) >= 0 >= G(hi)
    # start: if all t_y were equal to T, w_y = r_y / sqrt(T) and sum_y w_y = 1 give
    # T = (sum_y r_y)^2 and L = T + log(#nonzero rows); Newton corrects from either side
    r_sum = float(np.sum(np.exp(log_r - log_r.max()))) * math.exp(float(log_r.max()))
    guess = r_sum * r_sum + math.log(C - n_zero)
    L = guess if (n_zero == 0 and math.isfinite(guess) and guess > lo) else lo
    iterations = 0
    converged = False
    while iterations < max_iter:
        G, dG, log_w = _row_terms(L, log_r, n_zero)
        iterations += 1
        if abs(G) <= tol:
            converged = True
            break
        if G > 0.0:
            lo = max(lo, L)
        else:
            hi = min(hi, L)
        step = -G / dG
        L_new = L + step
        if not (lo < L_new < hi):  # rounding pushed Newton out of the bracket: bisect
            L_new = 0.5 * (lo + hi) if math.isfinite(hi) else lo + 2.0 * abs(step) + 1.0
        if abs(L_new - L) <= 4.0 * _EPS * max(1.0, abs(L)):
            G, dG, log_w = _row_terms(L_new, log_r, n_zero)
            L = L_new
            converged = abs(G) <= max(tol, 64.0 * _EPS)
            break
        L = L_new
    if not converged:
        raise FedLogSolveError(
            f"the root-find for the log-partition did not reach tol={tol} in {max_iter} "
            f"iterations (residual {G:.3e})"
        )

    # eta_y = 2 S_y / (N w_y) for nonzero rows; 2/N directly where it is a normal number
    # (no eps*|log N| loss), through logarithms otherwise
    with np.errstate(over="ignore", under="ignore"):
        factor = (2.0 / n) * np.exp(-log_w)
        bad = ~np.isfinite(factor) | (factor < _TINY)
        if np.any(bad):
            factor = np.where(bad, 2.0 * np.exp(-math.log(n) - log_w), factor)
        if n_zero:
            eta = np.zeros_like(s)
            eta[nz] = s[nz] * factor[:, None]
        else:
            eta = s * factor[:, None]
        q = 0.25 * np.einsum("ij,ij->i", eta, eta)
    if not np.all(q <= _Q_MAX):  # also catches an eta that overflowed (q = inf or nan)
        raise FedLogSolveError(
            f"the optimum is not representable in float64: max ||eta_y||^2/4 = {q.max():.3e} "
            f"exceeds {_Q_MAX:.3e} (||S_y|| / N is far too large)"
        )
    top = float(q.max())
    ex = np.exp(q - top)
    total = float(ex.sum())
    L_eta = top + math.log(total)
    w = ex / total
    grad = s - eta * ((0.5 * n) * w)[:, None]
    obj = float(np.einsum("ij,ij->", eta, s)) - n * L_eta
    if not math.isfinite(obj):
        raise FedLogSolveError("the optimum's objective is not representable in float64")
    grad_norm = math.sqrt(float(np.einsum("ij,ij->", grad, grad)))
    if not 0.0 < grad_norm < math.inf:  # underflow or overflow of the squares: rescale
        grad_norm = _norm(grad)
    return SolveResult(
        eta=eta,
        objective=obj,
        grad_norm=grad_norm,
        iterations=iterations,
        log_partition=L_eta,
        class_weights=w,
    )


def posterior_map(
    phi: np.ndarray,
    n: float,
    *,
    nu: float = 1.0,
    chi: np.ndarray | None = None,
    tol: float = 1e-13,
    max_iter: int = 200,
) -> SolveResult:
    """FedLog's server step: the MAP head from aggregated statistics and a conjugate prior.

    ``phi`` is the summed ``(C, D)`` statistic (row y = sum over class-y records of
    [1, phi(x)]), ``n`` the total record count; the posterior is ``(chi + phi, nu + n)``
    (paper Eq. 14). ``chi`` defaults to 0 and ``nu`` to 1 (the paper's default; the reference
    code uses nu = 0). Raises :class:`FedLogSolveError` on invalid input, e.g. nu + n <= 0.
    """
    p = _as_matrix(phi, "phi")
    count = n
    if isinstance(count, (bool, np.bool_)):
        raise FedLogSolveError("n must be a real number, got a bool")
    try:
        total = float(count) + float(nu)
    except (TypeError, ValueError) as exc:
        raise FedLogSolveError(f"n and nu must be real numbers, got n={n!r}, nu={nu!r}") from exc
    if not math.isfinite(float(count)) or float(count) < 0.0:
        raise FedLogSolveError(f"n must be a finite count >= 0, got {n!r}")
    if chi is not None:
        c = _as_matrix(chi, "chi")
        if c.shape != p.shape:
            raise FedLogSolveError(f"chi has shape {c.shape} but phi has shape {p.shape}")
        p = p + c
    return solve_map(p, _as_count(total, "nu + n"), tol=tol, max_iter=max_iter)


# ----------------------------------------------------------------------------- noised input


@dataclass(frozen=True)
class ShrunkStatistics:
    """Posterior-mean statistics for the solve, from noised ones (:func:`shrink_statistics`).

    Attributes:
        stats: the ``(C, D)`` statistics to solve with: row y is ``counts[y] * [1, means[y]]``.
        counts: the posterior mean of each class's record count, every entry > 0.
        means: the posterior-mean class feature means, ``(C, D - 1)``, inside ``[-b, b]``.
        mean_sd: per class, the std ``sigma / counts[y]`` of the noise on its raw mean.
        sigma: the noise std per entry the input was shrunk for.
    """

    stats: np.ndarray
    counts: np.ndarray
    means: np.ndarray
    mean_sd: np.ndarray
    sigma: float


def _positive_count_mean(c: np.ndarray, sigma: float) -> np.ndarray:
    """E[n | c] for c = n + N(0, sigma^2) under a flat prior on n >= 0: the mean of a normal
    truncated to [0, inf), ``sigma (x + R(x))`` with x = c / sigma and R(x) = phi(x)/Phi(x)
    the inverse Mills ratio. Always > 0; about c when c >> sigma, about sigma^2 / |c| when
    c << -sigma."""
    x = c / sigma
    u = -x
    out = np.empty_like(x)
    far = u > 100.0  # x + R(x) = 1/u - 2/u^3 + 10/u^5 - ... (no cancellation)
    uf = u[far]
    out[far] = 1.0 / uf - 2.0 / uf**3 + 10.0 / uf**5
    near = ~far
    # R(x) = sqrt(2/pi) / erfcx(-x / sqrt 2): no underflow of Phi(x) for negative x
    out[near] = x[near] + math.sqrt(2.0 / math.pi) / erfcx(-x[near] / math.sqrt(2.0))
    return sigma * np.maximum(out, _TINY)


def _box_mean(xbar: np.ndarray, sd: np.ndarray, b: float) -> np.ndarray:
    """E[mu | xbar] for xbar = mu + N(0, sd^2) under a flat prior on mu in [-b, b]: the
    mean of N(xbar, sd^2) truncated to [-b, b], elementwise. Always inside the box; xbar
    when sd is small against the distance to the box's faces, toward 0 as sd grows.

    ``m + sd (phi(lo) - phi(hi)) / (Phi(hi) - Phi(lo))`` with lo, hi the standardised faces;
    when both faces lie on one side of m, through the scaled complementary error function
    (erfcx) relative to the nearer face, so far tails neither underflow nor cancel."""
    from scipy.special import ndtr

    sd = np.minimum(sd, 1e6 * b)  # beyond this the posterior is the flat box: mean ~0
    m = np.clip(xbar, -1e150, 1e150)  # (an overflowed raw mean: the face, all the same)
    flip = m > 0  # reflect so that m <= 0: then the box lies above m or straddles it
    m = np.where(flip, -m, m)
    lo, hi = (-b - m) / sd, (b - m) / sd  # lo < hi, hi > 0
    out = np.empty_like(m)
    mid = lo <= 0.0
    # straddling: Phi(hi) - Phi(lo) >= Phi(hi) - 1/2 is no small difference
    pdf = math.sqrt(0.5 / math.pi)
    num = pdf * (np.exp(-0.5 * lo[mid] ** 2) - np.exp(-0.5 * hi[mid] ** 2))
    out[mid] = m[mid] + sd[mid] * num / (ndtr(hi[mid]) - ndtr(lo[mid]))
    # above m (0 < lo < hi): multiply through by exp(lo^2 / 2); the mean is lo's face plus
    # sd (ratio - lo), with ratio = (1 - e) / (sqrt(pi/2) (erfcx(lo/r2) - e erfcx(hi/r2)))
    up = ~mid
    a, c = lo[up], hi[up]
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        e = np.exp(-0.5 * (c - a) * (c + a))
        r2 = math.sqrt(2.0)
        ratio = (1.0 - e) / (math.sqrt(0.5 * math.pi) * (erfcx(a / r2) - e * erfcx(c / r2)))
        # far above (a > 1e4) the density on [a, c] is exp(-a t) to 1e-8: its mean offset
        # 1/a - L e^(-aL) / (1 - e^(-aL)), L = c - a, without ratio - a's cancellation
        k = a * (c - a)
        tail = 1.0 / a - np.where(k > 1e-12, (c - a) * np.exp(-k) / -np.expm1(-k),
                                  1.0 / a - 0.5 * (c - a))
    off = np.where(a > 1e4, tail, ratio - a)
    out[up] = -b + sd[up] * off
    return np.clip(np.where(flip, -out, out), -b, b)


def shrink_statistics(S: np.ndarray, sigma: float, feature_bound: float) -> ShrunkStatistics:
    """Posterior-mean FedLog statistics from a release noised with std ``sigma`` per entry.

    ``S`` is the noised ``(C, D)`` sum: row y is ``[n_y, t_y] + E_y`` where n_y is the class's
    record count, ``t_y = n_y mu_y`` the sum of its features (each clamped to
    ``[-b, b]``, b = ``feature_bound``, so ``mu_y`` lies in the box too), and E_y i.i.d.
    ``N(0, sigma^2)`` (what the DP layers add; a discrete or per-client noise of that
    total std is treated alike). The exact statistics are replaced by their posterior mean
    given the release under flat priors on what the statistics can be, which the MAP solve
    then treats as data. No class is dropped and every row has a positive count:

    * counts: ``n_y`` has a flat prior on ``[0, inf)``, so its posterior mean given the noised
      count c_y is that of ``N(c_y, sigma^2)`` truncated at 0,
      ``n_hat_y = c_y + sigma phi(c_y/sigma) / Phi(c_y/sigma) > 0`` (= c_y when
      c_y >> sigma; a pseudo-count of order ``sigma^2/|c_y|`` when the noise swamps it).
    * means: given the count (taken at n_hat_y), the raw mean ``t_y / n_hat_y`` is
      ``mu_y`` plus noise of std ``s_y = sigma / n_hat_y`` per coordinate, and ``mu_y`` has a
      flat prior on the box ``[-b, b]^(D-1)``; its posterior mean is, per coordinate, the
      mean of ``N(t_y / n_hat_y, s_y^2)`` truncated to ``[-b, b]``. A well-counted class
      keeps its own mean; as ``s_y`` grows past b the mean moves toward the box's centre 0,
      the conjugate prior's mean (chi = 0), so a swamped class gets a row near
      ``n_hat_y [1, 0]`` rather than a huge or sign-flipped one.

    The rows ``n_hat_y [1, mu_hat_y]`` have ``||S_y|| / n_hat_y <= sqrt(1 + (D-1) b^2)``, so the
    solve's head is finite for every class. The priors are deliberately flat (they encode
    only what the statistics can be): a prior fitted to the release would also shrink
    classes toward each other, which measured worse on digits (a head nearer one constant
    prediction). With ``sigma = 0`` nothing is estimated: ``S`` is returned as given (the
    exact solve).

    Raises:
        FedLogSolveError: ``S`` is not a finite ``(C, D)`` array with D >= 2, or ``sigma``
            is negative or not finite, or ``feature_bound`` is not a finite number > 0.
    """
    s = _as_matrix(S, "S")
    if isinstance(sigma, bool) or not (isinstance(sigma, numbers.Real)
                                       and math.isfinite(sigma) and sigma >= 0):
        raise FedLogSolveError(f"sigma must be a finite number >= 0, got {sigma!r}")
    if isinstance(feature_bound, bool) or not (
            isinstance(feature_bound, numbers.Real) and math.isfinite(feature_bound)
            and feature_bound > 0):
        raise FedLogSolveError(f"feature_bound must be a finite number > 0, got "
                               f"{feature_bound!r}")
    if s.shape[1] < 2:
        raise FedLogSolveError(f"S needs a count column and features, got shape {s.shape}")
    sigma = float(sigma)
    b = float(feature_bound)
    C = s.shape[0]
    if sigma == 0.0:
        counts = s[:, 0].copy()
        with np.errstate(divide="ignore", invalid="ignore"):
            means = np.where(counts[:, None] > 0, s[:, 1:] / counts[:, None], 0.0)
        return ShrunkStatistics(s.copy(), counts, means, np.zeros(C), 0.0)
    n_hat = _positive_count_mean(s[:, 0], sigma)
    sd = sigma / n_hat
    with np.errstate(over="ignore"):
        xbar = s[:, 1:] / n_hat[:, None]  # +-inf where it overflows: the face, below
    means = _box_mean(xbar, sd[:, None] * np.ones_like(xbar), b)
    stats = n_hat[:, None] * np.concatenate([np.ones((C, 1)), means], axis=1)
    return ShrunkStatistics(stats, n_hat, means, sd, sigma)


# ----------------------------------------------------------------------------- prediction


def predict_logits(eta: np.ndarray, features: np.ndarray) -> np.ndarray:
    """Class scores of FedLog's classifier (paper Eq. 10): ``logits_y = eta_y . [1, phi]``.

    ``eta`` is the ``(C, D)`` head, ``features`` the body outputs phi(x) *without* the
    constant 1, shape ``(n, D - 1)`` (or ``(D - 1,)`` for one record). Returns ``(n, C)``
    (or ``(C,)``) float64 logits; ``softmax`` of them is Pr(y | phi, eta). Equivalent to
    ``torch.nn.Linear(D - 1, C)`` with ``weight = eta[:, 1:]`` and ``bias = eta[:, 0]``.
    """
    e = _as_matrix(eta, "eta")
    try:
        f = np.asarray(features)
    except (TypeError, ValueError) as exc:
        raise FedLogSolveError(f"features is not an array: {exc}") from exc
    single = f.ndim == 1
    if single:
        f = f[None, :]
    if f.ndim != 2 or f.shape[1] != e.shape[1] - 1:
        raise FedLogSolveError(
            f"features must have shape (n, {e.shape[1] - 1}) for eta of shape {e.shape}, "
            f"got {np.shape(features)}"
        )
    if f.dtype == np.bool_ or not (
        np.issubdtype(f.dtype, np.integer) or np.issubdtype(f.dtype, np.floating)
    ):
        raise FedLogSolveError(f"features must be a real numeric array, got dtype {f.dtype}")
    f = np.asarray(f, dtype=np.float64)
    if not np.all(np.isfinite(f)):
        raise FedLogSolveError("features contains NaN or infinite entries")
    logits = f @ e[:, 1:].T + e[:, 0]
    return logits[0] if single else logits
