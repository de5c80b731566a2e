"""Samplers: discrete Gaussian (vectorised and exact) and Skellam match their laws."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from secagg.errors import PrivacyError
from secagg.privacy.samplers import (
    discrete_gaussian,
    discrete_gaussian_exact,
    discrete_gaussian_pmf,
    gaussian,
    noise_generator,
    skellam,
    skellam_pmf,
)

N = 10**6


def _chi2_pvalue(draws: np.ndarray, pmf) -> float:
    """Chi-square goodness of fit: one bin per integer in the central range, the two tails
    merged into one bin each (every expected count >= 5)."""
    n = draws.size
    lo, hi = int(np.percentile(draws, 0.01)), int(np.percentile(draws, 99.99))
    support = np.arange(lo, hi + 1)
    probs = pmf(support)
    obs = np.array([(draws == k).sum() for k in support], dtype=np.float64)
    # Tail bins: P[X < lo] and P[X > hi] by symmetry of both laws around 0.
    p_low = max(0.0, (1.0 - probs.sum()) / 2.0)
    p_high = p_low
    obs = np.concatenate([[np.sum(draws < lo)], obs, [np.sum(draws > hi)]])
    exp = np.concatenate([[p_low], probs, [p_high]]) * n
    keep = exp >= 5
    obs_k = np.concatenate([obs[keep], [obs[~keep].sum()]])
    exp_k = np.concatenate([exp[keep], [exp[~keep].sum()]])
    if exp_k[-1] < 5:  # fold the remainder into the largest bin
        obs_k, exp_k = obs_k[:-1], exp_k[:-1]
        obs_k[np.argmax(exp_k)] += obs[~keep].sum()
        exp_k[np.argmax(exp_k)] += exp[~keep].sum()
    exp_k *= obs_k.sum() / exp_k.sum()
    return float(stats.chisquare(obs_k, exp_k).pvalue)


@pytest.mark.parametrize("sigma", [0.8, 5.0, 40.0])
def test_discrete_gaussian_variance_within_one_percent(sigma: float) -> None:
    x = discrete_gaussian(sigma, N, noise_generator(11).rng)
    assert x.dtype == np.int64 and x.shape == (N,)
    k = np.arange(-int(60 * sigma) - 20, int(60 * sigma) + 21)
    exact_var = float(np.sum(k.astype(float) ** 2 * discrete_gaussian_pmf(sigma, k)))
    # sigma >= 0.8: the discrete Gaussian's variance is within 1e-3 of sigma^2.
    assert abs(exact_var - sigma**2) / sigma**2 < 1e-3
    assert abs(x.var() - sigma**2) / sigma**2 < 0.01
    assert abs(x.mean()) < 5 * sigma / np.sqrt(N)


@pytest.mark.parametrize("sigma", [1.5, 6.0])
def test_discrete_gaussian_chi_square(sigma: float) -> None:
    x = discrete_gaussian(sigma, N, noise_generator(12).rng)
    assert _chi2_pvalue(x, lambda s: discrete_gaussian_pmf(sigma, s)) > 1e-3
    # The test has power: the same draws are rejected against a 3% wider law.
    assert _chi2_pvalue(x, lambda s: discrete_gaussian_pmf(sigma * 1.03, s)) < 1e-6


@pytest.mark.parametrize("lam", [0.7, 12.5, 800.0])
def test_skellam_variance_and_chi_square(lam: float) -> None:
    x = skellam(lam, N, noise_generator(13).rng)
    assert x.dtype == np.int64
    assert abs(x.var() - 2 * lam) / (2 * lam) < 0.01
    if lam < 100:
        assert _chi2_pvalue(x, lambda s: skellam_pmf(lam, s)) > 1e-3
        assert _chi2_pvalue(x, lambda s: skellam_pmf(lam * 1.05, s)) < 1e-6


def test_exact_sampler_matches_law_and_vectorised_sampler() -> None:
    draws = discrete_gaussian_exact(Fraction(9, 4), 20000, random.Random(5).randrange)
    assert _chi2_pvalue(draws, lambda s: discrete_gaussian_pmf(1.5, s)) > 1e-3
    assert abs(draws.var() - 2.25) / 2.25 < 0.05
    vec = discrete_gaussian(1.5, 20000, noise_generator(5).rng)
    # Two-sample test: both samplers draw from the same law.
    assert stats.ks_2samp(draws, vec).pvalue > 1e-3


def test_noise_generator_private_by_default_and_seed_reproducible() -> None:
    a, b = noise_generator(), noise_generator()
    assert a.private and b.private and a.seed is None
    assert not np.array_equal(a.rng.integers(0, 2**62, 8), b.rng.integers(0, 2**62, 8))
    s1, s2 = noise_generator(3), noise_generator(3)
    assert not s1.private and s1.seed == 3
    assert np.array_equal(gaussian(1.0, 5, s1.rng), gaussian(1.0, 5, s2.rng))


def test_private_noise_bits_are_the_aes_ctr_keystream() -> None:
    """The default generator's raw words are AES-128-CTR under its key, checked against
    OpenSSL's AES (``cryptography``), and its normals follow N(0, 1)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    from secagg.privacy.samplers import aes_ctr_generator

    key = bytes(range(16))
    raw = aes_ctr_generator(key).bit_generator.random_raw(64)
    ecb = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    keystream = ecb.update(b"".join(i.to_bytes(16, "little") for i in range(32)))
    assert raw.tolist() == np.frombuffer(keystream, dtype="<u8").tolist()
    src = noise_generator()
    assert type(src.rng.bit_generator).__name__ == "AESCounter"
    z = src.rng.normal(size=200_000)
    assert stats.kstest(z, "norm").pvalue > 1e-4
    with pytest.raises(PrivacyError):
        aes_ctr_generator(b"short")


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf"), "x"])
def test_bad_scales_are_refused(bad) -> None:
    rng = noise_generator(0).rng
    with pytest.raises(PrivacyError):
        discrete_gaussian(bad, 3, rng)
    with pytest.raises(PrivacyError):
        skellam(bad, 3, rng)
    with pytest.raises(PrivacyError):
        gaussian(bad, 3, rng)


def test_bad_seed_and_sizes_are_refused() -> None:
    with pytest.raises(PrivacyError):
        noise_generator(-1)
    with pytest.raises(PrivacyError):
        discrete_gaussian(1.0, -3, noise_generator(0).rng)
    with pytest.raises(PrivacyError):
        discrete_gaussian_exact(Fraction(-1), 3)
