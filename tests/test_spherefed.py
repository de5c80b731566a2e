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


# -- the public (data-independent) body, centring, the noise-aware solve --------------------

import dataclasses  # noqa: E402

from algorithms.spherefed import dp_sum_sigma, ffc_solve_floor, noise_floor  # noqa: E402
from secagg.data import Partition  # noqa: E402
from secagg.errors import PrivacyError  # noqa: E402
from secagg.privacy.layers import CentralDP  # noqa: E402


def _public(**kw) -> SphereFed:
    return SphereFed(body="public", feature_dim=16, **kw)


def test_public_body_options_are_checked() -> None:
    with pytest.raises(ConfigurationError, match="calibrate"):
        SphereFed(body="public", calibrate=False)
    with pytest.raises(ConfigurationError, match="body must be"):
        SphereFed(body="frozen")
    with pytest.raises(ConfigurationError, match="lam"):
        SphereFed(lam="big")
    with pytest.raises(ConfigurationError, match="channels"):
        SphereFed(channels=(8,))
    assert _public().center and not SphereFed().center


def test_public_body_allows_record_level_dp_trained_body_refuses(digits_partition) -> None:
    res = Federation(_public(), CentralDP(Plaintext(), epsilon=1.0, delta=1e-5),
                     digits_partition, rounds=1, seed=0, progress=False).run()
    assert [p[1] for p in res.participation] == ["center", "ffc"]  # no training phase
    with pytest.raises(PrivacyError, match="record-level DP is refused"):
        Federation(SphereFed(feature_dim=16, local_epochs=1),
                   CentralDP(Plaintext(), epsilon=1.0, delta=1e-5),
                   digits_partition, rounds=1, seed=0, progress=False).run()
    with pytest.raises(PrivacyError, match="record-level DP is refused"):
        Federation(SphereFed(feature_dim=16, local_epochs=1, center=True),
                   CentralDP(Plaintext(), epsilon=1.0, delta=1e-5, public=("n",)),
                   digits_partition, rounds=1, seed=0, progress=False).run()


def _scrambled(partition: Partition, seed: int) -> Partition:
    """The same shapes with other records: random inputs, shuffled labels."""
    rng = np.random.default_rng(seed)
    ds = partition.dataset
    x = rng.uniform(0, 1, ds.x_train.shape).astype(ds.x_train.dtype)
    y = rng.permutation(ds.y_train)
    other = dataclasses.replace(ds, x_train=x, y_train=y)
    return dirichlet_split(other, 3, alpha=1.0, seed=seed)


def test_public_body_is_the_same_whatever_the_data(digits_partition) -> None:
    bodies, heads = [], []
    for part in (digits_partition, _scrambled(digits_partition, 1)):
        algo = _public()
        Federation(algo, Plaintext(), part, rounds=1, seed=5, progress=False).run()
        bodies.append(algo.params.copy())
        heads.append(algo.ffc_head)
    # Bit-identical bodies (the data changed, the body did not), equal to a fresh seeded one
    assert np.array_equal(bodies[0], bodies[1])
    fresh = _public()
    fresh.setup(digits_partition.dataset, [], 5)
    assert np.array_equal(bodies[0], fresh.params)
    # ...while the calibrated heads, which are computed from the data, differ.
    assert not np.allclose(heads[0], heads[1])
    other_seed = _public()
    other_seed.setup(digits_partition.dataset, [], 6)
    assert not np.array_equal(fresh.params, other_seed.params)


def test_centring_and_ffc_equal_numpy(digits_partition) -> None:
    algo = _public()
    res = Federation(algo, Plaintext(), digits_partition, rounds=1, seed=0,
                     progress=False).run()
    model = algo.model
    f = np.concatenate([features(model, c.x) for c in digits_partition])
    f = f / np.linalg.norm(f, axis=1, keepdims=True)
    mu = f.mean(axis=0)
    assert np.max(np.abs(algo.feature_mean - mu)) < 1e-12
    z = f - mu
    z = z / np.linalg.norm(z, axis=1, keepdims=True)
    y = np.concatenate([c.y for c in digits_partition])
    ref = np.linalg.lstsq(z, np.eye(10)[y], rcond=None)[0].T
    assert np.max(np.abs(algo.ffc_head - ref)) < 1e-8
    ft = features(model, digits_partition.dataset.x_test)
    ft = ft / np.linalg.norm(ft, axis=1, keepdims=True) - mu
    pred = (ft / np.linalg.norm(ft, axis=1, keepdims=True)) @ ref.T
    want = float(np.mean(pred.argmax(1) == digits_partition.dataset.y_test))
    assert res.accuracy == pytest.approx(want, abs=1e-12)
    assert res.accuracy > algo.accuracy_before_ffc


