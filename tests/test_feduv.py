"""FedUV's two regularisers against values computed by hand (acceptance 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from algorithms.feduv import feduv_loss, uniformity_loss, variance_loss, variance_target
from secagg.errors import ConfigurationError

LOGITS = [
    [2.0, 0.5, -1.0],
    [0.1, 1.5, 0.3],
    [-0.7, 0.2, 2.2],
    [1.0, 1.0, 1.0],
]
REPS = [
    [1.0, 0.0],
    [0.0, 2.0],
    [3.0, 1.0],
    [1.0, 1.0],
    [2.0, 2.0],
]


def _softmax_row(row: list[float]) -> list[float]:
    m = max(row)
    e = [math.exp(v - m) for v in row]
    s = sum(e)
    return [v / s for v in e]


def _hand_variance(logits: list[list[float]]) -> float:
    """L_V by loops: unbiased std over the batch per class, hinge at 1/sqrt(C), mean over C."""
    probs = [_softmax_row(r) for r in logits]
    b, c = len(probs), len(probs[0])
    target = 1.0 / math.sqrt(c)
    total = 0.0
    for j in range(c):
        col = [probs[i][j] for i in range(b)]
        mean = sum(col) / b
        var = sum((v - mean) ** 2 for v in col) / (b - 1)
        total += max(0.0, target - math.sqrt(var))
    return total / c


def _hand_uniformity(z: list[list[float]], scale: float) -> float:
    """L_U by loops over pairs i < j with sigma = lower median of squared distances."""
    d2 = []
    for i in range(len(z)):
        for j in range(i + 1, len(z)):
            d2.append(sum((a - b) ** 2 for a, b in zip(z[i], z[j])))
    nz = sorted(v for v in d2 if v > 0)
    sigma = nz[(len(nz) - 1) // 2]
    return sum(math.exp(-v / (scale * sigma)) for v in d2) / len(d2)


def test_variance_target_is_unbiased_identity_std() -> None:
    # Unbiased std of one column of I_C: mean 1/C, sum of squares (1-1/C)^2 + (C-1)/C^2.
    for c in (2, 7, 10, 100):
        mean = 1.0 / c
        var = ((1 - mean) ** 2 + (c - 1) * mean**2) / (c - 1)
        assert variance_target(c) == pytest.approx(math.sqrt(var), rel=1e-12)


def test_variance_loss_matches_hand_computation() -> None:
    got = float(variance_loss(torch.tensor(LOGITS, dtype=torch.float64)))
    want = _hand_variance(LOGITS)
    assert want > 0  # the batch is not spread enough on some class: the hinge is active
    assert got == pytest.approx(want, abs=1e-12)


def test_variance_loss_zero_when_batch_is_one_hot_confident() -> None:
    # Confident, balanced predictions: every class column has std >= 1/sqrt(C).
    logits = torch.eye(3, dtype=torch.float64) * 50.0
    assert float(variance_loss(logits)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("scale", [2.0, 1.0])
def test_uniformity_loss_matches_hand_computation(scale: float) -> None:
    got = float(uniformity_loss(torch.tensor(REPS, dtype=torch.float64), kernel_scale=scale))
    assert got == pytest.approx(_hand_uniformity(REPS, scale), abs=1e-12)


def test_uniformity_sigma_gradient_option() -> None:
    z = torch.tensor(REPS, dtype=torch.float64, requires_grad=True)
    uniformity_loss(z).backward()
    g_full = z.grad.clone()
    z.grad = None
    uniformity_loss(z, detach_sigma=True).backward()
    # Same value either way, but a gradient through the median changes the gradient.
    assert not torch.allclose(g_full, z.grad)


def test_degenerate_batches() -> None:
    same = torch.ones(4, 3, dtype=torch.float64)
    assert float(uniformity_loss(same)) == 0.0
    assert float(variance_loss(torch.zeros(1, 3))) == 0.0
    with pytest.raises(ConfigurationError):
        variance_loss(torch.zeros(4))
    with pytest.raises(ConfigurationError):
        uniformity_loss(torch.zeros(4, 2), kernel_scale=0.0)


def test_full_loss_weights() -> None:
    logits = torch.tensor(LOGITS, dtype=torch.float64)
    z = torch.tensor(REPS[:4], dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0])
    ce = torch.nn.functional.cross_entropy(logits, y)
    want = float(ce) + 0.5 * _hand_uniformity(REPS[:4], 2.0) + 0.75 * _hand_variance(LOGITS)
    assert float(feduv_loss(logits, z, y)) == pytest.approx(want, abs=1e-12)


def test_feduv_algorithm_regularises_fedavg() -> None:
    from algorithms.fedavg import FedAvg
    from algorithms.feduv import FedUV
    from secagg.data import dirichlet_split, load_dataset
    from secagg.federation import Federation
    from secagg.layers.plaintext import Plaintext

    part = dirichlet_split(load_dataset("digits"), 4, alpha=0.1, seed=0)
    kw = {"local_epochs": 1, "feature_dim": 16}

    def run(algo):
        Federation(algo, Plaintext(), part, rounds=1, seed=0, progress=False).run()
        return algo.params

    w_avg = run(FedAvg(**kw))
    # no regulariser: FedAvg's per-client loop bit for bit (FedUV's own loss keeps it on the
    # loop), and FedAvg's batched trainer within float32 rounding
    w_uv0 = run(FedUV(mu=0.0, lam=0.0, **kw))
    assert np.array_equal(w_uv0, run(FedAvg(batched=False, **kw)))
    np.testing.assert_allclose(w_uv0, w_avg, atol=1e-5)
    uv = FedUV(**kw)
    w_uv = run(uv)
    assert w_uv.shape == w_avg.shape  # same upload as FedAvg
    assert not np.allclose(w_uv, w_avg)
    assert uv.spec().names == ("n", "weighted_params")
    with pytest.raises(ConfigurationError):
        FedUV(mu=-1.0)


def test_collapsed_batch_has_finite_gradients() -> None:
    # Dead features: identical rows and identical logits (std 0, coincident points).
    z = torch.zeros(6, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    z2 = torch.cat([z, torch.ones(2, 4, dtype=torch.float64)])  # two distinct points
    loss = feduv_loss(z2 @ w, z2, torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.all(torch.isfinite(z.grad))
    assert float(variance_loss(torch.zeros(5, 3))) == pytest.approx(1 / math.sqrt(3))


def test_nearly_collapsed_batch_has_finite_uniformity_gradient() -> None:
    # Four rows within 1e-19 of each other and one far away: the median squared distance
    # underflows float32's useful range; an unfloored bandwidth gives inf * 0 = NaN.
    z = torch.tensor([[0.0, 0.0], [1e-19, 0.0], [2e-19, 0.0], [3e-19, 0.0], [5.0, 5.0]],
                     requires_grad=True)
    uniformity_loss(z).backward()
    assert torch.all(torch.isfinite(z.grad))
