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

Public body (``body="public"``): no training at all. The body is the seeded initial one
(:meth:`SphereFed.setup` seeds it from the run seed and builds it from the dataset's public
shape only; no record ever touches it), and the run's only releases are the centering
statistics and the FFC statistics. This follows Tramer & Boneh, "Differentially Private
Learning Needs Better Features (or Much More Data)", ICLR 2021: at small epsilon a DP linear
model on data-independent features beats end-to-end DP training. Because the features do
not depend on any record, one record's terms in ``V`` and ``U`` are bounded by 1 whatever
else is in the data, so a record-level DP layer on them is honest, and since nothing else
is released the layer's (epsilon, delta) is the whole run's guarantee.

Centering (``center=True``, the default for the public body): random features of images
lie in a narrow cone, and noise on ``V`` then swamps the few directions that separate the
classes (Fashion-MNIST, d=64: 0.746 plaintext, 0.437 with one epsilon=1 release of noise).
A phase ``"center"`` runs before ``"ffc"``: each client uploads ``[n, sum f]`` of its
unit-norm features ``f`` (per record ``[1, f]``, L2 norm sqrt(2)); the server broadcasts
``mu = sum f / n`` and FFC uses ``z = normalise(f - mu)``. Under a DP layer this is a
second release and the layer splits the run's budget over both (the engine plans
``rounds x phases`` releases). Composition is adaptive: the FFC release uses the first
release's output ``mu``, which is public once released; given ``mu`` each record still
adds ``z z^T`` and ``z onehot^T`` with ``||z|| <= 1``, so the FFC sensitivity stays 1 per
field and the RDP composition of the two Gaussian releases covers the run.

Noise-aware solve (``lam="auto"``): noise of std sigma on every entry of the packed ``V``
is a symmetric Gaussian matrix of spectral norm about ``2 sigma sqrt(d)``; the directions
where ``V``'s eigenvalues are below that are noise, and ``lambda = 0`` then inverts them
(indefinite or near-singular ``V``; the solve collapses). ``"auto"`` reads the noise the
DP layer actually added to the sum of ``V`` (``aggregate.notes["dp"]``: CentralDP's and
DistributedDP's ``sigma`` of the sum, LocalDP's ``sum_sigma``) and floors the eigenvalues
of ``V`` at ``AUTO_FLOOR * sigma * sqrt(d)`` (:func:`ffc_solve_floor`, pure
post-processing); without noise it is the plain ``lambda = 0`` solve. On Fashion-MNIST an
eigenvalue floor beat a ridge of the same order at every d measured (see
:data:`AUTO_FLOOR`).
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
from algorithms.models import CNN, SplitModel, build_model, set_flat
from algorithms.moments import dp_sum_sigma, pack_upper, packed_size, unpack_upper
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


#: ``lam="auto"``: eigenvalues of the noisy ``V`` are floored at ``AUTO_FLOOR * sigma * sqrt(d)``
#: (half the noise's spectral edge 2 sigma sqrt(d)). Chosen on full Fashion-MNIST (random
#: seeded CNN bodies, centred features, Gaussian noise of sigma 7.5 (CentralDP at epsilon=1
#: over two releases) and 8.9 (DistributedDP adds 9.7 in the engine); 3 draws): at d=64 a
#: floor of 0.75-1.5 was within 0.1 point of the best, 0.5 lost 0.4 points, 0.25 1.5; at
#: d=96-128 a floor of 1 was the best or within 0.1 point of it; at d=256 0.5 beat 1 by 0.6
#: point. A ridge ``lambda = c sigma sqrt(d)`` (c = 0.5-4) was 0.3-2 points below the
#: floor at every d from 64 to 256, and collapses (0.24-0.55) for c <= 1 at d >= 128.
AUTO_FLOOR = 1.0


def noise_floor(sigma: float, dim: int, c: float = AUTO_FLOOR) -> float:
    """The eigenvalue floor ``c * sigma * sqrt(d)`` of ``lam="auto"`` (0 when sigma is 0)."""
    if not (np.isfinite(sigma) and sigma >= 0) or dim < 1 or c < 0:
        raise ConfigurationError(f"need sigma >= 0, d >= 1, c >= 0; got {sigma}, {dim}, {c}")
    return float(c * sigma * np.sqrt(dim))


