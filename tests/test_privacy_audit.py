"""Empirical audit of the Gaussian mechanism: a threshold distinguisher lower-bounds epsilon.

Setup: a counting query with sensitivity 1 on neighbouring datasets D (answer 0) and D'
(answer 1), released with the Gaussian noise the ledger calibrates for epsilon = 1 at
delta = 1e-5 (one release). The distinguisher says "D'" when the output exceeds a
threshold T fixed in advance (T = 3 sigma, not tuned on the data, so there is no selection
bias). Any (epsilon, delta)-DP mechanism satisfies TPR <= e^epsilon FPR + delta, so

    epsilon >= ln((TPR - delta) / FPR).

Statistics: N = 10^6 trials per dataset (>= 10^5 as required). FPR and TPR are binomial
proportions; we take one-sided Clopper-Pearson bounds at level 1e-4 each (lower bound for
TPR, upper bound for FPR), so the reported epsilon lower bound is valid with probability
>= 1 - 2e-4. Expected values at T = 3 sigma, sigma = 3.73: FPR = 1.35e-3 (1350 hits),
TPR = 3.15e-3 (3150 hits), true log-ratio 0.85; the confidence-adjusted bound is about 0.7,
comfortably between epsilon/2 = 0.5 and epsilon = 1. With half the noise (a broken
mechanism) the same audit gives a bound about 1.5 > 1 and the audit fails it, which the
second test checks, so the audit is discriminating. Fixed seeds make it deterministic.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.calibrate import calibrate
from secagg.privacy.events import GaussianEvent
from secagg.privacy.samplers import gaussian, noise_generator

EPS, DELTA, TRIALS, LEVEL = 1.0, 1e-5, 10**6, 1e-4


def _epsilon_lower_bound(sigma: float, threshold: float, seed: int) -> float:
    rng = noise_generator(seed).rng
    out_d = 0.0 + gaussian(sigma, TRIALS, rng)  # mechanism on D
    out_d1 = 1.0 + gaussian(sigma, TRIALS, rng)  # mechanism on D' (sensitivity 1)
    fp = int(np.sum(out_d > threshold))
    tp = int(np.sum(out_d1 > threshold))
    fpr_hi = stats.beta.ppf(1 - LEVEL, fp + 1, TRIALS - fp)  # Clopper-Pearson upper
    tpr_lo = stats.beta.ppf(LEVEL, tp, TRIALS - tp + 1)  # Clopper-Pearson lower
    return math.log(max(tpr_lo - DELTA, 1e-300) / fpr_hi)


def _claimed() -> tuple[float, float]:
    z = calibrate(EPS, DELTA, rounds=1)
    ledger = PrivacyLedger()
    ledger.spend(GaussianEvent(noise_multiplier=z))
    return z, ledger.epsilon(DELTA)


def test_audit_lower_bound_between_half_and_claimed_epsilon() -> None:
    sigma, claimed = _claimed()  # sensitivity 1, so sigma = noise multiplier
    assert claimed <= EPS
    lb = _epsilon_lower_bound(sigma, 3.0 * sigma, seed=2024)
    assert lb < claimed, f"audit found epsilon >= {lb:.3f} > claimed {claimed:.3f}"
    assert lb > claimed / 2, f"audit too weak: {lb:.3f} <= {claimed / 2:.3f}"


def test_audit_catches_too_little_noise() -> None:
    sigma, claimed = _claimed()
    lb = _epsilon_lower_bound(sigma / 2, 3.0 * sigma / 2, seed=2025)
    assert lb > claimed
