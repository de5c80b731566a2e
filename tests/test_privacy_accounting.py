"""Privacy ledger, events and calibration against dp-accounting and closed forms."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import optimize, special, stats

from secagg.errors import BudgetExceeded, PrivacyError
from secagg.privacy.accountant import PrivacyLedger, ddg_rdp, skellam_rdp
from secagg.privacy.calibrate import calibrate, delta_for, epsilon_for
from secagg.privacy.events import (
    DiscreteGaussianEvent,
    GaussianEvent,
    NonPrivateEvent,
    PrivacyEvent,
    SampledGaussianEvent,
    SkellamEvent,
)

DELTA = 1e-5


def _gdp_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon of a mu-GDP mechanism (Dong, Roth, Su 2019; Balle & Wang 2018):
    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)."""
    def gap(eps: float) -> float:
        return (stats.norm.cdf(-eps / mu + mu / 2)
                - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2) - delta)
    return optimize.brentq(gap, 0.0, 100.0, xtol=1e-12)


@pytest.mark.parametrize(("rounds", "z"), [(1, 3.0), (10, 4.0), (50, 12.0)])
def test_r_fold_gaussian_matches_pld_and_closed_form(rounds: int, z: float) -> None:
    ledger = PrivacyLedger()
    for r in range(rounds):
        ledger.spend(GaussianEvent(noise_multiplier=z, round=r, phase="stats", fields=("S",)))
    ours = ledger.epsilon(DELTA)
    assert ledger.method() == "pld"
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z), rounds)
    ref = acc.get_epsilon(DELTA)
    assert abs(ours - ref) / ref < 0.01
    # Independent check: R Gaussians with multiplier z are sqrt(R)/z-GDP exactly.
    exact = _gdp_epsilon(math.sqrt(rounds) / z, DELTA)
    assert abs(ours - exact) / exact < 0.01
    assert ours >= exact * (1 - 1e-3)  # the accountant never under-reports


def test_calibrate_meets_target_and_one_percent_less_noise_misses() -> None:
    for target, rounds in [(1.0, 5), (4.0, 20)]:
        z = calibrate(target, DELTA, rounds=rounds)
        assert epsilon_for(z, DELTA, rounds=rounds) <= target
        assert epsilon_for(0.99 * z, DELTA, rounds=rounds) > target
        # Cross-check with the closed form: the calibrated z is within 1% of exact.
        z_exact = optimize.brentq(
            lambda s, t=target, r=rounds: _gdp_epsilon(math.sqrt(r) / s, DELTA) - t, 0.5, 1e3)
        assert abs(z - z_exact) / z_exact < 0.01


def test_any_two_determine_the_third() -> None:
    z = calibrate(2.0, DELTA, rounds=3, releases_per_round=2)
    eps = epsilon_for(z, DELTA, rounds=3, releases_per_round=2)
    d = delta_for(z, eps, rounds=3, releases_per_round=2)
    assert eps <= 2.0 and eps > 1.98
    assert 0.5 * DELTA < d <= DELTA * 1.01


def test_budget_guard_refuses_before_recording() -> None:
    ledger = PrivacyLedger(epsilon_budget=1.0, delta=DELTA)
    z = calibrate(1.0, DELTA, rounds=4)
    for r in range(4):
        ledger.spend(GaussianEvent(noise_multiplier=z, round=r))
    assert ledger.epsilon() <= 1.0
    with pytest.raises(BudgetExceeded):
        ledger.spend(GaussianEvent(noise_multiplier=z, round=4))
    assert len(ledger.events) == 4


def test_sampled_gaussian_matches_pld() -> None:
    ledger = PrivacyLedger()
    ledger.spend(SampledGaussianEvent(noise_multiplier=1.1, sampling_rate=0.01, steps=500))
    acc = dp_accounting.pld.PLDAccountant()
    acc.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)),
                500)
    assert abs(ledger.epsilon(DELTA) - acc.get_epsilon(DELTA)) / acc.get_epsilon(DELTA) < 0.01


def test_discrete_gaussian_single_share_is_cks_zcdp() -> None:
    ev = DiscreteGaussianEvent(l2_sensitivity=3.0, sigma_share=10.0)
    orders = np.array([2.0, 8.0, 32.0])
    # n = 1: rho = Delta^2 / (2 sigma^2) zCDP, i.e. RDP alpha * rho.
    assert np.allclose(ddg_rdp(ev.dp_event(), orders), orders * 9 / 200)
    # Many shares of a large sigma: the inflation tau vanishes; same as one share sqrt(n) sigma.
    many = DiscreteGaussianEvent(l2_sensitivity=3.0, sigma_share=5.0, n_shares=4, dimension=50)
    assert np.allclose(ddg_rdp(many.dp_event(), orders), orders * 9 / 200, rtol=1e-9)
    # Small shares: tau > 0 makes the bound strictly worse than the single-share bound.
    small = DiscreteGaussianEvent(l2_sensitivity=3.0, sigma_share=0.5, n_shares=4, dimension=50)
    assert np.all(ddg_rdp(small.dp_event(), orders) > orders * 9 / (2 * 4 * 0.25))


