"""Samplers: discrete Gaussian (vectorised and exact) and Skellam match their laws."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from secagg.errors import PrivacyError
from secagg.privacy.samplers import (
    SKELLAM_MAX_LAM,
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
    x = skellam(lam, N if lam < 100 else N // 5, noise_generator(13).rng)
    assert x.dtype == np.int64
    assert abs(x.var() - 2 * lam) / (2 * lam) < 0.01
    if lam < 100:
        assert _chi2_pvalue(x, lambda s: skellam_pmf(lam, s)) > 1e-3
        assert _chi2_pvalue(x, lambda s: skellam_pmf(lam * 1.05, s)) < 1e-6


# lam = 2^53 + 2 (just above float64's exact integers), 4e17 (> 2^58: numpy's Poisson returns
# multiples of 64 there) and the largest lam the sampler accepts.
@pytest.mark.parametrize("lam", [2.0**53 + 2, 4e17, SKELLAM_MAX_LAM])
def test_skellam_low_bits_uniform_at_large_lambda(lam: float) -> None:
    """At large lam, Sk(lam, lam) modulo 2^k is uniform to within 1e-9 (its std is >= 1e8),
    so a chi-square test of the residues must pass for k = 1..6; numpy's float Poisson
    fails it (every draw even above 2^53)."""
    x = skellam(lam, 200_000, noise_generator(21).rng)
    assert x.dtype == np.int64
    for k in range(1, 7):
        counts = np.bincount(np.mod(x, 2**k), minlength=2**k)
        assert stats.chisquare(counts).pvalue > 1e-4, (k, counts)
    # The shape too: standardised, Sk(lam, lam) is N(0, 1) to within 1/sqrt(lam).
    assert stats.kstest(x / np.sqrt(2 * lam), "norm").pvalue > 1e-4


def test_skellam_above_the_exact_range_is_refused() -> None:
    rng = noise_generator(0).rng
    assert skellam(SKELLAM_MAX_LAM, 3, rng).shape == (3,)
    with pytest.raises(PrivacyError, match="discrete_gaussian"):
        skellam(np.nextafter(SKELLAM_MAX_LAM, np.inf), 3, rng)
    assert skellam(1e19, 3, rng).dtype == np.int64  # numpy's Poisson raised ValueError


@pytest.mark.parametrize("lam", [0.3, 3.5, 1.0, 1e4 + 0.5])
def test_poisson_rejection_sampler_matches_poisson_law(lam: float) -> None:
    """The Poisson draws behind skellam (offsets from floor(lam)) follow Poisson(lam), with
    power against a 2% larger lam; non-integer lam included."""
    from secagg.privacy.samplers import _poisson_offsets

    a = int(np.floor(lam))
    k = _poisson_offsets(lam, 200_000, noise_generator(22).rng) + a
    assert k.min() >= 0

    def pvalue(mu: float) -> float:
        hi = int(stats.poisson.ppf(1 - 1e-6, lam)) + 1
        support = np.arange(0, hi + 1)
        probs = stats.poisson.pmf(support, mu)
        probs[-1] += stats.poisson.sf(hi, mu)
        obs = np.bincount(np.minimum(k, hi), minlength=hi + 1).astype(float)
        exp = probs * k.size
        keep = exp >= 5
        obs_k = np.append(obs[keep], obs[~keep].sum())
        exp_k = np.append(exp[keep], exp[~keep].sum())
        if exp_k[-1] < 5:
            obs_k, exp_k = obs_k[:-1], exp_k[:-1]
        return float(stats.chisquare(obs_k, exp_k * obs_k.sum() / exp_k.sum()).pvalue)

    assert pvalue(lam) > 1e-3
    assert pvalue(lam * 1.02) < 1e-6 or lam < 1


@pytest.mark.parametrize("lam", [0.01, 0.999, 1.0, 7.5, 123.25, 1e5 + 0.75])
def test_poisson_envelope_dominates_the_ratio_everywhere(lam: float) -> None:
    """The rejection constant is above log(target/proposal) at every integer the proposal
    can reach, so no acceptance probability exceeds 1 (which would bias the law), and it is
    tight (the sampler does not waste proposals)."""
    from secagg.privacy.samplers import _envelope, _log_poisson

    a, phi, t, c = _envelope(lam)
    j = np.arange(-a, 65 * t, dtype=np.int64)
    h = _log_poisson(j, lam, a, phi) + np.abs(j) / t
    assert h.max() <= c < h.max() + 1e-6
    # The log-pmf behind it is right to ~1e-12 (scipy's logpmf, computed directly).
    ref = stats.poisson.logpmf(j + a, lam) + 0.5 * np.log(2 * np.pi * lam)
    near = ref > -50
    np.testing.assert_allclose(h[near] - np.abs(j[near]) / t, ref[near], atol=1e-9)


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
