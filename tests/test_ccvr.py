"""CCVR: additive moment sums recover the paper's merged Gaussians; virtual features."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algorithms.ccvr import (
    class_moments,
    clip_rows,
    merge_gaussians,
    moments_to_gaussians,
    sample_gaussian,
    tukey,
    virtual_counts,
    virtual_features,
)
from secagg.errors import ConfigurationError


def _clients(seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    zs, ys = [], []
    for k, n in enumerate([30, 12, 1, 25]):
        zs.append(rng.standard_normal((n, 4)) * (1 + k) + k)
        y = rng.integers(0, 3, size=n)
        if k == 1:
            y[:] = np.where(y == 2, 0, y)  # client 1 holds no class 2
        ys.append(y)
    return zs, ys


def test_moment_sums_recover_pooled_mean_and_unbiased_covariance() -> None:
    zs, ys = _clients()
    mom = [class_moments(z, y, 3) for z, y in zip(zs, ys)]
    counts, sums, outer = (sum(m[i] for m in mom) for i in range(3))
    mu, cov = moments_to_gaussians(counts, sums, outer)
    z, y = np.concatenate(zs), np.concatenate(ys)
    for c in range(3):
        zc = z[y == c]
        assert counts[c] == len(zc)
        assert np.max(np.abs(mu[c] - zc.mean(axis=0))) < 1e-12
        assert np.max(np.abs(cov[c] - np.cov(zc, rowvar=False, ddof=1))) < 1e-10


def test_paper_merge_equals_moment_route() -> None:
    zs, ys = _clients()
    z, y = np.concatenate(zs), np.concatenate(ys)
    saw_single = saw_absent = False
    for c in range(3):
        means, covs, ns = [], [], []
        for zk, yk in zip(zs, ys):
            zc = zk[yk == c]
            ns.append(len(zc))
            means.append(zc.mean(axis=0) if len(zc) else np.zeros(4))
            covs.append(np.cov(zc, rowvar=False, ddof=1) if len(zc) > 1 else None)
        saw_single = saw_single or 1 in ns
        saw_absent = saw_absent or 0 in ns
        mu, cov = merge_gaussians(means, covs, ns)
        zc = z[y == c]
        assert np.max(np.abs(mu - zc.mean(axis=0))) < 1e-12
        assert np.max(np.abs(cov - np.cov(zc, rowvar=False, ddof=1))) < 1e-10
    assert saw_single and saw_absent  # the edge cases N_k = 1 and N_k = 0 were exercised


def test_absent_and_single_classes() -> None:
    counts = np.array([0.0, 1.0, 3.0])
    z = np.array([[1.0, 2.0], [0.0, 0.0], [1.0, 1.0], [2.0, 2.0]])
    y = np.array([1, 2, 2, 2])
    n, s, o = class_moments(z, y, 3)
    assert np.array_equal(n, counts)
    mu, cov = moments_to_gaussians(n, s, o)
    assert np.all(np.isnan(mu[0]))
    assert np.array_equal(mu[1], [1.0, 2.0]) and np.array_equal(cov[1], np.zeros((2, 2)))
    with pytest.raises(ConfigurationError):
        merge_gaussians([np.zeros(2)], [None], [1])


def test_clip_rows() -> None:
    z, n = clip_rows(np.array([[3.0, 4.0], [0.3, 0.4]]), 1.0)
    assert n == 1
    assert np.allclose(z, [[0.6, 0.8], [0.3, 0.4]])
    with pytest.raises(ConfigurationError):
        clip_rows(z, 0.0)


def test_sampling_rank_deficient_covariance() -> None:
    # Covariance of rank 1 along (1, 1, 0), slightly indefinite from round-off.
    v = np.array([1.0, 1.0, 0.0]) / np.sqrt(2)
    cov = 4.0 * np.outer(v, v) - 1e-12 * np.eye(3)
    rng = np.random.default_rng(0)
    x = sample_gaussian(np.array([1.0, -1.0, 2.0]), cov, 4000, rng)
    assert np.all(np.isfinite(x))
    resid = (x - [1.0, -1.0, 2.0]) - np.outer((x - [1.0, -1.0, 2.0]) @ v, v)
    assert np.max(np.abs(resid)) < 1e-5  # nothing outside the covariance's span
    assert np.var(x @ v) == pytest.approx(4.0, rel=0.1)


def test_tukey_and_counts() -> None:
    assert np.allclose(tukey(np.array([-1.0, 0.0, 4.0])), [0.0, 0.0, 2.0])
    m = virtual_counts(np.array([10.0, 30.0, 0.0, 60.0]), 100, proportional=True)
    # 100 per class on average over the 4 classes: 400 in proportion to 10/30/0/60 percent.
    assert list(m) == [40, 120, 0, 240]
    assert list(virtual_counts(np.array([1.0, 0.0]), 7, proportional=False)) == [7, 0]
    x, y = virtual_features(*class_moments(np.eye(3), np.array([0, 0, 1]), 2), per_class=5,
                            proportional=False, seed=1)
    assert x.shape == (10, 3) and list(np.bincount(y)) == [5, 5]


# -- the algorithm through the engine ------------------------------------------------------

from algorithms.ccvr import CCVR  # noqa: E402
from algorithms.models import set_flat  # noqa: E402
from algorithms.training import features  # noqa: E402
from secagg.data import dirichlet_split, load_dataset  # noqa: E402
from secagg.federation import Federation  # noqa: E402
from secagg.layers.plaintext import Plaintext  # noqa: E402
from secagg.secure_sum import SecureSum  # noqa: E402


@pytest.fixture(scope="module")
def digits_partition():
    return dirichlet_split(load_dataset("digits"), 4, alpha=0.3, seed=1)


def test_ccvr_moments_through_securesum(digits_partition) -> None:
    """Acceptance 2: pooled class mean / unbiased covariance to 1e-8, equal to Eq. 3-4."""
    algo = CCVR(local_epochs=1, feature_dim=16, feature_bound=50.0)
    Federation(algo, SecureSum(), digits_partition, rounds=1, seed=0, progress=False).run()
    assert algo.gaussians is not None and algo.feature_clips == 0
    mu, cov = algo.gaussians
    model = algo.model
    set_flat(algo.shared_parameters(model), algo.params)
    per_client = [(features(model, c.x), c.y) for c in digits_partition]
    z = np.concatenate([f for f, _ in per_client])
    y = np.concatenate([t for _, t in per_client])
    checked = 0
    for c in range(10):
        zc = z[y == c]
        if len(zc) < 2:
            continue
        assert np.max(np.abs(mu[c] - zc.mean(axis=0))) < 1e-8
        assert np.max(np.abs(cov[c] - np.cov(zc, rowvar=False, ddof=1))) < 1e-8
        means, covs, ns = [], [], []
        for f, t in per_client:
            fc = f[t == c]
            ns.append(len(fc))
            means.append(fc.mean(axis=0) if len(fc) else np.zeros(16))
            covs.append(np.cov(fc, rowvar=False, ddof=1) if len(fc) > 1 else None)
        pm, pc = merge_gaussians(means, covs, ns)
        assert np.max(np.abs(mu[c] - pm)) < 1e-8 and np.max(np.abs(cov[c] - pc)) < 1e-8
        checked += 1
    assert checked == 10


def test_ccvr_calibration_changes_only_the_head(digits_partition) -> None:
    algo = CCVR(local_epochs=1, feature_dim=16)
    res = Federation(algo, Plaintext(), digits_partition, rounds=2, seed=0, progress=False).run()
    ref = CCVR(local_epochs=1, feature_dim=16, calibrate=False)
    res0 = Federation(ref, Plaintext(), digits_partition, rounds=2, seed=0, progress=False).run()
    nb = sum(p.numel() for p in algo.model.body.parameters())
    assert np.array_equal(algo.params[:nb], ref.params[:nb])
    assert not np.allclose(algo.params[nb:], ref.params[nb:])
    assert algo.accuracy_before_calibration == pytest.approx(res0.accuracy)
    assert res.accuracy != res0.accuracy


def test_ccvr_tukey_is_applied_at_inference(digits_partition) -> None:
    algo = CCVR(local_epochs=1, feature_dim=16, tukey=0.5)
    Federation(algo, Plaintext(), digits_partition, rounds=1, seed=0, progress=False).run()
    x = torch.tensor(np.array(digits_partition.dataset.x_test[:5]))
    z = algo.model.body(x)
    lin = algo.model.head[-1]
    assert torch.allclose(algo.model(x), lin(torch.relu(z).sqrt()))
