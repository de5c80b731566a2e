"""FedUV (Son et al., CVPR 2024): uniformity and variance regularisers for non-IID FL.

The server is plain FedAvg; what changes is the local loss

    L = CE(logits, y) + mu * L_U(z) + lambda * L_V(logits),   mu = 0.5, lambda = C / 4

* ``L_V`` (Eq. 2-3) is a hinge on the per-class standard deviation, across the mini-batch,
  of the softmax probabilities: ``(1/C) sum_j max(0, c - std_batch(P)[:, j])`` with
  ``c = 1/sqrt(C)`` (the unbiased std of a C x C identity's columns, as the authors' code
  computes it) and the unbiased (N - 1) batch std.
* ``L_U`` (Eq. 4) is the mean Gaussian potential over the pairs i < j of the batch's
  representations ``z`` (the penultimate-layer output, not normalised):
  ``mean exp(-||z_i - z_j||^2 / (kernel_scale * sigma))`` with sigma the median of the
  non-zero squared pairwise distances. The paper writes ``2 sigma`` (``kernel_scale=2``,
  our default); the authors' code uses ``sigma`` (``kernel_scale=1``). The code does not
  detach sigma, so gradients flow through the median by default (``detach_sigma=False``).

No statistic of the regularisers leaves the client, so the upload is exactly FedAvg's.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from algorithms.base import ClientState
from algorithms.fedavg import FedAvg
from algorithms.models import SplitModel
from algorithms.training import LossFn
from secagg.errors import ConfigurationError


def variance_target(n_classes: int) -> float:
    """The hinge level ``c`` of L_V: mean unbiased column std of ``I_C``, i.e. ``1/sqrt(C)``."""
    if n_classes < 2:
        raise ConfigurationError(f"FedUV needs at least 2 classes, got {n_classes}")
    return 1.0 / math.sqrt(n_classes)


def variance_loss(logits: torch.Tensor) -> torch.Tensor:
    """FedUV's classifier-variance regulariser L_V on a ``(batch, C)`` tensor of logits.

    Returns ``(1/C) sum_j relu(1/sqrt(C) - std_batch(softmax(logits))[:, j])`` with the
    unbiased batch std. A batch of one sample has no std; the loss is then 0.
    """
    if logits.ndim != 2:
        raise ConfigurationError(
            f"logits must be (batch, classes), got shape {tuple(logits.shape)}"
        )
    b, c = logits.shape
    target = variance_target(c)
    if b < 2:
        return logits.sum() * 0.0
    p = F.softmax(logits, dim=1)
    # var clamped at 1e-24 before the square root: identical predictions over the batch (std
    # 0) would otherwise give an infinite gradient; the value is unchanged above 1e-12.
    std = p.var(dim=0, unbiased=True).clamp_min(1e-24).sqrt()
    return torch.relu(target - std).mean()


def uniformity_loss(
    z: torch.Tensor, kernel_scale: float = 2.0, detach_sigma: bool = False
) -> torch.Tensor:
    """FedUV's hyperspherical-uniformity regulariser L_U on ``(batch, d)`` representations.

    ``mean_{i<j} exp(-||z_i - z_j||^2 / (kernel_scale * sigma))`` where sigma is the median
    of the non-zero squared pairwise distances of the batch (torch's lower median, as in
    the authors' code). Returns 0 when the batch has fewer than two distinct rows (no
    bandwidth can be defined).
    """
    if z.ndim != 2:
        raise ConfigurationError(f"representations must be (batch, d), got {tuple(z.shape)}")
    if kernel_scale <= 0:
        raise ConfigurationError(f"kernel_scale must be positive, got {kernel_scale}")
    if z.shape[0] < 2:
        return z.sum() * 0.0
    # Squared distances over i < j computed directly (no square root, so coincident rows
    # have a finite gradient).
    i, j = torch.triu_indices(z.shape[0], z.shape[0], offset=1, device=z.device)
    d2 = (z[i] - z[j]).pow(2).sum(dim=1)
    nonzero = d2[d2 > 0]
    if nonzero.numel() == 0:
        return z.sum() * 0.0
    # The bandwidth is floored at 1e-12 so a nearly collapsed batch cannot overflow.
    sigma = nonzero.median().clamp_min(1e-12)
    if detach_sigma:
        sigma = sigma.detach()
    return torch.exp(-d2 / (kernel_scale * sigma)).mean()


def feduv_loss(
    logits: torch.Tensor,
    z: torch.Tensor,
    y: torch.Tensor,
    mu: float = 0.5,
    lam: float | None = None,
    kernel_scale: float = 2.0,
    detach_sigma: bool = False,
) -> torch.Tensor:
    """The full FedUV local loss ``CE + mu * L_U(z) + lam * L_V(logits)`` (lam = C/4 if None)."""
    c = logits.shape[1]
    lam = c / 4.0 if lam is None else lam
    loss = F.cross_entropy(logits, y)
    if mu:
        loss = loss + mu * uniformity_loss(z, kernel_scale, detach_sigma)
    if lam:
        loss = loss + lam * variance_loss(logits)
    return loss


class FedUV(FedAvg):
    """FedAvg whose clients train with FedUV's regularised loss.

    Args:
        mu: weight of L_U (paper: 0.5).
        lam: weight of L_V; ``None`` means ``C / 4`` (paper).
        kernel_scale: the ``2`` of ``exp(-d^2 / (2 sigma))`` (paper); 1 reproduces the
            authors' code.
        detach_sigma: stop the gradient through the median bandwidth (code: False).
        **kwargs: :class:`~algorithms.fedavg.FedAvg`'s arguments (local epochs, lr, ...).

    L_U acts on the body's output (the features the head reads), which in the toolkit's
    small models is a ReLU projection -- like the authors' post-ReLU projector output.
    """

    name: ClassVar[str] = "feduv"

    def __init__(self, mu: float = 0.5, lam: float | None = None, kernel_scale: float = 2.0,
                 detach_sigma: bool = False, **kwargs: Any) -> None:
        if mu < 0 or (lam is not None and lam < 0):
            raise ConfigurationError(f"FedUV weights must be >= 0, got mu={mu}, lam={lam}")
        if kernel_scale <= 0:
            raise ConfigurationError(f"kernel_scale must be positive, got {kernel_scale}")
        if kwargs.get("dpsgd") is not None and (mu > 0 or lam is None or lam > 0):
            raise ConfigurationError(
                "FedUV's regularisers couple the records of a batch (L_V is a std across "
                "the batch, L_U a mean over its pairs), so one record moves every other "
                "record's gradient and DP-SGD's per-sample clipping does not bound its "
                "effect: record-level DP-SGD would not be private. Use client-level DP "
                "(clip=C with adjacency='client'), or mu=0 and lam=0 (plain FedAvg)")
        super().__init__(**kwargs)
        self.mu = mu
        self.lam = lam
        self.kernel_scale = kernel_scale
        self.detach_sigma = detach_sigma

    def loss_fn(self, client: ClientState, model: SplitModel) -> LossFn:
        """``CE + mu L_U(body(x)) + lam L_V(head(body(x)))``."""

        def loss(m: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            z = m.body(x)
            return feduv_loss(m.head(z), z, y, self.mu, self.lam, self.kernel_scale,
                              self.detach_sigma)

        return loss

    def describe(self) -> dict[str, Any]:
        """FedAvg's description plus the regulariser settings."""
        return {**super().describe(), "mu": self.mu, "lam": self.lam,
                "kernel_scale": self.kernel_scale, "detach_sigma": self.detach_sigma}
