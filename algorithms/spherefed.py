"""SphereFed (Dong et al., ECCV 2022): a fixed orthonormal classifier and FFC calibration.

Training: the head is a fixed ``C x d`` matrix ``W`` with orthonormal rows (QR of a random
matrix, identical on every client, never trained and never sent); features are normalised,
``z = f(x)/||f(x)||``, and the body is trained with MSE against one-hot targets averaged
over classes, ``(1/C)||W z - onehot(y)||^2``. Only the body travels, through any base
algorithm (FedAvg or FedProx).

Calibration (Fast Federated Calibration, FFC), once after training: each client uploads
``V_k = sum z z^T`` (upper triangle, packed) and ``U_k = sum z onehot(y)^T``; the server
solves ``W* = (sum V + lambda I)^-1 sum U`` in float64 (Eq. 10/12). Both uploads are sums,
so FFC goes through any additive layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from algorithms.base import Aggregate, ClientState, Phase
from algorithms.fedavg import FedAvg, GlobalModelPhase
from algorithms.fedprox import with_proximal
from algorithms.models import SplitModel, build_model, set_flat
from algorithms.training import LossFn, accuracy, features
from secagg.data import Dataset
from secagg.errors import ConfigurationError
from secagg.federation import derive_seed
from secagg.messages import Bound, Field, UploadSpec


def orthonormal_classifier(n_classes: int, dim: int, seed: int = 0) -> np.ndarray:
    """A ``(C, d)`` float64 matrix with orthonormal rows from the QR of a seeded Gaussian.

    Raises :class:`ConfigurationError` when ``C > d`` (no C orthonormal vectors exist).
    """
    if n_classes < 1 or dim < 1:
        raise ConfigurationError(f"need C >= 1 and d >= 1, got C={n_classes}, d={dim}")
    if n_classes > dim:
        raise ConfigurationError(
            f"SphereFed needs C <= d for an orthonormal classifier, got C={n_classes} > d={dim}"
        )
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((dim, n_classes))
    q, _ = np.linalg.qr(a)
    return np.ascontiguousarray(q[:, :n_classes].T)


def packed_size(dim: int) -> int:
    """Number of entries in the packed upper triangle (diagonal included) of a d x d matrix."""
    return dim * (dim + 1) // 2


def pack_upper(m: np.ndarray) -> np.ndarray:
    """The upper triangle (diagonal included) of a square matrix, row-major, as a vector.

    Works on a batch too: ``(..., d, d) -> (..., d(d+1)/2)``.
    """
    m = np.asarray(m)
    if m.ndim < 2 or m.shape[-1] != m.shape[-2]:
        raise ConfigurationError(f"pack_upper needs square matrices, got shape {m.shape}")
    iu = np.triu_indices(m.shape[-1])
    return m[..., iu[0], iu[1]]


def unpack_upper(v: np.ndarray, dim: int) -> np.ndarray:
    """Inverse of :func:`pack_upper`: the symmetric ``(..., d, d)`` matrix of a packed vector."""
    v = np.asarray(v)
    if v.shape[-1] != packed_size(dim):
        raise ConfigurationError(
            f"packed length {v.shape[-1]} does not match d={dim} (expected {packed_size(dim)})"
        )
    out = np.zeros(v.shape[:-1] + (dim, dim), dtype=np.result_type(v.dtype, np.float64))
    iu = np.triu_indices(dim)
    out[..., iu[0], iu[1]] = v
    out[..., iu[1], iu[0]] = v
    return out


def normalise(features: np.ndarray | torch.Tensor, eps: float = 1e-12) -> np.ndarray:
    """Row-normalise features to unit L2 norm in float64 (rows of norm < eps stay 0)."""
    f = features.detach().cpu().numpy() if isinstance(features, torch.Tensor) else features
    f = np.asarray(f, dtype=np.float64)
    norms = np.linalg.norm(f, axis=1, keepdims=True)
    return np.where(norms > eps, f / np.maximum(norms, eps), 0.0)


def ffc_statistics(z: np.ndarray, y: np.ndarray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """One client's FFC upload from unit-norm features ``z`` (n, d) and labels ``y`` (n,).

    Returns ``(V_packed, U)``: the packed upper triangle of ``sum z z^T`` and ``sum z onehot^T``
    (d x C), both float64.
    """
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y)
    if z.ndim != 2 or y.shape != (z.shape[0],):
        raise ConfigurationError(f"need z (n, d) and y (n,), got {z.shape} and {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise ConfigurationError(f"labels must lie in [0, {n_classes})")
    onehot = np.zeros((z.shape[0], n_classes))
    onehot[np.arange(z.shape[0]), y] = 1.0
    return pack_upper(z.T @ z), z.T @ onehot


def ffc_solve(v_sum_packed: np.ndarray, u_sum: np.ndarray, lam: float = 0.0) -> np.ndarray:
    """FFC's server solve ``W* = (V + lam I)^-1 U`` in float64; returns the ``(C, d)`` head.

    ``V`` is given packed (see :func:`pack_upper`), ``U`` is ``(d, C)``. Uses a symmetric
    solve; when ``V + lam I`` is singular (fewer independent features than ``d`` and
    ``lam = 0``) the minimum-norm least-squares solution is returned instead.
    """
    u = np.asarray(u_sum, dtype=np.float64)
    if u.ndim != 2:
        raise ConfigurationError(f"U must be (d, C), got shape {u.shape}")
    d = u.shape[0]
    if lam < 0:
        raise ConfigurationError(f"lambda must be >= 0, got {lam}")
    v = unpack_upper(np.asarray(v_sum_packed, dtype=np.float64), d) + lam * np.eye(d)
    try:
        w = np.linalg.solve(v, u)
        if not np.all(np.isfinite(w)):
            raise np.linalg.LinAlgError("non-finite solution")
        if np.linalg.cond(v) > 1e14:
            raise np.linalg.LinAlgError("ill-conditioned")
    except np.linalg.LinAlgError:
        w = np.linalg.lstsq(v, u, rcond=None)[0]
    return np.ascontiguousarray(w.T)


def sphere_mse(outputs: torch.Tensor, y: torch.Tensor, n_classes: int) -> torch.Tensor:
    """SphereFed's loss (Eq. 5): ``(1/C)||W z - onehot(y)||^2`` averaged over the batch."""
    target = torch.nn.functional.one_hot(y, n_classes).to(outputs.dtype)
    return torch.nn.functional.mse_loss(outputs, target, reduction="mean")


