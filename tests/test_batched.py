"""Batched local training (algorithms/batched.py) against the per-client loop."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import algorithms.fedavg as fedavg_mod
from algorithms.batched import batching_unsupported, train_batched
from algorithms.fedavg import FedAvg
from algorithms.fedprox import FedProx
from algorithms.models import CNN, MLP, get_flat
from algorithms.training import train_local
from secagg.data import Dataset, dirichlet_split
from secagg.errors import ConfigurationError
from secagg.federation import Federation
from secagg.layers.plaintext import Plaintext

# unequal sizes: no data, fewer records than one batch (8), exact multiples, ragged ends
SIZES = [0, 3, 17, 40, 8, 33]


def _data(shape: tuple[int, ...], n_classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [(rng.random((n, *shape), dtype=np.float32), rng.integers(0, n_classes, n))
            for n in SIZES]


def _loop(model, data, seeds, **kw):
    flats, losses = [], []
    for (x, y), s in zip(data, seeds, strict=True):
        m = copy.deepcopy(model)
        losses.append(train_local(m, x, y, seed=s, **kw))
        flats.append(get_flat(m))
    return flats, losses


OPTIMIZERS = [
    dict(optimizer="sgd", momentum=0.0, lr=0.05),
    dict(optimizer="sgd", momentum=0.9, lr=0.05),
    dict(optimizer="adam", lr=0.01),
    dict(optimizer="adam", lr=0.01, fresh_optimizer_each_epoch=True),
    dict(optimizer="sgd", momentum=0.9, lr=0.05, fresh_optimizer_each_epoch=True),
]


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: "-".join(map(str, o.values())))
def test_mlp_matches_loop(opt):
    torch.manual_seed(0)
    model = MLP(20, 5, feature_dim=16, hidden=24)
    before = get_flat(model)
    data = _data((20,), 5)
    seeds = [1000 + 7 * i for i in range(len(SIZES))]
    ref, ref_loss = _loop(model, data, seeds, epochs=2, batch_size=8, **opt)
    res = train_batched(model, data, seeds, epochs=2, batch_size=8, **opt)
    np.testing.assert_array_equal(get_flat(model), before)  # the template is untouched
    for i, n in enumerate(SIZES):
        np.testing.assert_allclose(res.flat(i), ref[i], rtol=0, atol=1e-5)
        assert res.losses[i] == pytest.approx(ref_loss[i], abs=1e-5)
        moved = np.abs(ref[i] - before).max()
        assert (moved > 1e-3) if n else (moved == 0.0)
    # the clients trained differently: agreement is not an artefact of equal results
    assert np.abs(ref[2] - ref[3]).max() > 1e-3


@pytest.mark.parametrize("opt", OPTIMIZERS[:3], ids=["sgd", "momentum", "adam"])
def test_cnn_matches_loop(opt):
    torch.manual_seed(1)
    model = CNN(4, feature_dim=8, channels=(2, 4))
    data = _data((1, 28, 28), 4, seed=1)
    seeds = [5 + i for i in range(len(SIZES))]
    opt = {**opt, "lr": 0.001} if opt["optimizer"] == "adam" else opt
    ref, _ = _loop(model, data, seeds, epochs=1, batch_size=8, **opt)
    res = train_batched(model, data, seeds, epochs=1, batch_size=8, **opt)
    for i in range(len(SIZES)):
        np.testing.assert_allclose(res.flat(i), ref[i], rtol=0, atol=1e-5)


def test_order_of_clients_does_not_matter():
    """A client's result depends on its own data and seed only (the stacked axis is
    reordered internally by schedule length and restored)."""
    torch.manual_seed(0)
    model = MLP(20, 5, feature_dim=16, hidden=24)
    data = _data((20,), 5)
    seeds = list(range(len(SIZES)))
    a = train_batched(model, data, seeds, epochs=1, batch_size=8, lr=0.05, momentum=0.9)
    b = train_batched(model, data[::-1], seeds[::-1], epochs=1, batch_size=8, lr=0.05,
                      momentum=0.9)
    for i in range(len(SIZES)):
        np.testing.assert_allclose(a.flat(i), b.flat(len(SIZES) - 1 - i), rtol=0, atol=1e-6)


@pytest.mark.parametrize("which", ["clamped-mlp", "no-bias-sequential"])
def test_stacked_linear_path_matches_loop(which):
    """Models of Linear/ReLU/Flatten/clamp take the stacked-matmul path (no vmap), which
    must train as the loop does; a CNN keeps the vmap path."""
    from algorithms.batched import _stacked_plan

    torch.manual_seed(2)
    if which == "clamped-mlp":
        model = MLP(20, 5, feature_dim=16, hidden=24, feature_clamp=0.5, head_bias=False)
    else:
        model = nn.Sequential(nn.Flatten(), nn.Linear(20, 12, bias=False), nn.ReLU(),
                              nn.Linear(12, 5))
    plan = _stacked_plan(model)
    assert plan is not None and [op[0] for op in plan].count("linear") == (
        3 if which == "clamped-mlp" else 2)
    assert _stacked_plan(CNN(4, feature_dim=8, channels=(2, 4))) is None
    assert _stacked_plan(nn.Sequential(nn.Linear(4, 4), nn.Tanh())) is None
    data = _data((20,), 5, seed=4)
    seeds = [40 + i for i in range(len(SIZES))]
    ref, ref_loss = _loop(model, data, seeds, epochs=2, batch_size=8, lr=0.1, momentum=0.9)
    res = train_batched(model, data, seeds, epochs=2, batch_size=8, lr=0.1, momentum=0.9)
    for i in range(len(SIZES)):
        np.testing.assert_allclose(res.flat(i), ref[i], rtol=0, atol=1e-5)
        assert res.losses[i] == pytest.approx(ref_loss[i], abs=1e-5)
    assert np.abs(ref[2] - ref[3]).max() > 1e-3


def test_flats_are_the_rows_of_flat():
    """The chunk's matrix of flat parameters (one concatenation) is flat(i), row by row."""
    torch.manual_seed(0)
    model = MLP(20, 5, feature_dim=16, hidden=24)
    res = train_batched(model, _data((20,), 5), list(range(len(SIZES))), epochs=1,
                        batch_size=8, lr=0.05, momentum=0.9)
    rows = res.flats()
    assert rows.dtype == np.float32 and rows.shape == (len(SIZES), get_flat(model).size)
    for i in range(len(SIZES)):
        np.testing.assert_array_equal(rows[i], res.flat(i))
    assert np.abs(rows[2] - rows[3]).max() > 1e-3  # distinct clients, distinct rows


