"""Federated GMM (EM on additive sufficient statistics) vs scikit-learn on pooled data."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from sklearn.datasets import make_blobs
from sklearn.exceptions import ConvergenceWarning
from sklearn.mixture import GaussianMixture

from algorithms.gmm import GMM
from algorithms.moments import moments_to_gaussians, one_hot, weighted_moments
from secagg import Federation
from secagg.data import Dataset, iid_split
from secagg.errors import ConfigurationError
from secagg.homomorphic import Homomorphic
from secagg.layers.plaintext import Plaintext
from secagg.secure_sum import SecureSum

ROUNDS = 6


@pytest.fixture(scope="module")
def blobs():
    x, y = make_blobs(n_samples=400, centers=[[0, 0, 0], [3, 1, 0], [0, 4, 2]],
                      cluster_std=[0.6, 0.9, 0.7], random_state=0)
    x = (x - x.min(0)) / (x.max(0) - x.min(0))          # into the public box [0, 1]^3
    ds = Dataset("blobs", x[:300].astype(np.float32), y[:300], x[300:].astype(np.float32),
                 y[300:], 3, (3,))
    return iid_split(ds, n_clients=5, seed=0)


def pooled_sklearn(gmm: GMM, part) -> GaussianMixture:
    x = np.concatenate([c.x for c in part]).astype(np.float64)
    sk = GaussianMixture(3, covariance_type="full", reg_covar=gmm.reg_covar, max_iter=ROUNDS,
                         tol=0.0, weights_init=gmm.initial["weights"],
                         means_init=gmm.initial["means"],
                         precisions_init=gmm.initial["precisions"], random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        return sk.fit(x)


@pytest.mark.parametrize("layer", [Plaintext, lambda: SecureSum(precision=1e-10),
                                   lambda: Homomorphic("bfv", precision=1e-10)],
                         ids=["plaintext", "secure-sum", "bfv"])
def test_gmm_matches_sklearn_on_pooled_data(blobs, layer):
    gmm = GMM()
    res = Federation(gmm, layer(), blobs, rounds=ROUNDS, seed=0).run()
    assert gmm.iterations == ROUNDS
    sk = pooled_sklearn(gmm, blobs)
    assert np.max(np.abs(gmm.weights - sk.weights_)) < 1e-6
    assert np.max(np.abs(gmm.means - sk.means_)) < 1e-6
    assert np.max(np.abs(gmm.covariances - sk.covariances_)) < 1e-6
    assert res.accuracy == pytest.approx(matched_accuracy(sk, blobs.dataset))
    x_test = blobs.dataset.x_test.astype(np.float64)
    assert abs(gmm.score(x_test) - sk.score(x_test)) < 1e-5


def matched_accuracy(sk: GaussianMixture, ds) -> float:
    from scipy.optimize import linear_sum_assignment

    conf = np.zeros((3, 3))
    np.add.at(conf, (sk.predict(ds.x_test.astype(np.float64)), ds.y_test), 1)
    r, c = linear_sum_assignment(-conf)
    return conf[r, c].sum() / ds.n_test


def test_gmm_converges_to_the_blobs(blobs):
    res = Federation(GMM(), Plaintext(), blobs, rounds=30, seed=0).run()
    assert res.accuracy > 0.9 > res.history[0]


def test_moment_rewrite_recovers_class_means_and_covariances(blobs):
    x = np.concatenate([c.x for c in blobs]).astype(np.float64)
    y = np.concatenate([c.y for c in blobs])
    parts = [weighted_moments(c.x, one_hot(c.y, 3)) for c in blobs]
    n, s, q = (sum(p[i] for p in parts) for i in range(3))
    w, means, cov = moments_to_gaussians(n, s, q, ddof=1)
    for c in range(3):
        assert np.allclose(means[c], x[y == c].mean(0), atol=1e-12)
        assert np.allclose(cov[c], np.cov(x[y == c].T), atol=1e-12)
    assert np.allclose(w, np.bincount(y) / len(y))
    with pytest.raises(ConfigurationError, match="component 1"):
        moments_to_gaussians(np.array([3.0, 1.0]), s[:2], q[:2], ddof=1)


def test_gmm_clamps_to_the_public_box_and_counts(blobs):
    gmm = GMM(high=0.5)
    Federation(gmm, Plaintext(), blobs, rounds=1, seed=0).run()
    assert gmm.clamped > 0


def test_gmm_runs_under_dp_noise_with_covariances_projected_to_positive_definite(digits):
    """Noised sums can give an indefinite covariance (before: numpy's LinAlgError in the
    initialisation at the CLI defaults under every DP layer); the server floors its
    eigenvalues at reg_covar (post-processing) and counts it, and EM goes on."""
    from secagg.data import dirichlet_split
    from secagg.privacy import CentralDP

    part = dirichlet_split(digits, 10, 0.5, seed=0, local_test_fraction=0.2)
    gmm = GMM()
    layer = CentralDP(Plaintext(), epsilon=1.0, delta=1e-5, rounds=2)
    res = Federation(gmm, layer, part, rounds=2, seed=0, progress=False).run()
    assert res.failure() is None and 0.0 <= res.accuracy <= 1.0
    assert gmm.projected > 0
    assert np.all(np.linalg.eigvalsh(gmm.covariances) > 0)
    assert np.all(gmm.weights >= 0) and gmm.weights.sum() == pytest.approx(1.0)


def test_exact_covariances_are_left_as_they_are():
    from algorithms.gmm import floor_eigenvalues

    a = np.array([[[2.0, 0.5], [0.5, 1.0]], [[1.0, 0.0], [0.0, -0.3]]])
    out, count = floor_eigenvalues(a, 1e-6)
    assert count == 1 and np.array_equal(out[0], a[0])
    assert np.linalg.eigvalsh(out[1]).min() == pytest.approx(1e-6)
    assert out[1][0, 0] == pytest.approx(1.0)
