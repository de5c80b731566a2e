"""CCVR (Luo et al., NeurIPS 2021): classifier calibration with virtual representations.

After ordinary training (FedAvg or FedProx) every client uploads, per class, the additive
moment sums of its features under the final global body: the count ``n_c``, the sum
``s_c = sum z`` and the sum of outer products ``S_c = sum z z^T`` (upper triangle packed).
Features are clipped to a declared L2 bound first, so every field has a bound. The server
recovers exactly the paper's pooled mean and unbiased covariance (Eq. 3-4):

    mu_c = s_c / N_c,   Sigma_c = (S_c - s_c s_c^T / N_c) / (N_c - 1)

samples ``M_c`` virtual features per class from ``N(mu_c, Sigma_c)`` (eigenvalues clipped
at zero, so rank-deficient covariances are fine), optionally applies ReLU + Tukey's power
transform, and retrains the head with cross-entropy starting from the trained head.

The paper's own upload (per-client mean and covariance) is not additive; the merge of
those, :func:`merge_gaussians`, is kept here to test that both routes agree.

Under a DP layer (the server reads the noise stds of ``counts``, ``sums`` and ``outer``
from the aggregate's notes) the moments are estimated, not divided out: a noised count
can be <= 0 and a noised covariance indefinite. :func:`noisy_class_gaussians` (built on
:func:`algorithms.moments.noisy_gaussians`) shrinks every class's count, mean and
covariance toward the pooled moments of all classes with weights from the noise
variance, projects the means into the ball of radius ``feature_bound`` and the
covariances onto eigenvalues in ``[floor, feature_bound^2]`` (features in that ball have
no larger variance along any direction). A class whose noised count is not significantly
positive is *hopeless*: it is shrunk fully to the pooled moments, never dropped, and
still gets virtual features. When the pooled count is itself not significant, a
data-independent prior stands in (mean 0, covariance ``feature_bound^2 / d I``). The head
is then re-trained on the virtual features as without noise, and the update is scaled by
the *calibration strength* ``rho = sum_c pi_c w_c`` (``pi`` the shrunk class shares,
``w_c`` the class's mean-shrinkage weight): ``head = head_0 + rho (head_cal - head_0)``
(:func:`calibration_strength`). Without noise ``rho = 1`` (the paper's calibration); when
every class is hopeless the virtual features carry no label information, ``rho = 0`` and
the trained head is kept (re-training on them would only pull the head toward chance).
(Scaling ``rho`` also by the reliability of the pooled covariance was tried and dropped:
on a weakly trained body with small features it gave up most of the calibration's gain
at a noise the means survive, 0.26 against 0.45 on digits.) All of this is
post-processing of the released sums and spends no privacy.
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
from algorithms.models import SplitModel, get_flat, set_flat
from algorithms.moments import (
    MomentNoise,
    NoisyGaussians,
    Prior,
    noisy_gaussians,
    pack_upper,
    packed_size,
    unpack_upper,
)
from algorithms.training import LossFn, accuracy, features
from secagg.data import Dataset
from secagg.errors import ConfigurationError
from secagg.federation import derive_seed
from secagg.messages import Bound, Field, UploadSpec


def clip_rows(z: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
    """Scale every row of ``z`` whose L2 norm exceeds ``bound`` onto the ball.

    Returns the clipped rows and how many were clipped."""
    if bound <= 0:
        raise ConfigurationError(f"feature bound must be positive, got {bound}")
    z = np.asarray(z, dtype=np.float64)
    norms = np.linalg.norm(z, axis=1, keepdims=True)
    scale = np.minimum(1.0, bound / np.maximum(norms, 1e-300))
    return z * scale, int(np.sum(norms[:, 0] > bound))


def class_moments(
    z: np.ndarray, y: np.ndarray, n_classes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-class additive moments of features ``z`` (n, d) with labels ``y`` (n,).

    Returns ``(counts (C,), sums (C, d), outer (C, d(d+1)/2))`` in float64; every class is
    present (zeros where the client holds none), so the message hides the label set.
    """
    z = np.asarray(z, dtype=np.float64)
    y = np.asarray(y)
    if z.ndim != 2 or y.shape != (z.shape[0],):
        raise ConfigurationError(f"need z (n, d) and y (n,), got {z.shape} and {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= n_classes):
        raise ConfigurationError(f"labels must lie in [0, {n_classes})")
    d = z.shape[1]
    counts = np.bincount(y, minlength=n_classes).astype(np.float64)
    sums = np.zeros((n_classes, d))
    outer = np.zeros((n_classes, packed_size(d)))
    for c in range(n_classes):
        zc = z[y == c]
        if len(zc):
            sums[c] = zc.sum(axis=0)
            outer[c] = pack_upper(zc.T @ zc)
    return counts, sums, outer


def moments_to_gaussians(
    counts: np.ndarray, sums: np.ndarray, outer_packed: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Pooled per-class mean ``(C, d)`` and unbiased covariance ``(C, d, d)`` from summed moments.

    Classes with ``N_c = 0`` get NaN mean and covariance; ``N_c = 1`` gets a zero covariance
    (a single point has no spread).
    """
    counts = np.asarray(counts, dtype=np.float64)
    sums = np.asarray(sums, dtype=np.float64)
    n_classes, d = sums.shape
    outer = unpack_upper(np.asarray(outer_packed, dtype=np.float64), d)
    mu = np.full((n_classes, d), np.nan)
    cov = np.full((n_classes, d, d), np.nan)
    for c in range(n_classes):
        n = counts[c]
        if n <= 0:
            continue
        mu[c] = sums[c] / n
        if n < 2:
            cov[c] = 0.0
        else:
            cov[c] = (outer[c] - np.outer(sums[c], sums[c]) / n) / (n - 1.0)
            cov[c] = 0.5 * (cov[c] + cov[c].T)
    return mu, cov


def merge_gaussians(
    means: Sequence[np.ndarray], covs: Sequence[np.ndarray | None], counts: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """The paper's merge (Eq. 3-4) of one class's per-client ``(mu_k, Sigma_k, N_k)``.

    ``Sigma_k`` is the client's unbiased covariance; it may be ``None`` when ``N_k = 1``
    (its weight ``N_k - 1`` is 0). Clients with ``N_k = 0`` are skipped.
    """
    items = [(np.asarray(m, float), s, int(n)) for m, s, n in zip(means, covs, counts) if n > 0]
    total = sum(n for _, _, n in items)
    if total < 2:
        raise ConfigurationError(f"merging needs at least 2 samples in total, got {total}")
    d = items[0][0].shape[0]
    mu = sum(n / total * m for m, _, n in items)
    cov = np.zeros((d, d))
    for m, s, n in items:
        if n > 1:
            cov += (n - 1.0) / (total - 1.0) * np.asarray(s, float)
        cov += n / (total - 1.0) * np.outer(m, m)
    cov -= total / (total - 1.0) * np.outer(mu, mu)
    return mu, cov


def sample_gaussian(
    mean: np.ndarray, cov: np.ndarray, n: int, rng: np.random.Generator
) -> np.ndarray:
    """``n`` draws from ``N(mean, cov)`` through an eigendecomposition with eigenvalues
    clipped at 0, so singular or slightly indefinite covariances are sampled safely."""
    cov = 0.5 * (np.asarray(cov, float) + np.asarray(cov, float).T)
    vals, vecs = np.linalg.eigh(cov)
    vals = np.clip(vals, 0.0, None)
    eps = rng.standard_normal((n, len(vals)))
    return np.asarray(mean, float) + (eps * np.sqrt(vals)) @ vecs.T


def tukey(z: np.ndarray, power: float = 0.5) -> np.ndarray:
    """ReLU followed by Tukey's ladder-of-powers transform ``x -> x^power`` (log at 0)."""
    z = np.maximum(np.asarray(z, dtype=np.float64), 0.0)
    if power == 0:
        return np.log(z + 1e-12)
    return np.power(z, power)


def virtual_counts(counts: np.ndarray, per_class: int, proportional: bool = True) -> np.ndarray:
    """Virtual features per class: ``per_class`` each, or ``per_class * C * N_c / N`` (at
    least 1 for a present class) when ``proportional``; 0 for absent classes."""
    counts = np.asarray(counts, dtype=np.float64)
    present = counts > 0
    if not proportional:
        return np.where(present, per_class, 0).astype(int)
    total = counts.sum()
    if total <= 0:
        return np.zeros(len(counts), dtype=int)
    m = np.rint(per_class * len(counts) * counts / total).astype(int)
    return np.where(present, np.maximum(m, 1), 0)


def sample_virtual(means: np.ndarray, covs: np.ndarray, per_class: np.ndarray,
                   seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``per_class[c]`` draws from ``N(means[c], covs[c])`` for every class; returns
    ``(features, labels)``.

    Raises:
        ConfigurationError: no class has a positive number of draws.
    """
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for c in range(len(per_class)):
        if per_class[c] > 0:
            xs.append(sample_gaussian(means[c], covs[c], int(per_class[c]), rng))
            ys.append(np.full(int(per_class[c]), c, dtype=np.int64))
    if not xs:
        raise ConfigurationError("CCVR received no features: every class count is 0")
    return np.concatenate(xs), np.concatenate(ys)


def virtual_features(
    counts: np.ndarray,
    sums: np.ndarray,
    outer_packed: np.ndarray,
    per_class: int = 100,
    proportional: bool = True,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Sample CCVR's virtual features from exact summed moments; returns
    ``(features, labels)``."""
    mu, cov = moments_to_gaussians(counts, sums, outer_packed)
    return sample_virtual(mu, cov, virtual_counts(counts, per_class, proportional), seed)


def noisy_class_gaussians(counts: np.ndarray, sums: np.ndarray, outer_packed: np.ndarray,
                          noise: MomentNoise, feature_bound: float) -> NoisyGaussians:
    """Valid per-class Gaussians from noised moment sums (module docstring): every class
    present, means in the ball of radius ``feature_bound``, covariances symmetric with
    eigenvalues in ``[floor, feature_bound^2]``, unbiased (``ddof=1``) where not shrunk."""
    d = np.asarray(sums).shape[1]
    prior = Prior(np.zeros(d), feature_bound**2 / d * np.eye(d))
    return noisy_gaussians(counts, sums, outer_packed, noise, prior, ddof=1,
                           ceiling=feature_bound**2, radius=feature_bound)


def calibration_strength(g: NoisyGaussians) -> float:
    """``rho = sum_c pi_c w_c`` in [0, 1]: how far the re-trained head replaces the trained
    one, with ``w_c`` class c's mean-shrinkage weight and ``pi_c`` its shrunk share. 1
    without noise; 0 when every class was shrunk fully to the pooled mean (its virtual
    features then carry no label information)."""
    return float(np.clip(np.sum(g.weights * g.mean_weight), 0.0, 1.0))


class Tukey(nn.Module):
    """ReLU then ``x^power`` as a fixed layer in front of the head (CCVR's transform)."""

    def __init__(self, power: float = 0.5) -> None:
        super().__init__()
        self.power = power

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``relu(x) ** power`` (``log`` at power 0)."""
        x = torch.relu(x)
        return torch.log(x + 1e-12) if self.power == 0 else x.pow(self.power)


class CCVR(FedAvg):
    """FedAvg or FedProx training, then CCVR's post-hoc head calibration.

    Args:
        base: ``"fedavg"`` or ``"fedprox"``; ``mu`` is FedProx's weight.
        feature_bound: L2 clip applied to every feature before the moments (declared bound
            of the ``moments`` phase; clips are counted in :attr:`feature_clips`).
        virtual_per_class: M_c on average per class (paper: 100 for 10 classes).
        proportional: M_c proportional to the class frequency N_c / N (paper's suggestion)
            rather than ``virtual_per_class`` for every present class.
        tukey: ``None`` (default) or the power of ReLU + Tukey applied to virtual features and,
            for consistency, to real features at inference (paper: 0.5, applied "before
            re-training"; its placement at inference is not stated, so it is opt-in here).
        calib_lr, calib_epochs, calib_batch, calib_momentum: the head re-training (CE, SGD,
            warm start from the trained head). The paper's main text gives none of these.
        **kwargs: :class:`~algorithms.fedavg.FedAvg`'s arguments.

    :attr:`accuracy_before_calibration` holds the trained model's accuracy just before the
    head is replaced.
    """

    name: ClassVar[str] = "ccvr"

    def __init__(self, base: str = "fedavg", mu: float = 0.01, feature_bound: float = 50.0,
                 virtual_per_class: int = 100, proportional: bool = True,
                 tukey: float | None = None, calib_lr: float = 0.01, calib_epochs: int = 5,
                 calib_batch: int = 64, calib_momentum: float = 0.9, calibrate: bool = True,
                 **kwargs: Any) -> None:
        if base not in ("fedavg", "fedprox"):
            raise ConfigurationError(f"base must be 'fedavg' or 'fedprox', got {base!r}")
        if feature_bound <= 0 or virtual_per_class < 1 or calib_epochs < 0 or mu < 0:
            raise ConfigurationError("feature_bound, virtual_per_class must be positive; "
                                     "calib_epochs and mu non-negative")
        super().__init__(**kwargs)
        self.base = base
        self.mu = mu
        self.feature_bound = float(feature_bound)
        self.virtual_per_class = virtual_per_class
        self.proportional = proportional
        self.tukey = tukey
        self.calib_lr = calib_lr
        self.calib_epochs = calib_epochs
        self.calib_batch = calib_batch
        self.calib_momentum = calib_momentum
        self.calibrate = calibrate
        self.n_classes = 0
        self.dataset: Dataset | None = None
        self.feature_clips = 0
        self.accuracy_before_calibration: float | None = None
        self.gaussians: tuple[np.ndarray, np.ndarray] | None = None

    def loss_fn(self, client: ClientState, model: SplitModel) -> LossFn:
        """Cross-entropy, plus FedProx's term when ``base="fedprox"``."""
        base = super().loss_fn(client, model)
        if self.base == "fedprox":
            return with_proximal(base, self.shared_parameters(model), self.mu)
        return base

    def setup(self, dataset: Dataset, clients: Sequence[ClientState], seed: int) -> None:
        """FedAvg's setup; remembers the data set for the calibration."""
        self.dataset = dataset
        self.n_classes = dataset.n_classes
        self.feature_clips = 0
        self.accuracy_before_calibration = None
        self.gaussians = None
        self.calibration_skipped: str | None = None
        self.calibration_strength: float | None = None
        self.shrinkage: NoisyGaussians | None = None
        super().setup(dataset, clients, seed)

    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        """Training every round; the ``moments`` phase after the last one."""
        out = list(super().phases(round, rounds))
        if self.calibrate and round == rounds - 1:
            out.append(_MomentsPhase(self))
        return out

    def describe(self) -> dict[str, Any]:
        """FedAvg's description plus CCVR's options."""
        return {**super().describe(), "base": self.base, "mu": self.mu,
                "feature_bound": self.feature_bound, "virtual_per_class": self.virtual_per_class,
                "proportional": self.proportional, "tukey": self.tukey,
                "calib_lr": self.calib_lr, "calib_epochs": self.calib_epochs}

    def moments_spec(self) -> UploadSpec:
        """Fields ``counts`` (C), ``sums`` (C x d), ``outer`` (C x d(d+1)/2 packed).

        Per record (feature clipped to L2 <= B): one count, one row ``z`` (L2 <= B) and one
        packed ``z z^T`` (L2 <= ||z||^2 <= B^2).
        """
        d, c, b = self.feature_dim, self.n_classes, self.feature_bound
        return UploadSpec((
            Field("counts", (c,), "int64", bound=Bound(l2=1.0, linf=1.0), additive=True),
            Field("sums", (c, d), "float64", bound=Bound(l2=b, linf=b), additive=True),
            Field("outer", (c, packed_size(d)), "float64", bound=Bound(l2=b * b, linf=b * b),
                  additive=True),
        ))

    def client_moments(self, client: ClientState, params: np.ndarray) -> dict[str, np.ndarray]:
        """One client's clipped per-class moments under the global ``params``."""
        model = self.client_model(client, params)
        z, clipped = clip_rows(features(model, client.data.x), self.feature_bound)
        self.feature_clips += clipped
        n, s, o = class_moments(z, client.data.y, self.n_classes)
        return {"counts": n.astype(np.int64), "sums": s, "outer": o}

    def recalibrate(self, counts: np.ndarray, sums: np.ndarray, outer: np.ndarray,
                    noise: MomentNoise | None = None) -> None:
        """Server side: Gaussians from the summed moments, virtual features, head re-training.

        ``noise``: the stds of the noise on the sums (None or zero: exact sums, the paper's
        calibration); with noise the moments are shrunk and projected and the head update
        is scaled by the calibration strength (module docstring)."""
        assert self.model is not None and self.params is not None and self.dataset is not None
        model = self.model
        set_flat(self.shared_parameters(model), self.params)
        self.accuracy_before_calibration = accuracy(model, self.dataset.x_test,
                                                    self.dataset.y_test)
        seed = derive_seed(self.seed, "ccvr-virtual")
        if noise is None or noise.exact:
            if not np.any(virtual_counts(np.asarray(counts, dtype=np.float64),
                                         self.virtual_per_class, self.proportional) > 0):
                # exact sums with every class count 0: no record reached the server
                self.calibration_skipped = (
                    "every class count the server received is 0 (no records), so no "
                    "virtual features could be drawn; the trained head was kept")
                return
            self.gaussians = moments_to_gaussians(counts, sums, outer)
            x, y = virtual_features(counts, sums, outer, self.virtual_per_class,
                                    self.proportional, seed=seed)
            self.calibration_strength = 1.0
        else:
            g = noisy_class_gaussians(counts, sums, outer, noise, self.feature_bound)
            self.shrinkage = g
            self.gaussians = (g.means, g.covariances)
            x, y = sample_virtual(g.means, g.covariances,
                                  virtual_counts(g.counts, self.virtual_per_class,
                                                 self.proportional), seed)
            self.calibration_strength = calibration_strength(g)
        head = model.head
        if self.tukey is not None:
            x = tukey(x, self.tukey)
            if not isinstance(head, nn.Sequential):
                model.head = nn.Sequential(Tukey(self.tukey), head)
        linear = model.head[-1] if isinstance(model.head, nn.Sequential) else model.head
        start = [p.detach().clone() for p in linear.parameters()]
        xt = torch.as_tensor(x, dtype=torch.float32)
        yt = torch.as_tensor(y, dtype=torch.int64)
        opt = torch.optim.SGD(linear.parameters(), lr=self.calib_lr, momentum=self.calib_momentum)
        gen = torch.Generator().manual_seed(derive_seed(self.seed, "ccvr-retrain") % 2**63)
        for _ in range(self.calib_epochs):
            order = torch.randperm(len(yt), generator=gen)
            for i in range(0, len(order), self.calib_batch):
                idx = order[i:i + self.calib_batch]
                opt.zero_grad()
                nn.functional.cross_entropy(linear(xt[idx]), yt[idx]).backward()
                opt.step()
        if self.calibration_strength < 1.0:
            with torch.no_grad():
                for p, p0 in zip(linear.parameters(), start):
                    p.copy_(p0 + self.calibration_strength * (p - p0))
        self.params = get_flat(self.shared_parameters(model))


class _MomentsPhase(GlobalModelPhase):
    """CCVR: per-class moment sums under the final body; the server re-trains the head."""

    name: ClassVar[str] = "moments"

    algo: CCVR

    def spec(self) -> UploadSpec:
        return self.algo.moments_spec()

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: E501
        return self.algo.client_moments(client, broadcast["params"])

    def server_step(self, aggregate: Aggregate) -> None:
        self.algo.recalibrate(aggregate["counts"], aggregate["sums"], aggregate["outer"],
                              MomentNoise.from_notes(aggregate.notes, "counts", "sums", "outer"))

    def measurements(self) -> dict[str, Any]:
        """Why the calibration kept the trained head, when it did; under noise, the
        calibration strength and the classes shrunk fully to the pooled moments."""
        algo = self.algo
        out: dict[str, Any] = {}
        if algo.calibration_skipped is not None:
            out["calibration_skipped"] = algo.calibration_skipped
        if algo.shrinkage is not None:
            out["calibration_strength"] = algo.calibration_strength
            out["hopeless_classes"] = [int(c) for c in np.flatnonzero(algo.shrinkage.hopeless)]
        return out

    def client_flops(self, client: ClientState) -> float:
        d = self.algo.feature_dim
        return 2.0 * client.n_records * d * (d + 1)

    training_note: ClassVar[str] = (
        "the moments are features under the final global body, which the FedAvg rounds "
        "trained on the clients' records, this client's included")

    def trained_fields(self) -> tuple[str, ...]:
        """``sums`` and ``outer`` (features under the trained global body); ``counts`` is a
        plain label count. The body is the broadcast, itself the output of the training
        rounds' releases, so a record-level guarantee holds by adaptive composition exactly
        when those releases were record-level DP, i.e. (the engine refuses the training
        rounds otherwise) when training ran under DP-SGD."""
        return ("sums", "outer")

    def trained_with_dpsgd(self) -> bool:
        """True when the FedAvg rounds trained under DP-SGD."""
        return self.algo.dpsgd is not None
