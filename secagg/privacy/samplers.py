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
2 lambda; Agarwal, Kairouz and Liu, NeurIPS 2021) is drawn by :func:`skellam` with an
integer rejection sampler written for this module, exact in every bit of its output for
every lambda up to :data:`SKELLAM_MAX_LAM` (= 2^100); see :func:`skellam` for why numpy's
Poisson sampler cannot be used and for the reasoning behind the limit.
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
    "SKELLAM_MAX_LAM",
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
    centre, scale = s2 / t, 2.0 * s2
    filled = 0
    while filled < n:
        need = n - filled
        batch = int(need * 1.6) + 16  # acceptance is 0.45 (sigma << 1) to 0.76; loop tops up
        y = rng.geometric(p, size=batch)
        y -= rng.geometric(p, size=batch)
        # exp(-(|y| - sigma^2/t)^2 / (2 sigma^2)), computed in place (the same operations
        # in the same order as the plain expression, so the same bits, with no temporaries)
        keep = np.abs(y) - centre
        np.square(keep, out=keep)
        keep /= scale
        np.negative(keep, out=keep)
        np.exp(keep, out=keep)
        accept = rng.random(batch) < keep
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


#: Largest lambda :func:`skellam` accepts (its output is exact up to here; see there).
SKELLAM_MAX_LAM = 2.0**100
#: Discrete Laplace proposals x = u + t v with v above this are rejected (a truncation of
#: probability < e^-64 per proposal that keeps every integer inside int64; see skellam()).
_V_MAX = 64
_LN_2PI = math.log(2.0 * math.pi)
#: theta(k) = lgamma(k + 1) - (k ln k - k + ln(2 pi k) / 2) for k = 1..19 (math.lgamma).
_THETA_SMALL = np.array([0.0] + [math.lgamma(k + 1) - (k * math.log(k) - k + 0.5 * _LN_2PI
                                                        + 0.5 * math.log(k))
                                 for k in range(1, 20)])
#: (-1)^n / (n (n - 1)) for n = 18 down to 2: the series of g(x) = (1+x) ln(1+x) - x.
_G_SERIES = [(-1.0) ** n / (n * (n - 1)) for n in range(18, 1, -1)]


