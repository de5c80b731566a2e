"""Small plain-PyTorch models, each split into a body (feature extractor) and a head.

* :class:`MLP` for flat inputs (the 64 features of scikit-learn's digits).
* :class:`CNN` for 1x28x28 images (MNIST, Fashion-MNIST).
* :func:`Linear` (multinomial logistic regression: an identity body and a linear head).

:func:`model_recipe` names a model by ``"mlp"``, ``"cnn"``, ``"linear"`` or
``"module:factory"`` (the command line's ``--model``) as a JSON-able recipe that
:func:`secagg.model_io.build_from_recipe` calls; a saved run rebuilds its model from it.

Both return a :class:`SplitModel` whose ``body`` maps inputs to ``feature_dim`` features and
whose ``head`` is a linear classifier. ``feature_clamp`` ends the body with a clamp to
[-b, b] (FedLog's bounded features). SphereFed adds its own unit-norm feature layer.
:func:`get_flat` and :func:`set_flat` move parameters to and from one float32 vector.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import nn


class _Clamp(nn.Module):
    def __init__(self, bound: float) -> None:
        super().__init__()
        self.bound = float(bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(x, -self.bound, self.bound)

    def extra_repr(self) -> str:
        return f"bound={self.bound}"


class SplitModel(nn.Module):
    """``head(body(x))``, with the two parts addressable separately."""

    def __init__(self, body: nn.Module, head: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.body = body
        self.head = head
        self.feature_dim = feature_dim

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The body's output."""
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits."""
        return self.head(self.body(x))


def MLP(
    in_features: int,
    n_classes: int,
    feature_dim: int = 128,
    hidden: int = 128,
    feature_clamp: float | None = None,
    head_bias: bool = True,
) -> SplitModel:
    """A two-layer MLP body (ReLU) and a linear head. With ``feature_clamp`` the body ends in
    a clamp to [-b, b] instead of a ReLU."""
    last: nn.Module = _Clamp(feature_clamp) if feature_clamp is not None else nn.ReLU()
    body = nn.Sequential(
        nn.Flatten(),
        nn.Linear(in_features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, feature_dim),
        last,
    )
    return SplitModel(body, nn.Linear(feature_dim, n_classes, bias=head_bias), feature_dim)


def CNN(
    n_classes: int,
    feature_dim: int = 128,
    channels: Sequence[int] = (16, 32),
    feature_clamp: float | None = None,
    head_bias: bool = True,
) -> SplitModel:
    """Two 5x5 conv + max-pool blocks and a linear projection to ``feature_dim`` for
    1x28x28 inputs, then a linear head."""
    c1, c2 = channels
    last: nn.Module = _Clamp(feature_clamp) if feature_clamp is not None else nn.ReLU()
    body = nn.Sequential(
        nn.Conv2d(1, c1, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(c2 * 4 * 4, feature_dim),
        last,
    )
    return SplitModel(body, nn.Linear(feature_dim, n_classes, bias=head_bias), feature_dim)


def Linear(input_shape: Sequence[int], n_classes: int) -> SplitModel:
    """Multinomial logistic regression: the flattened input is the feature (identity
    body), the head is linear (Synthetic(alpha, beta) of Li et al. 2020 is fit by it)."""
    d = int(np.prod(tuple(input_shape)))
    return SplitModel(nn.Flatten(), nn.Linear(d, n_classes), d)


#: The model names :func:`model_recipe` knows besides ``module:factory``.
MODEL_NAMES: tuple[str, ...] = ("mlp", "cnn", "linear")


def named_model(name: str, input_shape: Sequence[int], n_classes: int,
                feature_dim: int = 128) -> nn.Module:
    """The built-in model ``name`` (``mlp``, ``cnn``, ``linear``) for this data shape."""
    shape = tuple(int(v) for v in input_shape)
    if name == "mlp":
        return MLP(int(np.prod(shape)), n_classes, feature_dim)
    if name == "cnn":
        if shape != (1, 28, 28):
            raise ValueError(f"--model cnn is for 1x28x28 images; the data has shape {shape} "
                             "(use mlp or linear)")
        return CNN(n_classes, feature_dim)
    if name == "linear":
        return Linear(shape, n_classes)
    raise ValueError(f"unknown model {name!r}: one of {', '.join(MODEL_NAMES)} or "
                     "module:factory")


def model_recipe(model: str | None, input_shape: Sequence[int], n_classes: int,
                 feature_dim: int = 128) -> dict[str, object]:
    """The JSON-able recipe ``{"factory": "module:function", "kwargs": {...}}`` of a model
    named as the command line's ``--model`` does: None (the default for the input shape),
    ``mlp``, ``cnn``, ``linear``, or ``module:factory`` -- a function of ``(input_shape,
    n_classes)`` returning an ``nn.Module`` of class logits (a :class:`SplitModel` where an
    algorithm needs a body and a head)."""
    shape = [int(v) for v in input_shape]
    if model is None:
        return {"factory": "algorithms.models:build_model",
                "kwargs": {"input_shape": shape, "n_classes": int(n_classes),
                           "feature_dim": int(feature_dim)}}
    if ":" in model:
        return {"factory": model, "kwargs": {"input_shape": shape, "n_classes": int(n_classes)}}
    if model not in MODEL_NAMES:
        raise ValueError(f"unknown model {model!r}: one of {', '.join(MODEL_NAMES)} or "
                         "module:factory")
    return {"factory": "algorithms.models:named_model",
            "kwargs": {"name": model, "input_shape": shape, "n_classes": int(n_classes),
                       "feature_dim": int(feature_dim)}}


def build_model(
    input_shape: Sequence[int],
    n_classes: int,
    feature_dim: int = 128,
    feature_clamp: float | None = None,
    head_bias: bool = True,
) -> SplitModel:
    """The default model for an input shape: MLP for flat inputs, CNN for (1, 28, 28)."""
    shape = tuple(input_shape)
    if len(shape) == 1:
        return MLP(
            shape[0], n_classes, feature_dim, feature_clamp=feature_clamp, head_bias=head_bias
        )
    if shape == (1, 28, 28):
        return CNN(n_classes, feature_dim, feature_clamp=feature_clamp, head_bias=head_bias)
    raise ValueError(f"no default model for input shape {shape}; pass your own SplitModel")


def get_flat(params: nn.Module | Iterable[torch.Tensor]) -> np.ndarray:
    """All parameters concatenated into one float32 numpy vector (module order)."""
    ps = params.parameters() if isinstance(params, nn.Module) else params
    return torch.cat([p.detach().reshape(-1) for p in ps]).cpu().numpy().astype(np.float32)


def set_flat(params: nn.Module | Iterable[torch.Tensor], vec: np.ndarray) -> None:
    """Load a vector produced by :func:`get_flat` back into the parameters (in place)."""
    ps = list(params.parameters() if isinstance(params, nn.Module) else params)
    total = sum(p.numel() for p in ps)
    v = np.asarray(vec).ravel()
    if v.size != total:
        raise ValueError(f"vector has {v.size} entries, the parameters have {total}")
    t = torch.as_tensor(v, dtype=torch.float32)
    i = 0
    with torch.no_grad():
        for p in ps:
            p.copy_(t[i : i + p.numel()].view_as(p))
            i += p.numel()


def n_params(params: nn.Module | Iterable[torch.Tensor]) -> int:
    """Number of scalar parameters."""
    ps = params.parameters() if isinstance(params, nn.Module) else params
    return sum(p.numel() for p in ps)