def test_whole_run_epsilon_is_the_configured_one(digits_partition) -> None:
    eps, delta = 1.0, 1e-5
    layer = CentralDP(Plaintext(), epsilon=eps, delta=delta)
    res = Federation(_public(lam="auto"), layer, digits_partition, rounds=1, seed=0,
                     progress=False).run()
    ledger = res.privacy
    assert ledger.private and not ledger.unnoised
    assert {e.phase for e in ledger.events} == {"center", "ffc"}
    assert layer.releases == 2
    spent = ledger.epsilon(delta)
    assert spent <= eps + 1e-6
    assert spent == pytest.approx(eps, rel=1e-3)  # the budget is used, not wasted
    # each release alone spends less than the whole
    assert ledger.epsilon(delta, phase="ffc") < spent


def test_auto_floor_is_zero_without_noise_and_grows_with_sigma(digits_partition) -> None:
    assert noise_floor(0.0, 64) == 0.0
    floors = [noise_floor(s, 64) for s in (0.5, 1.0, 4.0)]
    assert floors[0] > 0 and floors == sorted(floors) and floors[0] < floors[2]
    # from the layers' notes: central/distributed sigma of the sum; local: sum_sigma
    assert dp_sum_sigma({}, "V") == 0.0
    assert dp_sum_sigma({"dp": {"fields": {"V": {"sigma": 3.0}}}}, "V") == 3.0
    assert dp_sum_sigma({"dp": {"fields": {"V": {"sigma": 3.0}}, "sum_sigma": {"V": 30.0}}},
                        "V") == 30.0
    # plaintext: auto is exactly the lam=0 solve
    plain = _public(lam="auto")
    Federation(plain, Plaintext(), digits_partition, rounds=1, seed=0, progress=False).run()
    zero = _public(lam=0.0)
    Federation(zero, Plaintext(), digits_partition, rounds=1, seed=0, progress=False).run()
    assert plain.ffc_solve_info["floor"] == 0.0
    assert np.array_equal(plain.ffc_head, zero.ffc_head)
    # under DP: the floor follows the noise the layer reports, larger for a smaller epsilon
    seen = []
    for eps in (4.0, 0.5):
        algo = _public(lam="auto")
        Federation(algo, CentralDP(Plaintext(), epsilon=eps, delta=1e-5), digits_partition,
                   rounds=1, seed=0, progress=False).run()
        info = algo.ffc_solve_info
        assert info["sigma_V"] > 0
        assert info["floor"] == pytest.approx(noise_floor(info["sigma_V"], 16))
        seen.append(info["floor"])
    assert seen[1] > seen[0]


def test_floor_solve_lifts_only_small_eigenvalues() -> None:
    zs, ys, c = _pooled_problem()
    z, y = np.concatenate(zs), np.concatenate(ys)
    v, u = ffc_statistics(z, y, c)
    e = np.linalg.eigvalsh(unpack_upper(v, 6))
    # a floor below every eigenvalue changes nothing; one above all of them is a scaled U
    assert np.allclose(ffc_solve_floor(v, u, e.min() / 2), ffc_solve(v, u), atol=1e-10)
    assert np.allclose(ffc_solve_floor(v, u, 2 * e.max()), u.T / (2 * e.max()), atol=1e-12)
    with pytest.raises(ConfigurationError):
        ffc_solve_floor(v, u, -1.0)


def test_public_body_uploads_are_sums_over_records(digits_partition) -> None:
    """The additivity checker splits a client's data under one body: the feature cache must
    not serve one subset's features for another."""
    from threat_models.additivity import check_additivity

    got = {(c.phase, c.field): c.status
           for c in check_additivity(_public(), digits_partition)}
    assert got == {("center", "center"): "additive", ("ffc", "V"): "additive",
                   ("ffc", "U"): "additive"}
