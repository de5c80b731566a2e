"""Local training loops shared by the algorithms (ordinary PyTorch, deterministic by seed)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
from torch import nn

LossFn = Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``model(x)`` against ``y``."""
    return nn.functional.cross_entropy(model(x), y)


def train_local(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    *,
    epochs: int = 1,
    batch_size: int = 32,
    lr: float = 0.05,
    optimizer: str = "sgd",
    momentum: float = 0.0,
    params: Iterable[torch.Tensor] | None = None,
    loss_fn: LossFn = cross_entropy,
    seed: int = 0,
    fresh_optimizer_each_epoch: bool = False,
    dpsgd: Any | None = None,
    events: list[Any] | None = None,
) -> float:
    """Train ``model`` on (x, y) in place and return the mean loss of the last epoch.

    Args:
        params: the tensors to optimise (default: all of the model's parameters), e.g. only
            the body when the head is frozen.
        optimizer: ``"sgd"`` or ``"adam"``.
        loss_fn: ``loss_fn(model, xb, yb)`` -> scalar tensor (add regularizers here).
        seed: makes the batch order deterministic.
        fresh_optimizer_each_epoch: rebuild the optimizer (resetting Adam state) every epoch,
            as FedLog's reference code does (ignored under DP-SGD: one private optimizer).
        dpsgd: a :class:`secagg.privacy.dpsgd.DPSGD` to train with record-level DP-SGD
            through Opacus (per-sample clipping, Gaussian noise, Poisson-sampled batches of
            expected size ``batch_size``); the model is left unwrapped afterwards.
        events: with ``dpsgd``, the training's accounting events are appended here.
    """
    if len(y) == 0:
        return 0.0
    xt = torch.from_numpy(np.array(x, dtype=np.float32))
    yt = torch.from_numpy(np.array(y, dtype=np.int64))
    plist = list(params) if params is not None else list(model.parameters())

    def make() -> torch.optim.Optimizer:
        if optimizer == "sgd":
            return torch.optim.SGD(plist, lr=lr, momentum=momentum)
        if optimizer == "adam":
            return torch.optim.Adam(plist, lr=lr)
        raise ValueError(f"optimizer must be 'sgd' or 'adam', got {optimizer!r}")

    opt = make()
    if dpsgd is not None:
        return _train_private(model, xt, yt, opt, loss_fn, epochs, batch_size, dpsgd, events,
                              stream=seed)
    gen = torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
    model.train()
    last = 0.0
    for _ in range(epochs):
        if fresh_optimizer_each_epoch:
            opt = make()
        order = torch.randperm(len(yt), generator=gen)
        total, count = 0.0, 0
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            opt.zero_grad()
            loss = loss_fn(model, xt[idx], yt[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        last = total / max(1, count)
    return last


def _train_private(model: nn.Module, xt: torch.Tensor, yt: torch.Tensor,
                   opt: torch.optim.Optimizer, loss_fn: LossFn, epochs: int, batch_size: int,
                   dpsgd: Any, events: list[Any] | None, stream: int = 0) -> float:
    from torch.utils.data import DataLoader, TensorDataset

    from secagg.privacy.dpsgd import make_private

    loader = DataLoader(TensorDataset(xt, yt), batch_size=batch_size)
    model.train()
    private = make_private(model, opt, loader, dpsgd, stream=stream)  # per client and round
    private.module.train()
    last = 0.0
    try:
        for _ in range(epochs):
            total, count = 0.0, 0
            for xb, yb in private.data_loader:
                if len(yb) == 0:  # Poisson sampling can draw an empty batch
                    continue
                private.optimizer.zero_grad()
                loss = loss_fn(private.module, xb, yb)
                loss.backward()
                private.optimizer.step()
                total += float(loss.detach()) * len(yb)
                count += len(yb)
            last = total / max(1, count)
    finally:
        private.module._close()  # remove Opacus' hooks: the plain model is usable again
    if events is not None:
        events.extend(private.events())
    return last


@torch.no_grad()
def predict(model: nn.Module, x: np.ndarray, batch_size: int = 2048) -> np.ndarray:
    """Class predictions of ``model`` (eval mode) on ``x``."""
    model.eval()
    xt = torch.from_numpy(np.array(x, dtype=np.float32))
    out = [model(xt[i:i + batch_size]).argmax(1) for i in range(0, len(xt), batch_size)]
    return torch.cat(out).numpy() if out else np.zeros(0, dtype=np.int64)


@torch.no_grad()
def features(model: nn.Module, x: np.ndarray, batch_size: int = 2048) -> np.ndarray:
    """The body's features (eval mode) as float64, for statistics uploads."""
    model.eval()
    body = model.body if hasattr(model, "body") else model
    xt = torch.from_numpy(np.array(x, dtype=np.float32))
    out = [body(xt[i:i + batch_size]) for i in range(0, len(xt), batch_size)]
    return torch.cat(out).double().numpy() if out else np.zeros((0, 0))


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    """Fraction of correct predictions (0.0 for an empty set)."""
    if len(y) == 0:
        return 0.0
    return float(np.mean(predict(model, x) == np.asarray(y)))