def ffc_solve_floor(v_sum_packed: np.ndarray, u_sum: np.ndarray, floor: float) -> np.ndarray:
    """FFC's solve with the eigenvalues of ``V`` raised to at least ``floor``; ``(C, d)`` head.

    ``V = Q diag(e) Q^T`` becomes ``Q diag(max(e, floor)) Q^T`` (positive definite for
    ``floor > 0``), then ``W* = V^-1 U``. Only the released sums are used, so under a DP
    layer this is post-processing. ``floor = 0`` is :func:`ffc_solve` with ``lam = 0``.
    """
    if not (np.isfinite(floor) and floor >= 0):
        raise ConfigurationError(f"floor must be a finite number >= 0, got {floor}")
    if floor == 0:
        return ffc_solve(v_sum_packed, u_sum, 0.0)
    u = np.asarray(u_sum, dtype=np.float64)
    if u.ndim != 2:
        raise ConfigurationError(f"U must be (d, C), got shape {u.shape}")
    v = unpack_upper(np.asarray(v_sum_packed, dtype=np.float64), u.shape[0])
    e, q = np.linalg.eigh(v)
    w = q @ ((q.T @ u) / np.maximum(e, floor)[:, None])
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


def sphere_net(input_shape: Sequence[int], n_classes: int, feature_dim: int,
               channels: Sequence[int] | None = None, feature_relu: bool = True) -> SplitModel:
    """SphereFed's network before its head is set: the default body for the input shape
    (a CNN with ``channels`` for 28x28 images when given), its last ReLU dropped unless
    ``feature_relu``, then :class:`FeatureNorm`; a bias-free linear head."""
    if channels is not None and tuple(input_shape) == (1, 28, 28):
        model = CNN(n_classes, feature_dim, channels=tuple(channels), head_bias=False)
    else:
        model = build_model(tuple(input_shape), n_classes, feature_dim, head_bias=False)
    body = model.body
    if not feature_relu and isinstance(body, nn.Sequential) and isinstance(body[-1], nn.ReLU):
        body[-1] = nn.Identity()
    model.body = nn.Sequential(body, FeatureNorm())
    return model


