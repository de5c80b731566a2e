"""The pure math of the audits: Clopper-Pearson bounds on measured error rates, the
epsilon lower bound that a test's (FPR, FNR) give, and the one-run audit's p-value and
bound (Steinke, Nasr and Jagielski 2023)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import stats

from threat_models.dp_audit_gdp import AuditError


def clopper_pearson_upper(k: Any, n: int, alpha: float) -> np.ndarray:
    """One-sided Clopper-Pearson upper bound on a binomial proportion: the p with
    P[Binomial(n, p) <= k] = alpha (1 when k = n). Holds with probability >= 1 - alpha."""
    k = np.asarray(k)
    _check_alpha(alpha)
    if n < 1 or np.any(k < 0) or np.any(k > n):
        raise AuditError(f"counts must lie in [0, n] with n >= 1, got k={k!r}, n={n}")
    safe = np.minimum(k, n - 1)
    return np.where(k < n, stats.beta.ppf(1.0 - alpha, safe + 1, n - safe), 1.0)


def clopper_pearson_lower(k: Any, n: int, alpha: float) -> np.ndarray:
    """One-sided Clopper-Pearson lower bound: the p with P[Binomial(n, p) >= k] = alpha
    (0 when k = 0). Holds with probability >= 1 - alpha."""
    k = np.asarray(k)
    _check_alpha(alpha)
    if n < 1 or np.any(k < 0) or np.any(k > n):
        raise AuditError(f"counts must lie in [0, n] with n >= 1, got k={k!r}, n={n}")
    safe = np.maximum(k, 1)
    return np.where(k > 0, stats.beta.ppf(alpha, safe, n - safe + 1), 0.0)


def _check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise AuditError(f"alpha (1 - confidence) must be in (0, 1), got {alpha!r}")


def epsilon_from_rates(fpr: Any, fnr: Any, delta: float) -> np.ndarray:
    """eps_lb = max(ln((1 - delta - FNR) / FPR), ln((1 - delta - FPR) / FNR)), floored at 0.

    With upper confidence bounds for the rates this is a lower bound on the epsilon of any
    (epsilon, delta)-DP mechanism that the test was run against (module docstring)."""
    if not 0.0 <= delta < 1.0:
        raise AuditError(f"delta must be in [0, 1), got {delta!r}")
    fpr, fnr = np.asarray(fpr, dtype=np.float64), np.asarray(fnr, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.log(np.maximum(1.0 - delta - fnr, 0.0)) - np.log(fpr)
        b = np.log(np.maximum(1.0 - delta - fpr, 0.0)) - np.log(fnr)
    out = np.fmax(a, b)
    return np.where(np.isnan(out) | (out < 0.0), 0.0, out)


def epsilon_from_counts(false_pos: Any, n_without: int, false_neg: Any, n_with: int,
                        delta: float, alpha: float) -> np.ndarray:
    """The epsilon lower bound from a test's error counts: ``false_pos`` of ``n_without``
    canary-free runs called "canary", ``false_neg`` of ``n_with`` canary runs missed; both
    rates replaced by Clopper-Pearson upper bounds at level alpha/2 each, so the bound
    holds with probability >= 1 - alpha."""
    fpr = clopper_pearson_upper(false_pos, n_without, alpha / 2.0)
    fnr = clopper_pearson_upper(false_neg, n_with, alpha / 2.0)
    return epsilon_from_rates(fpr, fnr, delta)


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Steinke, Nasr and Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS
    2023), main theorem: m canaries, each included independently with probability 1/2
    (S in {-1, +1}^m uniform); the auditor, from one output of an (epsilon, delta)-DP
    mechanism, guesses T in {-1, 0, +1}^m with at most r non-abstentions. Its number of
    correct guesses W = sum_i max(0, T_i S_i) satisfies, for every v,

        P[W >= v] <= beta + 2 m delta alpha_v,
        beta    = P[Binomial(r, p) >= v],   p = e^epsilon / (1 + e^epsilon),
        alpha_v = max_{i = 1..v} (1/i) P[v - i <= Binomial(r, p) < v].

    Returns that bound (capped at 1): the p-value of v correct guesses under the hypothesis
    that the mechanism is (epsilon, delta)-DP."""
    if not (0 <= v <= r <= m) or m < 1:
        raise AuditError(f"need 0 <= v <= r <= m and m >= 1, got m={m}, r={r}, v={v}")
    if epsilon < 0 or not 0.0 <= delta <= 1.0:
        raise AuditError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    p = 1.0 / (1.0 + math.exp(-epsilon))
    beta = float(stats.binom.sf(v - 1, r, p))
    if delta == 0.0 or v == 0:
        return min(1.0, beta)
    i = np.arange(1, v + 1)
    # P[v - i <= B < v] = P[B >= v - i] - P[B >= v]
    window = stats.binom.sf(v - i - 1, r, p) - beta
    alpha_v = float(np.max(window / i))
    return min(1.0, beta + 2.0 * m * delta * alpha_v)


def one_run_half(canaries: int, guesses: int | None) -> int:
    """How many canaries a one-run auditor guesses on each side ("included" for the largest
    scores, "excluded" for the smallest): ``guesses // 2``, by default ``canaries / 5``
    guesses in all. :class:`AuditError` for fewer than 2 canaries or a guess count outside
    [2, canaries]."""
    if canaries < 2:
        raise AuditError(f"canaries must be >= 2, got {canaries}")
    k = (guesses if guesses is not None else max(2, canaries // 5)) // 2
    if not 1 <= k <= canaries // 2:
        raise AuditError(f"guesses must be in [2, canaries], got {guesses}")
    return k


def one_run_guess(score: np.ndarray, included: np.ndarray, k: int) -> tuple[int, int]:
    """(guesses r, correct v) of the one-run auditor who says "included" for the ``k``
    canaries of largest ``score`` and "excluded" for the ``k`` smallest; ``included`` is
    the auditor's coin per canary (bool)."""
    order = np.argsort(score)
    guess_out, guess_in = order[:k], order[-k:]
    return 2 * k, int(included[guess_in].sum() + (~included[guess_out]).sum())


def one_run_epsilon(m: int, r: int, v: int, delta: float, alpha: float = 0.05) -> float:
    """The largest epsilon rejected at level ``alpha`` by :func:`one_run_p_value` (v correct
    out of r guesses over m canaries): with probability >= 1 - alpha the mechanism is not
    (epsilon', delta)-DP for any epsilon' below it. 0 when nothing is rejected."""
    _check_alpha(alpha)
    if one_run_p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) < alpha:
        lo, hi = hi, 2.0 * hi
        if hi > 1e3:
            return lo
    for _ in range(60):  # the p-value increases with epsilon
        mid = (lo + hi) / 2.0
        if one_run_p_value(m, r, v, mid, delta) < alpha:
            lo = mid
        else:
            hi = mid
    return lo