def test_discrete_gaussian_ledger_close_to_gaussian_at_large_sigma() -> None:
    led = PrivacyLedger()
    led.spend(DiscreteGaussianEvent(l2_sensitivity=100.0, sigma_share=400.0, n_shares=4,
                                    dimension=10, count=5))
    assert led.method() == "rdp"
    rdp_gauss = PrivacyLedger(accountant="rdp")
    rdp_gauss.spend(GaussianEvent(noise_multiplier=8.0, count=5))
    assert abs(led.epsilon(DELTA) - rdp_gauss.epsilon(DELTA)) / rdp_gauss.epsilon(DELTA) < 0.01


def _renyi_divergence_skellam(lam: float, shift: int, alpha: int) -> float:
    k = np.arange(-400, 401)
    p = stats.skellam.pmf(k, lam, lam)
    q = stats.skellam.pmf(k - shift, lam, lam)
    keep = (p > 0) & (q > 0)
    return float(special.logsumexp(alpha * np.log(p[keep]) + (1 - alpha) * np.log(q[keep]))
                 / (alpha - 1))


@pytest.mark.parametrize("lam", [2.0, 10.0])
def test_skellam_rdp_bound_holds_exactly_in_one_dimension(lam: float) -> None:
    # One dimension, shift 1: D1 = D2 = 1, variance 2 lam; the bound must dominate the
    # numerically exact Renyi divergence (both directions are equal by symmetry).
    ev = SkellamEvent(l2_sensitivity=1.0, l1_sensitivity=1.0, variance=2 * lam)
    orders = np.arange(2, 9, dtype=float)
    bound = skellam_rdp(ev.dp_event(), orders)
    exact = np.array([_renyi_divergence_skellam(lam, 1, int(a)) for a in orders])
    assert np.all(bound >= exact)
    # ... and is not vacuous: within a factor 2 of the truth.
    assert np.all(bound <= 2 * exact + 0.05)


def test_unbounded_event_is_refused() -> None:
    class Mystery(PrivacyEvent):
        pass

    with pytest.raises(PrivacyError):
        PrivacyLedger().spend(Mystery())
    with pytest.raises(PrivacyError):
        GaussianEvent(noise_multiplier=0.0)
    with pytest.raises(PrivacyError):
        SampledGaussianEvent(noise_multiplier=1.0, sampling_rate=1.5, steps=3)
    with pytest.raises(PrivacyError):
        DiscreteGaussianEvent(l2_sensitivity=1.0, sigma_share=0.1)
    with pytest.raises(PrivacyError):
        PrivacyLedger(epsilon_budget=1.0)  # a budget needs a delta


def test_non_private_release_and_seeded_runs_are_flagged() -> None:
    led = PrivacyLedger()
    led.spend(GaussianEvent(noise_multiplier=5.0, fields=("a",)))
    assert math.isfinite(led.epsilon(DELTA)) and led.private
    led.mark_not_private("noise seed fixed by the user")
    assert not led.private and led.not_private_reasons
    led.spend(NonPrivateEvent(fields=("b",), reason="field released in the clear"))
    assert math.isinf(led.epsilon(DELTA))
    assert math.isfinite(led.epsilon(DELTA, field="a"))
    s = led.summary(DELTA)
    assert set(s["per_field"]) == {"a", "b"} and s["private"] is False


def test_per_field_and_total_epsilon() -> None:
    led = PrivacyLedger()
    led.spend(GaussianEvent(noise_multiplier=4.0, fields=("V",), phase="calib"),
              GaussianEvent(noise_multiplier=4.0, fields=("U",), phase="calib"))
    one = led.epsilon(DELTA, field="V")
    both = led.epsilon(DELTA)
    # Two Gaussians with z compose like one with z/sqrt(2).
    assert abs(both - _gdp_epsilon(math.sqrt(2) / 4.0, DELTA)) / both < 0.01
    assert one < both and abs(one - _gdp_epsilon(1 / 4.0, DELTA)) / one < 0.01


def test_calibrate_refuses_meaningless_epsilon_quickly():
    import time

    from secagg.privacy.calibrate import MAX_TARGET_EPSILON, calibrate

    t0 = time.perf_counter()
    with pytest.raises(PrivacyError, match="Plaintext"):
        calibrate(1e6, 1e-5, rounds=3)
    assert time.perf_counter() - t0 < 1.0
    assert MAX_TARGET_EPSILON == 100.0


def test_tiny_noise_multiplier_is_accounted_by_rdp_not_an_exploding_pld():
    """z = 0.001 once asked the PLD accountant for 451 GiB; now 'auto' switches to RDP,
    whose epsilon is the closed-form Gaussian RDP bound, and explicit 'pld' says why not."""
    import time

    from secagg.privacy.accountant import PLD_MIN_NOISE_MULTIPLIER

    t0 = time.perf_counter()
    ledger = PrivacyLedger()
    ledger.spend(GaussianEvent(noise_multiplier=1e-3, count=6))
    assert ledger.method() == "rdp"
    eps = ledger.epsilon(DELTA)
    # RDP of a Gaussian: alpha / (2 z^2) per release; the bound is at least the rho-term.
    assert eps > 6 / (2 * 1e-3**2) and math.isfinite(eps)
    assert time.perf_counter() - t0 < 5.0
    ok = PrivacyLedger()
    ok.spend(GaussianEvent(noise_multiplier=PLD_MIN_NOISE_MULTIPLIER))
    assert ok.method() == "pld"
    with pytest.raises(PrivacyError, match="rdp"):
        PrivacyLedger(accountant="pld").spend(GaussianEvent(noise_multiplier=1e-3))
