"""A federated Gaussian mixture: EM with additive sufficient statistics.

Every EM iteration is one round. The server broadcasts the mixture (weights, means and the
Cholesky factors of the precisions); each client computes its records' responsibilities
``r_ij`` (E-step) and uploads, per component j, ``N_j = sum_i r_ij``, ``S_j = sum_i r_ij x_i``
and ``Q_j = sum_i r_ij x_i x_i^T`` (packed upper triangle). All three are sums over records,
so the upload goes through any additive layer (plaintext, secure summation, BFV/CKKS, DP),
and the server's M-step on the summed statistics is the M-step on the pooled data:
``weights = N / sum N``, ``means = S / N``, ``cov = Q / N - means means^T + reg_covar I``,
the same update (and the same ``10 eps`` guard on ``N``) as scikit-learn's
``GaussianMixture(covariance_type="full")``.

Initialisation (round 0, phase ``init``): clients upload the global moments (count, sum,
packed sum of outer products); the server places the K initial means at
``mean + L z_j`` (``L L^T`` the global covariance, ``z_j`` standard normal from the run
seed), with equal weights and the global covariance for every component. The initial
mixture is kept in :attr:`GMM.initial` so a pooled run can start from it.

Under a DP layer the sums arrive noised: a count can come out negative, a mean far
outside the data and a covariance indefinite. The server then post-processes with the
noise stds the layer reports in the aggregate's notes (which spends no privacy):
:func:`algorithms.moments.noisy_gaussians` shrinks the counts toward equal ones, each
component's mean toward its *current* mean (the broadcast mixture, EM's own prior) and its
covariance toward the pooled within-component one, all with weights from the noise
variance, and only by what the noise does not explain (a spread of the counts or of the
means that noise alone accounts for is taken as none). A component whose count is not
significant keeps its mean and gets the pooled covariance, never dropped; every weight is
at least ``MIN_SHARE / (K (1 + MIN_SHARE))``; the means are projected into the public box
``[low, high]^d`` and the covariances onto eigenvalues in ``[floor, d (high - low)^2 / 4]``,
the floor ``reg_covar`` or, under noise, the noise's spectral scale. The pooled moments fall
back to a data-independent prior (the box's centre and the covariance of the uniform
distribution on it, ``(high - low)^2 / 12 I``) when the pooled count is itself not
significant. Two choices belong to EM itself:

* **Damped step.** The weights and covariances move from the current ones toward the
  noise-aware M-step's by :attr:`GMM.step_size`, the smallest mean-shrinkage weight of
  the components: as far as the least reliable mean. A component whose mean cannot be
  estimated cannot follow its records, and moving the others' weights and covariances
  regardless lets them take those records for good (measured on digits at epsilon 1: one
  component went to 73% of the weight; a step weighted by the components' shares instead
  of their minimum cost 2-5 points at epsilon 1-10 on the blobs below, gained 1 at 100,
  and cost 10 on digits at epsilon 10, pooled-data simulations of 80 and 8 seeds).
* **Initialisation under noise.** The initial means are drawn with the scaled identity of
  the noise-aware trace per coordinate instead of the noised covariance, whose noise
  inflates some eigenvalues: means drawn along them landed where no record is, and those
  components stayed empty.

Projected covariances are counted in :attr:`GMM.projected`; :attr:`GMM.shrinkage` keeps the
last M-step's :class:`~algorithms.moments.NoisyGaussians`. Exact sums (no DP noise
reported) take scikit-learn's update unchanged, so plaintext, SecureSum and BFV runs still
match scikit-learn.

Measured with ``benchmarks/gmm_noise.py --seeds 20`` (results and commands in
``benchmarks/results/gmm_noise.txt``; "before" is the same script on the parent of these
changes): mean clustering accuracy over seeds 0-19 (standard error ~0.03), record-level
``CentralDP`` at delta 1e-5 over the 11 releases of 10 EM rounds, the noise multiplier
calibrated to epsilon; the blobs of ``tests/test_gmm.py``, 300 records in [0, 1]^3, 5 IID
clients:

=========  =====  =====  =====  =====  =====  =====  =====  =========
epsilon    0.1    0.3    1      3      10     30     100    plaintext
=========  =====  =====  =====  =====  =====  =====  =====  =========
before     0.378  0.426  0.440  0.503  0.469  0.476  0.409  0.840
after      0.696  0.688  0.719  0.736  0.833  0.861  0.863  0.840
=========  =====  =====  =====  =====  =====  =====  =====  =========

After, the curve is non-decreasing but for 0.1 -> 0.3 (-0.008, a quarter of the standard
error); over seeds 0-59 it is non-decreasing there too (0.655 / 0.661 / 0.695 at epsilon
0.1 / 0.3 / 1, 0.843 plaintext).

Before, the solve was the gap, not the noise: at epsilon 100 the noise is not small for
the covariances (std 1.6 per entry of a component's summed second moments, against a
centred signal of ~100 records times variances ~0.01), yet the solve now reaches plaintext
there. Before, a noised covariance's negative eigenvalue was clipped to ``reg_covar`` = 1e-6
and the pooled one lost a direction the same way (the spread of the means subtracted from
an already shrunk covariance), so a component flat along a noise direction took every
record or none; a component whose count came out small had its mean set to the pooled one,
and identical components stay identical under EM (accuracy 0.36, the largest class's
share, in most runs); and one drowned component's noise pulled the estimated spread of
the means to 0 for all. Below epsilon ~1 the noise swamps every statistic and the mixture
stays near its initialisation (over seeds 0-59 the final accuracy is the initial mixture's
plus 0.007 / 0.012 / 0.019 at epsilon 0.1 / 0.3 / 1, measured ad hoc, not in
``benchmarks/``); it then rises to plaintext.
Fewer EM rounds do not close a gap here (plaintext EM needs its rounds: 0.73 after 3, 0.84
after 10, 0.94 after 20 on the blobs, 20 seeds), so the number of rounds is left to the run. On
digits (64 dimensions, 10 components, CLI defaults: 10 clients, Dirichlet 0.5, seeds 0-4;
``--dataset digits --seeds 5 --eps 1 10 100``) the DP runs read 0.274 / 0.344 / 0.614 at
epsilon 1 / 10 / 100, before 0.103 / 0.180 / 0.259; plaintext EM reads 0.258, below the DP run at
epsilon 100 (not investigated; a likely cause is scikit-learn's update with ``reg_covar``
1e-6 on pixels nearly constant within a component, which the noise-scaled floor avoids).

Records are clamped to the public box ``[low, high]^d`` before any statistic (clamped
entries are counted in :attr:`GMM.clamped`), which gives every field a declared bound: per
record ``||r|| <= 1``, ``||r (x) x|| <= ||x|| <= B sqrt(d)`` and ``||r (x) x x^T|| <= ||x||^2 <=
d B^2`` with ``B = max(|low|, |high|)``.

:meth:`GMM.evaluate` returns the clustering accuracy on the global test set: each
component is matched to one class by the Hungarian algorithm on the confusion matrix
(``scipy.optimize.linear_sum_assignment``) and the share of test records whose
most-responsible component maps to their label is reported. :meth:`GMM.score` gives the
mean log-likelihood of data under the mixture.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from scipy.linalg import solve_triangular
from scipy.special import logsumexp

from algorithms.base import Aggregate, Algorithm, ClientState, Phase
from algorithms.moments import (
    MomentNoise,
    NoisyGaussians,
    Prior,
    floor_eigenvalues,
    moments_to_gaussians,
    noisy_gaussians,
    packed_size,
    weighted_moments,
)
from secagg.data import Dataset
from secagg.errors import ConfigurationError
from secagg.federation import derive_seed
from secagg.messages import Bound, Field, UploadSpec


def precision_cholesky(cov: np.ndarray) -> np.ndarray:
    """Per component, the upper-triangular ``P`` with ``P P^T = cov^-1`` (scikit-learn's
    ``precisions_cholesky_`` for full covariances).

    Raises:
        ConfigurationError: a covariance is not positive definite (raise ``reg_covar``).
    """
    out = np.empty_like(cov)
    d = cov.shape[-1]
    for j, c in enumerate(cov):
        try:
            low = np.linalg.cholesky(c)
        except np.linalg.LinAlgError:
            raise ConfigurationError(
                f"component {j}: covariance is not positive definite; increase reg_covar"
            ) from None
        out[j] = solve_triangular(low, np.eye(d), lower=True).T
    return out


def log_gaussian(x: np.ndarray, means: np.ndarray, prec_chol: np.ndarray) -> np.ndarray:
    """(n, K) log densities of rows of ``x`` under each component."""
    n, d = x.shape
    out = np.empty((n, len(means)))
    for j, (mu, p) in enumerate(zip(means, prec_chol)):
        y = x @ p - mu @ p
        out[:, j] = np.sum(y * y, axis=1)
    log_det = np.sum(np.log(np.diagonal(prec_chol, axis1=1, axis2=2)), axis=1)
    return -0.5 * (d * np.log(2 * np.pi) + out) + log_det


def responsibilities(x: np.ndarray, weights: np.ndarray, means: np.ndarray,
                     prec_chol: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(responsibilities (n, K), per-record log-likelihood (n,)): the E-step."""
    wlp = log_gaussian(x, means, prec_chol) + np.log(weights)
    norm = logsumexp(wlp, axis=1)
    return np.exp(wlp - norm[:, None]), norm


