"""Empirical privacy auditing: a lower bound on epsilon, measured on the real mechanism.

A DP layer promises that its release is (epsilon, delta)-DP. An audit tests that promise:
it runs the mechanism many times on two neighbouring inputs -- without and with a
*canary* (one record, or one client, at its declared bound, in the direction that helps
the test most) -- and tries to tell the two apart from the output alone. Any test's error
rates bound epsilon from below (Kairouz, Oh, Viswanath 2015; the audits of Jagielski,
Ullman, Oprea 2020 and Nasr et al. 2021, 2023):

    if M is (epsilon, delta)-DP, every test has  FPR + e^epsilon FNR >= 1 - delta  and
    e^epsilon FPR + FNR >= 1 - delta, so

    epsilon >= eps_lb = max( ln((1 - delta - FNR) / FPR),  ln((1 - delta - FPR) / FNR) ).

That is the **threshold** mode (assumption-free). The **tight** mode (:func:`gdp_fit`,
:mod:`threat_models.dp_audit_gdp`) fits Gaussian DP to both worlds' whole score
distributions and bounds mu from below; its epsilon assumes the Gaussian trade-off shape,
which the layers' Gaussian, discrete-Gaussian and Skellam noise has. :func:`audit` runs the
threshold tests (and, in ``mode="tight"``, the fit too, sharing the confidence);
:func:`audit_modes` evaluates both modes on the same draws.

The rates are measured, so the bound uses one-sided Clopper-Pearson upper bounds FPR_ub,
FNR_ub (each at level alpha/2, so both hold with probability >= 1 - alpha, and then
eps_lb computed from them is still below the true epsilon). The threshold of each test is
chosen on a *selection split* of the trials and the bound is computed on the rest, so the
choice does not bias it; when several test statistics are tried, alpha is split between
them (Bonferroni). A reported lower bound above the claimed epsilon is therefore, at the
stated confidence, proof that the mechanism is not (epsilon, delta)-DP.

Test statistics (a user gets all that apply to the mechanism):

* ``shift`` -- the output itself (the likelihood-ratio test for Gaussian noise; exposes
  noise or sensitivity that is too small, and a clip that is not applied);
* ``parity`` -- the low bit of the integer output of an integer mechanism (a sampler
  whose low bit is biased reveals a canary whose integer shift is odd, so the canary is
  placed one quantisation step inside its bound when that makes the shift odd);
* ``exact`` -- whether the integer output equals a noise-free sum exactly (the signature
  of noise dropped where adding it would wrap around the ring: a pure modular wrap of
  the noised sum is post-processing and cannot raise epsilon, but noise that is skipped or
  saturated per client near the wrap leaves the un-noised value in the clear).

Audits here, apart from the pure math above:

* :func:`audit` -- any *batched* release ``draw(with_canary, n, rng) -> n observations``;
  :func:`audit_release` -- any single release ``release(with_canary, rng) -> observation``
  looped.
* :class:`SumRelease` / :func:`audit_sum` -- CentralDP, LocalDP or DistributedDP on a bare
  bounded sum, through the layers' own noise paths (``CentralDP.release``,
  ``LocalDP.noise_plan``/``noise_upload``, ``DistributedDP.release_plan``/``encode_noised``
  /``finish``) and samplers; ``n`` releases of the 1-coordinate sum are drawn as one
  ``n``-coordinate release with the 1-coordinate release's plan (same noise level, ring
  and encoding per coordinate, checked against a scalar release through ``aggregate``).
* :mod:`threat_models.dp_audit_fedavg` -- client-level DP-FedAvg with a crafted canary
  update (multi-run and one-run), through the real clip, upload check, layer and server
  step; :mod:`threat_models.dp_audit_adaptive` -- the same with adaptive clipping's count;
  :mod:`threat_models.dp_audit_tree` -- DP-FTRL's tree noise;
  :mod:`threat_models.dp_audit_fields` -- several fields released together;
  :mod:`threat_models.dp_audit_bugs` -- injected 10-30% miscalibrations
  (:mod:`threat_models.dp_audit_run` runs them all, for ``secagg dp-audit``).
* :func:`audit_dpsgd` (multi-run) and :func:`audit_dpsgd_one_run` (Steinke, Nasr and
  Jagielski, NeurIPS 2023) -- DP-SGD through :mod:`secagg.privacy.dpsgd` (Opacus) with
  gradient canaries.

``secagg dp-audit`` is the command line (:func:`main_cli`).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from scipy import stats

from threat_models.dp_audit_gdp import AuditError, epsilon_for_mu

__all__ = [
    "AuditError",
    "AuditResult",
    "Statistic",
    "SumRelease",
    "TestOutcome",
    "allowed_fnr",
    "audit",
    "audit_dpsgd",
    "audit_modes",
    "audit_dpsgd_one_run",
    "audit_release",
    "audit_sum",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_from_counts",
    "epsilon_from_rates",
    "format_table",
    "make_layer",
    "one_run_epsilon",
    "one_run_p_value",
    "plot_tradeoff",
    "threshold_test",
    "tradeoff_curve",
]

DEFAULT_DELTA = 1e-5
#: Audit modes: ``tight`` (the GDP test and the threshold tests), ``threshold`` (the
#: assumption-free threshold tests only).
MODES = ("tight", "threshold")
#: In the tight mode, the share of 1 - confidence spent on the GDP fit (the threshold
#: tests, which catch non-Gaussian defects such as a biased low bit, share the rest).
GDP_ALPHA_SHARE = 0.8
#: Fraction of each world's trials used to choose the test's threshold (the rest measure it).
SELECTION_FRACTION = 0.25


# ---------------------------------------------------------------------------------------
# Pure math: binomial confidence bounds and the epsilon lower bounds they give.


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


# ---------------------------------------------------------------------------------------
# Test statistics and the threshold test.


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


# ---------------------------------------------------------------------------------------
# Generic audits of a release.

#: A batched release: (with_canary, n, rng) -> n observations (first axis: trials).
BatchRelease = Callable[[bool, int, np.random.Generator], np.ndarray]
#: One release: (with_canary, rng) -> one observation (a number or an array).
Release = Callable[[bool, np.random.Generator], Any]


@dataclasses.dataclass
class AuditResult:
    """What an audit measured.

    Attributes:
        mechanism: what was audited (e.g. ``central-dp``, ``distributed-dp/skellam``).
        epsilon_claimed: the epsilon the mechanism promises at ``delta``.
        epsilon_lower: the largest lower bound over the tests (valid with probability
            >= ``confidence``, the tests sharing it).
        delta: the delta of the claim.
        confidence: 1 - alpha.
        trials: releases per world (without / with canary).
        canary: the canary, in words.
        tests: each test's outcome (each at level alpha / len(tests)); its ``mode`` says
            which bound it is (``gdp``: tight, ``threshold``: assumption-free).
        seconds: wall time of the audit.
        details: facts of the mechanism (noise std, ring bits, ...).
        curve: the best statistic's empirical trade-off curve on the evaluation split
            (``{"fpr": [...], "fnr": [...]}``, :func:`tradeoff_curve`), for plots.
    """

    mechanism: str
    epsilon_claimed: float
    epsilon_lower: float
    delta: float
    confidence: float
    trials: int
    canary: str
    tests: list[TestOutcome]
    seconds: float = 0.0
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    curve: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    @property
    def violated(self) -> bool:
        """True when the audit proves the claim false (lower bound above the claim)."""
        return self.epsilon_lower > self.epsilon_claimed

    @property
    def best(self) -> TestOutcome:
        """The test that gave the lower bound."""
        return max(self.tests, key=lambda t: t.epsilon_lower)

    def row(self) -> dict[str, Any]:
        """A JSON-able row (the ``--json`` output)."""
        return {
            "mechanism": self.mechanism, "epsilon_claimed": self.epsilon_claimed,
            "epsilon_lower": self.epsilon_lower, "delta": self.delta,
            "confidence": self.confidence, "trials": self.trials, "canary": self.canary,
            "test": self.best.statistic, "mode": self.best.mode,
            "mu_lower": self.best.mu_lower, "violated": self.violated,
            "ratio": self.epsilon_lower / self.epsilon_claimed if self.epsilon_claimed else None,
            "tests": [dataclasses.asdict(t) for t in self.tests],
            "seconds": round(self.seconds, 3), "details": self.details,
        }


def _world_rng(seed: int | None, world: int, batch: int) -> np.random.Generator:
    return np.random.default_rng(None if seed is None else [seed, world, batch])


def _progress(total: int, desc: str, progress: bool | None) -> Any:
    """A tqdm bar on a terminal (or when asked), else None."""
    show = sys.stderr.isatty() if progress is None else progress
    if not show:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="release", file=sys.stderr, leave=False)


def _batches(trials: int, batch: int) -> Iterator[int]:
    left = trials
    while left > 0:
        yield min(batch, left)
        left -= min(batch, left)


def audit(draw: BatchRelease, *, epsilon: float, delta: float = DEFAULT_DELTA,
          trials: int = 1_000_000, statistics: Sequence[Statistic] | None = None,
          confidence: float = 0.95, seed: int | None = 0, mechanism: str = "release",
          canary: str = "canary", batch: int = 1 << 18, progress: bool | None = None,
          selection_fraction: float = SELECTION_FRACTION,
          details: dict[str, Any] | None = None, mode: str = "threshold") -> AuditResult:
    """Audit a batched release against its claim (epsilon, delta).

    ``draw(with_canary, n, rng)`` returns n independent releases of the mechanism on the
    canary-free (False) or canary (True) input, first axis trials. Each world gets
    ``trials`` releases, drawn in batches of ``batch`` with ``rng`` seeded from (``seed``,
    world, batch) (the mechanism may use its own generator for its noise). Every statistic
    (default: :func:`shift_statistic`) is tested with :func:`threshold_test`; in
    ``mode="tight"`` (for the Gaussian-family layers; not the default here, where the
    mechanism is unknown) the first statistic also gets :func:`gdp_fit` (the tight
    bound, under the Gaussian-trade-off assumption of :mod:`threat_models.dp_audit_gdp`)
    at level :data:`GDP_ALPHA_SHARE` x (1 - confidence), the threshold tests sharing the
    rest; ``mode="threshold"`` (default) runs the assumption-free threshold tests only,
    sharing 1 - confidence. The shares add up to 1 - confidence (Bonferroni), so the largest bound,
    reported with the ``mode`` of the test that gave it, holds at ``confidence``.

    Raises:
        AuditError: bad parameters, or a release that returns the wrong number of trials.
    """
    return audit_modes(draw, epsilon=epsilon, delta=delta, trials=trials,
                       statistics=statistics, confidence=confidence, seed=seed,
                       mechanism=mechanism, canary=canary, batch=batch, progress=progress,
                       selection_fraction=selection_fraction, details=details,
                       modes=(mode,))[mode]


def audit_modes(draw: BatchRelease, *, epsilon: float, delta: float = DEFAULT_DELTA,
                trials: int = 1_000_000, statistics: Sequence[Statistic] | None = None,
                confidence: float = 0.95, seed: int | None = 0, mechanism: str = "release",
                canary: str = "canary", batch: int = 1 << 18, progress: bool | None = None,
                selection_fraction: float = SELECTION_FRACTION,
                details: dict[str, Any] | None = None, modes: Sequence[str] = MODES
                ) -> dict[str, AuditResult]:
    """:func:`audit` in each of ``modes`` on the same draws (one audit per mode, each at
    ``confidence``; the benchmark compares the modes this way). Each result's ``seconds``
    is the drawing time plus its own evaluation."""
    _check_claim(epsilon, delta, trials, confidence)
    for mode in modes:
        if mode not in MODES:
            raise AuditError(f"mode must be one of {MODES}, got {mode!r}")
    stats_ = list(statistics) if statistics is not None else [shift_statistic()]
    if not stats_:
        raise AuditError("audit needs at least one test statistic")
    t0 = time.perf_counter()
    bar = _progress(2 * trials, f"dp-audit {mechanism}", progress)
    worlds: list[np.ndarray] = []
    try:
        for world, with_canary in enumerate((False, True)):
            parts = []
            for b, n in enumerate(_batches(trials, batch)):
                obs = np.asarray(draw(with_canary, n, _world_rng(seed, world, b)))
                if obs.ndim == 0 or obs.shape[0] != n:
                    raise AuditError(f"{mechanism}: the release returned {obs.shape} "
                                     f"observations for {n} trials")
                parts.append(obs)
                if bar is not None:
                    bar.update(n)
            worlds.append(np.concatenate(parts))
    finally:
        if bar is not None:
            bar.close()
    scores = [(s.score(worlds[0]), s.score(worlds[1])) for s in stats_]
    drawn = time.perf_counter() - t0
    out = {}
    for mode in modes:
        t1 = time.perf_counter()
        tests = _tests(scores, stats_, mode, delta, 1.0 - confidence, selection_fraction)
        lower = max(t.epsilon_lower for t in tests)
        best = max(range(len(tests)), key=lambda i: tests[i].epsilon_lower)
        names = [s.name for s in stats_]
        s0, s1 = scores[names.index(tests[best].statistic)]
        curve = tradeoff_curve(s0[int(s0.size * selection_fraction):],
                               s1[int(s1.size * selection_fraction):], tests[best].side)
        out[mode] = AuditResult(mechanism, float(epsilon), lower, float(delta),
                                float(confidence), int(trials), canary, tests,
                                drawn + time.perf_counter() - t1, dict(details or {}), curve)
    return out


def _tests(scores: list[tuple[np.ndarray, np.ndarray]], stats_: list[Statistic], mode: str,
           delta: float, alpha: float, selection_fraction: float) -> list[TestOutcome]:
    """The tests of ``mode`` on each statistic's scores, sharing ``alpha`` (Bonferroni)."""
    share = GDP_ALPHA_SHARE if mode == "tight" else 0.0
    tests = [threshold_test(s0, s1, delta=delta, alpha=alpha * (1.0 - share) / len(stats_),
                            selection_fraction=selection_fraction, statistic=s.name)
             for s, (s0, s1) in zip(stats_, scores, strict=True)]
    if mode == "tight":
        tests.insert(0, gdp_fit(*scores[0], delta=delta, alpha=alpha * share,
                                statistic=stats_[0].name))
    return tests


