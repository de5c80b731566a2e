"""The tight audit mode's math: Gaussian differential privacy (mu-GDP) and its epsilon.

Gaussian differential privacy (Dong, Roth and Su, 2022): a mechanism is mu-GDP when telling
its two neighbouring worlds apart is at least as hard as telling N(0, 1) from N(mu, 1):
every test's rates satisfy ``TPR <= Phi(Phi^-1(FPR) + mu)``. mu-GDP is (eps, delta)-DP
exactly when ``delta >= Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)`` (Balle and Wang
2018; Dong, Roth and Su, Corollary 2.13): :func:`delta_for_mu`, and its inverses
:func:`epsilon_for_mu` and :func:`mu_for_epsilon`.

The tight mode (:func:`threat_models.dp_audit.gdp_fit`) fits mu to both worlds' whole
score distributions -- the mean shift of the canary over the noise's standard deviation,
the maximum-likelihood fit of the probit ROC ``Phi^-1(TPR) = Phi^-1(FPR) + mu`` over every
threshold at once -- bounds it below at the audit's confidence, and reports
``epsilon_for_mu(mu_lb, delta)``.

**What is assumed.** That each world's score is normal with a common standard deviation
(the Gaussian-shift model), so that the mechanism's trade-off curve is G_mu with mu that
shift over that deviation, and its epsilon at delta is ``epsilon_for_mu(mu, delta)``. This
holds exactly for the Gaussian mechanism (CentralDP, LocalDP, DP-FTRL's tree noise, whose
releases are linear in Gaussian noise) and to within the discretisation for the discrete
Gaussian and Skellam sums of DistributedDP, whose noise in integer units has a standard
deviation of about 2^20 steps (the fit's normal-approximation interval holds for them by
the central limit theorem at 10^4+ trials; their claims are RDP bounds that lie above the
Gaussian curve of the same noise, about 1.08x in epsilon at eps 1-8). A mechanism whose
curve is not Gaussian-shaped (randomized response, Laplace) can be (eps, delta)-DP with an
eps below the tight bound: audit it in the assumption-free threshold mode.
"""

from __future__ import annotations

import math

from scipy import optimize, special

from secagg.errors import PrivacyError

__all__ = [
    "AuditError",
    "delta_for_mu",
    "epsilon_for_mu",
    "mu_for_epsilon",
]


class AuditError(PrivacyError):
    """An audit that cannot be run as asked (bad parameters, an inconsistent release)."""


def _log_ndtr(x: float) -> float:
    return float(special.log_ndtr(x))


def delta_for_mu(mu: float, epsilon: float) -> float:
    """The smallest delta at which mu-GDP is (epsilon, delta)-DP:
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (0 for mu = 0)."""
    if mu < 0 or epsilon < 0:
        raise AuditError(f"need mu >= 0 and epsilon >= 0, got mu={mu!r}, epsilon={epsilon!r}")
    if mu == 0:
        return 0.0
    a = _log_ndtr(-epsilon / mu + mu / 2.0)
    b = epsilon + _log_ndtr(-epsilon / mu - mu / 2.0)
    if b >= a:
        return 0.0
    return float(math.exp(a) * -math.expm1(b - a))


def epsilon_for_mu(mu: float, delta: float) -> float:
    """The epsilon of mu-GDP at ``delta``: the eps >= 0 with :func:`delta_for_mu` = delta
    (0 when mu-GDP is already (0, delta)-DP)."""
    if not 0.0 < delta < 1.0:
        raise AuditError(f"delta must be in (0, 1), got {delta!r}")
    if not (math.isfinite(mu) and mu >= 0):
        raise AuditError(f"mu must be a finite number >= 0, got {mu!r}")
    if mu == 0 or delta_for_mu(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while delta_for_mu(mu, hi) > delta:  # decreasing in eps
        hi *= 2.0
    return float(optimize.brentq(lambda e: delta_for_mu(mu, e) - delta, 0.0, hi,
                                 xtol=1e-12, rtol=1e-12))


def mu_for_epsilon(epsilon: float, delta: float) -> float:
    """The mu of the Gaussian mechanism that is exactly (epsilon, delta)-DP (inverse of
    :func:`epsilon_for_mu`)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise AuditError(f"epsilon must be a positive number, got {epsilon!r}")
    if not 0.0 < delta < 1.0:
        raise AuditError(f"delta must be in (0, 1), got {delta!r}")
    hi = 1.0
    while delta_for_mu(hi, epsilon) < delta:  # increasing in mu
        hi *= 2.0
    return float(optimize.brentq(lambda m: delta_for_mu(m, epsilon) - delta, 1e-12, hi,
                                 xtol=1e-14, rtol=1e-12))
