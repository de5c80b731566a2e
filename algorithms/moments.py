"""Rewriting non-additive uploads as sums: weighted moment sums and what the server solves.

Secure summation, additive HE and summed DP noise give the server only the sum over
clients, so a field is additive only if the server wants ``sum_k f(D_k)``. Common uploads
are not, but each is a function of sums the clients can upload instead:

* a client's **mean**: upload the count ``n_k`` and the sum ``s_k = sum x``; the server
  computes ``mean = S / N``.
* its **covariance**: upload ``n_k``, ``s_k`` and ``Q_k = sum x x^T``; the server computes
  ``cov = Q/N - mean mean^T`` (or divides by ``N - 1``).
* its **class means**: per class c, ``n_c`` and ``s_c``; ``mean_c = S_c / N_c``.
* **class means and covariances** (CCVR): per class ``n_c``, ``s_c``, ``Q_c``
  (:mod:`algorithms.ccvr` uploads exactly these).
* **GMM component statistics** (EM, :mod:`algorithms.gmm`): ``N_j = sum_i r_ij``,
  ``S_j = sum_i r_ij x_i``, ``Q_j = sum_i r_ij x_i x_i^T`` for responsibilities r; the
  server computes weights ``N_j / N``, means and covariances.

Summing means instead is wrong by a factor that depends on the clients' sizes (two clients
with means 1 and 3 "sum" to 4, not to their pooled mean); :mod:`threat_models.additivity`
catches a field declared additive that is not (``f(A u B) != f(A) + f(B)``).

:func:`weighted_moments` computes all of them at once: ``weights`` is an (n, K) matrix whose
column j weights the records for component j (one-hot labels give per-class moments,
EM responsibilities give the GMM statistics, a single column of ones the plain moments).
Outer products are packed as upper triangles (:func:`pack_upper`), as CCVR and SphereFed
pack them. :func:`moments_to_gaussians` is the server side for exact sums.

**Noised sums** (a DP layer adds Gaussian noise of known std to every entry of the released
``N``, ``S`` and ``Q``; :func:`dp_sum_sigma` reads it from the aggregate's notes). Dividing
noised sums as if they were exact fails in three ways: a count at or below 0 (the
component vanishes or its mean explodes), a covariance with negative eigenvalues, and for
a small count a mean and covariance that are mostly noise. :func:`noisy_gaussians` is the
server side for noised sums, pure post-processing of the released values (it spends no
privacy, and needs only the noise stds, which are public parameters of the layer):

1. **Pooled moments.** The sums over components are the moments of all records, with
   noise std ``sqrt(K) sigma`` against ``K`` times the signal. The pooled mean is shrunk
   toward the prior's mean with weight ``p / (p + v_0)`` (``p`` the prior's variance per
   coordinate, ``v_0`` the pooled mean's noise variance). When the pooled count is not
   significantly positive (``N <= HOPELESS_Z * sigma_N``, or too small for ``ddof``) the
   data-independent prior stands in.
2. **Counts** are shrunk toward the pooled ``N / K`` by an empirical-Bayes weight
   ``w = tau^2 / (tau^2 + sigma_n^2)``, ``tau^2 = max(var(n~) - sigma_n^2, 0)`` (the spread
   of the true counts estimated by the method of moments; a spread that noise alone
   explains, by a chi-square test at level :data:`SIGNAL_LEVEL`, counts as none), and
   floored at :data:`MIN_SHARE` times their mean, so every weight is at least
   ``MIN_SHARE / (K (1 + MIN_SHARE))``: no component is ever dropped.
3. **Means** ``S_j / n~_j`` are shrunk toward their targets (the pooled mean, or per
   component the ``centres`` given: an EM step passes the current means) with weight
   ``w_j = tau^2 / (tau^2 + v_j)``, ``v_j = (sigma_s^2 + |m|^2 sigma_n^2 / d) / n~_j^2`` the
   delta-method noise variance per coordinate and ``tau^2`` the spread of the true means
   about their targets per coordinate (:func:`between_variance`: method of moments over
   the components with a significant count, each weighted by its precision). A spread
   that noise alone explains (:func:`significant_spread`, level :data:`SIGNAL_LEVEL`)
   counts as none: ``tau^2 = 0``, every mean stays on its target. A component whose count
   is not significantly positive (``n~_j <= HOPELESS_Z sigma_n``) is *hopeless*: its mean
   is its target (``w_j = 0``) and its covariance the pooled one; it is never dropped.
4. **The pooled within-component covariance** ``T`` (the pooled one less the spread of the
   shrunk means) is shrunk with the Ledoit-Wolf weight (as in step 5) toward the scaled
   identity ``s I``, ``s`` its trace per coordinate (linear in the sums, so unbiased under
   the noise) itself shrunk toward the prior's with the trace's noise variance.
5. **Covariances** are shrunk toward ``T`` with the Ledoit-Wolf weight
   ``alpha_j = min(1, E|noise|_F^2 / |C~_j - T|_F^2)``, ``E|noise|_F^2 ~ (d^2 sigma_q^2 +
   2 d sigma_s^2 |m|^2 + sigma_n^2 |m|^4) / (n~_j - ddof)^2`` (delta method).
6. **Projections.** Every covariance is projected (:func:`project_covariances`) onto
   symmetric matrices with eigenvalues in ``[floor, ceiling]``: eigenvectors kept,
   eigenvalues clipped. The floor follows the noise (:func:`noise_edge`): an eigenvalue of
   a noised covariance below ``sqrt(E|noise|_F^2 / d)``, half the noise's spectral edge,
   cannot be told from 0, and is raised to that scale (never above ``s`` for ``T``, nor
   above ``T``'s smallest eigenvalue for a component; with no noise the floor is the
   caller's). Clipping at a fixed tiny floor instead gave the GMM components a variance of
   ``reg_covar`` along a noise direction, which took every record or none. The ceiling is
   a public fact about the records when one is known (features in a ball of radius B: no
   variance exceeds B^2; records in a box: none exceeds d (high - low)^2 / 4). Means are
   projected onto the public set the records lie in (a ball or a box; the mean of records
   in a convex set lies in it), so no mean is ever absurd.

With no noise (every sigma 0) nothing is shrunk: the means and covariances of the
components with a count above ``ddof`` are :func:`moments_to_gaussians`'s, up to the
eigenvalue floor (a component with no records still gets the pooled moments and the
minimum share). The algorithms call the exact solve for exact sums, so their results
without DP are unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from secagg.errors import ConfigurationError


def packed_size(dim: int) -> int:
    """Number of entries in the packed upper triangle (diagonal included) of a d x d matrix."""
    return dim * (dim + 1) // 2


def pack_upper(m: np.ndarray) -> np.ndarray:
    """The upper triangle (diagonal included) of a square matrix, row-major, as a vector.

    Works on a batch too: ``(..., d, d) -> (..., d(d+1)/2)``.
    """
    m = np.asarray(m)
    if m.ndim < 2 or m.shape[-1] != m.shape[-2]:
        raise ConfigurationError(f"pack_upper needs square matrices, got shape {m.shape}")
    iu = np.triu_indices(m.shape[-1])
    return m[..., iu[0], iu[1]]


def unpack_upper(v: np.ndarray, dim: int) -> np.ndarray:
    """Inverse of :func:`pack_upper`: the symmetric ``(..., d, d)`` matrix of a packed vector."""
    v = np.asarray(v)
    if v.shape[-1] != packed_size(dim):
        raise ConfigurationError(
            f"packed length {v.shape[-1]} does not match d={dim} (expected {packed_size(dim)})"
        )
    out = np.zeros(v.shape[:-1] + (dim, dim), dtype=np.result_type(v.dtype, np.float64))
    iu = np.triu_indices(dim)
    out[..., iu[0], iu[1]] = v
    out[..., iu[1], iu[0]] = v
    return out


def dp_sum_sigma(notes: Mapping[str, Any], name: str) -> float:
    """The std of the noise a DP layer added to each entry of the *sum* of field ``name``,
    from an aggregate's ``notes`` (0.0 when no DP layer noised it).

    CentralDP and DistributedDP record the sum's sigma under ``notes["dp"]["fields"]``;
    LocalDP records each client's sigma there and the sum's (sigma sqrt(contributors))
    under ``notes["dp"]["sum_sigma"]``, which takes precedence.
    """
    dp = notes.get("dp") if isinstance(notes, Mapping) else None
    if not isinstance(dp, Mapping):
        return 0.0
    total = dp.get("sum_sigma")
    if isinstance(total, Mapping) and name in total:
        return float(total[name])
    fields = dp.get("fields")
    if isinstance(fields, Mapping) and isinstance(fields.get(name), Mapping):
        return float(fields[name].get("sigma", 0.0))
    return 0.0


def weighted_moments(x: np.ndarray, weights: np.ndarray | None = None
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(N (K,), S (K, d), Q (K, d(d+1)/2))``: per column j of ``weights`` (n, K; default one
    column of ones), the weight total, the weighted sum of rows of ``x`` (n, d) and the packed
    weighted sum of their outer products. All float64 and additive over records."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ConfigurationError(f"x must be (n, d), got shape {x.shape}")
    w = np.ones((x.shape[0], 1)) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.ndim != 2 or w.shape[0] != x.shape[0]:
        raise ConfigurationError(f"weights must be (n, K) with n={x.shape[0]}, got {w.shape}")
    n_k = w.sum(axis=0)
    s = w.T @ x
    q = np.einsum("nk,ni,nj->kij", w, x, x, optimize=True)
    return n_k, s, pack_upper(q)


def one_hot(y: np.ndarray, n_classes: int) -> np.ndarray:
    """(n, C) float64 indicator of labels ``y`` (weights for per-class moments)."""
    y = np.asarray(y, dtype=np.int64)
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise ConfigurationError(f"labels must lie in [0, {n_classes})")
    out = np.zeros((y.size, n_classes))
    out[np.arange(y.size), y] = 1.0
    return out


def moments_to_gaussians(n: np.ndarray, s: np.ndarray, q_packed: np.ndarray,
                         reg: float = 0.0, ddof: int = 0
                         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Server side: ``(weights (K,), means (K, d), covariances (K, d, d))`` from summed
    moments: ``mean = S/N``, ``cov = (Q - N mean mean^T) / (N - ddof) + reg I``.

    Raises:
        ConfigurationError: a component with total weight <= ddof (no covariance exists).
    """
    n = np.asarray(n, dtype=np.float64)
    s = np.asarray(s, dtype=np.float64)
    k, d = s.shape
    if q_packed.shape[-1] != packed_size(d):
        raise ConfigurationError(f"packed outer products of width {q_packed.shape[-1]} do not "
                                 f"match d={d}")
    if np.any(n <= ddof):
        j = int(np.argmin(n))
        raise ConfigurationError(f"component {j} has total weight {n[j]:.3g} <= {ddof}: its "
                                 "covariance is undefined")
    q = unpack_upper(np.asarray(q_packed, dtype=np.float64), d)
    means = s / n[:, None]
    cov = (q - n[:, None, None] * np.einsum("ki,kj->kij", means, means)) / (n - ddof)[:, None,
                                                                                       None]
    cov = 0.5 * (cov + np.swapaxes(cov, 1, 2))
    cov[:, np.arange(d), np.arange(d)] += reg
    return n / n.sum(), means, cov