def tradeoff_curve(without: np.ndarray, with_: np.ndarray, side: str = ">=",
                   points: int = 200) -> dict[str, list[float]]:
    """The empirical trade-off curve of the threshold tests on scores ``without`` /
    ``with_``: FPR and FNR at up to ``points`` thresholds (quantiles of the pooled scores,
    plus the two ends), for the tests that say "canary" on ``side`` of the threshold."""
    a = np.asarray(without, dtype=np.float64).ravel()
    b = np.asarray(with_, dtype=np.float64).ravel()
    if side == "<=":
        a, b = -a, -b
    pooled = np.concatenate([a, b])
    t = np.unique(np.concatenate([np.quantile(pooled, np.linspace(0, 1, points)),
                                  [np.inf]]))
    a.sort()
    b.sort()
    fpr = (a.size - np.searchsorted(a, t, "left")) / a.size
    fnr = np.searchsorted(b, t, "left") / b.size
    return {"fpr": fpr.tolist(), "fnr": fnr.tolist()}


def audit_release(release: Release, *, epsilon: float, delta: float = DEFAULT_DELTA,
                  trials: int = 1000, **kwargs: Any) -> AuditResult:
    """Audit a release given one run at a time: ``release(with_canary, rng)`` returns the
    observation of one run (a number or an array, the same shape every run). Each run
    gets its own generator; keyword arguments as :func:`audit`.

    This is the interface for releases that cannot be batched (a training run, an
    algorithm's round, client-level DP-FedAvg's clipped and noised model update)."""
    base = kwargs.pop("seed", 0)

    def draw(with_canary: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        seeds = rng.integers(0, 2**63 - 1, size=n)
        return np.stack([np.asarray(release(with_canary, np.random.default_rng(int(s))),
                                    dtype=np.float64) for s in seeds])

    kwargs.setdefault("batch", 64)
    return audit(draw, epsilon=epsilon, delta=delta, trials=trials, seed=base, **kwargs)


def _check_claim(epsilon: float, delta: float, trials: int, confidence: float) -> None:
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise AuditError(f"epsilon must be a positive number, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
        raise AuditError(f"delta must be in (0, 1), got {delta!r}")
    if not (isinstance(trials, (int, np.integer)) and trials >= 8):
        raise AuditError(f"trials must be an integer >= 8, got {trials!r}")
    if not 0.0 < confidence < 1.0:
        raise AuditError(f"confidence must be in (0, 1), got {confidence!r}")


# ---------------------------------------------------------------------------------------
# The DP layers on a bare bounded sum.

LAYER_NAMES = ("central-dp", "local-dp", "distributed-dp")
FIELD = "x"
PHASE = "dp-audit"


def make_layer(name: str, *, epsilon: float, delta: float = DEFAULT_DELTA,
               adjacency: Literal["record", "client"] = "record",
               mechanism: Literal["discrete_gaussian", "skellam"] = "discrete_gaussian",
               threshold: float = 0.7, seed: int | None = 0) -> Any:
    """The DP layer ``name`` (``central-dp``, ``local-dp``, ``distributed-dp``) for one
    release at (epsilon, delta), as a user would build it: CentralDP(Plaintext()),
    LocalDP(Plaintext()), DistributedDP(SecureSum(threshold)). ``seed`` fixes its noise
    streams (reproducible, and marked not private); None draws them from OS entropy."""
    from secagg.layers.plaintext import Plaintext
    from secagg.privacy.layers import CentralDP, DistributedDP, LocalDP

    common: dict[str, Any] = {"epsilon": epsilon, "delta": delta, "rounds": 1,
                              "adjacency": adjacency, "seed": seed}
    if name == "central-dp":
        return CentralDP(Plaintext(), **common)
    if name == "local-dp":
        return LocalDP(Plaintext(), **common)
    if name == "distributed-dp":
        from secagg.secure_sum import SecureSum

        return DistributedDP(SecureSum(threshold=threshold), mechanism=mechanism, **common)
    raise AuditError(f"unknown DP layer {name!r}; one of {', '.join(LAYER_NAMES)}")


#: Cohort of the audited sums by default: large enough that DistributedDP's secure sum
#: accepts fewer survivors than clients (7 of 10 at threshold 0.7).
DEFAULT_CLIENTS = 10
#: Which survivors DistributedDP is audited with by default: the fewest the secure sum
#: accepts (the least noise) and all of them (the ledger's smallest charge).
SURVIVOR_PATTERNS = ("fewest", "all")


def dropout_pattern(clients: int, fewest: int, survivors: int | str,
                    seed: int | None) -> tuple[int, ...]:
    """The surviving clients of a cohort of ``clients`` (ids 0..clients-1): ``"fewest"``
    (``fewest``, the least the secure sum accepts), ``"all"``, or a count in between.
    Client 0 (the canary's) always survives; which others drop is drawn by ``seed``, so
    the audit exercises dropouts anywhere in the cohort, not only at its end."""
    if survivors == "fewest":
        k = fewest
    elif survivors == "all":
        k = clients
    elif isinstance(survivors, int) and not isinstance(survivors, bool):
        k = survivors
    else:
        raise AuditError(f"survivors must be 'fewest', 'all' or a count, got {survivors!r}")
    if not fewest <= k <= clients:
        raise AuditError(f"survivors must be between the fewest the secure sum accepts "
                         f"({fewest}) and the cohort ({clients}), got {k}")
    rng = np.random.default_rng([0 if seed is None else seed, 31, clients, k])
    others = rng.choice(np.arange(1, clients), size=k - 1, replace=False)
    return (0, *sorted(int(c) for c in others))


def composed_ring(layer: Any, rel: Any, encoded: Any, ids: Sequence[int], ctx: Any, n: int,
                  *, skellam_sum: bool = False) -> np.ndarray:
    """DistributedDP's ring sum over the survivors ``ids`` for ``n`` trials of a release
    whose survivors' encodings (one trial, the release plan's fixed point) sum to
    ``encoded`` (per summed field, a mapping from its name; an array for a single field):
    the encodings once, tiled ``n`` times, plus each survivor's noise shares drawn by the
    layer's own ``_draw`` at the release's share std of each noised field, in field order,
    from that survivor's stream (``noise_source``), reduced to the ring.

    This is bit for bit the per-client path (``encode_noised`` of each survivor, summed mod
    2^64, then the ring mask) when ``encode_noised`` is ``encode + _draw``, which
    :func:`composition_holds` checks on the layer itself: the encoding is elementwise and
    deterministic, each survivor's stream is consumed by the same ``_draw`` calls of the
    same sizes in the same order in both, and the sum mod 2^64 does not depend on the
    order of its terms.

    ``skellam_sum`` (Skellam only, :func:`skellam_sum_holds`): the k survivors' shares of
    each entry are drawn as one Skellam variable Sk(k lam, k lam), lam = std^2 / 2 the
    share's parameter (as the layer's ``_draw`` computes it), from one stream of its own.
    That is the same distribution: a share is Poisson(lam) - Poisson(lam), and k
    independent shares sum to Poisson(k lam) - Poisson(k lam) (a sum of independent
    Poissons is Poisson). The only difference: k lam is rounded to float64 once (relative
    error <= 2^-53). A sum of discrete Gaussians is not a discrete Gaussian, so their
    shares are always drawn one by one."""
    from secagg.privacy.layers import noise_source
    from secagg.privacy.samplers import skellam

    fields = tuple(rel.additive)
    enc = encoded if isinstance(encoded, Mapping) else {fields[0].name: encoded}
    ring = np.concatenate([np.tile(np.asarray(enc[f.name], dtype=np.uint64), n)
                           for f in fields])
    segs = rel.segments
    noised = [f for f in fields if f.name in rel.share_std]
    if skellam_sum:
        src = noise_source(layer.seed, ctx.round, ctx.phase, ("survivors",) + tuple(ids))
        for f in noised:
            std = float(rel.share_std[f.name])
            ring[segs[f.name]] += skellam(len(ids) * (std * std / 2.0), f.size,
                                          src.rng).view(np.uint64)
    else:
        for c in ids:
            src = noise_source(layer.seed, ctx.round, ctx.phase, c)
            for f in noised:  # wraps mod 2^64
                ring[segs[f.name]] += layer._draw(rel.share_std[f.name], f.size,
                                                  src.rng).view(np.uint64)
    if rel.ring_bits < 64:
        ring &= np.uint64((1 << rel.ring_bits) - 1)
    return ring


def encoded_sum(plan: Any, values: Sequence[Any], ids: Sequence[int]) -> dict[str, np.ndarray]:
    """Per summed field of ``plan``, the ring sum of the clients ``ids``'s encodings of
    ``values[c]`` (one trial; a mapping from field name, or an array for a single field)."""
    out = {f.name: np.zeros(f.size, dtype=np.uint64) for f in plan.additive}
    for c in ids:
        one = values[c] if isinstance(values[c], Mapping) else {plan.additive[0].name:
                                                                 values[c]}
        for f in plan.additive:
            out[f.name] += plan.plans[f.name].encode(
                np.asarray(one[f.name], dtype=np.float64).ravel())
    return out


def composition_holds(layer: Any, plan: Any, worlds: Sequence[Sequence[Any]],
                      ids: Sequence[int], ctx: Any, probe: int = 3) -> bool:
    """Whether :func:`composed_ring` (shares drawn one by one) equals the layer's own
    per-client path -- ``encode_noised`` of every survivor in ``ids``, summed in the ring
    -- bit for bit, on a probe batch of ``probe`` trials of each world in ``worlds`` (per
    client, one trial's values as :func:`encoded_sum` takes them), with the same streams.
    A layer whose ``encode_noised`` does anything else (a subclass, an injected bug) fails
    and must be audited on the per-client path."""
    from secagg.privacy.layers import noise_source

    wide = tuple(dataclasses.replace(f, shape=(probe * f.size,)) for f in plan.additive)
    names = {f.name for f in plan.noised}
    rel = dataclasses.replace(plan, additive=wide,
                              noised=tuple(f for f in wide if f.name in names))
    for values in worlds:
        ring = np.zeros(sum(f.size for f in wide), dtype=np.uint64)
        for c in ids:
            src = noise_source(layer.seed, ctx.round, ctx.phase, c)
            one = values[c] if isinstance(values[c], Mapping) else {plan.additive[0].name:
                                                                     values[c]}
            tiled = {f.name: np.tile(np.asarray(one[f.name], dtype=np.float64).ravel(), probe)
                     for f in plan.additive}
            ring += layer.encode_noised(rel, tiled, src.rng)
        if rel.ring_bits < 64:
            ring &= np.uint64((1 << rel.ring_bits) - 1)
        mine = composed_ring(layer, rel, encoded_sum(plan, values, ids), ids, ctx, probe)
        if not np.array_equal(ring, mine):
            return False
    return True


def skellam_sum_holds(layer: Any, std: float = 1234.5, probe: int = 64) -> bool:
    """Whether the layer's share sampler is the Skellam sampler at lam = std^2 / 2 (same
    output from the same stream), so that :func:`composed_ring` may draw the survivors'
    summed shares as one Skellam variable."""
    from secagg.privacy.samplers import skellam

    if getattr(layer, "mechanism", None) != "skellam":
        return False
    mine = layer._draw(std, probe, np.random.default_rng(probe))
    return bool(np.array_equal(mine, skellam(std * std / 2.0, probe,
                                             np.random.default_rng(probe))))


class LayerClaim:
    """The (epsilon, delta) a release's DP layer (``self.layer``) claims for its one
    release: what an audit of that release tests."""

    layer: Any
    #: the released field whose noise the audit checks
    field_name: ClassVar[str] = FIELD

    @property
    def epsilon(self) -> float:
        """The claimed epsilon (the layer's, for its one release)."""
        return float(self.layer.epsilon)

    @property
    def delta(self) -> float:
        """The claimed delta."""
        return float(self.layer.delta)

    def _reference_notes(self) -> dict[str, Any]:
        """The ``notes["dp"]`` of one real release of the layer (set by the subclass)."""
        raise NotImplementedError

    def _same_sigma(self, got: float, want: float | None = None) -> None:
        """Refuse a batched draw whose noise std differs from a real release's (default:
        the reference release's own sigma), so that the audit tests the real mechanism."""
        if want is None:
            want = self._reference_notes()["fields"][self.field_name]["sigma"]
        if not math.isclose(float(got), float(want), rel_tol=1e-9):
            raise AuditError(f"{getattr(self, 'mechanism', '?')}: the batched release has "
                             f"noise std {got!r} but a real release {want!r}; it would not "
                             "audit the same mechanism")


class SumRelease(LayerClaim):
    """A DP layer releasing a bare bounded sum of one scalar field, as a batched release.

    The field ``x`` has shape (1,) and ``Bound(l2=bound)`` at the layer's adjacency, so one
    record (record adjacency) or one client (client adjacency) moves the sum by at most
    ``bound``. The canary is that record or client at ``+canary_scale * bound``, clipped
    by the real upload validation (``Upload.validate(..., on_violation="clip")``); the
    other ``clients - 1`` clients hold 0 (known to the adversary). For an integer
    mechanism the canary is moved one quantisation step inside the bound when that makes
    its integer shift odd (so the parity test can see a biased low bit).

    What is observed is what the layer's threat model protects: CentralDP's and
    DistributedDP's released sum, LocalDP's noised upload of the canary client. n releases
    are drawn at once as one release of an n-coordinate field whose noise plan is the
    scalar release's: CentralDP through ``release`` (its sigma depends on the L2 bound, not
    the size; checked), LocalDP through ``noise_plan``/``noise_upload``, DistributedDP
    through ``release_plan`` (of the scalar spec: scales, z, share std, ring) and then
    ``encode_noised`` per surviving client, the ring sum, and ``finish`` -- with only the
    ``survivors`` (by default the fewest the secure sum accepts: the least noise)
    contributing and the others dropped.

    Args:
        layer: a CentralDP, LocalDP or DistributedDP layer planned for one release (or a
            name for :func:`make_layer` with ``layer_kwargs``).
        bound: the L2 bound of one contribution.
        clients: the cohort size (DistributedDP sizes each share for the fewest survivors
            its secure sum accepts); default :data:`DEFAULT_CLIENTS`.
        canary_scale: the canary's raw value over the bound (> 1: a value the clip must
            bring back to the bound).
        survivors: DistributedDP only: who contributes to the sum (:func:`dropout_pattern`:
            ``"fewest"``, ``"all"`` or a count; the canary's client always survives). The
            claim is then what the layer's ``finish`` charges for those survivors.
    """

    def __init__(self, layer: Any, *, bound: float = 1.0, clients: int | None = None,
                 canary_scale: float = 1.0, survivors: int | str = "fewest",
                 **layer_kwargs: Any) -> None:
        from secagg.messages import Bound, Field, Upload, UploadSpec
        from secagg.privacy.layers import CentralDP, DistributedDP, LocalDP

        if isinstance(layer, str):
            layer = make_layer(layer, **layer_kwargs)
        elif layer_kwargs:
            raise AuditError("layer options are for a layer given by name only")
        if not isinstance(layer, (CentralDP, LocalDP, DistributedDP)):
            raise AuditError(f"SumRelease audits CentralDP, LocalDP or DistributedDP, got "
                             f"{type(layer).__name__}")
        if not (math.isfinite(bound) and bound > 0):
            raise AuditError(f"bound must be a positive number, got {bound!r}")
        if clients is None:
            clients = DEFAULT_CLIENTS
        if not (isinstance(clients, int) and clients >= 1):
            raise AuditError(f"clients must be a positive integer, got {clients!r}")
        if not (math.isfinite(canary_scale) and canary_scale > 0):
            raise AuditError(f"canary_scale must be a positive number, got {canary_scale!r}")
        self.layer = layer
        self.bound = float(bound)
        self.clients = clients
        self.kind = ("central" if isinstance(layer, CentralDP) else
                     "local" if isinstance(layer, LocalDP) else "distributed")
        self._bound = Bound(l2=self.bound, adjacency=layer.adjacency)
        self.spec = UploadSpec((Field(FIELD, (1,), bound=self._bound, additive=True),),
                               max_records=1)
        raw = np.array([canary_scale * self.bound])
        clipped = Upload.validate(self.spec, {FIELD: raw}, 0, 1, on_violation="clip")
        self.canary_value = float(clipped[FIELD][0])
        self._round = 0
        self.step = 0.0
        self.survivors: tuple[int, ...] = tuple(range(clients))
        self._claim: float | None = None
        if self.kind == "distributed":
            self._plan = layer.release_plan(self.spec, clients)
            self.survivors = dropout_pattern(clients, self._plan.worst, survivors,
                                             layer.seed)
            scale = self._plan.scales[FIELD]
            self.step = math.ldexp(1.0, -scale)
            # on the encoding's grid (what the sum carries), with an odd integer shift
            q = round(self.canary_value / self.step)
            if q % 2 == 0:
                q = q - 1 if q > 0 else q + 1
            self.canary_value = q * self.step
        elif self.kind == "local":
            self._sigmas, _ = layer.noise_plan(self.spec)
        self.scalar_notes = self._scalar_release()
        self._composed = self._skellam_sum = False
        if self.kind == "distributed":
            self._claim = self._survivors_claim()
            one = [np.zeros(1)] * self.clients
            self._composed = composition_holds(
                layer, self._plan, [one, [np.array([self.canary_value])] + one[1:]],
                self.survivors, self._ctx())
            self._skellam_sum = self._composed and skellam_sum_holds(layer)

    # -- facts --------------------------------------------------------------------------

    @property
    def epsilon(self) -> float:
        """The claimed epsilon: the layer's; for DistributedDP what its ledger charges for
        the release with these survivors (more survivors, more noise, a smaller charge)."""
        return float(self.layer.epsilon) if self._claim is None else self._claim

    @property
    def mechanism(self) -> str:
        """The layer's name (with the integer mechanism and the survivors for
        DistributedDP)."""
        name = self.layer.name
        if self.kind != "distributed":
            return name
        return f"{name}/{self.layer.mechanism} ({len(self.survivors)} of {self.clients})"

    @property
    def canary(self) -> str:
        """The canary, in words."""
        who = "record" if self.layer.adjacency == "record" else "client"
        return f"{who} at +{self.canary_value:.6g} (L2 bound {self.bound:g})"

    @property
    def statistics(self) -> list[Statistic]:
        """The tests that apply: shift; for an integer mechanism also parity and exact."""
        out = [shift_statistic()]
        if self.kind == "distributed":
            out += [parity_statistic(self.step), exact_statistic(0.0, self.canary_value)]
        return out

    def details(self) -> dict[str, Any]:
        """Noise facts of the release (from a scalar release's notes)."""
        notes = self.scalar_notes
        out: dict[str, Any] = {"noise_multiplier": notes.get("noise_multiplier"),
                               "sigma": notes["fields"][FIELD]["sigma"],
                               "adjacency": self.layer.adjacency, "clients": self.clients}
        if self.kind == "distributed":
            out.update(ring_bits=notes.get("ring_bits"), survivors=len(self.survivors),
                       survivor_ids=list(self.survivors), min_survivors=self._plan.worst,
                       share_std=self._plan.share_std.get(FIELD),
                       sigma=notes["target_sigma"][FIELD]
                       * math.sqrt(len(self.survivors) / self._plan.worst),
                       scale_bits=notes.get("scale_bits", {}).get(FIELD))
        return out

    def _survivors_claim(self) -> float:
        """What the layer's own ``finish`` charges the ledger for a release with these
        survivors (the events of the noise they actually added), as epsilon at delta."""
        ctx = self._ctx()
        self.layer.finish(self._plan, self.spec, np.zeros(1, dtype=np.uint64),
                          self.survivors, ctx, ctx.privacy, True)
        return float(ctx.privacy.epsilon(self.delta))

    # -- the release --------------------------------------------------------------------

    def _values(self, with_canary: bool, n: int) -> np.ndarray:
        return np.full(n, self.canary_value if with_canary else 0.0)

    def _ctx(self) -> Any:
        from secagg.layers.base import RoundContext
        from secagg.privacy.accountant import PrivacyLedger

        self._round += 1
        return RoundContext(self._round, PHASE, self._round, privacy=PrivacyLedger())

    def _wide(self, n: int) -> Any:
        from secagg.messages import Field, UploadSpec

        return UploadSpec((Field(FIELD, (n,), bound=self._bound, additive=True),),
                          max_records=1)

    def _scalar_release(self) -> dict[str, Any]:
        """One real release of the scalar sum through ``aggregate`` (the canary-free
        cohort), for the notes the batched release is checked against."""
        from secagg.messages import Upload

        ups = {c: Upload.validate(self.spec, {FIELD: np.zeros(1)}, c, 1)
               for c in range(self.clients)}
        agg = self.layer.aggregate(ups, self.spec, self._ctx())
        return dict(agg.notes["dp"])

    def __call__(self, with_canary: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        """n releases (float64), the canary in the sum when ``with_canary``. The noise
        comes from the layer's own streams (``noise_source``); ``rng`` is unused."""
        from secagg.layers.base import Aggregate
        from secagg.messages import Upload
        from secagg.privacy.layers import noise_source

        spec = self._wide(n)
        ctx = self._ctx()
        values = self._values(with_canary, n)
        if self.kind == "central":
            ledger = self.layer.begin(spec, ctx)
            agg = Aggregate(PHASE, ctx.round, {FIELD: values}, {}, tuple(range(self.clients)))
            agg = self.layer.release(agg, spec, ctx, ledger)
            self._same_sigma(agg.notes["dp"]["fields"][FIELD]["sigma"])
            return np.asarray(agg.sums[FIELD], dtype=np.float64)
        if self.kind == "local":
            sigmas, wide = self.layer.noise_plan(spec)
            self._same_sigma(sigmas[FIELD], self._sigmas[FIELD])
            up = Upload({FIELD: values}, spec, 0, 1)
            src = noise_source(self.layer.seed, ctx.round, PHASE, 0)
            noised = self.layer.noise_upload(up, spec, sigmas, wide, src.rng)
            return np.asarray(noised[FIELD], dtype=np.float64)
        return self._distributed(values, spec, ctx)

    def _distributed(self, values: np.ndarray, spec: Any, ctx: Any) -> np.ndarray:
        from secagg.privacy.layers import noise_source

        plan = self._plan
        wide_field = dataclasses.replace(plan.additive[0], shape=(values.size,))
        rel = dataclasses.replace(plan, additive=(wide_field,), noised=(wide_field,))
        survivors = self.survivors
        if self._composed:  # the same ring sum (composed_ring), the encoding done once
            ring = composed_ring(self.layer, rel, plan.plans[FIELD].encode(values[:1]),
                                 survivors, ctx, values.size, skellam_sum=self._skellam_sum)
        else:
            mask = (1 << plan.ring_bits) - 1
            ring = np.zeros(values.size, dtype=np.uint64)
            for c in survivors:  # client 0 holds the canary, the others 0; the rest dropped
                mine = values if c == 0 else np.zeros_like(values)
                src = noise_source(self.layer.seed, ctx.round, PHASE, c)
                ring += self.layer.encode_noised(rel, {FIELD: mine}, src.rng)  # mod 2^64
            if plan.ring_bits < 64:
                ring &= np.uint64(mask)
        agg = self.layer.finish(rel, spec, ring, survivors, ctx, ctx.privacy, True)
        # the scalar release had every client contribute; compare the noise each share
        # was sized for (the fewest survivors' total), and what these survivors add
        self._same_sigma(agg.notes["dp"]["target_sigma"][FIELD],
                         self.scalar_notes["target_sigma"][FIELD])
        self._same_sigma(agg.notes["dp"]["fields"][FIELD]["sigma"],
                         self.scalar_notes["target_sigma"][FIELD]
                         * math.sqrt(len(survivors) / plan.worst))
        return np.asarray(agg.sums[FIELD], dtype=np.float64)

    def _reference_notes(self) -> dict[str, Any]:
        return self.scalar_notes


def audit_sum(layer: Any = "central-dp", *, epsilon: float | None = None,
              delta: float = DEFAULT_DELTA, adjacency: Literal["record", "client"] = "record",
              mechanism: Literal["discrete_gaussian", "skellam"] = "discrete_gaussian",
              trials: int = 1_000_000, seed: int | None = 0, clients: int | None = None,
              bound: float = 1.0, canary_scale: float = 1.0, confidence: float = 0.95,
              threshold: float = 0.7, progress: bool | None = None,
              survivors: int | str = "fewest", mode: str = "tight") -> AuditResult:
    """Audit a DP layer on a bare bounded sum (:class:`SumRelease`) against its claim.

    ``layer``: a layer name (built by :func:`make_layer` with ``epsilon``, ``delta``,
    ``adjacency``, ``mechanism``, ``threshold`` and ``seed``) or a DP layer planned for one
    release. The statistics are :attr:`SumRelease.statistics`; ``seed`` also seeds the
    auditor. Example: ``audit_sum("central-dp", epsilon=2.0).epsilon_lower``.
    """
    if isinstance(layer, str):
        if epsilon is None:
            raise AuditError(f"audit_sum({layer!r}) needs epsilon")
        release = SumRelease(layer, bound=bound, clients=clients, canary_scale=canary_scale,
                             survivors=survivors, epsilon=epsilon, delta=delta,
                             adjacency=adjacency, mechanism=mechanism, threshold=threshold,
                             seed=seed)
    else:
        release = SumRelease(layer, bound=bound, clients=clients, canary_scale=canary_scale,
                             survivors=survivors)
    return audit(release, epsilon=release.epsilon, delta=release.delta, trials=trials,
                 statistics=release.statistics, confidence=confidence, seed=seed,
                 mechanism=release.mechanism, canary=release.canary, progress=progress,
                 details=release.details(), mode=mode)


# ---------------------------------------------------------------------------------------
# DP-SGD (Opacus through secagg.privacy.dpsgd) with gradient canaries.


def _dpsgd_run(config: Any, included: np.ndarray, *, steps: int, lr: float,
               canary_norm: float, records: int, torch_seed: int) -> np.ndarray:
    """One DP-SGD training through :func:`secagg.privacy.dpsgd.make_private` of a linear
    model (no bias, zero init, loss (w.x - y)^2 / 2) on ``records`` ordinary records and
    one gradient canary per True entry of ``included``.

    Canary i has feature ``e_i`` (its own coordinate, which no ordinary record touches)
    and label ``-canary_norm``: its gradient is ``(w_i + canary_norm) e_i``, ``canary_norm e_i``
    at the start and close to it over a few small steps, so with ``canary_norm`` well
    above the clip it is clipped to the clip norm, and coordinate i of the
    trained weights moves by the clipped canary gradient plus noise. An excluded canary
    is the zero record (gradient 0), so both worlds have the same dataset size and
    Opacus divides by the same expected batch size. Ordinary records live in the other
    coordinates. Full-batch Poisson sampling (rate 1). Returns, per canary, its
    coordinate of (initial - final) weights over lr: the sum over steps of the noised,
    clipped gradient sums over the expected batch size."""
    import warnings

    with warnings.catch_warnings():
        # Opacus warns that its own secure RNG is off (secagg's generator draws the noise)
        # and torch about backward hooks, on every training
        warnings.filterwarnings("ignore", module=r"opacus(\.|$)")
        warnings.filterwarnings("ignore", message=r".*(backward hook|Secure RNG).*")
        return _dpsgd_train(config, included, steps=steps, lr=lr, canary_norm=canary_norm,
                            records=records, torch_seed=torch_seed)


def _dpsgd_train(config: Any, included: np.ndarray, *, steps: int, lr: float,
                 canary_norm: float, records: int, torch_seed: int) -> np.ndarray:
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from secagg.privacy.dpsgd import make_private

    m = included.size
    d = m + 4
    g = torch.Generator().manual_seed(torch_seed)
    xs = [torch.cat([torch.zeros(records, m), torch.randn(records, 4, generator=g)], 1)]
    ys = [torch.randn(records, generator=g)]
    # one row per canary: e_i and label -canary_norm when included, else the zero record
    # (feature 0, label 0: gradient 0, so it adds nothing to the sum) -- the dataset size,
    # hence Opacus' normalisation by the expected batch size, is the same in both worlds
    inc = torch.as_tensor(np.asarray(included, dtype=bool))
    xs.append(torch.eye(m, d) * inc[:, None])
    ys.append(torch.where(inc, -float(canary_norm), 0.0))
    x, y = torch.cat(xs), torch.cat(ys)
    model = nn.Linear(d, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loader = DataLoader(TensorDataset(x, y), batch_size=len(x))
    pt = make_private(model, opt, loader, config, stream=torch_seed)
    for _ in range(steps):
        for xb, yb in pt.data_loader:
            pt.optimizer.zero_grad()
            if len(xb):
                loss = ((pt.module(xb).squeeze(-1) - yb) ** 2).sum() / 2.0
                loss.backward()
            pt.optimizer.step()
    w = next(pt.module.parameters()).detach().numpy().ravel()
    # weights only ever move by -lr * (noised clipped sum / expected batch size)
    return -w[:m].astype(np.float64) / lr


def _dpsgd_claim(noise_multiplier: float, steps: int, delta: float) -> float:
    from secagg.privacy.accountant import PrivacyLedger
    from secagg.privacy.events import SampledGaussianEvent

    ledger = PrivacyLedger(delta=delta)
    ledger.spend(SampledGaussianEvent(noise_multiplier=noise_multiplier, sampling_rate=1.0,
                                      steps=steps, label="dp-sgd"))
    return float(ledger.epsilon(delta))


def audit_dpsgd(*, noise_multiplier: float, max_grad_norm: float = 1.0, steps: int = 1,
                delta: float = DEFAULT_DELTA, trials: int = 400, seed: int = 0,
                canary_norm: float = 10.0, records: int = 8, lr: float = 0.1,
                confidence: float = 0.95, progress: bool | None = None,
                mode: str = "tight") -> AuditResult:
    """Multi-run audit of DP-SGD (record level): ``trials`` trainings without and with one
    gradient canary (:func:`_dpsgd_run`), the test statistic the canary coordinate's total
    update. The claim is the ledger's epsilon for the trainings' event (full batch,
    ``steps`` steps at ``noise_multiplier``: no sampling, so the update is Gaussian and the
    tight ``mode`` applies). Every training is real Opacus (per-sample
    clipping, noise from secagg's generator seeded per run)."""
    from secagg.privacy.dpsgd import DPSGD

    claimed = _dpsgd_claim(noise_multiplier, steps, delta)
    counter = [0]

    def release(with_canary: bool, rng: np.random.Generator) -> float:
        counter[0] += 1
        config = DPSGD(noise_multiplier, max_grad_norm, seed=int(rng.integers(2**31)))
        out = _dpsgd_run(config, np.array([with_canary]), steps=steps, lr=lr,
                         canary_norm=canary_norm, records=records, torch_seed=counter[0])
        return float(out[0])

    res = audit_release(release, epsilon=claimed, delta=delta, trials=trials, seed=seed,
                        confidence=confidence, mechanism="dp-sgd",
                        canary=f"gradient canary (norm {canary_norm:g} before the clip "
                               f"{max_grad_norm:g})", progress=progress, mode=mode,
                        details={"noise_multiplier": noise_multiplier, "steps": steps,
                                 "max_grad_norm": max_grad_norm, "sampling_rate": 1.0})
    return res


def audit_dpsgd_one_run(*, noise_multiplier: float, max_grad_norm: float = 1.0,
                        steps: int = 1, delta: float = DEFAULT_DELTA, canaries: int = 1000,
                        guesses: int | None = None, seed: int = 0, canary_norm: float = 10.0,
                        records: int = 8, lr: float = 0.1, confidence: float = 0.95
                        ) -> AuditResult:
    """One-run audit of DP-SGD (Steinke, Nasr, Jagielski, NeurIPS 2023): ``canaries``
    gradient canaries, each included with probability 1/2 (auditor's seeded coin), one
    training; the auditor guesses "included" for the ``guesses // 2`` canaries with the
    largest update on their coordinate and "excluded" for the ``guesses // 2`` smallest,
    counts the correct guesses v, and reports the largest epsilon that
    :func:`one_run_p_value` rejects at 1 - confidence. The one-run bound is loose by
    design (a single training gives the mechanism many chances to hide a canary);
    it costs one training instead of thousands."""
    from secagg.privacy.dpsgd import DPSGD

    if canaries < 2:
        raise AuditError(f"canaries must be >= 2, got {canaries}")
    k = (guesses if guesses is not None else max(2, canaries // 5)) // 2
    if not 1 <= k <= canaries // 2:
        raise AuditError(f"guesses must be in [2, canaries], got {guesses}")
    t0 = time.perf_counter()
    rng = np.random.default_rng([seed, 1])
    included = rng.random(canaries) < 0.5
    config = DPSGD(noise_multiplier, max_grad_norm, seed=int(rng.integers(2**31)))
    score = _dpsgd_run(config, included, steps=steps, lr=lr, canary_norm=canary_norm,
                       records=records, torch_seed=seed)
    order = np.argsort(score)
    guess_out, guess_in = order[:k], order[-k:]
    v = int(included[guess_in].sum() + (~included[guess_out]).sum())
    r = 2 * k
    lower = one_run_epsilon(canaries, r, v, delta, 1.0 - confidence)
    claimed = _dpsgd_claim(noise_multiplier, steps, delta)
    test = TestOutcome("one-run", lower, float("nan"), "top/bottom", r - v, r, 0, canaries)
    return AuditResult("dp-sgd (one run)", claimed, lower, float(delta), float(confidence),
                       1, f"{canaries} gradient canaries, {r} guesses, {v} correct",
                       [test], time.perf_counter() - t0,
                       {"noise_multiplier": noise_multiplier, "steps": steps,
                        "canaries": canaries, "guesses": r, "correct": v})


# ---------------------------------------------------------------------------------------
# Output.


def format_table(results: Sequence[AuditResult]) -> str:
    """A plain-text table: one row per audit."""
    head = ("mechanism", "eps claimed", "eps lower", "ratio", "conf", "trials", "test",
            "mode", "verdict", "canary")
    rows = []
    for r in results:
        ratio = r.epsilon_lower / r.epsilon_claimed if r.epsilon_claimed else float("nan")
        rows.append((r.mechanism, f"{r.epsilon_claimed:.3f}", f"{r.epsilon_lower:.3f}",
                     f"{ratio:.2f}", f"{r.confidence:.4g}", str(r.trials), r.best.statistic,
                     r.best.mode, "VIOLATED" if r.violated else "ok", r.canary))
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
              for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]
    return "\n".join(lines)


def allowed_fnr(fpr: Any, epsilon: float, delta: float) -> np.ndarray:
    """The smallest FNR an (epsilon, delta)-DP mechanism allows at each FPR:
    max(0, 1 - delta - e^epsilon FPR, e^-epsilon (1 - delta - FPR))."""
    f = np.asarray(fpr, dtype=np.float64)
    return np.maximum.reduce([np.zeros_like(f), 1.0 - delta - math.exp(epsilon) * f,
                              math.exp(-epsilon) * (1.0 - delta - f)])


def plot_tradeoff(results: Sequence[AuditResult], path: str | Any) -> list[Any]:
    """Draw each audit's empirical trade-off curve (FPR against FNR of its best test, on
    the evaluation split) over the region its claimed (epsilon, delta) forbids (shaded:
    a point there would break the claim), one panel per audit. Writes ``path`` with the
    suffixes .png and .svg; returns the two paths."""
    from pathlib import Path

    from matplotlib.figure import Figure

    if not results:
        raise AuditError("nothing to plot: no audit results")
    base = Path(path)
    base = base.with_suffix("") if base.suffix in (".png", ".svg") else base
    cols = min(3, len(results))
    rows = math.ceil(len(results) / cols)
    fig = Figure(figsize=(4.0 * cols, 3.8 * rows), constrained_layout=True)
    axes = fig.subplots(rows, cols, squeeze=False)
    grid = np.linspace(0.0, 1.0, 401)
    for ax, r in zip(axes.ravel(), results, strict=False):
        floor = allowed_fnr(grid, r.epsilon_claimed, r.delta)
        ax.fill_between(grid, 0.0, floor, color="tab:red", alpha=0.15, lw=0,
                        label=f"forbidden by ({r.epsilon_claimed:g}, {r.delta:g})-DP")
        ax.plot(grid, floor, color="tab:red", lw=1)
        if r.curve:
            ax.plot(r.curve["fpr"], r.curve["fnr"], color="tab:blue", lw=1.5,
                    label=f"empirical ({r.best.statistic} test)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("false negative rate")
        verdict = "VIOLATED" if r.violated else "ok"
        ax.set_title(f"{r.mechanism}\neps claimed {r.epsilon_claimed:.3g}, lower "
                     f"{r.epsilon_lower:.3g} ({verdict})", fontsize=9)
        ax.legend(fontsize=7, loc="upper right")
    for ax in axes.ravel()[len(results):]:
        ax.set_axis_off()
    base.parent.mkdir(parents=True, exist_ok=True)
    out = []
    for suffix in (".png", ".svg"):
        target = base.with_suffix(suffix)
        fig.savefig(target, dpi=120)
        out.append(target)
    return out


# ---------------------------------------------------------------------------------------
# Command line (``secagg dp-audit``; secagg.cli parses, this runs).

#: Exit status of ``secagg dp-audit`` when some lower bound exceeds its claim.
EXIT_VIOLATED = 6
DPSGD_TRIALS = 1000
#: Releases per world of the multi-run DP-FedAvg audit by default.
FEDAVG_TRIALS = 100_000
#: Trees (of 8 rounds) per world of the DP-FTRL audit by default.
FTRL_TRIALS = 250_000
#: Releases per world of the command line's DistributedDP sum with all survivors.
SURVIVORS_ALL_TRIALS = 250_000
#: What ``secagg dp-audit --release`` audits the DP layers on.
RELEASES = ("sum", "dp-fedavg", "dp-fedavg-adaptive")


ALL_LAYERS = (*LAYER_NAMES, "dp-ftrl", "dp-sgd")
