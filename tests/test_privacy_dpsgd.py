"""DP-SGD through Opacus: its accounting joins the privacy ledger."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from secagg.errors import PrivacyError
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.dpsgd import DPSGD, make_private, round_event
from secagg.privacy.events import GaussianEvent, SampledGaussianEvent

DELTA = 1e-5


def _train(config: DPSGD, n: int = 256, batch: int = 32, epochs: int = 2):
    torch.manual_seed(0)
    x = torch.randn(n, 5)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(x, y), batch_size=batch)
    pt = make_private(model, opt, loader, config)
    loss_fn = nn.CrossEntropyLoss()
    for _ in range(epochs):
        for xb, yb in pt.data_loader:
            pt.optimizer.zero_grad()
            if len(xb):
                loss_fn(pt.module(xb), yb).backward()
            pt.optimizer.step()
    return pt


def test_opacus_history_becomes_sampled_gaussian_events() -> None:
    cfg = DPSGD(noise_multiplier=1.2, max_grad_norm=1.0, seed=0)
    pt = _train(cfg)
    evs = pt.events(round=0)
    assert len(evs) == 1
    ev = evs[0]
    assert ev.noise_multiplier == 1.2 and math.isclose(ev.sampling_rate, 32 / 256)
    assert ev.steps == 2 * 8 == cfg.event(256, 32, 2).steps
    ledger = PrivacyLedger(delta=DELTA)
    pt.record(ledger, round=0)
    assert not ledger.private  # seeded
    ours = ledger.epsilon()
    # Opacus' own (RDP) accountant is an upper bound; the PLD ledger is tighter but close.
    theirs = pt.engine.get_epsilon(DELTA)
    assert ours <= theirs * 1.001 and ours > 0.6 * theirs


def test_training_and_statistics_compose_in_one_ledger() -> None:
    sgd = SampledGaussianEvent(noise_multiplier=1.0, sampling_rate=0.05, steps=30)
    stats = GaussianEvent(noise_multiplier=5.0)
    led = PrivacyLedger(delta=DELTA, pld_discretization=1e-3)
    led.spend(sgd)
    only_sgd = led.epsilon()
    led.spend(stats)
    alone = PrivacyLedger(delta=DELTA, pld_discretization=1e-3)
    alone.spend(stats)
    assert led.epsilon() > max(only_sgd, alone.epsilon())
    assert led.epsilon() < only_sgd + alone.epsilon()  # tighter than basic composition


def test_round_event_dominates_each_client() -> None:
    evs = [SampledGaussianEvent(noise_multiplier=1.0, sampling_rate=q, steps=s)
           for q, s in [(0.1, 6), (0.2, 3), (0.05, 12)]]
    worst = round_event(evs, round=3)
    w = PrivacyLedger(delta=DELTA, pld_discretization=1e-3)
    w.spend(worst)
    for e in evs:
        one = PrivacyLedger(delta=DELTA, pld_discretization=1e-3)
        one.spend(e)
        assert one.epsilon() <= w.epsilon()


def test_bad_config_refused() -> None:
    with pytest.raises(PrivacyError):
        DPSGD(noise_multiplier=0.0, max_grad_norm=1.0)
    with pytest.raises(PrivacyError):
        DPSGD(noise_multiplier=1.0, max_grad_norm=float("nan"))
    with pytest.raises(PrivacyError):
        round_event([])
    assert np.isfinite(DPSGD(1.0, 1.0).event(10, 3, 1).sampling_rate)


def test_dpsgd_noise_comes_from_the_noise_generator() -> None:
    """With zero gradients, one DP-SGD step moves the weights by exactly the Gaussian noise
    drawn from the training's noise generator (std z * C, divided by the expected batch
    size)."""
    import copy

    torch.manual_seed(0)
    x = torch.randn(256, 5)
    y = torch.zeros(256, dtype=torch.long)
    model = nn.Sequential(nn.Linear(5, 3))
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    cfg = DPSGD(noise_multiplier=2.0, max_grad_norm=0.5, seed=7)
    pt = make_private(model, opt, DataLoader(TensorDataset(x, y), batch_size=32), cfg)
    assert pt.noise is not None and not pt.noise.private
    rng = copy.deepcopy(pt.noise.rng)
    xb, _ = next(iter(pt.data_loader))
    pt.optimizer.zero_grad()
    (0.0 * pt.module(xb).sum()).backward()  # per-sample gradients are all zero
    pt.optimizer.step()
    for p, p0 in zip(model.parameters(), before, strict=True):
        want = -torch.as_tensor(rng.normal(0.0, 2.0 * 0.5, size=tuple(p.shape)),
                                dtype=p.dtype) / 32
        torch.testing.assert_close(p.detach() - p0, want, rtol=1e-5, atol=1e-6)


def test_poisson_sampling_is_secret_not_torch_global_state() -> None:
    """Batches drawn by the private loader do not follow torch's global generator (which a
    run seeds publicly); a DPSGD seed makes them reproducible."""
    x = torch.arange(200, dtype=torch.float32).reshape(200, 1)
    y = torch.zeros(200, dtype=torch.long)

    def batches(seed):
        torch.manual_seed(1234)  # the same public global state every time
        model = nn.Sequential(nn.Linear(1, 2))
        pt = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          DataLoader(TensorDataset(x, y), batch_size=20),
                          DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, seed=seed))
        return [xb.ravel().tolist() for xb, _ in pt.data_loader]

    assert batches(None) != batches(None)
    assert batches(5) == batches(5)


def test_seeded_trainings_get_one_stream_each() -> None:
    """With a user seed, the stream name picks the training's own noise and sampling: the
    same (seed, stream) reproduces them, another stream (client, round) gets others, and
    the events say the run is not private. Without a seed the noise is secret."""
    import copy

    x = torch.arange(200, dtype=torch.float32).reshape(200, 1)
    y = torch.zeros(200, dtype=torch.long)

    def streams(seed, stream):
        model = nn.Sequential(nn.Linear(1, 2))
        pt = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1),
                          DataLoader(TensorDataset(x, y), batch_size=20),
                          DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, seed=seed), stream)
        noise = tuple(copy.deepcopy(pt.noise.rng).standard_normal(3))
        return noise, [xb.ravel().tolist() for xb, _ in pt.data_loader], pt

    a_noise, a_batches, pt = streams(5, 1)
    b_noise, b_batches, _ = streams(5, 2)
    assert streams(5, 1)[:2] == (a_noise, a_batches)
    assert a_noise != b_noise and a_batches != b_batches
    ev = round_event([pt.config.event(200, 20, 1), DPSGD(1.0, 1.0).event(100, 20, 1)])
    assert "seed=5" in ev.not_private_reason
    ledger = PrivacyLedger(delta=DELTA)
    ledger.spend(ev)
    assert not ledger.private and "seed=5" in ledger.not_private_reasons[0]
    _, _, secret = streams(None, 1)
    assert secret.noise.private and secret.config.event(200, 20, 1).not_private_reason == ""
    with pytest.raises(PrivacyError):
        streams(5, 1.5)
