"""Noise samplers for differential privacy: Gaussian, discrete Gaussian and Skellam.

Randomness comes from :func:`noise_generator`: by default a numpy ``Generator`` whose raw
bits are the AES-128 counter-mode keystream under a fresh 128-bit key from ``os.urandom``
(:func:`aes_ctr_generator`, randomgen's ``AESCounter`` with AES-NI; the tests check it bit
for bit against OpenSSL's AES through ``cryptography``). So the noise comes from a
cryptographic generator and cannot be predicted from anything public. A user seed is
accepted for experiments (PCG64); :attr:`NoiseSource.private` is then False and the DP layers
mark the run as not private in the privacy ledger and the transcript.

The discrete Gaussian follows Canonne, Kamath and Steinke, "The Discrete Gaussian for
Differential Privacy" (NeurIPS 2020), Algorithm 3: propose from a discrete Laplace with
scale t = floor(sigma) + 1 and accept Y with probability
exp(-(|Y| - sigma^2/t)^2 / (2 sigma^2)). Two implementations are provided:

* :func:`discrete_gaussian` draws whole arrays at once (numpy, seconds for 10^7 draws).
  The Bernoulli trials compare float64 uniforms with float64 probabilities, so the pmf of
  each integer differs from the exact one by a relative error of order 2^-52; the output
  is integer-valued, so there is no "porous support" of the kind that breaks floating-point
  Laplace samplers.
* :func:`discrete_gaussian_exact` is the paper's exact sampler (Algorithms 1-3 with
  rational arithmetic and integer randomness only, sigma^2 rational). It is slow (pure
  Python) and meant for small draws and for cross-checking the vectorised sampler.

The symmetric Skellam Sk(lambda, lambda) = Poisson(lambda) - Poisson(lambda) (variance
2 lambda; Agarwal, Kairouz and Liu, NeurIPS 2021) is drawn with numpy's Poisson sampler.
"""

from __future__ import annotations

import math
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from secagg.errors import PrivacyError

__all__ = [
    "NoiseSource",
    "aes_ctr_generator",
    "discrete_gaussian",
    "discrete_gaussian_exact",
    "discrete_gaussian_pmf",
    "gaussian",
    "noise_generator",
    "skellam",
    "skellam_pmf",
]


@dataclass
class NoiseSource:
    """A random generator for DP noise and whether it is fit for a private release.

    Attributes:
        rng: the numpy generator noise is drawn from.
        private: False when the generator was seeded by the user (experiments only).
        seed: the user seed, or None for an unpredictable (OS-entropy) key.
    """

    rng: np.random.Generator
    private: bool
    seed: int | None = None


def aes_ctr_generator(key: bytes) -> np.random.Generator:
    """A numpy ``Generator`` whose raw 64-bit words are the AES-128-CTR keystream under
    ``key`` (16 bytes): block i is AES_key(i as a 128-bit little-endian integer), i = 0, 1, ...,
    read as little-endian 64-bit words. Distributions (normal, geometric, Poisson, ...) are
    numpy's, fed by these bits."""
    from randomgen import AESCounter

    if not isinstance(key, bytes) or len(key) != 16:
        raise PrivacyError("an AES-128 key is 16 bytes")
    return np.random.Generator(AESCounter(key=int.from_bytes(key, "little"), counter=0))


def noise_generator(seed: int | None = None) -> NoiseSource:
    """A noise generator: cryptographic and unpredictable by default, reproducible (and not
    private) when a ``seed`` is given.

    Without a seed the generator is :func:`aes_ctr_generator` under a fresh key from
    ``os.urandom``. With a seed it is PCG64 seeded with it.
    """
    if seed is None:
        return NoiseSource(aes_ctr_generator(os.urandom(16)), private=True, seed=None)
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or seed < 0:
        raise PrivacyError(f"noise seed must be a non-negative integer, got {seed!r}")
    return NoiseSource(np.random.Generator(np.random.PCG64(int(seed))), private=False,
                       seed=int(seed))


def _check_scale(name: str, value: float) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise PrivacyError(f"{name} must be a number, got {value!r}") from exc
    if not (math.isfinite(v) and v > 0):
        raise PrivacyError(f"{name} must be a finite positive number, got {value!r}")
    return v


def _shape(size: int | tuple[int, ...]) -> tuple[int, ...]:
    shape = (size,) if isinstance(size, (int, np.integer)) else tuple(size)
    if any(int(s) < 0 for s in shape):
        raise PrivacyError(f"noise size must be non-negative, got {size!r}")
    return tuple(int(s) for s in shape)


