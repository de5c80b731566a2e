"""The test statistics an audit scores each release with (``shift``, ``parity``,
``exact``), the threshold test chosen on a selection split and measured on the rest,
and the tight mode's Gaussian-DP fit."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np
from scipy import stats

from threat_models.dp_audit_bounds import _check_alpha, epsilon_from_counts
from threat_models.dp_audit_gdp import AuditError, epsilon_for_mu

#: Fraction of each world's trials used to choose the test's threshold (the rest measure it).
SELECTION_FRACTION = 0.25


@dataclasses.dataclass(frozen=True)
class Statistic:
    """A test statistic: maps a world's observations to one score per trial (a test then
    says "canary" on one side of a threshold of the score).

    Attributes:
        name: short name (``shift``, ``parity``, ``exact``).
        score: observations (first axis: trials) -> float scores.
        what: one line saying what it exposes.
    """

    name: str
    score: Callable[[np.ndarray], np.ndarray]
    what: str = ""


def shift_statistic(direction: np.ndarray | None = None) -> Statistic:
    """The output projected on the canary's direction (the output itself for a scalar)."""
    def score(obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, dtype=np.float64)
        if direction is None:
            return x.reshape(x.shape[0], -1).sum(axis=1) if x.ndim > 1 else x
        return x.reshape(x.shape[0], -1) @ np.asarray(direction, dtype=np.float64).ravel()
    return Statistic("shift", score, "output along the canary (noise or sensitivity too "
                     "small, clip not applied)")


def parity_statistic(step: float) -> Statistic:
    """The low bit of the integer output (output / ``step``, exact for a fixed-point sum)."""
    def score(obs: np.ndarray) -> np.ndarray:
        ints = np.rint(np.asarray(obs, dtype=np.float64) / step).astype(np.int64)
        return (ints & 1).astype(np.float64)
    return Statistic("parity", score, "low bit of the integer output (biased sampler bits)")


def exact_statistic(without: float, with_: float) -> Statistic:
    """+1 where the output equals the canary's noise-free sum exactly, -1 where it equals
    the canary-free one, 0 elsewhere."""
    def score(obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, dtype=np.float64)
        return (x == with_).astype(np.float64) - (x == without).astype(np.float64)
    return Statistic("exact", score, "output equal to a noise-free sum (noise dropped or "
                     "saturated at the ring wrap)")


@dataclasses.dataclass(frozen=True)
class TestOutcome:
    """One statistic's test, measured on the evaluation split.

    Attributes:
        statistic: its name.
        epsilon_lower: the lower bound it proves (at its share of the confidence).
        threshold: the threshold chosen on the selection split.
        side: ``">="`` (say "canary" at or above the threshold) or ``"<="``.
        false_pos, n_without, false_neg, n_with: the evaluation split's error counts.
        mode: ``"threshold"`` (the assumption-free (epsilon, delta) bound of the test) or
            ``"gdp"`` (the tight mode: a lower bound ``mu_lower`` on the Gaussian-DP
            parameter, turned into epsilon on the Gaussian trade-off curve,
            :mod:`threat_models.dp_audit_gdp`).
        mu_lower: the GDP mode's lower bound on mu (None in threshold mode).
    """

    statistic: str
    epsilon_lower: float
    threshold: float
    side: str
    false_pos: int
    n_without: int
    false_neg: int
    n_with: int
    mode: str = "threshold"
    mu_lower: float | None = None


