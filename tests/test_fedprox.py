"""FedProx: the proximal term and its effect on local training."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from algorithms.fedavg import FedAvg
from algorithms.fedprox import FedProx, proximal_term, with_proximal
from secagg.data import dirichlet_split, load_dataset
from secagg.errors import ConfigurationError
from secagg.federation import Federation
from secagg.layers.plaintext import Plaintext


def test_proximal_term_by_hand() -> None:
    p = [torch.tensor([1.0, 2.0]), torch.tensor([[0.5]])]
    a = [torch.tensor([0.0, 4.0]), torch.tensor([[1.5]])]
    assert float(proximal_term(p, a)) == pytest.approx(1.0 + 4.0 + 1.0)
    with pytest.raises(ConfigurationError):
        proximal_term(p, a[:1])


def test_with_proximal_adds_half_mu_times_distance() -> None:
    w = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
    loss = with_proximal(lambda m, x, y: w.sum() * 0.0, [w], mu=0.4)
    with torch.no_grad():
        w.add_(torch.tensor([3.0, 4.0]))  # move 5 away from the anchor
    assert float(loss(None, None, None).detach()) == pytest.approx(0.5 * 0.4 * 25.0)
    with pytest.raises(ConfigurationError):
        FedProx(mu=-1.0)


@pytest.fixture(scope="module")
def part():
    return dirichlet_split(load_dataset("digits"), 4, alpha=0.5, seed=0)


def _run(algo, part):
    Federation(algo, Plaintext(), part, rounds=1, seed=0, progress=False).run()
    return algo.params


def test_mu_zero_is_fedavg_and_large_mu_stays_near_the_start(part) -> None:
    kw = {"local_epochs": 1, "feature_dim": 16}
    start = FedAvg(**kw)
    start.setup(part.dataset, [], 0)
    w0 = start.params
    w_avg = _run(FedAvg(**kw), part)
    # FedProx's own loss keeps it on the per-client loop: mu = 0 equals FedAvg's loop bit
    # for bit, and FedAvg's batched trainer within float32 rounding
    assert np.array_equal(_run(FedProx(mu=0.0, **kw), part), _run(FedAvg(batched=False, **kw), part))
    np.testing.assert_allclose(_run(FedProx(mu=0.0, **kw), part), w_avg, atol=1e-5)
    w_prox = _run(FedProx(mu=5.0, **kw), part)
    assert np.linalg.norm(w_prox - w0) < 0.8 * np.linalg.norm(w_avg - w0)
