"""FedLog (Yu, Zhang, Poupart): personalized bodies, a Bayesian head from summed statistics.

Every client keeps its own body (never shared). Each round the server broadcasts the head
eta (C x (d+1), bias in column 0); each client trains its body with eta frozen
(cross-entropy), then computes in eval mode, for every class y, the count and the sum of its
features with a constant 1 prepended: ``stats[y] = sum over its class-y records of [1, phi]``.
It is additive, so the server needs only the sum; it then solves the MAP of the conjugate
posterior exactly (:func:`algorithms.fedlog_solver.solve_map`). The record count n the solve
also needs is the sum of the count column, ``n = sum_y stats[y, 0]``, so it is not uploaded
separately: a separate ``n`` field would split a DP budget across two fields and cost
sqrt(2) more noise on the statistics for information the server already has.

Statistics are recomputed every round; nothing accumulates across rounds (the bodies move).
Round 0 is the reference code's "pretrain" round: clients send statistics of their freshly
initialised bodies (all clients start from the same initialisation) and the server solves
for the first head.

One release (``release_rounds=1``). Round 0's statistics come from the seeded initial body,
which no record has trained, so one record adds exactly its own ``[1, phi]`` term: the
per-record bound is a record-level sensitivity and the whole run releases that one
statistic. Every later round is a :class:`~algorithms.base.LocalPhase` ("personalize"): each
client trains its body against the frozen head for ``local_epochs`` and uploads nothing.
Under DP the run's epsilon then covers everything that left a client, and the budget is
not split over rounds (the approach of Tramer and Boneh, "Differentially Private Learning
Needs Better Features (or Much More Data)", ICLR 2021: release statistics of
data-independent features once, rather than of features trained on the private records).
The head does not improve after round 0; the bodies adapt to it (as SphereFed's bodies do
to a fixed classifier).

Features are clamped to [-b, b] by the body's last layer, so one record contributes
[1, phi] with L2 norm <= sqrt(1 + d b^2) and L-inf <= max(1, b) (FedLog, Theorem 3.1).
With ``feature_norm=R`` the body instead ends by scaling each record's feature vector to L2
norm R (after the clamp): one record then contributes [1, phi] with L2 norm sqrt(1 + R^2)
and L-inf max(1, R), whatever d and whatever the scale of the body's raw output.

Adjacency. That per-record bound is *not* a record-level sensitivity once the body has been
trained on the same records (every round after the first): removing one record changes the
body and so every record's phi (measured on digits: declared 16.03, observed 65-77). So by
default the statistic carries a client-level bound: each client scales its whole upload
into the L2 ball of radius ``client_l2`` (a public parameter; scalings are counted in
:attr:`FedLog.clipped`). That bounds a client's contribution by ``client_l2`` (client-level
DP) and one record's by ``2 client_l2`` (record-level DP). Scaling keeps the count column
consistent with the feature sums (a client is down-weighted, not distorted), and the server
still takes n from the count column. ``client_l2=None`` declares the per-record bound
instead; the engine then refuses record-level DP unless the bodies train under DP-SGD
(then, given the body, one record moves the statistic by at most its bound, and the DP-SGD
events compose with the release on the run's ledger).

Defaults under DP (:meth:`FedLog.dp_defaults`). Under a record-level DP layer the command
line and the sweep build FedLog with ``release_rounds=1`` unless the user chose the release
schedule, the bound or DP-SGD: the one release then has the per-record bound as its
sensitivity, the whole budget buys one release, and the guarantee is record-level end to
end. With it comes ``feature_norm=8`` (:data:`FedLog.DP_FEATURE_NORM`) unless the user chose
the feature bound (``feature_norm`` or ``feature_bound`` given): each record's features
scaled to norm 8, so one record moves the statistic by sqrt(1 + 8^2) = 8.06, a bound every
record meets with equality. Why, measured on held-out *training* records of digits (the
seeded MLP body, d = 64, 10 clients, Dirichlet 0.5, 6 seeds x 2 noise draws; the local test
sets untouched; ``benchmarks/results/fedlog_dp_defaults.txt``):

* The paper's box b = 2 declares sqrt(1 + 64 * 4) = 16.03 per record for features of norm
  at most 1.7 (|phi_i| <= 0.6): the noise is sized ten times too large. A tighter box
  (b = 0.25) cuts it, but at the raw scale (within-class sd 0.045 against the unit spread
  FedLog's model assumes) the exact head leans on its class-prior term and is poor and
  unstable: validation accuracy 0.66-0.68 without noise.
* Norm 8: plaintext 0.832 (box: 0.679); central DP 0.679/0.819/0.828 at epsilon 1/4/16,
  local DP 0.729/0.825/0.830 at 4/16/64 (box: central 0.122/0.166/0.430, local
  0.125/0.174/0.400). Norms 2, 4, 16 give plaintext 0.807, 0.823, 0.835; 16 is within 0.4
  point of 8 everywhere, and 8 keeps the logits (~R^2) moderate for bodies trained against
  the head afterwards. d = 64 beats 32 and 16 (plaintext 0.794, 0.722).
* One noise level for the count column and the sums, as in the paper: giving the counts a
  larger share of the budget (count column scaled by 2, 4, 8) never helped.

Client-level DP over a handful of clients cannot carry these statistics (noise
``z * client_l2`` against class counts of ~100: the run's plan warns), and a release every
round of trained bodies is not record-level without DP-SGD. ``FedLog()`` built directly
keeps the paper's schedule.

Noised statistics. Under DP the server step reads the noise std of the released sum from
the aggregate (:func:`algorithms.moments.dp_sum_sigma`) and solves with the statistics'
posterior mean (:func:`algorithms.fedlog_solver.shrink_statistics`): every class keeps a
positive count and a mean inside the feature box, so no class is dropped and the head is
finite however heavy the noise.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch import nn

from algorithms.base import Aggregate, Algorithm, ClientState, LocalPhase, Phase
from algorithms.fedlog_solver import ShrunkStatistics, shrink_statistics, solve_map
from algorithms.models import SplitModel, build_model
from algorithms.moments import dp_sum_sigma
from algorithms.training import accuracy, features, train_local
from secagg.data import Dataset
from secagg.errors import ConfigurationError
from secagg.federation import derive_seed
from secagg.messages import Bound, Field, UploadSpec

#: FedLog's default public bound on the L2 norm of one client's statistic.
DEFAULT_CLIENT_L2 = 1000.0


def fedlog_model(input_shape: Sequence[int], n_classes: int, feature_dim: int,
                 feature_bound: float, feature_norm: float | None = None) -> SplitModel:
    """FedLog's model: the default body for the input shape ending in a clamp to
    [-b, b] (then, with ``feature_norm``, a scaling to norm R) and a linear head."""
    base = build_model(tuple(input_shape), n_classes, feature_dim, feature_clamp=feature_bound)
    if feature_norm is not None:
        base.body.append(_ToNorm(feature_norm))
    return base


class _ToNorm(nn.Module):
    """Scale each row (one record's feature vector) to L2 norm ``norm``; a zero row stays
    zero. FedLog's last body layer under ``feature_norm``."""

    def __init__(self, norm: float) -> None:
        super().__init__()
        self.norm = float(norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = torch.linalg.vector_norm(x, dim=1, keepdim=True)
        return x * (self.norm / length.clamp_min(1e-30))

    def extra_repr(self) -> str:
        return f"norm={self.norm}"


def project_to_ball(phi: np.ndarray, radius: float) -> np.ndarray:
    """Rows of ``phi`` (float64) with L2 norm above ``radius`` scaled just inside it; the
    others unchanged. Makes the declared per-record bound hold exactly in float64 after the
    body's float32 normalisation (which may overshoot by an ulp or two)."""
    phi = np.asarray(phi, dtype=np.float64)
    norms = np.linalg.norm(phi, axis=1, keepdims=True) if phi.size else np.zeros((len(phi), 1))
    over = norms > radius
    if not np.any(over):
        return phi
    return np.where(over, phi * (radius / np.where(over, norms, 1.0) * (1.0 - 1e-12)), phi)


def class_statistics(phi: np.ndarray, y: np.ndarray, n_classes: int) -> np.ndarray:
    """``stats[c] = sum over records of class c of [1, phi]`` (C x (d+1), float64)."""
    aug = np.concatenate([np.ones((len(y), 1)), np.asarray(phi, dtype=np.float64)], axis=1)
    out = np.zeros((n_classes, aug.shape[1]))
    np.add.at(out, np.asarray(y, dtype=np.int64), aug)
    return out


class FedLog(Algorithm):
    """FedLog with the exact float64 MAP solve.

    Args:
        feature_dim: d, the body's output width (the head is C x (d+1)).
        feature_bound: b, features are clamped to [-b, b] (with ``feature_norm``, before
            the scaling).
        feature_norm: R; when given, the body then scales each record's features to L2 norm
            R, and the per-record bound is sqrt(1 + R^2) (see the module docstring).
            ``None`` (default): the paper's box only. The command line's and the sweep's
            default under record-level DP is :data:`DP_FEATURE_NORM` (:meth:`dp_defaults`).
        nu: prior count (the paper suggests 1, the reference code uses 0); chi = 0.
        local_epochs, lr, batch_size: local Adam training of the body (fresh optimizer every
            epoch, as in the reference code).
        dpsgd: train the bodies with record-level DP-SGD (a
            :class:`secagg.privacy.dpsgd.DPSGD`); its accounting joins the run's ledger. The
            statistics are computed afresh from the data, so they still need a DP layer.
        release_rounds: release statistics in the first ``release_rounds`` rounds only;
            later rounds train the bodies against the last head and upload nothing
            (:class:`_PersonalizePhase`). ``None`` (default): every round, as in the paper.
            ``1``: one release of the initial bodies' statistics (see the module docstring;
            the command line's and the sweep's default under record-level DP).
        client_l2: public L2 bound on one client's whole statistic (each client scales its
            upload into it); the field's bound is then client-level. ``None`` declares the
            per-record bound sqrt(1 + d b^2) instead (sound at record level only with
            ``dpsgd``; the engine refuses it otherwise). ``"auto"`` (default): ``None``
            with ``dpsgd`` or ``release_rounds=1`` (the only release is of untrained bodies),
            else :data:`DEFAULT_CLIENT_L2` (1000, about 1.4x the largest
            statistic norm of a digits client: 140 records, trained body). Under DP a
            smaller bound means less noise and more scaled clients.
    """

    name: ClassVar[str] = "fedlog"
    personalized: ClassVar[bool] = True
    #: the feature norm R the DP defaults choose (:meth:`dp_defaults`; measured in the
    #: module docstring)
    DP_FEATURE_NORM: ClassVar[float] = 8.0

    def __init__(self, feature_dim: int = 64, feature_bound: float = 2.0, nu: float = 0.0,
                 local_epochs: int = 5, lr: float = 1e-3, batch_size: int = 10,
                 dpsgd: Any | None = None,
                 client_l2: float | Literal["auto"] | None = "auto",
                 release_rounds: int | None = None,
                 feature_norm: float | None = None) -> None:
        if feature_norm is not None and (isinstance(feature_norm, bool) or not (
                isinstance(feature_norm, (int, float)) and math.isfinite(feature_norm)
                and feature_norm > 0)):
            raise ConfigurationError(
                f"feature_norm must be a positive number or None, got {feature_norm!r}")
        self.feature_norm = None if feature_norm is None else float(feature_norm)
        if release_rounds is not None and (isinstance(release_rounds, bool) or not isinstance(
                release_rounds, int) or release_rounds < 1):
            raise ConfigurationError(
                f"release_rounds must be a positive integer or None, got {release_rounds!r}")
        self.release_rounds = release_rounds
        if client_l2 == "auto":
            client_l2 = (None if dpsgd is not None or release_rounds == 1
                         else DEFAULT_CLIENT_L2)
        if client_l2 is not None and not (isinstance(client_l2, (int, float))
                                          and math.isfinite(client_l2) and client_l2 > 0):
            raise ConfigurationError(
                f"client_l2 must be a positive number (or None), got {client_l2!r}")
        self.client_l2 = None if client_l2 is None else float(client_l2)
        self.clipped = 0
        self.feature_dim = feature_dim
        self.feature_bound = feature_bound
        self.nu = nu
        self.local_epochs = local_epochs
        self.lr = lr
        self.batch_size = batch_size
        self.dpsgd = dpsgd
        self.pending_events: list[Any] = []
        self.eta: np.ndarray | None = None
        #: the last solve's shrinkage of noised statistics (None without DP noise)
        self.shrinkage: ShrunkStatistics | None = None
        self.n_classes = 0
        self.seed = 0
        self.model_recipe: dict[str, Any] = {}

    def setup(self, dataset: Dataset, clients: Sequence[ClientState], seed: int) -> None:
        """Give every client the same freshly initialised body; no head yet."""
        self.seed = seed
        self.n_classes = dataset.n_classes
        torch.manual_seed(derive_seed(seed, "init"))
        self.model_recipe = {"factory": "algorithms.fedlog:fedlog_model", "kwargs": {
            "input_shape": list(dataset.input_shape), "n_classes": int(dataset.n_classes),
            "feature_dim": self.feature_dim, "feature_bound": self.feature_bound,
            "feature_norm": self.feature_norm}}
        base = fedlog_model(dataset.input_shape, dataset.n_classes, self.feature_dim,
                            self.feature_bound, self.feature_norm)
        for c in clients:
            c.state["model"] = copy.deepcopy(base)
        self.eta = None
        self.shrinkage = None

    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        """One statistics phase per round; with ``release_rounds``, a local personalisation
        phase (no upload) in every round from ``release_rounds`` on."""
        if self.release_rounds is not None and round >= self.release_rounds:
            return [_PersonalizePhase(self, round)]
        return [_StatsPhase(self, round)]

    def train_body(self, client: ClientState, eta: np.ndarray, round: int) -> None:
        """Train the client's body for ``local_epochs`` with the head frozen at ``eta``
        (Adam, a fresh optimizer each epoch; DP-SGD events go to :attr:`pending_events`)."""
        model: SplitModel = client.state["model"]
        self.load_head(model, eta)
        for p in model.head.parameters():
            p.requires_grad_(False)
        train_local(model, client.data.x, client.data.y, epochs=self.local_epochs,
                    batch_size=self.batch_size, lr=self.lr, optimizer="adam",
                    params=model.body.parameters(), fresh_optimizer_each_epoch=True,
                    seed=derive_seed(self.seed, round, client.id),
                    dpsgd=self.dpsgd, events=self.pending_events)

    def training_flops(self, client: ClientState) -> float:
        """Forward and backward passes of one body training (about 6 FLOPs per body
        parameter per record per epoch)."""
        model = client.state["model"]
        n_body = sum(p.numel() for p in model.body.parameters())
        return 6.0 * n_body * client.n_records * self.local_epochs

    @property
    def coordinate_bound(self) -> float:
        """The bound on one feature coordinate |phi_i|: R with ``feature_norm``, else b."""
        return self.feature_bound if self.feature_norm is None else self.feature_norm

    def record_l2(self) -> float:
        """One record's L2 bound ||[1, phi]||: sqrt(1 + R^2) with ``feature_norm``, else
        sqrt(1 + d b^2) (FedLog, Theorem 3.1)."""
        if self.feature_norm is not None:
            return math.sqrt(1.0 + self.feature_norm ** 2)
        return math.sqrt(1.0 + self.feature_dim * self.feature_bound ** 2)

    def client_features(self, client: ClientState) -> np.ndarray:
        """The client's features (float64), inside the ball of radius ``feature_norm`` when
        it is set (:func:`project_to_ball`)."""
        phi = features(client.state["model"], client.data.x)
        return phi if self.feature_norm is None else project_to_ball(phi, self.feature_norm)

    def spec(self) -> UploadSpec:
        """One field, ``stats`` (C x (d+1)); column 0 holds the class counts. Its bound is
        client-level (``client_l2``) or, with ``client_l2=None``, per record
        (:meth:`record_l2`)."""
        d = self.feature_dim
        if self.client_l2 is not None:
            bound = Bound(l2=self.client_l2, adjacency="client")
        else:
            bound = Bound(l2=self.record_l2(), linf=max(1.0, self.coordinate_bound))
        return UploadSpec((Field("stats", (self.n_classes, d + 1), "float64", additive=True,
                                 bound=bound),))

    def clip(self, stats: np.ndarray) -> np.ndarray:
        """Scale one client's statistic into the L2 ball of radius ``client_l2`` (counted
        in :attr:`clipped`); unchanged when ``client_l2`` is None or it already fits."""
        if self.client_l2 is None:
            return stats
        norm = float(np.linalg.norm(stats))
        if norm <= self.client_l2:
            return stats
        self.clipped += 1
        return stats * (self.client_l2 / norm * (1.0 - 1e-12))

    def load_head(self, model: SplitModel, eta: np.ndarray) -> None:
        """Write eta into the model's linear head (weight = eta[:, 1:], bias = eta[:, 0])."""
        with torch.no_grad():
            model.head.weight.copy_(torch.as_tensor(eta[:, 1:], dtype=torch.float32))
            model.head.bias.copy_(torch.as_tensor(eta[:, 0], dtype=torch.float32))

    def evaluate(self, dataset: Dataset, clients: Sequence[ClientState]) -> float:
        """Mean over clients (with a local test set) of their local test accuracy, each with
        its own body and the global head."""
        if self.eta is None:
            return 0.0
        accs = []
        for c in clients:
            if c.data.y_test is None or len(c.data.y_test) == 0:
                continue
            model = c.state["model"]
            self.load_head(model, self.eta)
            accs.append(accuracy(model, c.data.x_test, c.data.y_test))
        return float(np.mean(accs)) if accs else 0.0

    def export_model(self, clients: Sequence[ClientState]) -> Any | None:
        """Each client's model (its own body, the global head eta) as
        :meth:`evaluate` scores it (a :class:`secagg.model_io.TrainedModel` with one
        model per client; no global model: the bodies are personal)."""
        from secagg.model_io import TrainedModel

        if not clients:
            return None  # a remote runtime: the bodies live on the nodes
        models = {}
        for c in clients:
            model = c.state.get("model")
            if model is None:
                return None  # the models live elsewhere (a remote runtime's nodes)
            model = copy.deepcopy(model)
            if self.eta is not None:
                self.load_head(model, self.eta)
            models[int(c.id)] = model.eval()
        return TrainedModel(recipe=self.model_recipe, clients=models)

    def evaluation_state(self) -> dict[str, np.ndarray]:
        """What :meth:`evaluate` needs of the server's state to score one client where its
        body lives (the Flower runtime sends it to the nodes): the global head eta, which
        every round's broadcast already carries (empty before the first solve)."""
        return {} if self.eta is None else {"eta": np.asarray(self.eta, dtype=np.float64)}

    def load_evaluation_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Install :meth:`evaluation_state`'s output (a node's copy of the algorithm)."""
        self.eta = (np.array(state["eta"], dtype=np.float64) if "eta" in state else None)

    @classmethod
    def dp_defaults(cls, adjacency: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """Under a record-level DP layer, ``release_rounds=1`` unless the user chose the
        release schedule, the bound or DP-SGD (``release_rounds``, ``client_l2`` or
        ``dpsgd`` given): one release, of the seeded untrained bodies, whose per-record
        bound is a true record-level sensitivity, so the whole budget buys one release with
        noise sized to one record. With it ``feature_norm=8`` (:data:`DP_FEATURE_NORM`)
        unless ``feature_norm`` or ``feature_bound`` is given: every record's features
        scaled to norm 8, so the bound is sqrt(1 + 8^2) = 8.06, met by every record, where
        the box b = 2 declares 16.03 for features whose norm is at most 1.7 (digits,
        d = 64). Measured on held-out training records of digits (module docstring): the
        plaintext head 0.832 (box: 0.679) and every DP layer within a point of it by
        epsilon 16, local DP included. Under client-level DP nothing changes (the default
        ``client_l2`` bound serves it)."""
        if adjacency != "record" or any(k in given for k in
                                        ("release_rounds", "client_l2", "dpsgd")):
            return {}
        out: dict[str, Any] = {"release_rounds": 1}
        if "feature_norm" not in given and "feature_bound" not in given:
            out["feature_norm"] = cls.DP_FEATURE_NORM
        return out

    def describe(self) -> dict[str, Any]:
        """Name and hyper-parameters."""
        return {"name": self.name, "feature_dim": self.feature_dim,
                "client_l2": self.client_l2, "release_rounds": self.release_rounds,
                "feature_bound": self.feature_bound, "feature_norm": self.feature_norm,
                "nu": self.nu,
                "local_epochs": self.local_epochs, "lr": self.lr, "batch_size": self.batch_size,
                "dpsgd": None if self.dpsgd is None else vars(self.dpsgd)}


class _StatsPhase(Phase):
    name: ClassVar[str] = "stats"

    def __init__(self, algo: FedLog, round: int) -> None:
        self.algo = algo
        self.round = round

    def spec(self) -> UploadSpec:
        return self.algo.spec()

    def broadcast(self) -> dict[str, np.ndarray]:
        return {} if self.algo.eta is None else {"eta": self.algo.eta.astype(np.float32)}

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: E501
        a = self.algo
        if "eta" in broadcast:
            a.train_body(client, np.asarray(broadcast["eta"], dtype=np.float64), self.round)
        phi = a.client_features(client)
        return {"stats": a.clip(class_statistics(phi, client.data.y, a.n_classes))}

    training_note: ClassVar[str] = (
        "FedLog's statistics are features of a body trained on the same records (locally, "
        "in this and every earlier round)")

    def trained_fields(self) -> tuple[str, ...]:
        """``stats`` from round 1 on; round 0's body is the data-independent initialisation
        (every client gets the same seeded body), so its statistics are a plain sum of
        per-record terms."""
        return ("stats",) if self.round > 0 else ()

    def trained_with_dpsgd(self) -> bool:
        """True when the bodies train under DP-SGD."""
        return self.algo.dpsgd is not None

    def server_step(self, aggregate: Aggregate) -> None:
        a = self.algo
        stats = aggregate["stats"]
        sigma = dp_sum_sigma(aggregate.notes, "stats")
        a.shrinkage = None
        if sigma > 0:  # noised: solve with the posterior-mean statistics (every count > 0)
            shrunk = shrink_statistics(stats, sigma, a.coordinate_bound)
            a.shrinkage = shrunk
            stats = shrunk.stats
        n = float(stats[:, 0].sum())  # the record count: the counts' sum
        if n + a.nu <= 0:  # exact statistics of no records: nothing to solve
            return
        a.eta = solve_map(stats, a.nu + n).eta

    def measurements(self) -> dict[str, Any]:
        """Under DP, what the solve shrank: the noise std on the sum, the smallest
        posterior-mean count and the largest noise std on a class's raw feature mean
        (:func:`~algorithms.fedlog_solver.shrink_statistics`)."""
        s = self.algo.shrinkage
        if s is None or s.sigma == 0:
            return {}
        return {"sigma": s.sigma, "min_count": float(s.counts.min()),
                "max_mean_sd": float(s.mean_sd.max())}

    def privacy_events(self) -> list[Any]:
        """DP-SGD events of this round's body trainings (cleared once read)."""
        out, self.algo.pending_events[:] = list(self.algo.pending_events), []
        return out

    def client_flops(self, client: ClientState) -> float:
        # the body's training (from round 1 on), then the statistic: one forward pass per
        # record plus C x (d+1) accumulations
        model = client.state["model"]
        fwd = 2.0 * sum(p.numel() for p in model.body.parameters())
        train = self.algo.training_flops(client) if self.algo.eta is not None else 0.0
        return train + client.n_records * (fwd + self.algo.feature_dim + 1)


class _PersonalizePhase(LocalPhase):
    """After the last release: each client trains its body against the broadcast head and
    uploads nothing (a :class:`~algorithms.base.LocalPhase`)."""

    name: ClassVar[str] = "personalize"

    def __init__(self, algo: FedLog, round: int) -> None:
        self.algo = algo
        self.round = round

    def broadcast(self) -> dict[str, np.ndarray]:
        return {} if self.algo.eta is None else {"eta": self.algo.eta.astype(np.float32)}

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: E501
        if "eta" in broadcast:  # no head yet (the only release was swamped): nothing to fit
            self.algo.train_body(client, np.asarray(broadcast["eta"], dtype=np.float64),
                                 self.round)
        return {}

    def client_flops(self, client: ClientState) -> float:
        return self.algo.training_flops(client) if self.algo.eta is not None else 0.0