# -- noised sums ---------------------------------------------------------------------------

#: A noised count is *significant* when it exceeds ``HOPELESS_Z`` noise stds (a true count
#: of 0 passes by chance with probability about 2.3%); below that a component's own moments
#: are not used (it is shrunk fully to the pooled ones).
HOPELESS_Z = 2.0

#: Under noise every (shrunk) count is at least ``MIN_SHARE`` times their mean, so every
#: weight is at least ``MIN_SHARE / (K (1 + MIN_SHARE))`` and no component is dropped.
MIN_SHARE = 0.01

#: Counts and means are shrunk toward their targets only by a spread that is significant at
#: level ``1 - SIGNAL_LEVEL`` (:func:`shrink_counts`, :func:`significant_spread`); below
#: it they stay on their targets. A pre-test: an empirical-Bayes weight estimated from K
#: noised values lets noise through (its positive part is biased up), and under EM the
#: components then drift (measured on the GMM's blobs at epsilon 1, 80 seeds: 0.58 without
#: the test, 0.63 at level 0.95, 0.645 at 0.99; at epsilon 30 the test costs 2.6 points).
SIGNAL_LEVEL = 0.99

#: The eigenvalue floor of a projected covariance, relative to the mean eigenvalue
#: (trace / d) of the pooled covariance it is shrunk toward.
REL_FLOOR = 1e-6


