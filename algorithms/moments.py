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
Outer products are packed as upper triangles (:func:`algorithms.spherefed.pack_upper`),
as CCVR packs them. :func:`moments_to_gaussians` is the server side.
"""

from __future__ import annotations

import numpy as np

from algorithms.spherefed import pack_upper, packed_size, unpack_upper
from secagg.errors import ConfigurationError


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
