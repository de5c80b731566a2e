"""The Gaussian reference of DistributedDP's integer mechanisms (secagg.privacy.pld).

Each bound the reference rests on is checked against the exact law where the exact law is
computable (modified Bessel functions for Skellam, convolutions for sums of discrete
Gaussians), and the ledger's claim is checked from the attacker's seat: the exact privacy
curve of the one-dimensional mechanism (the Neyman-Pearson optimal test between the two
worlds) must meet the claimed (epsilon, delta), and no longer meets it 1% below.
"""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from scipy import signal, special, stats

from secagg.errors import PrivacyError
from secagg.privacy import pld
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.calibrate import epsilon_for
from secagg.privacy.events import (
    DiscreteGaussianEvent,
    SampledGaussianEvent,
    SkellamEvent,
)

DELTA = 1e-5


def _discrete_gaussian_pmf(sigma: float, half_width: int) -> np.ndarray:
    k = np.arange(-half_width, half_width + 1, dtype=np.float64)
    w = np.exp(-k * k / (2.0 * sigma * sigma))
    return w / w.sum()


def _log_rounded_gaussian(k: np.ndarray, s: float) -> np.ndarray:
    """log P[round(N(0, s^2)) = k] for k >= 0, without cancellation in the tail."""
    a = stats.norm.logsf((k - 0.5) / s)
    b = stats.norm.logsf((k + 0.5) / s)
    return a + np.log(-np.expm1(b - a))


def _exact_delta(pmf: np.ndarray, shift: int, eps: float) -> float:
    """delta(eps) of x + Z against x + shift + Z, Z of law ``pmf`` (symmetric support):
    the hockey-stick divergence, i.e. the best any test can do."""
    shifted = np.zeros_like(pmf)
    shifted[shift:] = pmf[:-shift]
    return float(np.sum(np.maximum(pmf - math.exp(eps) * shifted, 0.0)))


# --- the pointwise bounds ---------------------------------------------------------------


@pytest.mark.parametrize("mu", [1e4, 1e6])
def test_skellam_pmf_is_within_eta_of_the_rounded_gaussian(mu: float) -> None:
    eta, log_tail = pld.skellam_coordinate(mu)
    s = math.sqrt(mu)
    t = 0.5 + s * math.sqrt(2 * (pld.TAIL_LOG + math.log(2)))
    k = np.arange(0, int(t) + 1, dtype=np.float64)
    log_sk = np.log(special.ive(k, mu))  # Skellam(mu/2, mu/2) pmf = e^-mu I_k(mu)
    gap = np.abs(log_sk - _log_rounded_gaussian(k, s))
    assert np.all(np.isfinite(gap))
    assert gap.max() <= eta
    # not vacuous: the bound is the quartic term the exact law does show at the box's edge
    assert eta <= 1.2 * gap.max()
    # the Chernoff tail: the exact mass beyond the box is below e^log_tail
    assert stats.skellam.sf(int(t), mu / 2, mu / 2) <= math.exp(max(log_tail, -700))


@pytest.mark.parametrize("sigma", [0.5, 0.8, 1.0])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_sum_of_discrete_gaussians_is_within_a_of_the_gaussian_density(sigma: float,
                                                                       n: int) -> None:
    one = _discrete_gaussian_pmf(sigma, 80)
    total = one
    for _ in range(n - 1):
        total = np.convolve(total, one)
    half = (total.size - 1) // 2
    k = np.arange(-half, half + 1)
    err = np.abs(total - stats.norm.pdf(k, scale=math.sqrt(n) * sigma)).max()
    assert err <= math.exp(pld.ddg_log_abs_error(sigma, n))
    with pytest.raises(PrivacyError):
        pld.ddg_log_abs_error(0.4, n)


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_discrete_gaussian_is_sigma2_subgaussian(sigma: float) -> None:
    # the tail bound the reference uses (Canonne, Kamath, Steinke 2020)
    k = np.arange(-400, 401, dtype=np.float64)
    log_w = -k * k / (2 * sigma * sigma)
    log_pmf = log_w - special.logsumexp(log_w)
    for t in (0.1, 0.5, 1.0, 2.0, 4.0):
        log_mgf = special.logsumexp(log_pmf + t * k)
        assert log_mgf <= t * t * sigma * sigma / 2 + 1e-12


