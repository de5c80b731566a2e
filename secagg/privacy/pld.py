"""Tight (epsilon, delta) for the integer mechanisms of DistributedDP, by a Gaussian reference.

The RDP bounds for a sum of discrete Gaussians (Kairouz, Liu, Steinke 2021) and for Skellam
noise (Agarwal, Kairouz, Liu 2021) are sound, but converting any RDP curve to (eps, delta)
loses about 8% of epsilon at eps 1-8 against the Gaussian's exact curve. DistributedDP's
noise is huge in integer units (a standard deviation of ~2^20 quantisation steps or more),
where both laws are, point by point, the rounded Gaussian of the same variance up to a
factor e^{+-eta} with eta ~ 1e-10. This module makes that precise and turns it into a
guarantee:

**Transfer lemma.** Let M(x) = f(x) + Z and R(x) = f(x) + Z' add independent integer noise
to an integer query f, with pmfs that satisfy e^-eta <= P_Z(z) / P_Z'(z) <= e^eta on a box
B, and P[Z not in B] <= beta, P[Z' not in B] <= beta'. If R is (eps, delta)-DP then M is
(eps + 2 eta, e^eta delta + beta + e^(eps + eta) beta')-DP. (For a set S: P[M(x) in S] <=
e^eta P[R(x) in S] + beta <= e^eta (e^eps P[R(x') in S] + delta) + beta, and P[R(x') in S]
<= e^eta P[M(x') in S] + beta'.) It holds for adaptive compositions too, with eta and the
betas summed over the releases (the ratio of the transcripts' pmfs is the product of the
releases' ratios; the tails are a union bound).

The reference Z' is round(N(0, S^2 I_d)): R is then a post-processing of the Gaussian
mechanism of L2 sensitivity Delta_2 (f(x) is an integer vector), whose exact curve is
mu-GDP with mu = Delta_2 / S (Balle and Wang 2018; Dong, Roth and Su 2022), and a
composition of Gaussians is mu-GDP with mu^2 the sum of the mu_i^2. So the ledger charges
the Gaussian's exact epsilon at delta' = e^-H delta (1 - 1e-9), plus 2 H (H the releases'
summed eta), and checks that the tails fit in the 1e-9 delta left. Per coordinate, with
the box |z| <= T and T = 1/2 + S sqrt(2 (L + ln 2)), L = :data:`TAIL_LOG`:

* **phi vs rounded Gaussian:** for |k| <= T the rounded Gaussian's pmf over the density
  phi_S(k) is int_{-1/2}^{1/2} e^{-(2ku + u^2)/(2 S^2)} du, in [e^{-1/(24 S^2)},
  e^{k^2/(24 S^4)}] (Jensen below; sinh(a)/a <= e^{a^2/6} above).
* **sum of n discrete Gaussians N_Z(0, sigma^2), S^2 = n sigma^2:** by Poisson summation
  the characteristic function of N_Z(0, sigma^2) on [-pi, pi] is within
  e_phi = eps1 + (1 + eps1) eps0 of e^{-sigma^2 t^2/2}, eps1 = 2q/(1-q), q =
  e^{-pi^2 sigma^2/2}, eps0 = 2p/(1-p), p = e^{-2 pi^2 sigma^2}; Fourier inversion then
  gives |P[Z = k] - phi_S(k)| <= A = n e_phi + e^{-pi^2 S^2/2} / (pi^2 S^2) for every k, a
  relative error rho = A / phi_S(T) on the box. Tails: each share is sigma^2-subgaussian
  (Canonne, Kamath, Steinke 2020), so P[|Z| > T] <= 2 e^{-T^2/(2 S^2)}.
* **Skellam of variance mu = S^2** (Poisson(mu/2) - Poisson(mu/2); a sum of Skellam
  shares is Skellam): tilt by theta = asinh(k/mu), so that P[Y = k] = e^{mu(cosh theta -
  1) - theta k} P_theta[Y = k] and the tilted law has mean k and variance V = mu cosh
  theta; its pmf at the mean is 1/sqrt(2 pi V) up to a relative r bounded by Fourier
  inversion (|e^{V(cos t - 1) + ik(sin t - t)} - e^{-V t^2/2}| <= e^{-2Vt^2/pi^2}
  (V t^4/24 + |k| |t|^3/6)). The log-ratio to phi_S(k) is then mu f(s) - log(1 + s^2)/4
  + log(1 + r_k), s = k/mu, with 0 <= f(s) = sqrt(1+s^2) - 1 - s asinh(s) + s^2/2 <=
  s^4/24. Tails by Chernoff: P[Y > T] <= e^{-T^2/(2 mu) + T^4/(24 mu^3)}.

Where these bounds are not small (little noise per share: eta above
:data:`MAX_ETA` per release, or rho, r >= 1/2), :func:`reference` returns None and the
ledger keeps the RDP bound. What is assumed beyond the cited facts: that the shares are
exactly N_Z(0, sigma^2) or Skellam (the samplers' documented error, ~1e-14 relative per
pmf value, is not charged), and the event's sensitivity and dimension are right.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import optimize, special

from secagg.errors import PrivacyError

__all__ = [
    "MAX_ETA",
    "TAIL_LOG",
    "TAIL_SHARE",
    "GaussianReference",
    "ddg_coordinate",
    "ddg_log_abs_error",
    "delta_for_mu",
    "epsilon_for_mu",
    "mu_for_epsilon",
    "reference",
    "skellam_coordinate",
]

#: -log of each coordinate's tail mass outside the box (e^-300 ~ 5e-131).
TAIL_LOG = 300.0
#: Largest eta (log pmf ratio over a whole release) the reference is used for; above it
#: the RDP bound is kept.
MAX_ETA = 1e-4
#: Share of delta set aside for the tails outside the boxes.
TAIL_SHARE = 1e-9


@dataclass(frozen=True)
class GaussianReference:
    """A release's Gaussian reference (see the module docstring).

    Attributes:
        noise_multiplier: S / Delta_2 of the reference Gaussian (mu = 1 / it).
        eta: bound on |log(P_Z / P_Z')| over the release's box (all coordinates).
        log_tail: log of a bound on the mass outside the box, of the actual noise and of
            the reference alike.
    """

    noise_multiplier: float
    eta: float
    log_tail: float


def _box(s: float) -> float:
    return 0.5 + s * math.sqrt(2.0 * (TAIL_LOG + math.log(2.0)))


def _rounding_eta(s: float, t: float) -> float:
    return max(1.0 / (24.0 * s * s), t * t / (24.0 * s ** 4))


def _log_geometric(log_x: float) -> float:
    """log(2x / (1 - x)) for x = e^log_x < 1."""
    return math.log(2.0) + log_x - math.log1p(-math.exp(log_x))


def ddg_log_abs_error(sigma_share: float, n_shares: int) -> float:
    """log A: |P[Z = k] - phi_S(k)| <= A for every integer k, where Z is a sum of
    ``n_shares`` N_Z(0, sigma_share^2) and phi_S the N(0, n sigma^2) density (Poisson
    summation and Fourier inversion, module docstring). Needs sigma_share >= 1/2."""
    if sigma_share < 0.5 or n_shares < 1:
        raise PrivacyError(f"need sigma_share >= 1/2 and n_shares >= 1, got "
                           f"{sigma_share!r}, {n_shares!r}")
    s2 = n_shares * sigma_share ** 2
    log_e1 = _log_geometric(-math.pi ** 2 * sigma_share ** 2 / 2.0)
    log_e0 = _log_geometric(-2.0 * math.pi ** 2 * sigma_share ** 2)
    log_ephi = float(special.logsumexp([log_e1, math.log1p(math.exp(log_e1)) + log_e0]))
    return float(special.logsumexp([math.log(n_shares) + log_ephi,
                                    -math.pi ** 2 * s2 / 2.0
                                    - 2.0 * math.log(math.pi * math.sqrt(s2))]))


def ddg_coordinate(sigma_share: float, n_shares: int) -> tuple[float, float] | None:
    """(eta, log tail) of one coordinate of a sum of ``n_shares`` N_Z(0, sigma_share^2)
    against round(N(0, n sigma^2)); None when the pointwise bound is not below 1/2."""
    if sigma_share < 0.5 or n_shares < 1:
        return None
    s2 = n_shares * sigma_share ** 2
    s = math.sqrt(s2)
    t = _box(s)
    log_a = ddg_log_abs_error(sigma_share, n_shares)
    log_rho = log_a + t * t / (2.0 * s2) + 0.5 * math.log(2.0 * math.pi) + math.log(s)
    if log_rho >= math.log(0.5):
        return None
    eta = -math.log1p(-math.exp(log_rho)) + _rounding_eta(s, t)
    return eta, -TAIL_LOG


def skellam_coordinate(variance: float) -> tuple[float, float] | None:
    """(eta, log tail) of one coordinate of Skellam noise of ``variance`` against
    round(N(0, variance)); None when the local bound is not below 1/2."""
    mu = float(variance)
    s = math.sqrt(mu)
    t = _box(s)
    if t >= mu:
        return None
    v_max = mu * math.sqrt(1.0 + (t / mu) ** 2)
    err = (((math.pi ** 2 / 2.0) ** 2.5 * 3.0 * math.sqrt(math.pi) / 96.0) * mu ** -1.5
           + t * math.pi ** 4 / (24.0 * mu * mu)) / (2.0 * math.pi)
    err += math.exp(-mu * math.pi ** 2 / 2.0) / (math.pi ** 2 * mu)
    r = err * math.sqrt(2.0 * math.pi * v_max)
    if r >= 0.5:
        return None
    quartic = t ** 4 / (24.0 * mu ** 3)
    eta0 = max(t * t / (4.0 * mu * mu) - math.log1p(-r), quartic + math.log1p(r))
    return eta0 + _rounding_eta(s, t), -TAIL_LOG + quartic


def reference(event: object) -> GaussianReference | None:
    """The Gaussian reference of one integer-noise dp event (a
    ``DistributedDiscreteGaussianDpEvent`` or a ``SkellamDpEvent`` with a dimension), or
    None: another event, too little noise for a small eta, or an unknown dimension."""
    from secagg.privacy.events import DistributedDiscreteGaussianDpEvent, SkellamDpEvent

    if isinstance(event, DistributedDiscreteGaussianDpEvent):
        coord = ddg_coordinate(float(event.sigma_share), int(event.n_shares))
        s = math.sqrt(event.n_shares) * event.sigma_share
        d = int(event.dimension)
    elif isinstance(event, SkellamDpEvent) and event.dimension is not None:
        coord = skellam_coordinate(float(event.variance))
        s = math.sqrt(event.variance)
        d = int(event.dimension)
    else:
        return None
    if coord is None or d < 1:
        return None
    eta, log_tail = coord[0] * d, coord[1] + math.log(d)
    if not eta <= MAX_ETA:
        return None
    return GaussianReference(s / float(event.l2_sensitivity), eta, log_tail)


# -- Gaussian differential privacy (the reference's exact curve) ---------------------------


def delta_for_mu(mu: float, epsilon: float) -> float:
    """The smallest delta at which mu-GDP is (epsilon, delta)-DP:
    Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (0 for mu = 0)."""
    if not (mu >= 0 and epsilon >= 0):
        raise PrivacyError(f"need mu >= 0 and epsilon >= 0, got mu={mu!r}, "
                           f"epsilon={epsilon!r}")
    if mu == 0:
        return 0.0
    a = float(special.log_ndtr(-epsilon / mu + mu / 2.0))
    b = epsilon + float(special.log_ndtr(-epsilon / mu - mu / 2.0))
    if b >= a:
        return 0.0
    return float(math.exp(a) * -math.expm1(b - a))


def epsilon_for_mu(mu: float, delta: float) -> float:
    """The epsilon of mu-GDP at ``delta``: the eps >= 0 with :func:`delta_for_mu` = delta
    (0 when mu-GDP is already (0, delta)-DP). Rounded up, never down."""
    if not 0.0 < delta < 1.0:
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
    if not (math.isfinite(mu) and mu >= 0):
        raise PrivacyError(f"mu must be a finite number >= 0, got {mu!r}")
    if mu == 0 or delta_for_mu(mu, 0.0) <= delta:
        return 0.0
    hi = max(1.0, mu * mu)
    while delta_for_mu(mu, hi) > delta:  # decreasing in eps
        hi *= 2.0
    eps = float(optimize.brentq(lambda e: delta_for_mu(mu, e) - delta, 0.0, hi,
                                xtol=1e-12, rtol=1e-12))
    while delta_for_mu(mu, eps) > delta:  # the root's last digit, on the safe side
        eps = math.nextafter(eps, math.inf) * (1 + 1e-15)
    return eps


def mu_for_epsilon(epsilon: float, delta: float) -> float:
    """The mu of the Gaussian mechanism that is exactly (epsilon, delta)-DP (inverse of
    :func:`epsilon_for_mu`)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise PrivacyError(f"epsilon must be a positive number, got {epsilon!r}")
    if not 0.0 < delta < 1.0:
        raise PrivacyError(f"delta must be in (0, 1), got {delta!r}")
    hi = 1.0
    while delta_for_mu(hi, epsilon) < delta:  # increasing in mu
        hi *= 2.0
    return float(optimize.brentq(lambda m: delta_for_mu(m, epsilon) - delta, 1e-12, hi,
                                 xtol=1e-14, rtol=1e-12))