class GMM(Algorithm):
    """Federated EM for a full-covariance Gaussian mixture.

    :attr:`step_size` is the last noise-aware M-step's damping (1 for exact sums).

    Args:
        n_components: K (default: the data set's number of classes).
        reg_covar: added to every covariance's diagonal (scikit-learn's default 1e-6).
        low, high: the public box records are clamped to (digits and the image sets are
            scaled to [0, 1]).
    """

    name: ClassVar[str] = "gmm"

    def __init__(self, n_components: int | None = None, reg_covar: float = 1e-6,
                 low: float = 0.0, high: float = 1.0) -> None:
        if n_components is not None and n_components < 1:
            raise ConfigurationError(f"n_components must be >= 1, got {n_components}")
        if not (reg_covar >= 0 and math.isfinite(reg_covar)):
            raise ConfigurationError(f"reg_covar must be a finite number >= 0, got {reg_covar}")
        if not low < high:
            raise ConfigurationError(f"the box needs low < high, got [{low}, {high}]")
        self.n_components = n_components
        self.reg_covar = float(reg_covar)
        self.low, self.high = float(low), float(high)
        self.k = 0
        self.d = 0
        self.seed = 0
        self.clamped = 0
        self.weights: np.ndarray | None = None
        self.means: np.ndarray | None = None
        self.covariances: np.ndarray | None = None
        self.initial: dict[str, np.ndarray] | None = None
        self.iterations = 0
        self.projected = 0
        self.shrinkage: NoisyGaussians | None = None
        self.step_size = 1.0

    # -- Algorithm ------------------------------------------------------------------------
    def setup(self, dataset: Dataset, clients: Sequence[ClientState], seed: int) -> None:
        """Fix K, d and the seed; the mixture is initialised in round 0's ``init`` phase."""
        self.seed = seed
        self.d = int(np.prod(dataset.input_shape))
        self.k = int(self.n_components or dataset.n_classes)
        self.weights = self.means = self.covariances = None
        self.initial = None
        self.iterations = 0
        self.clamped = 0
        self.projected = 0
        self.shrinkage = None
        self.step_size = 1.0

    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        """Round 0: ``init`` then ``em``; later rounds: ``em``."""
        return [_InitPhase(self), _EMPhase(self)] if round == 0 else [_EMPhase(self)]

    def evaluate(self, dataset: Dataset, clients: Sequence[ClientState]) -> float:
        """Clustering accuracy on the global test set (Hungarian matching of components to
        classes; 0.0 before the first M-step)."""
        if self.means is None or dataset.n_test == 0:
            return 0.0
        from scipy.optimize import linear_sum_assignment

        x = self.clamp(dataset.x_test)
        pred = np.argmax(self.predict_proba(x), axis=1)
        conf = np.zeros((self.k, dataset.n_classes))
        np.add.at(conf, (pred, dataset.y_test), 1)
        rows, cols = linear_sum_assignment(-conf)
        return float(conf[rows, cols].sum() / dataset.n_test)

    def describe(self) -> dict[str, Any]:
        """Name and hyper-parameters."""
        return {"name": self.name, "n_components": self.n_components,
                "reg_covar": self.reg_covar, "low": self.low, "high": self.high}

    # -- the mixture ----------------------------------------------------------------------
    def clamp(self, x: np.ndarray) -> np.ndarray:
        """Flatten to (n, d) float64 and clamp into the public box."""
        return np.clip(np.asarray(x, dtype=np.float64).reshape(len(x), -1), self.low, self.high)

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        """(n, K) responsibilities of already-flattened records."""
        assert self.weights is not None and self.means is not None
        assert self.covariances is not None
        return responsibilities(x, self.weights, self.means,
                                precision_cholesky(self.covariances))[0]

    def score(self, x: np.ndarray) -> float:
        """Mean log-likelihood per record of ``x`` (clamped) under the mixture."""
        assert self.weights is not None and self.means is not None
        assert self.covariances is not None
        return float(np.mean(responsibilities(self.clamp(x), self.weights, self.means,
                                              precision_cholesky(self.covariances))[1]))

    @property
    def box_bound(self) -> float:
        """B = max(|low|, |high|)."""
        return max(abs(self.low), abs(self.high))

    def spec(self, k: int) -> UploadSpec:
        """Fields ``N`` (k,), ``S`` (k, d), ``Q`` (k, d(d+1)/2), per-record bounds."""
        b, d = self.box_bound, self.d
        return UploadSpec((
            Field("N", (k,), "float64", additive=True, bound=Bound(l2=1.0, linf=1.0)),
            Field("S", (k, d), "float64", additive=True,
                  bound=Bound(l2=b * math.sqrt(d), linf=b)),
            Field("Q", (k, packed_size(d)), "float64", additive=True,
                  bound=Bound(l2=d * b * b, linf=b * b)),
        ))

    def client_statistics(self, client: ClientState, weights: np.ndarray | None = None,
                          means: np.ndarray | None = None,
                          prec_chol: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """One client's (N, S, Q): global moments without a mixture, else the E-step's."""
        raw = np.asarray(client.data.x, dtype=np.float64).reshape(len(client.data.x), -1)
        x = self.clamp(raw)
        self.clamped += int(np.count_nonzero(x != raw))
        r = None if weights is None else responsibilities(x, weights, means, prec_chol)[0]
        n, s, q = weighted_moments(x, r)
        return {"N": n, "S": s, "Q": q}

    def prior(self) -> Prior:
        """The data-independent moments of the noise-aware solve: the box's centre and the
        covariance ``(high - low)^2 / 12 I`` of the uniform distribution on the box."""
        return Prior(np.full(self.d, 0.5 * (self.low + self.high)),
                     (self.high - self.low) ** 2 / 12.0 * np.eye(self.d))

    def noisy_solve(self, n: np.ndarray, s: np.ndarray, q: np.ndarray,
                    noise: MomentNoise, centres: np.ndarray | None = None) -> NoisyGaussians:
        """The noise-aware M-step's Gaussians (module docstring): the means shrunk toward
        ``centres`` (the current means; None: the pooled mean); counts projections."""
        out = noisy_gaussians(n, s, q, noise, self.prior(), ddof=0, floor=self.reg_covar,
                              ceiling=self.d * (self.high - self.low) ** 2 / 4.0,
                              box=(self.low, self.high), centres=centres)
        self.projected += out.projected
        self.shrinkage = out
        return out

    def initialise(self, n: np.ndarray, s: np.ndarray, q: np.ndarray,
                   noise: MomentNoise | None = None) -> None:
        """Server: the initial mixture from the global moments (see the module docstring);
        ``noise``: the stds of the noise on the sums (None or zero: exact sums)."""
        if noise is None or noise.exact:
            n = np.maximum(np.asarray(n, dtype=np.float64), 10 * np.finfo(np.float64).eps)
            _, mean, cov = moments_to_gaussians(n, s, q, reg=self.reg_covar)
            cov = self._positive(cov)
        else:
            # under noise the spread of the initial means is isotropic, of the noise-aware
            # trace per coordinate: the noise inflates some eigenvalues of the noised
            # covariance, and means drawn along them land where no record is
            g = self.noisy_solve(n, s, q, noise)
            mean, cov = g.means, g.scale * np.eye(self.d)[None]
        rng = np.random.default_rng(derive_seed(self.seed, "gmm-init"))
        try:
            low = np.linalg.cholesky(cov[0])
        except np.linalg.LinAlgError:
            raise ConfigurationError("the global covariance is not positive definite; "
                                     "increase reg_covar") from None
        z = rng.standard_normal((self.k, self.d))
        self.means = mean[0] + z @ low.T
        self.weights = np.full(self.k, 1.0 / self.k)
        self.covariances = np.repeat(cov, self.k, axis=0)
        self.initial = {"weights": self.weights.copy(), "means": self.means.copy(),
                        "precisions": np.linalg.inv(self.covariances)}

    def m_step(self, n: np.ndarray, s: np.ndarray, q: np.ndarray,
               noise: MomentNoise | None = None) -> None:
        """Server: the M-step from summed statistics: scikit-learn's update for exact sums
        (``noise`` None or zero), the noise-aware one (module docstring) otherwise: means
        shrunk toward the current means, weights and covariances moved from the current
        ones by :attr:`step_size`."""
        if noise is None or noise.exact:
            n = np.maximum(np.asarray(n, dtype=np.float64), 0.0) + 10 * np.finfo(np.float64).eps
            self.weights, self.means, cov = moments_to_gaussians(n, s, q, reg=self.reg_covar)
            self.covariances = self._positive(cov)
        else:
            g = self.noisy_solve(n, s, q, noise, centres=self.means)
            step = float(np.clip(np.min(g.mean_weight), 0.0, 1.0))
            if self.weights is None or self.covariances is None:
                step = 1.0
            self.step_size = step
            self.means = g.means
            self.weights = (1 - step) * self.weights + step * g.weights if step < 1 \
                else g.weights
            self.covariances = (1 - step) * self.covariances + step * g.covariances \
                if step < 1 else g.covariances
        self.iterations += 1

    def _positive(self, cov: np.ndarray) -> np.ndarray:
        """Covariances projected to eigenvalues >= reg_covar (counted)."""
        cov, count = floor_eigenvalues(cov, self.reg_covar)
        self.projected += count
        return cov


class _InitPhase(Phase):
    name: ClassVar[str] = "init"

    def __init__(self, algo: GMM) -> None:
        self.algo = algo

    def spec(self) -> UploadSpec:
        return self.algo.spec(1)

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: E501
        return self.algo.client_statistics(client)

    def server_step(self, aggregate: Aggregate) -> None:
        self.algo.initialise(aggregate["N"], aggregate["S"], aggregate["Q"],
                             MomentNoise.from_notes(aggregate.notes, "N", "S", "Q"))


class _EMPhase(Phase):
    name: ClassVar[str] = "em"

    def __init__(self, algo: GMM) -> None:
        self.algo = algo

    def spec(self) -> UploadSpec:
        return self.algo.spec(self.algo.k)

    def broadcast(self) -> dict[str, np.ndarray]:
        a = self.algo
        if a.means is None or a.covariances is None or a.weights is None:
            raise ConfigurationError("the GMM has no mixture yet: the init phase must run first")
        return {"weights": a.weights, "means": a.means,
                "prec_chol": precision_cholesky(a.covariances)}

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: E501
        return self.algo.client_statistics(client, np.asarray(broadcast["weights"]),
                                           np.asarray(broadcast["means"]),
                                           np.asarray(broadcast["prec_chol"]))

    def server_step(self, aggregate: Aggregate) -> None:
        self.algo.m_step(aggregate["N"], aggregate["S"], aggregate["Q"],
                         MomentNoise.from_notes(aggregate.notes, "N", "S", "Q"))

    def client_flops(self, client: ClientState) -> float:
        a = self.algo
        return float(client.n_records * a.k * (2 * a.d * a.d + a.d * (a.d + 1)))


__all__ = ["GMM", "floor_eigenvalues", "log_gaussian", "precision_cholesky",
           "responsibilities"]