def test_reference_exists_only_for_large_noise() -> None:
    big = DiscreteGaussianEvent(l2_sensitivity=1e6, sigma_share=2e6, n_shares=7, dimension=8)
    ref = pld.reference(big.dp_event())
    assert ref is not None and math.isclose(ref.noise_multiplier, 2 * math.sqrt(7))
    assert 0 < ref.eta < 1e-9
    small = DiscreteGaussianEvent(l2_sensitivity=3.0, sigma_share=2.0, n_shares=7, dimension=8)
    assert pld.reference(small.dp_event()) is None
    no_dim = SkellamEvent(l2_sensitivity=1e6, l1_sensitivity=3e6, variance=4e12)
    assert pld.reference(no_dim.dp_event()) is None
    with_dim = SkellamEvent(l2_sensitivity=1e6, l1_sensitivity=3e6, variance=4e12,
                            dimension=8)
    assert pld.reference(with_dim.dp_event()) is not None
    led = PrivacyLedger(delta=DELTA)
    led.spend(small)
    assert led.method() == "rdp"  # too little noise: the published RDP bound is kept
    with pytest.raises(PrivacyError, match="reference"):
        PrivacyLedger(accountant="pld").spend(small)


# --- the ledger's claim against the exact curve -----------------------------------------


def _claimed(event: object) -> tuple[float, float]:
    led = PrivacyLedger(delta=DELTA)
    led.spend(event)  # type: ignore[arg-type]
    rdp = PrivacyLedger(delta=DELTA, accountant="rdp")
    rdp.spend(event)  # type: ignore[arg-type]
    assert led.method() == "pld"
    return led.epsilon(), rdp.epsilon()


@pytest.mark.parametrize("n_shares", [1, 2])
def test_discrete_gaussian_claim_meets_the_exact_curve_and_is_tight(n_shares: int) -> None:
    sigma, shift = 5000.0 / math.sqrt(n_shares), 1000
    one = _discrete_gaussian_pmf(sigma, int(40 * sigma))
    pmf = one if n_shares == 1 else np.maximum(signal.fftconvolve(one, one), 0.0)
    eps, eps_rdp = _claimed(DiscreteGaussianEvent(l2_sensitivity=shift, sigma_share=sigma,
                                                  n_shares=n_shares))
    assert _exact_delta(pmf, shift, eps) <= DELTA  # sound
    assert _exact_delta(pmf, shift, 0.99 * eps) > DELTA  # tight to 1%
    assert eps_rdp > 1.08 * eps  # what the RDP conversion charged before


def test_skellam_claim_meets_the_exact_curve_and_is_tight() -> None:
    s, shift = 15000.0, 3000
    k = np.arange(0, int(30 * s) + 1)
    half = special.ive(k, s * s)
    pmf = np.concatenate([half[:0:-1], half])
    eps, eps_rdp = _claimed(SkellamEvent(l2_sensitivity=shift, l1_sensitivity=shift,
                                         variance=s * s, dimension=1))
    assert _exact_delta(pmf, shift, eps) <= DELTA
    assert _exact_delta(pmf, shift, 0.99 * eps) > DELTA
    assert eps_rdp > 1.08 * eps


def test_composition_is_the_gaussian_composition_plus_the_gap() -> None:
    # 20 rounds of two fields: the references compose exactly (mu^2 adds up), which lands
    # on dp-accounting's PLD of the one Gaussian with the same mu; delta_for inverts epsilon
    ddg = DiscreteGaussianEvent(l2_sensitivity=1e6, sigma_share=3e6, n_shares=7, dimension=8,
                                count=20)
    sk = SkellamEvent(l2_sensitivity=1e6, l1_sensitivity=8e6, variance=9e12 * 7, dimension=8,
                      count=20)
    led = PrivacyLedger(delta=DELTA)
    led.spend(ddg, sk)
    z = 3 * math.sqrt(7)
    gauss = epsilon_for(z / math.sqrt(40), DELTA)
    assert led.method() == "pld"
    assert abs(led.epsilon() - gauss) <= 2e-3 * gauss
    assert math.isclose(led.delta_for(led.epsilon()), DELTA, rel_tol=1e-6)
    # with a subsampled Gaussian among them, dp-accounting's PLD composes the references
    sampled = SampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.05, steps=10)
    coarse = PrivacyLedger(delta=DELTA, pld_discretization=1e-3)
    coarse.spend(ddg, sk, sampled)
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    acc.compose(dp_accounting.GaussianDpEvent(z / math.sqrt(40)))
    acc.compose(sampled.dp_event())
    want = acc.get_epsilon(DELTA)
    assert coarse.method() == "pld"
    assert want <= coarse.epsilon() <= want * 1.002