def _discrete_laplace(t: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` draws of the discrete Laplace P[x] ~ exp(-|x|/t) for an integer t >= 1, built
    from uniform integers as in Canonne, Kamath and Steinke (2020), Algorithm 2: u uniform
    in [0, t) kept with probability exp(-u/t), v >= 0 geometric with P[v] ~ exp(-v),
    x = u + t v, a random sign (a negative zero is redrawn).

    Every integer of the output comes from ``rng.integers`` (unbiased integer sampling),
    never from rounding a float; the only floating-point quantities are the acceptance
    probabilities exp(-u/t) in [1/e, 1] and v's success probability 1 - 1/e, each correct to
    a relative 2^-52. Proposals with v > ``_V_MAX`` are rejected (see :func:`skellam`).
    """
    out = np.empty(n, dtype=np.int64)
    p_stop = -math.expm1(-1.0)  # 1 - 1/e
    filled = 0
    while filled < n:
        batch = int((n - filled) / 0.6) + 32  # at least 0.63 are kept; the loop tops up
        w = rng.integers(0, 2 * t, size=batch, dtype=np.int64)  # u and the sign, in one
        u, neg = w >> 1, (w & 1) == 1
        keep = rng.random(batch) < np.exp(-(u / t))
        v = rng.geometric(p_stop, size=batch).astype(np.int64) - 1
        keep &= v <= _V_MAX
        x = u + np.int64(t) * np.minimum(v, _V_MAX)
        keep &= ~(neg & (x == 0))
        got = np.where(neg, -x, x)[keep][: n - filled]
        out[filled:filled + got.size] = got
        filled += got.size
    return out


def _g(x: np.ndarray) -> np.ndarray:
    """g(x) = (1 + x) ln(1 + x) - x for x > -1, without cancellation near 0 (series for
    |x| < 0.1, truncated where the next term is below 2^-52 of the sum)."""
    small = np.abs(x) < 0.1
    if small.all():
        return _g_series(x)
    out = np.empty_like(x)
    out[small] = _g_series(x[small])
    xl = x[~small]
    out[~small] = (1.0 + xl) * np.log1p(xl) - xl
    return out


def _g_series(x: np.ndarray) -> np.ndarray:
    acc = np.full_like(x, _G_SERIES[0])
    for c in _G_SERIES[1:]:
        acc *= x
        acc += c
    return acc * x * x


def _theta(k: np.ndarray) -> np.ndarray:
    """Stirling's remainder lgamma(k+1) - (k ln k - k + ln(2 pi k)/2) for integers k >= 1
    (given as float64): a table below 20, the asymptotic series (error < 2e-15) above."""
    small = k < 20
    if small.any():
        out = np.empty_like(k)
        out[small] = _THETA_SMALL[k[small].astype(np.int64)]
        out[~small] = _theta(k[~small])
        return out
    r = 1.0 / (k * k)
    return (1.0 / 12 - r * (1.0 / 360 - r * (1.0 / 1260 - r / 1680))) / k


def _log_poisson(j: np.ndarray, lam: float, a: int, phi: float) -> np.ndarray:
    """ln P[K = a + j] + ln(2 pi lam)/2 for K ~ Poisson(lam), a = floor(lam), phi = lam - a,
    at int64 offsets ``j`` (-inf where a + j < 0).

    For lam >= 1 it is evaluated relative to the mode, so its absolute error is ~1e-14
    whatever lam (no lam-sized terms cancel): by Stirling, for k = a + j >= 1 and
    y = k - lam, ln p(k) + ln(2 pi lam)/2 = -lam g(y/lam) - ln(1 + y/lam)/2 - theta(k), and
    y = j - phi is computed from the small integer j, never from k itself.
    """
    jf = j.astype(np.float64)
    out = np.full(j.shape, -np.inf)
    if lam < 1.0:  # a = 0: k = j, every term is small
        from scipy.special import gammaln

        pos = j >= 0
        k = jf[pos]
        out[pos] = k * math.log(lam) - lam - gammaln(k + 1.0) + 0.5 * (_LN_2PI + math.log(lam))
        return out
    lo = -min(a, 2**62)  # |j| < 2^58 (see skellam), so this is -a wherever it matters
    pos = j > lo
    x = (jf[pos] - phi) / lam
    out[pos] = -lam * _g(x) - 0.5 * np.log1p(x) - _theta(jf[pos] + float(a))
    out[j == lo] = -lam + 0.5 * (_LN_2PI + math.log(lam))
    return out


def _envelope(lam: float) -> tuple[int, float, int, float]:
    """The rejection sampler's constants for Poisson(lam): a = floor(lam), phi = lam - a,
    the proposal scale t = isqrt(a) + 1, and c >= max_j h(j), where
    h(j) = ln p(a + j) + ln(2 pi lam)/2 + |j|/t is the log of target over proposal."""
    a = math.floor(lam)  # exact: lam is a float, so floor(lam) and lam - a are exact
    phi = lam - a
    t = math.isqrt(a) + 1
    # h is concave on j >= 0 and on j <= 0 (the Poisson law is log-concave), so its maximum
    # on each side is where its increment changes sign: k + 1 <= lam e^(1/t) going up,
    # k >= lam e^(-1/t) going down. Those points are found to within one (lam e^(+-1/t) is
    # written a + phi + lam expm1(+-1/t), whose float error is < 1); the neighbours cover it.
    j_up = max(0, math.floor(phi + lam * math.expm1(1.0 / t)))
    j_down = min(0, max(-a, math.ceil(phi + lam * math.expm1(-1.0 / t)) - 1))
    cand = [0] + [j for c in (j_up, j_down) for j in (c - 1, c, c + 1)]
    js = np.array([j for j in cand if j >= -a], dtype=np.int64)
    h = _log_poisson(js, lam, a, phi) + np.abs(js) / t
    return a, phi, t, float(np.max(h)) + 1e-9  # above every h(j), float error included


def _poisson_offsets(lam: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` draws of K - floor(lam), K ~ Poisson(lam), as int64 (see :func:`skellam`)."""
    a, phi, t, c_max = _envelope(lam)

    def h(j: np.ndarray) -> np.ndarray:  # log target / proposal, up to a constant
        return _log_poisson(j, lam, a, phi) + np.abs(j) / t

    out = np.empty(n, dtype=np.int64)
    filled, rate = 0, (0.7 if lam >= 10 else 0.4)  # first guess, then the rate seen
    while filled < n:
        batch = int((n - filled) / rate * 1.02) + 32
        j = _discrete_laplace(t, batch, rng)
        gap = c_max - h(j)  # accept with probability exp(-gap) = P[Exp(1) > gap]
        if float(np.min(gap)) < 0.0:
            raise PrivacyError(f"internal error: Poisson({lam!r}) envelope violated by "
                               f"{-float(np.min(gap)):.3g}; no noise was released")
        acc = j[rng.standard_exponential(batch) > gap]
        rate = max(0.05, acc.size / batch)
        got = acc[: n - filled]
        out[filled:filled + got.size] = got
        filled += got.size
    return out


def skellam(
    lam: float, size: int | tuple[int, ...], rng: np.random.Generator
) -> np.ndarray:
    """Symmetric Skellam Sk(lam, lam) = Poisson(lam) - Poisson(lam): mean 0, variance 2 lam,
    as int64, exact in every bit for 0 < lam <= :data:`SKELLAM_MAX_LAM` (2^100).

    Why not numpy's Poisson: its PTRS sampler (Hormann 1993) computes the draw as a float
    floor(... + lam + 0.43), so beyond lam = 2^53 (float64's 53-bit mantissa) it can only
    return multiples of 2 (lam >= 2^53), of 64 (lam >= 2^58, e.g. 4e17), ...: the low bits
    of the Skellam noise are zero and the release reveals the sum modulo 2^k. Well below
    2^53 its acceptance test -lam + k ln lam - lgamma(k+1) already subtracts terms of size
    ~lam ln lam in float64, an absolute error of ~lam ln lam 2^-53 in the log-probability
    (a few 1e-3 at lam = 1e12), so the pmf of each integer is off by that much, unevenly.
    And numpy refuses lam > 9.2e18 with a ValueError.

    How it is drawn: each Poisson is a + J with a = floor(lam), and J drawn by rejection
    from a discrete Laplace of integer scale t = isqrt(a) + 1 (:func:`_discrete_laplace`,
    integers only), accepted with probability p(a+J) e^{|J|/t} / C, C >= the maximum of
    that ratio (found exactly, by concavity). The log-ratio is evaluated relative to the
    mode (:func:`_log_poisson`), with an absolute error of ~1e-14 whatever lam, so the
    pmf of every integer carries a relative error ~1e-14 (the same order as the vectorised
    discrete Gaussian's), uniform in the low bits. The Skellam draw is J1 - J2: a cancels,
    so no lam-sized integer is formed and the output fits int64 for every lam allowed.

    The limit: a proposal is u + t v with u < t, and v > 64 is rejected, so |J| < 65 t.
    That truncates the Poisson law beyond 65 t > 65 sqrt(lam) from floor(lam), a mass
    below 2^-300 for every lam (computed with scipy over lam in [1e-6, 1e7]: the worst
    case, 2^-304, is lam just under 1, where t = 1; for large lam the Chernoff bound gives
    about exp(-65^2/2)) -- a statistical distance far below any delta. For
    lam <= 2^100, t <= 2^50 + 1 and |J1 - J2| < 130 t < 2^58 < 2^63: int64 holds every
    output and every intermediate exactly. Larger lam is refused
    (:class:`PrivacyError`); it is useless anyway: the noise alone (std 2^50.5 per share)
    would not fit any 64-bit secure-sum ring with its tail bound.

    Draws use only ``rng`` (``noise_generator().rng``: AES-CTR in production).

    Raises:
        PrivacyError: lam is not a finite positive number, or exceeds SKELLAM_MAX_LAM (use
            ``mechanism="discrete_gaussian"`` or a coarser ``precision`` in DistributedDP).
    """
    lam_ = _check_scale("lam", lam)
    if lam_ > SKELLAM_MAX_LAM:
        raise PrivacyError(
            f"Skellam lam={lam_:.6g} is above {SKELLAM_MAX_LAM:.6g} (2^100), the largest "
            "for which the sampler is exact; use a coarser fixed-point precision (smaller "
            "integer sensitivity, hence lam) or mechanism='discrete_gaussian'")
    shape = _shape(size)
    n = math.prod(shape)
    x = _poisson_offsets(lam_, 2 * n, rng)
    return (x[:n] - x[n:]).reshape(shape)


def skellam_pmf(lam: float, support: np.ndarray) -> np.ndarray:
    """pmf of the symmetric Skellam Sk(lam, lam) at the integers ``support`` (scipy)."""
    from scipy.stats import skellam as _sk

    lam_ = _check_scale("lam", lam)
    return _sk.pmf(np.asarray(support), lam_, lam_)
