"""FedAvg (McMahan et al., AISTATS 2017) written as an upload.

Each selected client trains the broadcast model on its data and uploads ``n`` (its record
count) and ``weighted_params`` = n * its parameters. Both are additive, so the server needs
only their sums: the new global model is sum(n_k w_k) / sum(n_k), the weighted mean.

Bounds: every parameter is clamped to [-param_bound, param_bound] before upload (counted in
the phase's ``clamped`` counter), so a client's ``weighted_params`` has entries of at most
``n * param_bound``, and ``n`` moves by 1 per record. Because theta is trained on the same
records, removing one record moves every entry of ``n * theta`` (not by ``param_bound``):
the per-record bound is a record-level sensitivity only under DP-SGD (given the DP model,
one record adds one theta), so the engine refuses record-level DP on ``weighted_params``
without DP-SGD; client-level DP uses ``max_records * param_bound`` with a public
``Federation(max_records=...)``.

Subclasses (FedProx, FedUV, SphereFed) override :meth:`FedAvg.build_model` and
:meth:`FedAvg.loss_fn`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from algorithms.base import Aggregate, Algorithm, ClientState, Phase
from algorithms.models import SplitModel, build_model, get_flat, n_params, set_flat
from algorithms.training import LossFn, accuracy, cross_entropy, train_local
from secagg.data import Dataset
from secagg.federation import derive_seed
from secagg.messages import Bound, Field, UploadSpec


class FedAvg(Algorithm):
    """Federated averaging.

    Args:
        local_epochs: local passes over the client's data per round.
        lr, momentum, batch_size: local SGD settings.
        param_bound: |parameter| clamp before upload (the field's L-inf bound per record).
        feature_dim: width of the model's feature layer.
        upload_dtype: dtype of ``weighted_params`` on the wire (``"float32"`` or ``"float64"``).
        dpsgd: train locally with record-level DP-SGD (a :class:`secagg.privacy.dpsgd.DPSGD`);
            its accounting joins the run's privacy ledger. The averaged parameters are then
            post-processing of DP-SGD; ``n`` is not, so it needs a DP layer (or counts as a
            non-private release).
    """

    name: ClassVar[str] = "fedavg"

    def __init__(self, local_epochs: int = 2, lr: float = 0.05, momentum: float = 0.9,
                 batch_size: int = 32, param_bound: float = 10.0, feature_dim: int = 128,
                 upload_dtype: str = "float32", dpsgd: Any | None = None) -> None:
        self.local_epochs = local_epochs
        self.lr = lr
        self.momentum = momentum
        self.batch_size = batch_size
        self.param_bound = param_bound
        self.feature_dim = feature_dim
        self.upload_dtype = upload_dtype
        self.dpsgd = dpsgd
        self.pending_events: list[Any] = []
        self.model: SplitModel | None = None
        self.params: np.ndarray | None = None
        self.seed = 0
        self.clamped = 0

    # -- hooks for subclasses ---------------------------------------------------------
    def build_model(self, dataset: Dataset) -> SplitModel:
        """The model every client trains (default: :func:`algorithms.models.build_model`)."""
        return build_model(dataset.input_shape, dataset.n_classes, self.feature_dim)

    def loss_fn(self, client: ClientState, model: SplitModel) -> LossFn:
        """The local loss (default: cross-entropy)."""
        return cross_entropy

    def shared_parameters(self, model: SplitModel) -> list[torch.Tensor]:
        """The parameters that are averaged (default: all)."""
        return list(model.parameters())

    # -- Algorithm ------------------------------------------------------------------------
    def setup(self, dataset: Dataset, clients: Sequence[ClientState], seed: int) -> None:
        """Build the global model from ``seed``."""
        self.seed = seed
        torch.manual_seed(derive_seed(seed, "init"))
        self.model = self.build_model(dataset)
        self.params = get_flat(self.shared_parameters(self.model))

    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        """One training phase per round."""
        return [_TrainPhase(self, round)]

    def evaluate(self, dataset: Dataset, clients: Sequence[ClientState]) -> float:
        """Global-model accuracy on the global test set."""
        assert self.model is not None and self.params is not None
        set_flat(self.shared_parameters(self.model), self.params)
        return accuracy(self.model, dataset.x_test, dataset.y_test)

    def describe(self) -> dict[str, Any]:
        """Name and hyper-parameters."""
        return {"name": self.name, "local_epochs": self.local_epochs, "lr": self.lr,
                "momentum": self.momentum, "batch_size": self.batch_size,
                "param_bound": self.param_bound, "upload_dtype": self.upload_dtype,
                "dpsgd": None if self.dpsgd is None else vars(self.dpsgd)}

    # -- pieces the phase uses ----------------------------------------------------------
    def spec(self) -> UploadSpec:
        """Fields ``n`` and ``weighted_params``."""
        assert self.params is not None
        return UploadSpec((
            Field("n", (1,), "int64", bound=Bound(l2=1.0, linf=1.0), additive=True),
            Field("weighted_params", (self.params.size,), self.upload_dtype,
                  bound=Bound(linf=self.param_bound), additive=True),
        ))

    def client_model(self, client: ClientState, params: np.ndarray) -> SplitModel:
        """The client's own copy of the global model (made on first use), loaded with the
        broadcast ``params``."""
        assert self.model is not None
        model = client.state.get("model")
        if model is None:
            model = copy.deepcopy(self.model)
            client.state["model"] = model
        set_flat(self.shared_parameters(model), params)
        return model

    def local_update(self, client: ClientState, params: np.ndarray, round: int) -> np.ndarray:
        """Train a copy of the global model on the client's data; return its parameters."""
        model = self.client_model(client, params)
        train_local(model, client.data.x, client.data.y, epochs=self.local_epochs,
                    batch_size=self.batch_size, lr=self.lr, momentum=self.momentum,
                    loss_fn=self.loss_fn(client, model),
                    seed=derive_seed(self.seed, round, client.id),
                    dpsgd=self.dpsgd, events=self.pending_events)
        return get_flat(self.shared_parameters(model))

    def apply_average(self, aggregate: Aggregate) -> None:
        """New global parameters = sum(n w) / sum(n) (kept if no record contributed)."""
        total = float(aggregate["n"][0])
        if total > 0:
            self.params = (aggregate["weighted_params"] / total).astype(np.float32)


class GlobalModelPhase(Phase):
    """A phase of a FedAvg-family algorithm: the server broadcasts the global parameters
    (``params``); subclasses say what clients upload and what the server does with it."""

    def __init__(self, algo: FedAvg, round: int = 0) -> None:
        self.algo = algo
        self.round = round

    def broadcast(self) -> dict[str, np.ndarray]:
        """The current global parameters."""
        assert self.algo.params is not None
        return {"params": self.algo.params}


class _TrainPhase(GlobalModelPhase):
    name: ClassVar[str] = "train"

    def spec(self) -> UploadSpec:
        return self.algo.spec()

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: E501
        w = self.algo.local_update(client, broadcast["params"], self.round)
        b = self.algo.param_bound
        over = int(np.count_nonzero(np.abs(w) > b))
        if over:
            self.algo.clamped += over
            w = np.clip(w, -b, b)
        n = client.n_records
        return {"n": np.array([n], dtype=np.int64),
                "weighted_params": (w.astype(np.float64) * n).astype(self.algo.upload_dtype)}

    def server_step(self, aggregate: Aggregate) -> None:
        self.algo.apply_average(aggregate)

    def privacy_events(self) -> list[Any]:
        """DP-SGD events of this round's local trainings (cleared once read)."""
        out, self.algo.pending_events[:] = list(self.algo.pending_events), []
        return out

    def dp_covered_fields(self) -> tuple[str, ...]:
        """Fields that are post-processing of DP-SGD output (when it is on)."""
        return ("weighted_params",) if self.algo.dpsgd is not None else ()

    training_note: ClassVar[str] = (
        "n * theta is the model the client just trained on these records")

    def trained_fields(self) -> tuple[str, ...]:
        """``weighted_params`` (the locally trained model); ``n`` is a plain count."""
        return ("weighted_params",)

    def trained_with_dpsgd(self) -> bool:
        """True when local training runs under DP-SGD."""
        return self.algo.dpsgd is not None

    def client_flops(self, client: ClientState) -> float:
        # forward + backward ~ 6 FLOPs per parameter per sample per epoch
        assert self.algo.model is not None
        return 6.0 * n_params(self.algo.model) * client.n_records * self.algo.local_epochs