def test_weighted_upload_is_the_float64_product_rounded_once():
    """FedAvg's n * theta in float32 is bit for bit the float64 product cast to float32
    (n exact in float32, one rounding either way), including tiny, huge and subnormal
    entries; a count beyond float32's exact integers takes the float64 path."""
    rng = np.random.default_rng(0)
    w = np.concatenate([rng.standard_normal(5000), rng.uniform(-10, 10, 5000),
                        [0.0, -0.0, 1e-45, -3e-39, 1e-30, 9.999999, -10.0]]).astype(np.float32)
    for n in (0, 1, 3, 7, 33, 600, 59_999, 2**23 + 1, 2**24 - 1, 2**24 + 1, 2**30 + 3):
        ref = (w.astype(np.float64) * n).astype(np.float32)
        got = fedavg_mod.weighted(w, n, "float32")
        assert got.dtype == np.float32
        np.testing.assert_array_equal(got.view(np.uint32), ref.view(np.uint32))
    got64 = fedavg_mod.weighted(w, 600, "float64")
    assert got64.dtype == np.float64
    np.testing.assert_array_equal(got64, w.astype(np.float64) * 600)


def test_refuses_what_the_loop_must_train():
    drop = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2))
    norm = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    assert "Dropout" in batching_unsupported(drop)
    assert "BatchNorm1d" in batching_unsupported(norm)
    assert "DP-SGD" in batching_unsupported(nn.Linear(4, 2), dpsgd=object())
    assert batching_unsupported(MLP(4, 2)) is None
    with pytest.raises(ValueError, match="Dropout"):
        train_batched(drop, [(np.zeros((2, 4), np.float32), np.zeros(2, np.int64))], [0])
    with pytest.raises(ValueError, match="seeds"):
        train_batched(MLP(4, 2), [(np.zeros((2, 4), np.float32), np.zeros(2, np.int64))], [])


def _partition():
    rng = np.random.default_rng(3)
    x = rng.random((240, 12), dtype=np.float32)
    y = (x[:, 0] * 3).astype(np.int64)
    ds = Dataset("toy", x, y, x[:60], y[:60], n_classes=3, input_shape=(12,))
    return dirichlet_split(ds, 12, 0.5, seed=2)


@pytest.mark.parametrize("clip", [None, 1.0])
def test_fedavg_batched_equals_loop(monkeypatch, clip):
    part = _partition()
    assert part.sizes().min() < 8 <= part.sizes().max()  # a client below one batch
    calls = []
    real = fedavg_mod.train_batched

    def counting(model, data, seeds, **kw):
        calls.append(len(data))
        return real(model, data, seeds, **kw)

    monkeypatch.setattr(fedavg_mod, "train_batched", counting)
    runs = {}
    for batched in (False, None):
        algo = FedAvg(local_epochs=2, batch_size=8, feature_dim=8, clip=clip,
                      batched=batched, chunk=5)
        res = Federation(algo, Plaintext(), part, rounds=2, seed=0, progress=False).run()
        runs[batched] = (algo.params.copy(), res.history)
    assert calls == [5, 5, 2] * 2  # two rounds of 12 clients in chunks of 5
    np.testing.assert_allclose(runs[None][0], runs[False][0], rtol=0, atol=1e-5)
    assert runs[None][1] == runs[False][1]


def test_fedavg_batched_true_refuses_where_it_does_not_apply():
    part = _partition()
    with pytest.raises(ConfigurationError, match="FedProx overrides loss_fn"):
        Federation(FedProx(batched=True, feature_dim=8), Plaintext(), part, rounds=1,
                   seed=0, progress=False).run()
    with pytest.raises(ConfigurationError, match="chunk"):
        FedAvg(chunk=0)


def test_fedavg_auto_mode_batches_the_mlp_and_leaves_the_cnn_to_the_loop():
    mlp = Dataset("flat", np.zeros((4, 12), np.float32), np.arange(4) % 2,
                  np.zeros((2, 12), np.float32), np.arange(2), n_classes=2, input_shape=(12,))
    img = Dataset("img", np.zeros((4, 1, 28, 28), np.float32), np.arange(4) % 2,
                  np.zeros((2, 1, 28, 28), np.float32), np.arange(2), n_classes=2,
                  input_shape=(1, 28, 28))
    for ds, auto in ((mlp, None), (img, "convolutional")):
        algo = FedAvg(feature_dim=4)
        algo.setup(ds, [], 0)
        why = algo.batching_reason()
        assert why is None if auto is None else auto in why
        forced = FedAvg(feature_dim=4, batched=True)
        forced.setup(ds, [], 0)
        assert forced.batching_reason() is None
    off = FedAvg(feature_dim=4, batched=False)
    off.setup(mlp, [], 0)
    assert off.batching_reason() == "batched=False"
