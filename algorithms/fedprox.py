"""FedProx (Li et al., MLSys 2020): FedAvg with a proximal term in the local loss.

Each client minimises ``loss + (mu/2) ||w - w_global||^2`` over the shared parameters, where
``w_global`` is the model it received this round. The upload and the server solve are
FedAvg's, so FedProx goes through every layer FedAvg goes through. :func:`with_proximal`
adds the term to any local loss, which is how SphereFed and CCVR use FedProx as their base.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from algorithms.base import ClientState
from algorithms.fedavg import FedAvg
from algorithms.models import SplitModel
from algorithms.training import LossFn
from secagg.errors import ConfigurationError


def proximal_term(params: Sequence[torch.Tensor], anchors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``||w - w_anchor||^2`` summed over the given parameter tensors."""
    if len(params) != len(anchors):
        raise ConfigurationError(f"{len(params)} parameters but {len(anchors)} anchors")
    total = params[0].new_zeros(())
    for p, a in zip(params, anchors):
        total = total + (p - a).pow(2).sum()
    return total


def with_proximal(base: LossFn, params: Sequence[torch.Tensor], mu: float) -> LossFn:
    """Wrap ``base`` with ``(mu/2)||w - w0||^2``, anchoring ``w0`` at the params' current values."""
    if mu < 0:
        raise ConfigurationError(f"FedProx mu must be >= 0, got {mu}")
    plist = list(params)
    anchors = [p.detach().clone() for p in plist]
    if mu == 0:
        return base

    def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return base(model, x, y) + 0.5 * mu * proximal_term(plist, anchors)

    return loss


class FedProx(FedAvg):
    """FedAvg with the proximal term ``(mu/2)||w - w_global||^2`` (default ``mu = 0.01``).

    All other arguments are :class:`~algorithms.fedavg.FedAvg`'s.
    """

    name: ClassVar[str] = "fedprox"

    def __init__(self, mu: float = 0.01, **kwargs: Any) -> None:
        if mu < 0:
            raise ConfigurationError(f"FedProx mu must be >= 0, got {mu}")
        super().__init__(**kwargs)
        self.mu = mu

    def loss_fn(self, client: ClientState, model: SplitModel) -> LossFn:
        """Cross-entropy plus the proximal term around the parameters just received."""
        return with_proximal(super().loss_fn(client, model), self.shared_parameters(model), self.mu)

    def describe(self) -> dict[str, Any]:
        """FedAvg's description plus ``mu``."""
        return {**super().describe(), "mu": self.mu}