@dataclass(frozen=True)
class MomentNoise:
    """Per-entry standard deviation of the noise on the released sums: counts ``n``,
    first moments ``s`` and packed second moments ``q`` (all 0 for exact sums)."""

    n: float = 0.0
    s: float = 0.0
    q: float = 0.0

    def __post_init__(self) -> None:
        for name in ("n", "s", "q"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ConfigurationError(f"noise std {name} must be a finite number >= 0, "
                                         f"got {v!r}")

    @property
    def exact(self) -> bool:
        """True when no sum carries noise."""
        return self.n == 0 and self.s == 0 and self.q == 0

    @classmethod
    def from_notes(cls, notes: Mapping[str, Any], n: str, s: str, q: str) -> MomentNoise:
        """The noise a DP layer reported in an aggregate's ``notes`` for the fields named
        ``n``, ``s`` and ``q`` (:func:`dp_sum_sigma`)."""
        return cls(dp_sum_sigma(notes, n), dp_sum_sigma(notes, s), dp_sum_sigma(notes, q))

    def scaled(self, factor: float) -> MomentNoise:
        """The noise of a sum of ``factor**2`` independent such releases (std x factor)."""
        return MomentNoise(self.n * factor, self.s * factor, self.q * factor)


@dataclass(frozen=True)
class Prior:
    """Data-independent moments (mean (d,), covariance (d, d)) that stand in for the pooled
    ones when the pooled count itself is not significant."""

    mean: np.ndarray
    cov: np.ndarray


@dataclass(frozen=True)
class NoisyGaussians:
    """What :func:`noisy_gaussians` returns.

    Attributes:
        counts: (K,) shrunk counts, every one > 0.
        weights: (K,) ``counts / counts.sum()``: a simplex with every entry > 0.
        means: (K, d) finite, inside the public set given (ball or box).
        covariances: (K, d, d) symmetric, eigenvalues in ``[floor, ceiling]``.
        mean_weight: (K,) ``w_j`` in [0, 1]: 1 keeps the component's own mean, 0 is its
            target (the pooled mean, or its centre when centres were given).
        cov_weight: (K,) ``alpha_j`` in [0, 1]: the share of the pooled covariance.
        hopeless: (K,) True where the count was not significant (fully shrunk).
        mean_noise: (K,) ``v_j``, the noise variance per coordinate of the component's raw
            mean ``S_j / n_j`` (inf where hopeless); ``w_j v_j`` is the variance left in
            the shrunk mean.
        pooled_mean, pooled_cov: the pooled mean (shrunk toward the prior's) and the
            pooled within-component covariance ``T``, the covariances' target.
        prior_weight: the share of the scaled identity ``scale I`` in ``T``, or 1 when the
            pooled count was not significant and the data-independent prior stands in (0
            without noise).
        projected: how many covariances (components and pooled) had an eigenvalue clipped.
        scale: ``s``, the variance per coordinate of that scaled identity: the trace of
            the pooled within-component covariance per coordinate, shrunk toward the
            prior's (the best-measured summary of the spread: a linear statistic averaged
            over d noised entries).
    """

    counts: np.ndarray
    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray
    mean_weight: np.ndarray
    cov_weight: np.ndarray
    hopeless: np.ndarray
    mean_noise: np.ndarray
    pooled_mean: np.ndarray
    pooled_cov: np.ndarray
    prior_weight: float
    projected: int
    scale: float


def floor_eigenvalues(cov: np.ndarray, floor: float) -> tuple[np.ndarray, int]:
    """``(covariances, count)``: each symmetric ``cov[j]`` whose smallest eigenvalue is
    below half its floor replaced by the matrix with the same eigenvectors and its
    eigenvalues raised to at least the floor (the others are returned unchanged); the
    floor is ``floor``, or 1e-9 of the largest |eigenvalue| where that is larger (so that
    the result stays well conditioned in float64). ``count`` is the number replaced.
    ``floor`` 0 leaves every matrix as it is."""
    out = np.array(cov, dtype=np.float64)
    if floor <= 0:
        return out, 0
    count = 0
    for j in range(out.shape[0]):
        w, v = np.linalg.eigh(out[j])
        low = max(floor, 1e-9 * float(np.max(np.abs(w))))
        if w[0] < low / 2:
            out[j] = (v * np.maximum(w, low)) @ v.T
            out[j] = 0.5 * (out[j] + out[j].T)
            count += 1
    return out, count


def project_covariances(cov: np.ndarray, floor: float | np.ndarray,
                        ceiling: float | None = None) -> tuple[np.ndarray, int]:
    """``(covariances, count)``: each ``cov[j]`` (K, d, d) symmetrised and projected onto
    the symmetric matrices with every eigenvalue in ``[floor, ceiling]`` (eigenvectors
    kept, eigenvalues clipped: the nearest such matrix in Frobenius norm); ``floor`` is one
    number or one per matrix (K,). ``count`` is how many had an eigenvalue outside the
    interval.

    Raises:
        ConfigurationError: a negative or non-finite floor, a ceiling below a floor, or
            a non-finite matrix entry.
    """
    out = np.array(cov, dtype=np.float64)
    floors = np.broadcast_to(np.asarray(floor, dtype=np.float64), out.shape[:1])
    if not (np.all(np.isfinite(floors)) and np.all(floors >= 0)):
        raise ConfigurationError(f"floor must be a finite number >= 0, got {floor}")
    if ceiling is not None and not (math.isfinite(ceiling) and ceiling >= floors.max(
            initial=0.0)):
        raise ConfigurationError(f"ceiling must be finite and >= floor {floor}, got {ceiling}")
    if not np.all(np.isfinite(out)):
        raise ConfigurationError("a covariance to project has a non-finite entry")
    out = 0.5 * (out + np.swapaxes(out, -1, -2))
    hi = math.inf if ceiling is None else ceiling
    count = 0
    for j in range(out.shape[0]):
        w, v = np.linalg.eigh(out[j])
        if w[0] < floors[j] or w[-1] > hi:
            out[j] = (v * np.clip(w, floors[j], hi)) @ v.T
            out[j] = 0.5 * (out[j] + out[j].T)
            count += 1
    return out, count


def project_means(means: np.ndarray, radius: float | None = None,
                  box: tuple[float, float] | None = None) -> np.ndarray:
    """Rows of ``means`` (K, d) projected onto the ball of ``radius`` about 0 and/or the
    box ``[low, high]^d``: the public set the records lie in, which contains their mean."""
    out = np.array(means, dtype=np.float64)
    if radius is not None:
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        out = out * np.minimum(1.0, radius / np.maximum(norms, 1e-300))
    if box is not None:
        out = np.clip(out, box[0], box[1])
    return out


def shrink_counts(n: np.ndarray, sigma: float) -> tuple[np.ndarray, float]:
    """``(counts, w)``: noised counts ``n`` (K,) shrunk toward their mean ``N / K`` by the
    empirical-Bayes weight ``w = tau^2 / (tau^2 + sigma^2)`` with ``tau^2 = max(s^2 -
    sigma^2, 0)`` (``s^2`` the counts' sample variance, whose expectation is the true
    counts' spread plus ``sigma^2``), then floored at ``MIN_SHARE`` of the mean positive
    count, so every count is > 0. A spread that noise alone explains (``(K - 1) s^2 /
    sigma^2``, chi-square with ``K - 1`` degrees of freedom when the true counts are equal,
    below its :data:`SIGNAL_LEVEL` quantile) counts as none: ``w = 0``, the counts are
    equal (as with the means, :func:`significant_spread`; at heavy noise the positive part
    of ``s^2 - sigma^2`` let one count in ten take 60% of the weight). With ``sigma = 0``
    nothing is shrunk (``w = 1``; only the floor applies). When ``N <= 0`` every count is 1
    (uniform, ``w = 0``)."""
    n = np.asarray(n, dtype=np.float64)
    k = len(n)
    nbar = float(n.mean())
    if nbar <= 0:
        return np.ones(k), 0.0
    if sigma == 0:
        w = 1.0
    elif k < 2:
        w = 0.0
    else:
        from scipy.stats import chi2

        s2 = float(np.var(n, ddof=1))
        tau2 = max(s2 - sigma**2, 0.0)
        if (k - 1) * s2 / sigma**2 <= float(chi2.ppf(SIGNAL_LEVEL, k - 1)):
            tau2 = 0.0
        w = tau2 / (tau2 + sigma**2)
    out = np.maximum(nbar + w * (n - nbar), 0.0)
    return np.maximum(out, MIN_SHARE * float(out.sum()) / k), w


def between_variance(spread: np.ndarray, noise: np.ndarray, iterations: int = 50) -> float:
    """Method-of-moments ``tau^2`` of the random-effects model ``spread_j = tau^2 + noise_j +
    error``: ``spread_j`` the mean squared deviation per coordinate of estimate j from the
    common centre, ``noise_j`` its known noise variance. The moments are weighted by their
    precision ``1 / (tau^2 + noise_j)^2`` (iterated to the fixed point, as Paule and Mandel's
    estimator is), so one estimate drowned in noise cannot pull ``tau^2`` to 0 for all (an
    equal-weight mean did: a component of noised count ~2 beside two of ~100 set every
    mean to the pooled one). Returns 0 for no estimates; with no noise, the mean spread."""
    spread = np.asarray(spread, dtype=np.float64)
    noise = np.asarray(noise, dtype=np.float64)
    if spread.size == 0:
        return 0.0
    if np.all(noise == 0):
        return max(float(spread.mean()), 0.0)
    tau2 = 0.0
    for _ in range(iterations):
        a = 1.0 / (tau2 + noise) ** 2
        new = max(float(np.sum(a * (spread - noise)) / np.sum(a)), 0.0)
        if abs(new - tau2) <= 1e-12 * max(new, 1e-300):
            return new
        tau2 = new
    return tau2


def significant_spread(spread: np.ndarray, noise: np.ndarray, d: int,
                       level: float | None = None) -> bool:
    """Whether estimates lie farther from their targets than noise alone would put them:
    under "every true mean is its target", ``sum_j d spread_j / noise_j`` is chi-square
    with ``d K`` degrees of freedom (``spread_j`` the mean squared deviation per coordinate
    of estimate j, ``noise_j`` its noise variance per coordinate); True when the statistic
    exceeds that law's ``level`` quantile (default :data:`SIGNAL_LEVEL`), or when some
    estimate is exact (noise 0) and off its target."""
    spread = np.asarray(spread, dtype=np.float64)
    noise = np.asarray(noise, dtype=np.float64)
    if spread.size == 0:
        return False
    exact = noise <= 0
    if np.any(exact & (spread > 0)):
        return True
    from scipy.stats import chi2

    stat = float(np.sum(d * spread[~exact] / noise[~exact]))
    level = SIGNAL_LEVEL if level is None else level
    return stat > float(chi2.ppf(level, d * int(np.count_nonzero(~exact))))


def _mean_cov(n: float, s: np.ndarray, q: np.ndarray, ddof: int) -> tuple[np.ndarray,
                                                                            np.ndarray]:
    """The raw (unshrunk) mean and covariance of one component's sums (q unpacked)."""
    m = s / n
    c = (q - n * np.outer(m, m)) / (n - ddof)
    return m, 0.5 * (c + c.T)


def _cov_noise(noise: MomentNoise, mean: np.ndarray, n: float, ddof: int) -> float:
    """Delta-method ``E|noise|_F^2`` of ``(Q - n m m^T) / (n - ddof)`` from noised sums."""
    d = len(mean)
    m2 = float(mean @ mean)
    return (d * d * noise.q**2 + 2 * d * noise.s**2 * m2 + noise.n**2 * m2 * m2) / (n - ddof)**2


def noise_edge(noise_f2: float, d: int) -> float:
    """``sqrt(E|N|_F^2 / d)``: for a symmetric d x d noise matrix ``N`` of Frobenius energy
    ``noise_f2`` (entry std ``sigma = sqrt(noise_f2) / d``) this is ``sigma sqrt(d)``, half the
    edge ``2 sigma sqrt(d)`` of its eigenvalue spectrum: an eigenvalue of a noised
    covariance below it cannot be told from 0. It is the eigenvalue floor of a noised
    covariance, as :func:`algorithms.spherefed.noise_floor` is the floor of FFC's ``V``."""
    return math.sqrt(max(noise_f2, 0.0) / d)


def _lw_weight(raw: np.ndarray, target: np.ndarray, noise_f2: float) -> float:
    """Ledoit-Wolf style share of the target: ``min(1, E|noise|^2 / |raw - target|^2)``."""
    if noise_f2 <= 0:
        return 0.0
    dist = float(np.sum((raw - target) ** 2))
    return 1.0 if dist <= 0 else min(1.0, noise_f2 / dist)


def noisy_gaussians(n: np.ndarray, s: np.ndarray, q_packed: np.ndarray, noise: MomentNoise,
                    prior: Prior, *, ddof: int = 0, floor: float = 0.0,
                    ceiling: float | None = None, radius: float | None = None,
                    box: tuple[float, float] | None = None,
                    centres: np.ndarray | None = None) -> NoisyGaussians:
    """Valid per-component Gaussians from noised moment sums (the module docstring, steps
    1-6): counts ``n`` (K,), sums ``s`` (K, d), packed outer sums ``q_packed`` (K, d(d+1)/2),
    each entry with Gaussian noise of std ``noise``. ``centres`` (K, d): the means'
    shrinkage targets (default: the pooled mean for every component). Every component
    comes back with a positive weight, a finite mean inside the public ``radius`` ball /
    ``box`` and a symmetric covariance with eigenvalues in ``[max(floor, REL_FLOOR *
    trace(T) / d), ceiling]`` (``T`` the pooled covariance). Pure post-processing of the
    released sums.

    Raises:
        ConfigurationError: shapes that do not match, or a prior or centres of the wrong
            size.
    """
    n = np.asarray(n, dtype=np.float64)
    s = np.asarray(s, dtype=np.float64)
    if s.ndim != 2 or n.shape != (s.shape[0],):
        raise ConfigurationError(f"need n (K,) and s (K, d), got {n.shape} and {s.shape}")
    k, d = s.shape
    q = unpack_upper(np.asarray(q_packed, dtype=np.float64), d)
    p_mean = np.asarray(prior.mean, dtype=np.float64)
    p_cov = np.asarray(prior.cov, dtype=np.float64)
    if p_mean.shape != (d,) or p_cov.shape != (d, d):
        raise ConfigurationError(f"the prior must be (d,) and (d, d) with d={d}, got "
                                 f"{p_mean.shape} and {p_cov.shape}")
    if not np.all(np.isfinite(n)) or not np.all(np.isfinite(s)) or not np.all(np.isfinite(q)):
        raise ConfigurationError("the released sums have a non-finite entry")
    base_floor = max(floor, REL_FLOOR * float(np.trace(p_cov)) / d)

    # 1. pooled moments: K releases summed, noise sqrt(K) sigma
    pooled_noise = noise.scaled(math.sqrt(k))
    big_n = float(n.sum())
    pooled = big_n > max(HOPELESS_Z * pooled_noise.n, ddof)
    p_scale = float(np.trace(p_cov)) / d
    if pooled:
        m0, c0 = _mean_cov(big_n, s.sum(axis=0), q.sum(axis=0), ddof)
        noise0 = _cov_noise(pooled_noise, m0, big_n, ddof)
        # the pooled mean shrunk toward the prior's, whose spread per coordinate is the
        # prior's variance (for records in a box: the mean of the uniform distribution)
        v0 = (pooled_noise.s**2 + float(m0 @ m0) * pooled_noise.n**2 / d) / big_n**2
        m0 = p_mean + p_scale / (p_scale + v0) * (m0 - p_mean) if v0 > 0 else m0
    else:
        m0, c0, noise0 = p_mean.copy(), p_cov.copy(), 0.0
    m0 = project_means(m0[None], radius, box)[0]

    # 2. counts
    counts, _ = shrink_counts(n, noise.n)
    # 3. means: significant components only, shrunk toward their targets by the spread
    # about them that the noise does not explain
    significant = (n > HOPELESS_Z * noise.n) & (n > ddof)
    raw = np.zeros((k, d))
    var = np.zeros(k)
    m02 = float(m0 @ m0)
    for j in np.flatnonzero(significant):
        raw[j] = s[j] / n[j]
        var[j] = (noise.s**2 + m02 * noise.n**2 / d) / n[j] ** 2
    if centres is None:
        target = np.repeat(m0[None], k, axis=0)
    else:
        target = np.asarray(centres, dtype=np.float64)
        if target.shape != (k, d) or not np.all(np.isfinite(target)):
            raise ConfigurationError(f"centres must be finite and (K, d) = ({k}, {d}), got "
                                     f"shape {target.shape}")
        target = project_means(target, radius, box)
    spread = np.sum((raw[significant] - target[significant]) ** 2, axis=1) / d
    tau2 = between_variance(spread, var[significant])
    if tau2 > 0 and not significant_spread(spread, var[significant], d):
        tau2 = 0.0
    w = np.zeros(k)
    for j in np.flatnonzero(significant):
        w[j] = 1.0 if tau2 + var[j] == 0 else tau2 / (tau2 + var[j])
    means = project_means(target + w[:, None] * (raw - target), radius, box)

    # 4. the pooled within-component covariance: the pooled one less the spread of the
    # shrunk means (subtracted before any shrinkage: the mean spread subtracted from a
    # covariance already shrunk toward the identity could leave a direction with nothing),
    # shrunk toward the scaled identity of its own trace (Ledoit-Wolf's target; the trace
    # is linear in the sums, so unbiased under the noise, while clipping the eigenvalues of
    # a noisy matrix inflates it), eigenvalues floored at the noise's spectral scale
    share = counts / counts.sum()
    dev = means - m0
    c0 = c0 - np.einsum("k,ki,kj->ij", share, dev, dev)
    hi = math.inf if ceiling is None else ceiling
    if pooled:
        # the target's scale: the trace per coordinate, shrunk toward the prior's with
        # the noise variance of a diagonal mean (noise0 / d^3) against the prior's own
        # square (the scale is a priori uncertain by its size)
        v_t = noise0 / d**3
        w_t = 1.0 if v_t == 0 else p_scale**2 / (p_scale**2 + v_t)
        scale = min(max(p_scale + w_t * (float(np.trace(c0)) / d - p_scale), base_floor), hi)
        iso = scale * np.eye(d)
        a0 = _lw_weight(c0, iso, noise0)
        c0 = a0 * iso + (1 - a0) * c0
    else:
        scale = min(max(float(np.trace(c0)) / d, base_floor), hi)
        a0 = 1.0
    # an eigenvalue below the noise's spectral scale cannot be told from 0: raise it to
    # that scale, but never above the target's
    floor0 = max(base_floor, min(noise_edge(noise0, d), scale))
    c0_arr, projected = project_covariances(c0[None], floor0, ceiling)
    c0 = c0_arr[0]
    cov_floor = max(floor, REL_FLOOR * float(np.trace(c0)) / d)

    # 5. component covariances toward the pooled within-component one; 6. projected, the
    # floor the noise's spectral scale in the share (1 - alpha) the noised matrix has
    covs = np.repeat(c0[None], k, axis=0)
    floors = np.full(k, cov_floor)
    alpha = np.ones(k)
    low0 = float(np.linalg.eigvalsh(c0)[0])
    for j in np.flatnonzero(significant):
        mj, cj = _mean_cov(float(n[j]), s[j], q[j], ddof)
        noise_j = _cov_noise(noise, mj, float(n[j]), ddof)
        alpha[j] = _lw_weight(cj, c0, noise_j)
        covs[j] = alpha[j] * c0 + (1 - alpha[j]) * cj
        floors[j] = max(cov_floor, alpha[j] * low0 + (1 - alpha[j]) * min(
            noise_edge(noise_j, d), low0))
    covs, count = project_covariances(covs, floors, ceiling)
    return NoisyGaussians(counts=counts, weights=counts / counts.sum(), means=means,
                          covariances=covs, mean_weight=w, cov_weight=alpha,
                          hopeless=~significant,
                          mean_noise=np.where(significant, var, np.inf), pooled_mean=m0,
                          pooled_cov=c0, prior_weight=a0, scale=scale,
                          projected=projected + count)