def gaussian(sigma: float, size: int | tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Continuous Gaussian noise N(0, sigma^2) as float64."""
    s = _check_scale("sigma", sigma)
    return rng.normal(0.0, s, size=_shape(size))


def discrete_gaussian(
    sigma: float, size: int | tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """Discrete Gaussian N_Z(0, sigma^2) on the integers, as int64 (vectorised).

    P[X = x] is proportional to exp(-x^2 / (2 sigma^2)) for every integer x. Algorithm 3 of
    Canonne, Kamath and Steinke (2020): discrete Laplace proposals with scale
    t = floor(sigma) + 1, each accepted with probability exp(-(|Y| - sigma^2/t)^2/(2 sigma^2)).
    The discrete Laplace is drawn as the difference of two geometric variables with
    success probability 1 - exp(-1/t).
    """
    s = _check_scale("sigma", sigma)
    shape = _shape(size)
    n = int(np.prod(shape, dtype=np.int64))
    out = np.empty(n, dtype=np.int64)
    t = math.floor(s) + 1
    p = -math.expm1(-1.0 / t)  # 1 - exp(-1/t)
    s2 = s * s
    filled = 0
    while filled < n:
        need = n - filled
        batch = int(need * 1.6) + 16  # acceptance is 0.45 (sigma << 1) to 0.76; loop tops up
        y = rng.geometric(p, size=batch) - rng.geometric(p, size=batch)
        gamma = (np.abs(y) - s2 / t) ** 2 / (2.0 * s2)
        accept = rng.random(batch) < np.exp(-gamma)
        got = y[accept][:need]
        out[filled:filled + got.size] = got
        filled += got.size
    return out.reshape(shape)


# ---------------------------------------------------------------------------------------
# Exact sampler (Canonne, Kamath, Steinke 2020, Algorithms 1-3): rational arithmetic only.


def _bernoulli(p: Fraction, below: Callable[[int], int]) -> bool:
    """Bernoulli(p) for rational p in [0, 1] from integer randomness."""
    return below(p.denominator) < p.numerator


def _bernoulli_exp_small(gamma: Fraction, below: Callable[[int], int]) -> bool:
    """Bernoulli(exp(-gamma)) for rational gamma in [0, 1] (CKS Algorithm 1, first part)."""
    k = 1
    while _bernoulli(gamma / k, below):
        k += 1
    return k % 2 == 1


def _bernoulli_exp(gamma: Fraction, below: Callable[[int], int]) -> bool:
    """Bernoulli(exp(-gamma)) for rational gamma >= 0 (CKS Algorithm 1)."""
    while gamma > 1:
        if not _bernoulli_exp_small(Fraction(1), below):
            return False
        gamma -= 1
    return _bernoulli_exp_small(gamma, below)


def _discrete_laplace_exact(t: int, below: Callable[[int], int]) -> int:
    """Discrete Laplace with scale t (P[x] ~ exp(-|x|/t)) for integer t >= 1 (CKS Alg. 2)."""
    while True:
        u = below(t)
        if not _bernoulli_exp(Fraction(u, t), below):
            continue
        v = 0
        while _bernoulli_exp(Fraction(1), below):
            v += 1
        x = u + t * v
        negative = below(2) == 1
        if negative and x == 0:
            continue
        return -x if negative else x


def discrete_gaussian_exact(
    sigma2: Fraction | int | str, size: int, below: Callable[[int], int] | None = None
) -> np.ndarray:
    """Exact discrete Gaussian N_Z(0, sigma2) for rational ``sigma2`` (CKS Algorithm 3).

    Uses only rational arithmetic and uniform integers from ``below(n)`` (an integer in
    [0, n)); by default ``secrets.randbelow``. Pure Python: use for small draws.
    """
    try:
        s2 = Fraction(sigma2)
    except (TypeError, ValueError, ZeroDivisionError) as exc:
        raise PrivacyError(f"sigma2 must be a rational number, got {sigma2!r}") from exc
    if s2 <= 0:
        raise PrivacyError(f"sigma2 must be positive, got {sigma2!r}")
    if int(size) < 0:
        raise PrivacyError(f"size must be non-negative, got {size!r}")
    draw = below or secrets.randbelow
    t = math.isqrt(s2.numerator // s2.denominator) + 1  # floor(sqrt(s2)) + 1, exactly
    out = np.empty(int(size), dtype=np.int64)
    for i in range(int(size)):
        while True:
            y = _discrete_laplace_exact(t, draw)
            gamma = (abs(y) - s2 / t) ** 2 / (2 * s2)
            if _bernoulli_exp(gamma, draw):
                out[i] = y
                break
    return out


def discrete_gaussian_pmf(sigma: float, support: np.ndarray) -> np.ndarray:
    """Exact (to float64) pmf of N_Z(0, sigma^2) at the integers ``support``."""
    s = _check_scale("sigma", sigma)
    half = int(math.ceil(s * 40)) + 10
    k = np.arange(-half, half + 1, dtype=np.float64)
    norm = float(np.sum(np.exp(-(k * k) / (2 * s * s))))
    x = np.asarray(support, dtype=np.float64)
    return np.exp(-(x * x) / (2 * s * s)) / norm


def skellam(
    lam: float, size: int | tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """Symmetric Skellam Sk(lam, lam) = Poisson(lam) - Poisson(lam): mean 0, variance 2 lam."""
    lam_ = _check_scale("lam", lam)
    shape = _shape(size)
    return rng.poisson(lam_, size=shape).astype(np.int64) - rng.poisson(
        lam_, size=shape
    ).astype(np.int64)


def skellam_pmf(lam: float, support: np.ndarray) -> np.ndarray:
    """pmf of the symmetric Skellam Sk(lam, lam) at the integers ``support`` (scipy)."""
    from scipy.stats import skellam as _sk

    lam_ = _check_scale("lam", lam)
    return _sk.pmf(np.asarray(support), lam_, lam_)