class FeatureNorm(nn.Module):
    """Scale each row to unit L2 norm (rows with norm below ``eps`` are divided by ``eps``)."""

    def __init__(self, eps: float = 1e-12) -> None:
        super().__init__()
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x / max(||x||, eps)`` row-wise."""
        return x / x.norm(dim=1, keepdim=True).clamp_min(self.eps)


class SphereFed(FedAvg):
    """SphereFed training over FedAvg or FedProx, then (by default) one FFC calibration.

    Args:
        base: ``"fedavg"`` or ``"fedprox"`` -- how the body is trained and averaged.
        mu: FedProx's proximal weight (used when ``base="fedprox"``).
        calibrate: run the FFC phase (``"ffc"``) after the last training round.
        lam: ridge term of the FFC solve (paper main experiments: 0).
        feature_relu: keep the ReLU that ends the toolkit's small bodies. Default False,
            because the fixed class targets ``W_y`` have mixed signs that non-negative
            features cannot reach; True gives post-ReLU features like the paper's backbones.
        **kwargs: :class:`~algorithms.fedavg.FedAvg`'s arguments.

    Only the body is shared; the fixed head ``W`` (derived from the run seed) is never sent.
    After calibration the head is ``W*`` from the FFC solve; :attr:`accuracy_before_ffc`
    keeps the fixed-classifier accuracy measured just before it was replaced.
    """

    name: ClassVar[str] = "spherefed"

    def __init__(self, base: str = "fedavg", mu: float = 0.01, calibrate: bool = True,
                 lam: float = 0.0, feature_relu: bool = False, **kwargs: Any) -> None:
        if base not in ("fedavg", "fedprox"):
            raise ConfigurationError(f"base must be 'fedavg' or 'fedprox', got {base!r}")
        if lam < 0 or mu < 0:
            raise ConfigurationError(f"lam and mu must be >= 0, got lam={lam}, mu={mu}")
        super().__init__(**kwargs)
        self.base = base
        self.mu = mu
        self.calibrate = calibrate
        self.lam = lam
        self.feature_relu = feature_relu
        self.n_classes = 0
        self.dataset: Dataset | None = None
        self.ffc_head: np.ndarray | None = None
        self.accuracy_before_ffc: float | None = None

    def build_model(self, dataset: Dataset) -> SplitModel:
        """Bias-free fixed orthonormal head over normalised features."""
        if dataset.n_classes > self.feature_dim:
            raise ConfigurationError(
                f"SphereFed needs C <= d, got C={dataset.n_classes} > d={self.feature_dim}"
            )
        model = build_model(dataset.input_shape, dataset.n_classes, self.feature_dim,
                            head_bias=False)
        body = model.body
        if not self.feature_relu and isinstance(body, nn.Sequential) and isinstance(
                body[-1], nn.ReLU):
            body[-1] = nn.Identity()
        model.body = nn.Sequential(body, FeatureNorm())
        w = orthonormal_classifier(dataset.n_classes, self.feature_dim,
                                   seed=derive_seed(self.seed, "spherefed-W") % 2**32)
        with torch.no_grad():
            model.head.weight.copy_(torch.as_tensor(w, dtype=torch.float32))
        model.head.weight.requires_grad_(False)
        return model

    def shared_parameters(self, model: SplitModel) -> list[torch.Tensor]:
        """Only the body travels; the classifier is fixed and identical everywhere."""
        return list(model.body.parameters())

    def loss_fn(self, client: ClientState, model: SplitModel) -> LossFn:
        """MSE to one-hot over the fixed head, plus FedProx's term when ``base="fedprox"``."""
        c = model.head.out_features

        def mse(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return sphere_mse(m(x), y, c)

        if self.base == "fedprox":
            return with_proximal(mse, self.shared_parameters(model), self.mu)
        return mse

    def setup(self, dataset: Dataset, clients: Sequence[ClientState], seed: int) -> None:
        """Build the model (with the seed-derived fixed head) and the global body."""
        self.seed = seed
        self.dataset = dataset
        self.n_classes = dataset.n_classes
        self.ffc_head = None
        self.accuracy_before_ffc = None
        super().setup(dataset, clients, seed)

    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        """Training every round; FFC after the last one when ``calibrate``."""
        out = list(super().phases(round, rounds))
        if self.calibrate and round == rounds - 1:
            out.append(_FFCPhase(self))
        return out

    def describe(self) -> dict[str, Any]:
        """FedAvg's description plus SphereFed's options."""
        return {**super().describe(), "base": self.base, "mu": self.mu,
                "calibrate": self.calibrate, "lam": self.lam, "feature_relu": self.feature_relu}

    def ffc_spec(self) -> UploadSpec:
        """Fields ``V`` (packed upper triangle of sum z z^T) and ``U`` (sum z onehot^T).

        One unit-norm record adds ``z z^T`` (Frobenius norm 1, so its packed triangle has L2
        <= 1) and ``z e_y^T`` (L2 = 1): both bounds are 1 per record with no clipping.
        """
        d, c = self.feature_dim, self.n_classes
        return UploadSpec((
            Field("V", (packed_size(d),), "float64", bound=Bound(l2=1.0, linf=1.0), additive=True),
            Field("U", (d, c), "float64", bound=Bound(l2=1.0, linf=1.0), additive=True),
        ))

    def client_features(self, client: ClientState, params: np.ndarray) -> np.ndarray:
        """Unit-norm float64 features of the client's training data under ``params``."""
        model = self.client_model(client, params)
        return normalise(features(model, client.data.x))

    def set_head(self, w: np.ndarray) -> None:
        """Install a ``(C, d)`` head on the global model."""
        assert self.model is not None
        with torch.no_grad():
            self.model.head.weight.copy_(torch.as_tensor(w, dtype=torch.float32))


class _FFCPhase(GlobalModelPhase):
    """FFC: each client uploads (V, U) under the final body; the server solves for W*."""

    name: ClassVar[str] = "ffc"

    algo: SphereFed

    def spec(self) -> UploadSpec:
        return self.algo.ffc_spec()

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: E501
        z = self.algo.client_features(client, broadcast["params"])
        v, u = ffc_statistics(z, client.data.y, self.algo.n_classes)
        return {"V": v, "U": u}

    def server_step(self, aggregate: Aggregate) -> None:
        algo = self.algo
        assert algo.dataset is not None and algo.model is not None and algo.params is not None
        set_flat(algo.shared_parameters(algo.model), algo.params)
        algo.accuracy_before_ffc = accuracy(algo.model, algo.dataset.x_test, algo.dataset.y_test)
        algo.ffc_head = ffc_solve(aggregate["V"], aggregate["U"], algo.lam)
        algo.set_head(algo.ffc_head)

    def client_flops(self, client: ClientState) -> float:
        d, c = self.algo.feature_dim, self.algo.n_classes
        return 2.0 * d * client.n_records * (d + c)

    training_note: ClassVar[str] = (
        "V and U are features under the final global body, which the training rounds "
        "trained on the clients' records, this client's included")

    def trained_fields(self) -> tuple[str, ...]:
        """``V`` and ``U``: unit-norm features bound each record's term by 1 whatever the
        body, but the body itself moves with the client's records (see CCVR's moments
        phase: record-level DP holds by composition only when training ran under DP-SGD)."""
        return ("V", "U")

    def trained_with_dpsgd(self) -> bool:
        """True when the training rounds ran under DP-SGD."""
        return self.algo.dpsgd is not None


__all__: Sequence[str] = [
    "orthonormal_classifier",
    "packed_size",
    "pack_upper",
    "unpack_upper",
    "normalise",
    "ffc_statistics",
    "ffc_solve",
    "sphere_mse",
    "FeatureNorm",
    "SphereFed",
]
