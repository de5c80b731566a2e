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
the central limit theorem at 10^4+ trials). Their claims are the same Gaussian curve: the
ledger charges each release as its rounded-Gaussian reference plus the proven pointwise gap
between the two laws (secagg.privacy.pld; below 1e-7 in epsilon at these noise levels), no
longer the RDP bound that sat ~8% above it. A mechanism whose
curve is not Gaussian-shaped (randomized response, Laplace) can be (eps, delta)-DP with an
eps below the tight bound: audit it in the assumption-free threshold mode.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from secagg.errors import PrivacyError
from secagg.privacy import pld

__all__ = [
    "AuditError",
    "delta_for_mu",
    "epsilon_for_mu",
    "mu_for_epsilon",
]


class AuditError(PrivacyError):
    """An audit that cannot be run as asked (bad parameters, an inconsistent release)."""


def _audit_errors(fn: Callable[..., float]) -> Callable[..., float]:
    """``fn`` with its PrivacyError raised as an :class:`AuditError`."""

    @functools.wraps(fn)
    def wrapped(*args: float) -> float:
        try:
            return fn(*args)
        except AuditError:
            raise
        except PrivacyError as e:
            raise AuditError(str(e)) from None

    return wrapped


#: The smallest delta at which mu-GDP is (epsilon, delta)-DP:
#: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (0 for mu = 0).
delta_for_mu = _audit_errors(pld.delta_for_mu)
#: The epsilon of mu-GDP at ``delta`` (0 when mu-GDP is already (0, delta)-DP).
epsilon_for_mu = _audit_errors(pld.epsilon_for_mu)
#: The mu of the Gaussian mechanism that is exactly (epsilon, delta)-DP.
mu_for_epsilon = _audit_errors(pld.mu_for_epsilon)
