"""Server optimizers applied to the (noised) mean update: FedAvg, FedAvgM and FedAdam.

The server treats the mean client update Delta (the average of the clients' clipped
updates, noised when a DP layer is in the stack) as a pseudo-gradient pointing uphill and
takes one step (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Algorithm 2):

* ``sgd`` (FedAvg with a server learning rate): ``x <- x + lr * Delta``;
* ``momentum`` (FedAvgM, Hsu et al. 2019): ``m <- beta1 * m + Delta``, ``x <- x + lr * m``;
* ``adam`` (FedAdam): ``m <- beta1 m + (1 - beta1) Delta``,
  ``v <- beta2 v + (1 - beta2) Delta^2``, ``x <- x + lr * m / (sqrt(v) + tau)``
  (no bias correction, as in the paper; ``tau`` is its adaptivity, default 1e-3).

Everything here reads only the released mean, so under a DP layer it is post-processing:
it costs no privacy. The configuration (:class:`ServerOptimizer`) is immutable and apart
from the state (:class:`OptimizerState`), as in TensorFlow Federated's optimizers:
``step(state, params, delta) -> (state, params)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from secagg.errors import ConfigurationError

__all__ = ["OptimizerState", "SERVER_OPTIMIZERS", "ServerOptimizer"]

SERVER_OPTIMIZERS = ("sgd", "momentum", "adam")


@dataclass(frozen=True)
class OptimizerState:
    """The server optimizer's state: first and second moments (None until used)."""

    m: np.ndarray | None = None
    v: np.ndarray | None = None


@dataclass(frozen=True)
class ServerOptimizer:
    """One of ``sgd``, ``momentum``, ``adam`` with its hyper-parameters.

    Args:
        name: the optimizer (:data:`SERVER_OPTIMIZERS`).
        lr: server learning rate (FedAvg's plain average is ``sgd`` with lr 1).
        beta1: momentum (``momentum``, ``adam``); default 0.9.
        beta2: second-moment decay (``adam``); default 0.99 (Reddi et al.).
        tau: adaptivity (``adam``); default 1e-3 (Reddi et al.).
    """

    name: str = "sgd"
    lr: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3

    def __post_init__(self) -> None:
        if self.name not in SERVER_OPTIMIZERS:
            raise ConfigurationError(
                f"server optimizer must be one of {SERVER_OPTIMIZERS}, got {self.name!r}")
        for key, lo, hi in (("lr", 0.0, math.inf), ("beta1", -1e-300, 1.0),
                            ("beta2", -1e-300, 1.0), ("tau", 0.0, math.inf)):
            v = getattr(self, key)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and lo < v < hi):
                raise ConfigurationError(f"server optimizer {key} must be in ({max(lo, 0)}, "
                                         f"{hi}), got {v!r}")

    @property
    def is_plain_average(self) -> bool:
        """True for ``sgd`` with lr 1: the new model is the mean model itself."""
        return self.name == "sgd" and self.lr == 1.0

    def step(self, state: OptimizerState, params: np.ndarray,
             delta: np.ndarray) -> tuple[OptimizerState, np.ndarray]:
        """One server step from ``params`` along the mean update ``delta``; returns the new
        state and the new parameters (float64 arithmetic, the parameters' dtype kept)."""
        x = np.asarray(params, dtype=np.float64)
        d = np.asarray(delta, dtype=np.float64)
        if x.shape != d.shape:
            raise ConfigurationError(f"update shape {d.shape} does not match the model's "
                                     f"{x.shape}")
        if self.name == "sgd":
            new = x + self.lr * d
        elif self.name == "momentum":
            m = d if state.m is None else self.beta1 * state.m + d
            state = OptimizerState(m=m)
            new = x + self.lr * m
        else:
            m0 = np.zeros_like(d) if state.m is None else state.m
            v0 = np.zeros_like(d) if state.v is None else state.v
            m = self.beta1 * m0 + (1.0 - self.beta1) * d
            v = self.beta2 * v0 + (1.0 - self.beta2) * d * d
            state = OptimizerState(m=m, v=v)
            new = x + self.lr * m / (np.sqrt(v) + self.tau)
        return state, new.astype(np.asarray(params).dtype)

    def describe(self) -> dict[str, Any]:
        """JSON-able description."""
        out: dict[str, Any] = {"name": self.name, "lr": self.lr}
        if self.name in ("momentum", "adam"):
            out["beta1"] = self.beta1
        if self.name == "adam":
            out.update(beta2=self.beta2, tau=self.tau)
        return out