def _counts(without: np.ndarray, with_: np.ndarray, thresholds: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(fp, fn) for "canary iff score >= t" and for "canary iff score <= t", every t."""
    a0, a1 = np.sort(without), np.sort(with_)
    n0, n1 = a0.size, a1.size
    fp_ge = n0 - np.searchsorted(a0, thresholds, "left")
    fn_ge = np.searchsorted(a1, thresholds, "left")
    fp_le = np.searchsorted(a0, thresholds, "right")
    fn_le = n1 - np.searchsorted(a1, thresholds, "right")
    return fp_ge, fn_ge, fp_le, fn_le


def threshold_test(without: np.ndarray, with_: np.ndarray, *, delta: float, alpha: float,
                   selection_fraction: float = SELECTION_FRACTION, statistic: str = "score",
                   candidates: int = 512) -> TestOutcome:
    """The epsilon lower bound of the best threshold test on scores ``without`` / ``with_``
    (canary-free and canary worlds; trials in order, independent).

    The first ``selection_fraction`` of each world's scores chooses the threshold and side
    (among up to ``candidates`` quantiles of the pooled selection scores, or every distinct
    value when there are few), maximising the bound the evaluation split would give at the
    same counts; the rest of the scores measure that one test, and the bound
    (:func:`epsilon_from_counts`, level ``alpha``) is computed from them only.
    """
    without = np.asarray(without, dtype=np.float64).ravel()
    with_ = np.asarray(with_, dtype=np.float64).ravel()
    if not 0.0 < selection_fraction < 1.0:
        raise AuditError(f"selection_fraction must be in (0, 1), got {selection_fraction!r}")
    k0 = int(without.size * selection_fraction)
    k1 = int(with_.size * selection_fraction)
    if min(k0, k1, without.size - k0, with_.size - k1) < 1:
        raise AuditError(f"too few trials ({without.size}, {with_.size}) to split into a "
                         "selection and an evaluation part; use more trials")
    sel0, ev0, sel1, ev1 = without[:k0], without[k0:], with_[:k1], with_[k1:]
    pooled = np.concatenate([sel0, sel1])
    distinct = np.unique(pooled)
    if distinct.size <= candidates:
        thresholds = distinct
    else:
        thresholds = np.unique(np.quantile(pooled, np.linspace(0.0, 1.0, candidates)))
    n0e, n1e = ev0.size, ev1.size
    fp_ge, fn_ge, fp_le, fn_le = _counts(sel0, sel1, thresholds)
    # score each candidate as if its selection rates had been seen on the evaluation split
    s0, s1 = n0e / sel0.size, n1e / sel1.size
    ge = epsilon_from_counts(np.minimum(np.rint(fp_ge * s0), n0e), n0e,
                             np.minimum(np.rint(fn_ge * s1), n1e), n1e, delta, alpha)
    le = epsilon_from_counts(np.minimum(np.rint(fp_le * s0), n0e), n0e,
                             np.minimum(np.rint(fn_le * s1), n1e), n1e, delta, alpha)
    i_ge, i_le = int(np.argmax(ge)), int(np.argmax(le))
    if ge[i_ge] >= le[i_le]:
        t, side = float(thresholds[i_ge]), ">="
        fp, fn = int(np.sum(ev0 >= t)), int(np.sum(ev1 < t))
    else:
        t, side = float(thresholds[i_le]), "<="
        fp, fn = int(np.sum(ev0 <= t)), int(np.sum(ev1 > t))
    eps = float(epsilon_from_counts(fp, n0e, fn, n1e, delta, alpha))
    return TestOutcome(statistic, eps, t, side, fp, n0e, fn, n1e)


def gdp_fit(without: np.ndarray, with_: np.ndarray, *, delta: float, alpha: float,
            statistic: str = "score") -> TestOutcome:
    """The tight mode's test: fit Gaussian DP to both worlds' whole score distributions.

    Under the Gaussian-shift model of :mod:`threat_models.dp_audit_gdp` (each world's score
    is normal with a common standard deviation, so the trade-off curve is G_mu with mu the
    mean shift over that deviation), mu is estimated from every trial,
    ``mu_hat = (mean_with - mean_without) / s_pooled``, and bounded below one-sided at level
    ``alpha`` with its standard error ``sqrt(1/n0 + 1/n1 + mu_hat^2 / (2 (n0 + n1 - 2)))``
    (normal approximation; n0, n1 >= 10^4 in every audit the command line runs). The
    epsilon is :func:`~threat_models.dp_audit_gdp.epsilon_for_mu` (mu_lb, delta). This is
    the maximum-likelihood fit of the probit ROC ``Phi^-1(TPR) = Phi^-1(FPR) + mu`` over all
    thresholds at once, hence the tightest bound 10^6 trials allow (its error is about
    sqrt(2 / trials) in mu)."""
    s0 = np.asarray(without, dtype=np.float64).ravel()
    s1 = np.asarray(with_, dtype=np.float64).ravel()
    n0, n1 = s0.size, s1.size
    if min(n0, n1) < 8:
        raise AuditError(f"too few trials ({n0}, {n1}) for the GDP fit; use more trials")
    _check_alpha(alpha)
    m0, m1 = float(np.mean(s0)), float(np.mean(s1))
    var = (float(np.var(s0, ddof=1)) * (n0 - 1) + float(np.var(s1, ddof=1)) * (n1 - 1)) \
        / (n0 + n1 - 2)
    if not (math.isfinite(var) and math.isfinite(m1 - m0)):
        raise AuditError(f"{statistic}: the scores are not finite")
    if var == 0.0:  # noise-free: the worlds are told apart exactly unless they coincide
        mu = float("inf") if m1 > m0 else 0.0
    else:
        mu_hat = (m1 - m0) / math.sqrt(var)
        se = math.sqrt(1.0 / n0 + 1.0 / n1 + mu_hat * mu_hat / (2.0 * (n0 + n1 - 2)))
        mu = max(0.0, mu_hat - float(stats.norm.isf(alpha)) * se)
    eps = float("inf") if math.isinf(mu) else epsilon_for_mu(mu, delta)
    return TestOutcome(statistic, eps, float("nan"), "mean", 0, n0, 0, n1, "gdp", mu)
