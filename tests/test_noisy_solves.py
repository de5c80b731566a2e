"""Every server solve under heavy DP noise returns a valid model (issue 25, point 1).

CCVR, the GMM and SphereFed's FFC each receive noised sums through a DP layer (or, for the
pure math, sums with Gaussian noise of a known std). Whatever the noise, every class or
component must come back present, with finite parameters, symmetric positive
semi-definite covariances and, for the GMM, weights on the simplex. Imports of the new
helpers are inside the tests that use them, so that the engine-level tests also run (and
fail) against the code before the change.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from algorithms.ccvr import CCVR, class_moments, moments_to_gaussians
from algorithms.gmm import GMM, responsibilities
from algorithms.spherefed import SphereFed, noise_floor
from secagg import CentralDP, Federation, Plaintext
from secagg.data import Dataset, dirichlet_split, iid_split, load_dataset
from secagg.errors import ConfigurationError


def assert_psd(cov: np.ndarray) -> None:
    """Symmetric, finite, and every eigenvalue >= 0 up to 1e-9 of the largest."""
    cov = np.asarray(cov)
    assert np.all(np.isfinite(cov))
    assert np.allclose(cov, np.swapaxes(cov, -1, -2), atol=0, rtol=1e-12)
    for c in cov.reshape(-1, cov.shape[-1], cov.shape[-1]):
        e = np.linalg.eigvalsh(c)
        assert e[0] >= -1e-9 * max(abs(e[-1]), 1.0), e


@pytest.fixture(scope="module")
def digits_part():
    return dirichlet_split(load_dataset("digits"), 6, 0.5, seed=0)


@pytest.fixture(scope="module")
def blobs():
    from sklearn.datasets import make_blobs

    x, y = make_blobs(n_samples=400, centers=[[0, 0, 0], [3, 1, 0], [0, 4, 2]],
                      cluster_std=[0.6, 0.9, 0.7], random_state=0)
    x = (x - x.min(0)) / (x.max(0) - x.min(0))
    ds = Dataset("blobs", x[:300].astype(np.float32), y[:300], x[300:].astype(np.float32),
                 y[300:], 3, (3,))
    return iid_split(ds, n_clients=5, seed=0)


# -- the math (algorithms.moments) ----------------------------------------------------------

def _class_sums(seed: int = 0, n_per: tuple[int, ...] = (400, 300, 200, 5)):
    """Exact per-class sums of 4-d features: three well-populated classes, one tiny."""
    rng = np.random.default_rng(seed)
    z, y = [], []
    for c, n in enumerate(n_per):
        z.append(rng.standard_normal((n, 4)) * (0.5 + 0.2 * c) + 2.0 * np.eye(4)[c])
        y.append(np.full(n, c))
    return class_moments(np.concatenate(z), np.concatenate(y), len(n_per))


def _noised(sums, sigma, rng):
    n, s, q = sums
    return (n + rng.normal(0, sigma[0], n.shape), s + rng.normal(0, sigma[1], s.shape),
            q + rng.normal(0, sigma[2], q.shape))


def test_noisy_gaussians_tend_to_the_exact_moments_as_the_noise_vanishes() -> None:
    from algorithms.moments import MomentNoise, Prior, noisy_gaussians

    sums = _class_sums()
    mu, cov = moments_to_gaussians(*sums)
    rng = np.random.default_rng(1)
    prior = Prior(np.zeros(4), np.eye(4))
    errs = []
    for sigma in (1e-1, 1e-3, 1e-6):
        g = noisy_gaussians(*_noised(sums, (sigma,) * 3, rng), MomentNoise(sigma, sigma, sigma),
                            prior, ddof=1)
        errs.append((np.max(np.abs(g.means - mu)), np.max(np.abs(g.covariances - cov))))
        assert not g.hopeless.any()
    assert errs[-1][0] < 1e-5 and errs[-1][1] < 1e-4
    assert errs[0][0] > errs[-1][0]


def test_shrinkage_beats_dividing_the_noised_sums() -> None:
    """Over noise draws, the shrunk class means and covariances are closer to the exact
    ones than the plain division of the noised sums (whose covariances are indefinite)."""
    from algorithms.moments import MomentNoise, Prior, noisy_gaussians

    sums = _class_sums(n_per=(60, 40, 30, 20))
    mu, cov = moments_to_gaussians(*sums)
    sigma = MomentNoise(3.0, 6.0, 12.0)
    rng = np.random.default_rng(2)
    raw_err = shrunk_err = 0.0
    indefinite = 0
    for _ in range(30):
        noised = _noised(sums, (sigma.n, sigma.s, sigma.q), rng)
        g = noisy_gaussians(*noised, sigma, Prior(np.zeros(4), np.eye(4)), ddof=1)
        assert_psd(g.covariances)
        rmu, rcov = moments_to_gaussians(*noised)
        indefinite += int(np.any(np.linalg.eigvalsh(rcov)[:, 0] < 0))
        raw_err += np.sum((rmu - mu) ** 2) + np.sum((rcov - cov) ** 2)
        shrunk_err += np.sum((g.means - mu) ** 2) + np.sum((g.covariances - cov) ** 2)
    assert indefinite > 0  # the noise really breaks the plain division
    assert shrunk_err < 0.5 * raw_err


def test_a_hopeless_class_is_shrunk_to_the_pooled_moments_not_dropped() -> None:
    from algorithms.moments import MIN_SHARE, MomentNoise, Prior, noisy_gaussians

    n, s, q = _class_sums(n_per=(400, 300, 200, 0))
    n = n.copy()
    n[3] = -7.0  # a noised count below zero
    g = noisy_gaussians(n, s, q, MomentNoise(5.0, 1e-3, 1e-3), Prior(np.zeros(4), np.eye(4)),
                        ddof=1)
    assert list(g.hopeless) == [False, False, False, True]
    assert g.mean_weight[3] == 0 and g.cov_weight[3] == 1
    assert np.allclose(g.means[3], g.pooled_mean) and np.allclose(g.covariances[3], g.pooled_cov)
    assert np.all(g.weights >= MIN_SHARE / (4 * (1 + MIN_SHARE)))
    assert g.weights.sum() == pytest.approx(1.0)
    assert_psd(g.covariances)
    # nothing significant at all: the data-independent prior stands in
    prior = Prior(np.full(4, 0.5), 0.2 * np.eye(4))
    g = noisy_gaussians(np.array([-3.0, 1.0, 2.0, -1.0]), s, q, MomentNoise(50.0, 1.0, 1.0),
                        prior, ddof=1)
    assert g.hopeless.all() and g.prior_weight == 1.0
    assert np.allclose(g.means, 0.5) and np.allclose(g.covariances, 0.2 * np.eye(4))


def test_one_drowned_component_does_not_shrink_the_well_measured_means() -> None:
    """Two components of count 200 with distinct means beside one of count 4.5 whose noised
    mean came out on the pooled mean. Before, the spread of the true means was an
    equal-weight average over the components, and the drowned one's noise variance (~3)
    pulled it below 0: every mean was shrunk to the pooled one."""
    from algorithms.moments import MomentNoise, Prior, noisy_gaussians, pack_upper

    d = 4
    mu = np.array([[1.0] * d, [-1.0] * d, [0.0] * d])
    n = np.array([200.0, 200.0, 4.5])
    s = n[:, None] * mu
    s[2] = n[2] * (s.sum(axis=0) / n.sum())
    q = np.stack([pack_upper(nj * (np.outer(m, m) + 0.1 * np.eye(d))) for nj, m in zip(n, mu)])
    g = noisy_gaussians(n, s, q, MomentNoise(2.0, 8.0, 1.0), Prior(np.zeros(d), np.eye(d)))
    assert not g.hopeless.any()
    assert np.all(g.mean_weight[:2] > 0.99)
    assert np.allclose(g.means[:2], mu[:2], atol=0.01)


def test_noised_covariances_are_floored_at_the_noise_scale_not_at_reg_covar(blobs) -> None:
    """Per-class moments of the blobs (records in [0, 1]^3) with the noise a record-level
    CentralDP release at epsilon 100 over 11 EM releases adds. Before, an eigenvalue the
    noise pushed below 0 was clipped to reg_covar = 1e-6 (a component flat along a noise
    direction takes every record or none); the pooled covariance too, after the spread of
    the means was subtracted from an already shrunk one."""
    from algorithms.moments import MomentNoise, Prior, noisy_gaussians, one_hot, weighted_moments

    x = blobs.dataset.x_train.astype(np.float64)
    y = blobs.dataset.y_train
    n, s, q = weighted_moments(x, one_hot(y, 3))
    smallest = min(np.linalg.eigvalsh(np.cov(x[y == c].T, bias=True))[0] for c in range(3))
    noise = MomentNoise(0.54, 0.94, 1.63)
    rng = np.random.default_rng(0)
    for _ in range(20):
        g = noisy_gaussians(*_noised((n, s, q), (noise.n, noise.s, noise.q), rng), noise,
                            Prior(np.full(3, 0.5), np.eye(3) / 12), floor=1e-6, ceiling=0.75,
                            box=(0.0, 1.0))
        assert_psd(g.covariances)
        assert np.linalg.eigvalsh(g.covariances)[:, 0].min() > 0.25 * smallest
        assert np.linalg.eigvalsh(g.pooled_cov)[0] > 0.25 * smallest


def test_hopeless_components_keep_their_centres() -> None:
    """With per-component centres (an EM step passes the current means), a component whose
    count is drowned keeps its centre, so two drowned components stay apart; without
    centres both go to the pooled mean."""
    from algorithms.moments import MomentNoise, Prior, noisy_gaussians

    n, s, q = _class_sums(n_per=(400, 300, 0, 0))
    n = n.copy()
    n[2:] = [-3.0, 1.0]
    centres = np.array([[2.0, 0, 0, 0], [0, 2.0, 0, 0], [0, 0, 1.5, 0], [0, 0, 0, 1.5]])
    noise = MomentNoise(5.0, 1e-3, 1e-3)
    g = noisy_gaussians(n, s, q, noise, Prior(np.zeros(4), np.eye(4)), ddof=1,
                        centres=centres)
    assert list(g.hopeless) == [False, False, True, True]
    assert np.allclose(g.means[2:], centres[2:])
    plain = noisy_gaussians(n, s, q, noise, Prior(np.zeros(4), np.eye(4)), ddof=1)
    assert np.allclose(plain.means[2], plain.means[3])
    with pytest.raises(ConfigurationError, match="centres"):
        noisy_gaussians(n, s, q, noise, Prior(np.zeros(4), np.eye(4)), centres=centres[:2])


def test_projection_respects_the_public_sets() -> None:
    from algorithms.moments import MomentNoise, Prior, noisy_gaussians, project_covariances

    a = np.array([[[2.0, 0.0], [0.0, -1.0]], [[5.0, 0.0], [0.0, 0.5]]])
    out, count = project_covariances(a, 0.1, 3.0)
    assert count == 2
    assert np.allclose(np.linalg.eigvalsh(out), [[0.1, 2.0], [0.5, 3.0]])
    n, s, q = _class_sums()
    g = noisy_gaussians(n, s * 50, q, MomentNoise(1.0, 1.0, 1.0),
                        Prior(np.zeros(4), np.eye(4)), ddof=1, ceiling=4.0, radius=1.5)
    assert np.all(np.linalg.norm(g.means, axis=1) <= 1.5 + 1e-12)
    assert np.all(np.linalg.eigvalsh(g.covariances) <= 4.0 + 1e-9)


# -- CCVR -----------------------------------------------------------------------------------

def test_ccvr_under_heavy_noise_keeps_every_class_with_a_valid_gaussian(digits_part) -> None:
    """Client-level central DP at epsilon 0.05: every noised count is noise. Before, classes
    whose count came out <= 0 got NaN moments and no virtual features, the others
    indefinite covariances (or the calibration was skipped outright)."""
    algo = CCVR(local_epochs=1, feature_dim=8, clip=1.0, calib_epochs=1)
    layer = CentralDP(Plaintext(), epsilon=0.05, delta=1e-5, adjacency="client", seed=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = Federation(algo, layer, digits_part, rounds=1, seed=0, max_records=500,
                         progress=False).run()
    assert res.failure() is None
    assert algo.calibration_skipped is None and algo.gaussians is not None
    mu, cov = algo.gaussians
    assert mu.shape == (10, 8) and np.all(np.isfinite(mu))
    assert np.all(np.linalg.norm(mu, axis=1) <= algo.feature_bound + 1e-9)
    assert_psd(cov)
    from algorithms.ccvr import virtual_counts

    assert np.all(virtual_counts(algo.shrinkage.counts, algo.virtual_per_class) > 0)
    # every count is drowned: the virtual features carry no label information, so the
    # calibration keeps the trained head (strength 0) instead of pulling it toward chance
    assert algo.calibration_strength == 0.0
    assert res.accuracy == pytest.approx(algo.accuracy_before_calibration)
    assert res.measurements[-1]["calibration_strength"] == 0.0


def test_ccvr_calibration_strength_is_one_without_noise_and_falls_with_it() -> None:
    from algorithms.ccvr import calibration_strength, noisy_class_gaussians
    from algorithms.moments import MomentNoise

    sums = _class_sums(n_per=(200, 150, 100, 80))
    rng = np.random.default_rng(4)
    strengths = []
    for sigma in (1e-6, 0.3, 3.0, 300.0):
        g = noisy_class_gaussians(*_noised(sums, (sigma,) * 3, rng),
                                  MomentNoise(sigma, sigma, sigma), feature_bound=10.0)
        assert_psd(g.covariances)
        strengths.append(calibration_strength(g))
    assert strengths[0] == pytest.approx(1.0, abs=1e-6)
    assert strengths == sorted(strengths, reverse=True)
    assert strengths[-1] == 0.0


# -- the GMM --------------------------------------------------------------------------------

def test_gmm_under_heavy_noise_keeps_weights_on_the_simplex_and_covariances_valid(blobs):
    """Record-level central DP at epsilon 0.01 on every EM release. Before, noised counts
    went to 0 (weights ~1e-19: a dropped component) and means to ~1e18, far outside the
    public box the records are clamped to."""
    gmm = GMM()
    layer = CentralDP(Plaintext(), epsilon=0.01, delta=1e-5, seed=5)
    res = Federation(gmm, layer, blobs, rounds=3, seed=0, progress=False).run()
    assert res.failure() is None and gmm.iterations == 3
    k, d = 3, 3
    assert gmm.weights.shape == (k,) and gmm.weights.sum() == pytest.approx(1.0)
    # no component dropped: every weight >= MIN_SHARE / (K (1 + MIN_SHARE)), MIN_SHARE = 0.01
    assert np.all(gmm.weights >= 0.01 / (k * 1.01))
    assert np.all(np.isfinite(gmm.means))
    assert np.all((gmm.means >= gmm.low) & (gmm.means <= gmm.high))
    assert_psd(gmm.covariances)
    e = np.linalg.eigvalsh(gmm.covariances)
    assert np.all(e >= gmm.reg_covar * (1 - 1e-9))
    assert np.all(e <= d * (gmm.high - gmm.low) ** 2 / 4 * (1 + 1e-9))
    from algorithms.gmm import precision_cholesky

    x = blobs.dataset.x_test.astype(np.float64)
    r, ll = responsibilities(x, gmm.weights, gmm.means, precision_cholesky(gmm.covariances))
    assert np.all(np.isfinite(r)) and np.all(np.isfinite(ll))
    assert 0.0 <= res.accuracy <= 1.0
    # the components stay apart: before, every drowned mean went to the pooled one, and
    # identical components stay identical under EM (accuracy: the largest class's share)
    dist = np.linalg.norm(gmm.means[:, None] - gmm.means[None], axis=-1)
    assert dist[np.triu_indices(k, 1)].min() > 0.05


def test_gmm_accuracy_does_not_fall_as_epsilon_grows(blobs) -> None:
    """Mean clustering accuracy over 6 seeds under record-level CentralDP over 10 EM rounds
    (11 releases), blobs of 300 records in [0, 1]^3, at the noise multipliers that
    ``calibrate(eps, 1e-5, rounds=11, rel_tol=0.05)`` gives for epsilon 0.3 / 3 / 30
    (given directly: calibrating at 30 alone costs 4 s); and epsilon 30 as good as
    plaintext, within 5 points. Before, the DP runs collapsed to the largest class's share,
    0.36, on most seeds, and accuracy fell from epsilon 3 to 30 (0.50 / 0.48 over 20 seeds
    in ``benchmarks/results/gmm_noise.txt``, against 0.84 plaintext)."""
    means = []
    for z in (37.64, 4.655, 0.7148, None):
        accs = []
        for seed in range(6):
            layer = (Plaintext() if z is None else
                     CentralDP(Plaintext(), noise_multiplier=z, delta=1e-5, seed=100 + seed))
            res = Federation(GMM(), layer, blobs, rounds=10, seed=seed, progress=False).run()
            accs.append(res.accuracy)
        means.append(float(np.mean(accs)))
    assert means[:3] == sorted(means[:3]), means
    assert means[2] > means[0] + 0.1, means
    assert means[2] >= means[3] - 0.05, means


@pytest.fixture(scope="module")
def ccvr_body(digits_part):
    """CCVR's body after 3 plaintext FedAvg rounds, and the exact per-class moment sums of
    the training features (clipped to the feature bound 4)."""
    from algorithms.ccvr import clip_rows
    from algorithms.training import features

    algo = CCVR(feature_dim=16, local_epochs=1, calibrate=False, feature_bound=4.0)
    Federation(algo, Plaintext(), digits_part, rounds=3, seed=0, progress=False).run()
    ds = digits_part.dataset
    z, _ = clip_rows(features(algo.model, ds.x_train), algo.feature_bound)
    return algo, algo.params.copy(), class_moments(z, ds.y_train, ds.n_classes)


def test_ccvr_accuracy_does_not_fall_as_epsilon_grows(ccvr_body) -> None:
    """Mean test accuracy over 5 noise draws after CCVR's calibration from the moments of
    one record-level Gaussian release at (epsilon, 1e-5): noise std z sqrt(3) Delta on each
    of the three fields (the layer's equal split; Delta 1, B, B^2)."""
    from algorithms.models import set_flat
    from algorithms.moments import MomentNoise
    from algorithms.training import accuracy
    from secagg.privacy.calibrate import calibrate

    algo, params, (n, s, q) = ccvr_body
    ds = algo.dataset
    b = algo.feature_bound
    means = []
    for eps in (0.3, 3.0, 10.0):
        z = calibrate(eps, 1e-5, rel_tol=0.05) * np.sqrt(3)
        noise = MomentNoise(z, z * b, z * b * b)
        accs = []
        for seed in range(5):
            rng = np.random.default_rng(seed)
            algo.params, algo.seed = params.copy(), seed
            algo.recalibrate(*_noised((n, s, q), (noise.n, noise.s, noise.q), rng), noise)
            set_flat(algo.shared_parameters(algo.model), algo.params)
            accs.append(accuracy(algo.model, ds.x_test, ds.y_test))
        means.append(float(np.mean(accs)))
    assert means == sorted(means), means
    assert means[-1] > means[0] + 0.1, means


# -- SphereFed ------------------------------------------------------------------------------

def test_spherefed_ridge_follows_the_noise_under_heavy_noise(digits_part) -> None:
    """epsilon 0.01: the noised V is indefinite; lam="auto" inverts V with its eigenvalues
    floored at the noise scale, lam=0 inverts the indefinite V as it is."""
    infos = {}
    for lam in ("auto", 0.0):
        algo = SphereFed(body="public", feature_dim=16, lam=lam)
        layer = CentralDP(Plaintext(), epsilon=0.01, delta=1e-5, seed=7)
        Federation(algo, layer, digits_part, rounds=1, seed=0, progress=False).run()
        head = algo.ffc_head
        assert head.shape == (10, 16) and np.all(np.isfinite(head))
        assert np.all(np.linalg.norm(head, axis=1) > 0)  # every class has a head row
        infos[lam] = algo.ffc_solve_info
    auto = infos["auto"]
    assert auto["sigma_V"] > 0
    assert auto["floor"] == pytest.approx(noise_floor(auto["sigma_V"], 16))
    assert auto["min_eigenvalue"] >= auto["floor"] > 0
    assert infos[0.0]["min_eigenvalue"] < 0  # the noise made V indefinite


def test_spherefed_accuracy_does_not_fall_as_epsilon_grows(digits_part) -> None:
    """Mean test accuracy over 3 seeds on a small epsilon grid (public body, lam="auto")."""
    means = []
    for eps in (0.05, 0.5, 5.0):
        accs = []
        for seed in range(3):
            layer = CentralDP(Plaintext(), epsilon=eps, delta=1e-5, seed=100 + seed)
            res = Federation(SphereFed(body="public", feature_dim=16, lam="auto"), layer,
                             digits_part, rounds=1, seed=seed, progress=False).run()
            accs.append(res.accuracy)
        means.append(float(np.mean(accs)))
    assert means == sorted(means), means
    assert means[-1] > means[0] + 0.2, means
