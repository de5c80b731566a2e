"""SphereFed: the fixed orthonormal classifier, packing, and the FFC solve."""

from __future__ import annotations

import numpy as np
import pytest

from algorithms.spherefed import (
    ffc_solve,
    ffc_statistics,
    normalise,
    orthonormal_classifier,
    pack_upper,
    packed_size,
    unpack_upper,
)
from secagg.errors import ConfigurationError


def test_orthonormal_rows_and_seed() -> None:
    w = orthonormal_classifier(10, 32, seed=3)
    assert w.shape == (10, 32)
    assert np.allclose(w @ w.T, np.eye(10), atol=1e-12)
    assert np.array_equal(w, orthonormal_classifier(10, 32, seed=3))
    assert not np.allclose(w, orthonormal_classifier(10, 32, seed=4))
    with pytest.raises(ConfigurationError, match="C <= d"):
        orthonormal_classifier(11, 10)


def test_pack_roundtrip() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((5, 5))
    s = a + a.T
    p = pack_upper(s)
    assert p.shape == (packed_size(5),) == (15,)
    assert np.array_equal(unpack_upper(p, 5), s)
    batch = np.stack([s, 2 * s])
    assert np.array_equal(unpack_upper(pack_upper(batch), 5), batch)
    with pytest.raises(ConfigurationError):
        unpack_upper(p[:-1], 5)
    with pytest.raises(ConfigurationError):
        pack_upper(np.zeros((2, 3)))


def _pooled_problem(seed: int = 0) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    rng = np.random.default_rng(seed)
    d, c = 6, 4
    zs, ys = [], []
    for k in range(3):
        n = 20 + 7 * k
        zs.append(normalise(rng.standard_normal((n, d)) + 0.3))
        ys.append(rng.integers(0, c, size=n))
    return zs, ys, c


@pytest.mark.parametrize("lam", [0.0, 0.1])
def test_ffc_equals_pooled_least_squares(lam: float) -> None:
    zs, ys, c = _pooled_problem()
    v = sum(ffc_statistics(z, y, c)[0] for z, y in zip(zs, ys))
    u = sum(ffc_statistics(z, y, c)[1] for z, y in zip(zs, ys))
    w = ffc_solve(v, u, lam)
    z = np.concatenate(zs)
    y = np.concatenate(ys)
    target = np.eye(c)[y]
    d = z.shape[1]
    # Ridge as an augmented ordinary least-squares problem, solved independently by lstsq.
    za = np.vstack([z, np.sqrt(lam) * np.eye(d)])
    ya = np.vstack([target, np.zeros((d, c))])
    ref = np.linalg.lstsq(za, ya, rcond=None)[0]
    assert w.shape == (c, d)
    assert np.max(np.abs(w - ref.T)) < 1e-10


def test_ffc_statistics_shapes_and_trace() -> None:
    zs, ys, c = _pooled_problem()
    v, u = ffc_statistics(zs[0], ys[0], c)
    # Unit-norm features: trace(V) = n exactly; column sums of U hold per-class sums.
    assert np.trace(unpack_upper(v, 6)) == pytest.approx(len(zs[0]))
    assert np.allclose(u[:, 1], zs[0][ys[0] == 1].sum(axis=0))
    with pytest.raises(ConfigurationError):
        ffc_statistics(zs[0], ys[0], 2)


def test_ffc_singular_falls_back_to_min_norm() -> None:
    z = normalise(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]))
    v, u = ffc_statistics(z, np.array([0, 1]), 2)
    w = ffc_solve(v, u)
    assert np.all(np.isfinite(w))
    assert np.allclose(w, [[1, 0, 0], [0, 1, 0]])
    with pytest.raises(ConfigurationError):
        ffc_solve(v, u, lam=-1.0)


# -- the algorithm through the engine ------------------------------------------------------

import torch  # noqa: E402

from algorithms.models import set_flat  # noqa: E402
from algorithms.spherefed import SphereFed  # noqa: E402
from algorithms.training import features  # noqa: E402
from secagg.data import dirichlet_split, load_dataset  # noqa: E402
from secagg.federation import Federation  # noqa: E402
from secagg.layers.plaintext import Plaintext  # noqa: E402
from secagg.secure_sum import SecureSum  # noqa: E402


@pytest.fixture(scope="module")
def digits_partition():
    return dirichlet_split(load_dataset("digits"), 4, alpha=0.5, seed=0)


def test_ffc_through_securesum_equals_pooled_least_squares(digits_partition) -> None:
    """Acceptance 1: the FFC head after SecureSum == lstsq on pooled normalised features.

    The solve amplifies the fixed-point step by cond(V) (about 2e5 here), so the secure sum
    is asked for a 1e-12 step; at the default 1e-9 step the head agrees to about 2e-6.
    """
    algo = SphereFed(local_epochs=1, lr=0.5, feature_dim=32)
    layer = SecureSum(precision=1e-12)
    res = Federation(algo, layer, digits_partition, rounds=1, seed=0, progress=False).run()
    assert algo.ffc_head is not None
    # Independent reference: final body on every client's data, pooled, normalised, lstsq.
    model = algo.model
    set_flat(algo.shared_parameters(model), algo.params)
    z = np.concatenate([features(model, c.x) for c in digits_partition])
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    y = np.concatenate([c.y for c in digits_partition])
    ref = np.linalg.lstsq(z, np.eye(10)[y], rcond=None)[0].T
    assert np.max(np.abs(algo.ffc_head - ref)) < 1e-8
    # The secure sum carried the FFC phase and the head is the one evaluated.
    assert any(r.phase == "ffc" for r in res.costs.rows)
    assert torch.allclose(model.head.weight, torch.as_tensor(ref, dtype=torch.float32))
    assert res.accuracy >= algo.accuracy_before_ffc - 0.05


def test_spherefed_shares_only_the_body_and_keeps_w_fixed(digits_partition) -> None:
    algo = SphereFed(local_epochs=1, lr=0.5, feature_dim=32, calibrate=False)
    Federation(algo, Plaintext(), digits_partition, rounds=1, seed=0, progress=False).run()
    body = sum(p.numel() for p in algo.model.body.parameters())
    assert algo.params.size == body
    w = algo.model.head.weight.detach().double().numpy()
    assert np.allclose(w @ w.T, np.eye(10), atol=1e-6)
    with pytest.raises(ConfigurationError):
        Federation(SphereFed(feature_dim=8), Plaintext(), digits_partition, rounds=1,
                   progress=False).run()
