"""The fast DistributedDP path of the audits (threat_models.dp_audit.composed_ring): the
survivors' encodings summed once and their noise shares drawn by the layer's own sampler
give the per-client ring sum bit for bit; a layer whose ``encode_noised`` or sampler is
anything else is audited on the per-client path; the Skellam shares drawn as one summed
Skellam variable have the law of the sum of the shares. Fixed seeds throughout."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from secagg.privacy.layers import DistributedDP
from threat_models.dp_audit import (
    SumRelease,
    composition_holds,
    make_layer,
    skellam_sum_holds,
)
from threat_models.dp_audit_fedavg import FedAvgRelease

KW = {"epsilon": 1.0, "delta": 1e-5, "clients": 10}


@pytest.mark.parametrize("survivors", ["fewest", "all"])
def test_fedavg_composed_ring_is_the_per_client_ring_bit_for_bit(survivors: str) -> None:
    fast = FedAvgRelease("distributed-dp", survivors=survivors, seed=4, **KW)
    slow = FedAvgRelease("distributed-dp", survivors=survivors, seed=4, **KW)
    assert fast._composed and not fast._skellam_sum
    slow._composed = False  # every survivor's encode_noised, as the layer runs it
    for world in (False, True, True, False):
        a, b = fast(world, 40, np.random.default_rng(0)), slow(world, 40,
                                                               np.random.default_rng(0))
        assert a.shape == (40, 8) and np.array_equal(a, b)
        assert np.std(a[:, 0]) > 0  # noised


def test_sum_composed_ring_is_the_per_client_ring_bit_for_bit() -> None:
    fast = SumRelease("distributed-dp", seed=5, mechanism="discrete_gaussian", **KW)
    slow = SumRelease("distributed-dp", seed=5, mechanism="discrete_gaussian", **KW)
    assert fast._composed and not fast._skellam_sum
    slow._composed = False
    for world in (True, False):
        assert np.array_equal(fast(world, 500, np.random.default_rng(0)),
                              slow(world, 500, np.random.default_rng(0)))


def _biased(layer: DistributedDP) -> DistributedDP:
    """A client-side bug the composition would hide: encode_noised adds 1 to every entry."""
    real = layer.encode_noised

    def encode_noised(rel, upload, rng):  # type: ignore[no-untyped-def]
        return real(rel, upload, rng) + np.uint64(1)

    layer.encode_noised = encode_noised  # type: ignore[method-assign]
    return layer


def test_a_layer_whose_encode_noised_differs_is_audited_per_client() -> None:
    lay = _biased(make_layer("distributed-dp", epsilon=1.0, delta=1e-5, adjacency="client",
                             seed=6))
    rel = FedAvgRelease(lay, clients=10)
    assert not rel._composed
    honest = FedAvgRelease("distributed-dp", seed=6, **KW)
    # the bug shows in the audited release: each survivor's +1 (in ring units) moves the
    # mean of the new model, on the per-client path that runs it
    shift = rel(False, 20_000, np.random.default_rng(0)).mean(axis=0) \
        - honest(False, 20_000, np.random.default_rng(0)).mean(axis=0)
    assert np.all(shift != 0)


def test_composition_check_refuses_a_biased_layer_directly() -> None:
    lay = make_layer("distributed-dp", epsilon=1.0, delta=1e-5, adjacency="record", seed=7)
    rel = SumRelease(lay, clients=10)
    worlds = [[np.zeros(1)] * 10, [np.array([rel.canary_value])] + [np.zeros(1)] * 9]
    assert composition_holds(lay, rel._plan, worlds, rel.survivors, rel._ctx())
    _biased(lay)
    assert not composition_holds(lay, rel._plan, worlds, rel.survivors, rel._ctx())


def test_skellam_sum_is_used_only_for_the_layers_own_skellam_sampler() -> None:
    sk = make_layer("distributed-dp", epsilon=1.0, delta=1e-5, mechanism="skellam", seed=8)
    dg = make_layer("distributed-dp", epsilon=1.0, delta=1e-5, seed=8)
    assert skellam_sum_holds(sk) and not skellam_sum_holds(dg)
    real = sk._draw
    sk._draw = lambda std, size, rng: real(std / 2, size, rng)  # type: ignore[method-assign]
    assert not skellam_sum_holds(sk)  # halved shares: drawn one by one, as the layer does
    rel = SumRelease(sk, clients=10)
    assert rel._composed and not rel._skellam_sum


@pytest.mark.parametrize("survivors", ["fewest", "all"])
def test_summed_skellam_has_the_law_of_the_sum_of_shares(survivors: str) -> None:
    fast = SumRelease("distributed-dp", seed=9, mechanism="skellam", survivors=survivors,
                      **KW)
    slow = SumRelease("distributed-dp", seed=9, mechanism="skellam", survivors=survivors,
                      **KW)
    assert fast._composed and fast._skellam_sum
    slow._skellam_sum = False  # each survivor's share from its own stream
    n = 100_000
    for world in (False, True):
        a = fast(world, n, np.random.default_rng(0))
        b = slow(world, n, np.random.default_rng(0))
        assert not np.array_equal(a, b)  # really a different draw
        sigma = fast.details()["sigma"]
        for x in (a, b):
            assert np.std(x) == pytest.approx(sigma, rel=0.01)
        assert abs(np.mean(a) - np.mean(b)) < 5 * sigma * np.sqrt(2 / n)
        assert stats.ks_2samp(a, b).pvalue > 1e-3


def _reference_discrete_gaussian(sigma: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """CKS Algorithm 3 as the sampler wrote it before its arithmetic went in place."""
    import math

    out = np.empty(n, dtype=np.int64)
    t = math.floor(sigma) + 1
    p = -math.expm1(-1.0 / t)
    s2 = sigma * sigma
    filled = 0
    while filled < n:
        need = n - filled
        batch = int(need * 1.6) + 16
        y = rng.geometric(p, size=batch) - rng.geometric(p, size=batch)
        gamma = (np.abs(y) - s2 / t) ** 2 / (2.0 * s2)
        accept = rng.random(batch) < np.exp(-gamma)
        got = y[accept][:need]
        out[filled:filled + got.size] = got
        filled += got.size
    return out


@pytest.mark.parametrize("sigma", [0.3, 1.5, 37.2, 1603499.77])
def test_in_place_discrete_gaussian_gives_the_same_bits(sigma: float) -> None:
    from secagg.privacy.samplers import discrete_gaussian

    for seed in range(3):
        assert np.array_equal(discrete_gaussian(sigma, 50_000, np.random.default_rng(seed)),
                              _reference_discrete_gaussian(sigma, 50_000,
                                                           np.random.default_rng(seed)))


@pytest.mark.parametrize("mechanism", ["discrete_gaussian", "skellam"])
def test_adaptive_composed_ring_is_the_per_client_ring_bit_for_bit(mechanism: str) -> None:
    from threat_models.dp_audit_adaptive import AdaptiveRelease

    fast = AdaptiveRelease("distributed-dp", seed=10, mechanism=mechanism, **KW)
    slow = AdaptiveRelease("distributed-dp", seed=10, mechanism=mechanism, **KW)
    assert fast._composed and fast._skellam_sum == (mechanism == "skellam")
    fast._skellam_sum = False  # shares one by one: bit for bit (two fields, field order)
    slow._composed = False
    for world in (True, False):
        a, b = fast(world, 30, np.random.default_rng(0)), slow(world, 30,
                                                               np.random.default_rng(0))
        assert a.shape == (30, 2) and np.array_equal(a, b)