class SphereModel(nn.Module):
    """SphereFed's trained model as :meth:`SphereFed.evaluate` scores it: with a released
    feature mean (``centred``), logits ``normalise(normalise(body(x)) - mean) W^T`` in
    float64; without, the network's own forward."""

    def __init__(self, input_shape: Sequence[int], n_classes: int, feature_dim: int,
                 channels: Sequence[int] | None = None, feature_relu: bool = True,
                 centred: bool = False) -> None:
        super().__init__()
        self.net = sphere_net(input_shape, n_classes, feature_dim, channels, feature_relu)
        self.centred = bool(centred)
        self.register_buffer("mean", torch.zeros(feature_dim, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class logits (float64 when centred)."""
        if not self.centred:
            return self.net(x)
        f = torch.from_numpy(normalise(self.net.body(x)))
        z = torch.from_numpy(normalise(f - self.mean))
        return z @ self.net.head.weight.detach().double().T


class SphereFed(FedAvg):
    """SphereFed training over FedAvg or FedProx, then (by default) one FFC calibration.

    Args:
        base: ``"fedavg"`` or ``"fedprox"`` -- how the body is trained and averaged.
        mu: FedProx's proximal weight (used when ``base="fedprox"``).
        calibrate: run the FFC phase (``"ffc"``) after the last training round.
        lam: ridge term of the FFC solve (paper main experiments: 0), or ``"auto"``: the
            noise-aware solve (eigenvalue floor from the DP noise actually added to ``V``,
            see the module docstring; the plain ``lambda = 0`` solve without noise).
        feature_relu: keep the ReLU that ends the toolkit's small bodies. Default False,
            because the fixed class targets ``W_y`` have mixed signs that non-negative
            features cannot reach; True gives post-ReLU features like the paper's backbones.
        body: ``"trained"`` (default): SphereFed's training rounds, then FFC. ``"public"``:
            no training and no model upload; FFC on the seeded initial body, which no record
            touches, so record-level DP on the calibration statistics is honest and the DP
            layer's epsilon is the whole run's (module docstring).
        center: run the ``"center"`` phase before FFC and calibrate on centred features
            (None: True for the public body, False for the trained one).
        channels: the two conv widths of the CNN body for 1x28x28 inputs (None: the
            toolkit's default (16, 32)); ignored for flat inputs.
        **kwargs: :class:`~algorithms.fedavg.FedAvg`'s arguments.

    Public body on full Fashion-MNIST (100 clients, Dirichlet 0.1, epsilon=1, delta=1e-5,
    record level, seeds 0-2, ``benchmarks/results/spherefed_public_fmnist.txt``):
    ``body="public", feature_dim=96, channels=(32, 64), lam="auto"`` gave 0.773
    plaintext, 0.765 central (gap 0.77 point, at most 0.79 per seed), 0.764 distributed
    (0.17 below central) and 0.722 local. Larger d is better without noise (0.785 at
    d=128, 0.807 at d=256 with the default channels) but loses more under noise (gaps 1.6
    and 3.6 points), so d=96 is the widest measured that keeps the gap below 1 point.

    Only the body is shared; the fixed head ``W`` (derived from the run seed) is never sent.
    After calibration the head is ``W*`` from the FFC solve; :attr:`accuracy_before_ffc`
    keeps the fixed-classifier accuracy measured just before it was replaced, and
    :attr:`ffc_solve_info` the noise and floor the solve used and the smallest eigenvalue of
    the matrix it inverted (``min_eigenvalue``: at least the floor under ``lam="auto"``).
    """

    name: ClassVar[str] = "spherefed"

    def __init__(self, base: str = "fedavg", mu: float = 0.01, calibrate: bool = True,
                 lam: float | str = 0.0, feature_relu: bool = False, body: str = "trained",
                 center: bool | None = None, channels: Sequence[int] | None = None,
                 **kwargs: Any) -> None:
        if base not in ("fedavg", "fedprox"):
            raise ConfigurationError(f"base must be 'fedavg' or 'fedprox', got {base!r}")
        if isinstance(lam, str):
            if lam != "auto":
                raise ConfigurationError(f"lam must be a number >= 0 or 'auto', got {lam!r}")
        elif not (isinstance(lam, (int, float)) and np.isfinite(lam) and lam >= 0):
            raise ConfigurationError(f"lam must be a number >= 0 or 'auto', got {lam!r}")
        if mu < 0:
            raise ConfigurationError(f"mu must be >= 0, got mu={mu}")
        if body not in ("trained", "public"):
            raise ConfigurationError(f"body must be 'trained' or 'public', got {body!r}")
        if body == "public" and not calibrate:
            raise ConfigurationError(
                "body='public' never trains the body, so FFC calibration is the whole "
                "algorithm; calibrate=False would leave the random fixed head W. Use "
                "calibrate=True (or body='trained')")
        if body == "public" and kwargs.get("dpsgd") is not None:
            raise ConfigurationError(
                "body='public' runs no training, so dpsgd has nothing to protect; drop it "
                "(the DP layer covers the calibration releases) or use body='trained'")
        if center is not None and not isinstance(center, bool):
            raise ConfigurationError(f"center must be True, False or None, got {center!r}")
        if center and not calibrate:
            raise ConfigurationError("center=True centres the FFC features; it needs "
                                     "calibrate=True")
        if channels is not None:
            channels = tuple(channels)
            if len(channels) != 2 or not all(isinstance(c, int) and c >= 1 for c in channels):
                raise ConfigurationError(
                    f"channels must be two positive integers, got {channels!r}")
        if kwargs.get("model") is not None:
            raise ConfigurationError(
                "SphereFed builds its own model (a fixed orthonormal head over unit-norm "
                f"features); model={kwargs['model']!r} would be ignored")
        super().__init__(**kwargs)
        self.base = base
        self.mu = mu
        self.calibrate = calibrate
        self.lam = lam
        self.feature_relu = feature_relu
        self.body = body
        self.center = (body == "public") if center is None else center
        self.channels = channels
        self.n_classes = 0
        self.dataset: Dataset | None = None
        self.ffc_head: np.ndarray | None = None
        self.accuracy_before_ffc: float | None = None
        self.feature_mean: np.ndarray | None = None
        self.ffc_solve_info: dict[str, float] = {}
        self._test_cache: dict[str, Any] = {}

    def build_model(self, dataset: Dataset) -> SplitModel:
        """Bias-free fixed orthonormal head over normalised features.

        Uses only the dataset's public shape and class count, never its records."""
        if dataset.n_classes > self.feature_dim:
            raise ConfigurationError(
                f"SphereFed needs C <= d, got C={dataset.n_classes} > d={self.feature_dim}"
            )
        model = sphere_net(dataset.input_shape, dataset.n_classes, self.feature_dim,
                           self.channels, self.feature_relu)
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
        """Build the model (with the seed-derived fixed head) and the global body.

        The initial body is seeded from ``seed`` alone (``derive_seed(seed, "init")``) and
        built from the dataset's shape: with ``body="public"`` it is the body of the run."""
        self.seed = seed
        self.dataset = dataset
        self.n_classes = dataset.n_classes
        self.ffc_head = None
        self.accuracy_before_ffc = None
        self.feature_mean = None
        self.ffc_solve_info = {}
        self._test_cache = {}
        super().setup(dataset, clients, seed)

    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        """Training every round (none for the public body); after the last one, when
        ``calibrate``, ``"center"`` (when centring) and ``"ffc"``."""
        out = [] if self.body == "public" else list(super().phases(round, rounds))
        if self.calibrate and round == rounds - 1:
            if self.center:
                out.append(_CenterPhase(self))
            out.append(_FFCPhase(self))
        return out

    def evaluate(self, dataset: Dataset, clients: Sequence[ClientState]) -> float:
        """Global test accuracy of the current head on the features FFC uses (centred by
        the released mean once there is one)."""
        assert self.model is not None and self.params is not None
        set_flat(self.shared_parameters(self.model), self.params)
        if self.feature_mean is None:
            return accuracy(self.model, dataset.x_test, dataset.y_test)
        head = self.model.head.weight.detach().double().numpy()
        z = self.transform(self.model, dataset.x_test, self.feature_mean,
                           self._test_cache, self.params)
        y = np.asarray(dataset.y_test)
        return float(np.mean((z @ head.T).argmax(axis=1) == y)) if len(y) else 0.0

    def export_model(self, clients: Sequence[ClientState]) -> Any | None:
        """The global model as :meth:`evaluate` scores it (a :class:`SphereModel`, centred
        by the released feature mean once there is one)."""
        from secagg.model_io import TrainedModel

        assert self.model is not None and self.params is not None
        set_flat(self.shared_parameters(self.model), self.params)
        centred = self.feature_mean is not None
        kwargs = {"input_shape": list(self.dataset.input_shape), "n_classes": self.n_classes,
                  "feature_dim": self.feature_dim,
                  "channels": None if self.channels is None else list(self.channels),
                  "feature_relu": self.feature_relu, "centred": centred}
        out = SphereModel(**kwargs)
        out.net.load_state_dict(self.model.state_dict())
        if centred:
            out.mean.copy_(torch.as_tensor(self.feature_mean, dtype=torch.float64))
        return TrainedModel(recipe={"factory": "algorithms.spherefed:SphereModel",
                                    "kwargs": kwargs}, model=out.eval())

    #: the feature width the DP defaults choose (:meth:`dp_defaults`)
    DP_FEATURE_DIM: ClassVar[int] = 16

    @classmethod
    def dp_defaults(cls, adjacency: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """Under a record-level DP layer, the public body unless the user chose the trained body or
        DP-SGD (``body="trained"``, ``dpsgd`` given): a trained body's upload has no
        record-level bound (the run would refuse), while the seeded, untrained body's FFC
        statistics do, so the whole budget buys the one calibration release. With it:
        ``lam="auto"`` (the ridge floor set from the noise on V) and ``feature_dim=16``
        unless given: the noise on the d x d Gram matrix grows with d while the signal per
        record stays bounded, so a narrow body keeps the release useful at record-level
        epsilons (digits, 10 clients, 3 seeds, epsilon 64: d=16 within 0.7 points of
        plaintext for every DP layer; d=64 scores higher without DP, 0.94, but local DP
        stays 4.5 points below). With many records per class a wider body pays: on
        Fashion-MNIST (60,000 records) d=64-96 came within 1 point of plaintext at epsilon
        1 (benchmarks/results/spherefed_public_fmnist.txt); pass ``feature_dim`` there.
        Under client-level DP nothing changes."""
        if adjacency != "record" or "dpsgd" in given or given.get("body",
                                                                  "public") != "public":
            return {}
        return {"body": "public", "lam": "auto", "feature_dim": cls.DP_FEATURE_DIM}

    def describe(self) -> dict[str, Any]:
        """FedAvg's description plus SphereFed's options."""
        return {**super().describe(), "base": self.base, "mu": self.mu,
                "calibrate": self.calibrate, "lam": self.lam, "feature_relu": self.feature_relu,
                "body": self.body, "center": self.center, "feature_dim": self.feature_dim,
                "channels": None if self.channels is None else list(self.channels)}

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

    def center_spec(self) -> UploadSpec:
        """Field ``center``: ``[n, sum f]`` of the unit-norm (uncentred) features. One record
        adds ``[1, f]`` with ``||f|| <= 1``: L2 bound sqrt(2), L-inf bound 1."""
        return UploadSpec((
            Field("center", (self.feature_dim + 1,), "float64",
                  bound=Bound(l2=float(np.sqrt(2.0)), linf=1.0), additive=True),
        ))

    @staticmethod
    def transform(model: SplitModel, x: np.ndarray, mean: np.ndarray | None,
                  cache: dict[str, Any] | None = None,
                  params: np.ndarray | None = None) -> np.ndarray:
        """The features FFC and evaluation use: ``f = normalise(body(x))`` in float64, then,
        with a ``mean``, ``normalise(f - mean)``. Every row has norm 1 (or 0).

        With a ``cache`` dict and the body's ``params``, ``f`` is kept there and reused
        for the same input array (the same object) while the parameters are unchanged (the
        centring and FFC phases, and the two evaluations around the solve, use the same
        body and data)."""
        if cache is not None and params is not None and cache.get("x") is x and np.array_equal(
                cache["params"], params):
            f = cache["f"]
        else:
            f = normalise(features(model, x))
            if cache is not None and params is not None:
                cache.update(x=x, params=np.array(params, copy=True), f=f)
        return f if mean is None else normalise(f - np.asarray(mean, dtype=np.float64))

    def client_features(self, client: ClientState, params: np.ndarray,
                        mean: np.ndarray | None = None) -> np.ndarray:
        """Unit-norm float64 features of the client's training data under ``params``
        (centred by ``mean`` when given); cached in the client's own state."""
        model = self.client_model(client, params)
        cache = client.state.setdefault("spherefed_features", {})
        return self.transform(model, client.data.x, mean, cache, params)

    def set_head(self, w: np.ndarray) -> None:
        """Install a ``(C, d)`` head on the global model."""
        assert self.model is not None
        with torch.no_grad():
            self.model.head.weight.copy_(torch.as_tensor(w, dtype=torch.float32))


class _CenterPhase(GlobalModelPhase):
    """Centring: each client uploads ``[n, sum f]``; the server keeps ``mu = sum f / n``."""

    name: ClassVar[str] = "center"

    algo: SphereFed

    def spec(self) -> UploadSpec:
        return self.algo.center_spec()

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: E501
        f = self.algo.client_features(client, broadcast["params"])
        return {"center": np.concatenate([[float(f.shape[0])], f.sum(axis=0)])}

    def server_step(self, aggregate: Aggregate) -> None:
        s = np.asarray(aggregate["center"], dtype=np.float64)
        count = float(s[0])
        if not count > 0:  # nothing contributed, or noise pushed the count below 0
            self.algo.feature_mean = np.zeros(self.algo.feature_dim)
            return
        mean = s[1:] / count
        norm = float(np.linalg.norm(mean))
        # the mean of unit vectors lies in the unit ball: projecting a noisy one back is
        # post-processing
        self.algo.feature_mean = mean / norm if norm > 1.0 else mean

    def client_flops(self, client: ClientState) -> float:
        return 2.0 * self.algo.feature_dim * client.n_records

    training_note: ClassVar[str] = (
        "the feature sums are taken under the final global body, which the training rounds "
        "trained on the clients' records, this client's included")

    def trained_fields(self) -> tuple[str, ...]:
        """``center`` under a trained body; none under the public (never trained) body."""
        return () if self.algo.body == "public" else ("center",)

    def trained_with_dpsgd(self) -> bool:
        """True when the training rounds ran under DP-SGD."""
        return self.algo.dpsgd is not None


class _FFCPhase(GlobalModelPhase):
    """FFC: each client uploads (V, U) under the final body; the server solves for W*."""

    name: ClassVar[str] = "ffc"

    algo: SphereFed

    def spec(self) -> UploadSpec:
        return self.algo.ffc_spec()

    def broadcast(self) -> dict[str, np.ndarray]:
        """The global parameters, and the released feature mean when centring."""
        out = super().broadcast()
        if self.algo.center:
            mean = self.algo.feature_mean
            out["mean"] = np.zeros(self.algo.feature_dim) if mean is None else mean
        return out

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: E501
        mean = broadcast["mean"] if self.algo.center else None
        z = self.algo.client_features(client, broadcast["params"], mean)
        v, u = ffc_statistics(z, client.data.y, self.algo.n_classes)
        return {"V": v, "U": u}

    def server_step(self, aggregate: Aggregate) -> None:
        algo = self.algo
        assert algo.dataset is not None and algo.model is not None and algo.params is not None
        algo.accuracy_before_ffc = algo.evaluate(algo.dataset, [])
        sigma = dp_sum_sigma(aggregate.notes, "V")
        low = float(np.linalg.eigvalsh(unpack_upper(aggregate["V"], algo.feature_dim))[0])
        if algo.lam == "auto":
            floor = noise_floor(sigma, algo.feature_dim)
            algo.ffc_head = ffc_solve_floor(aggregate["V"], aggregate["U"], floor)
            algo.ffc_solve_info = {"sigma_V": sigma, "floor": floor, "lam": 0.0,
                                   "min_eigenvalue": max(low, floor) if floor else low}
        else:
            algo.ffc_head = ffc_solve(aggregate["V"], aggregate["U"], float(algo.lam))
            algo.ffc_solve_info = {"sigma_V": sigma, "floor": 0.0, "lam": float(algo.lam),
                                   "min_eigenvalue": low + float(algo.lam)}
        algo.set_head(algo.ffc_head)

    def client_flops(self, client: ClientState) -> float:
        d, c = self.algo.feature_dim, self.algo.n_classes
        return 2.0 * d * client.n_records * (d + c)

    training_note: ClassVar[str] = (
        "V and U are features under the final global body, which the training rounds "
        "trained on the clients' records, this client's included")

    def trained_fields(self) -> tuple[str, ...]:
        """``V`` and ``U`` under a trained body: unit-norm features bound each record's term
        by 1 whatever the body, but the body itself moves with the client's records (see
        CCVR's moments phase: record-level DP holds by composition only when training ran
        under DP-SGD). None under the public body: the seeded body never saw a record, and
        the released mean is a DP output, so one record changes only its own terms."""
        return () if self.algo.body == "public" else ("V", "U")

    def trained_with_dpsgd(self) -> bool:
        """True when the training rounds ran under DP-SGD."""
        return self.algo.dpsgd is not None


__all__: Sequence[str] = [
    "AUTO_FLOOR",
    "orthonormal_classifier",
    "packed_size",
    "pack_upper",
    "unpack_upper",
    "normalise",
    "ffc_statistics",
    "ffc_solve",
    "ffc_solve_floor",
    "noise_floor",
    "dp_sum_sigma",
    "sphere_mse",
    "FeatureNorm",
    "SphereFed",
]
