"""TurboSVM-FL (Wang et al., AAAI 2024): SVM-based selective aggregation for lazy clients.

Clients are "lazy" (one local epoch of plain SGD, no momentum). Each uploads its encoder
(weighted by its sample count, additive, group ``"encoder"``) and its class embeddings
``[w_k; b_k]`` -- the rows of its logit layer with the bias appended -- plus its per-class
counts (group ``"embeddings"``, **not additive**: the server fits an SVM on individual
clients' embeddings, so secure summation cannot carry them).

Server, each round t of T:

1. FedAvg on the encoder.
2. A linear ``sklearn.svm.SVC`` (one-vs-one) on the embeddings labelled by class, with
   ``C_svm = (T - t) / T`` (the authors' code schedule) and ``max_iter=50``, ``tol=1e-3``.
3. Selective aggregation (Alg. 1): each global class row is the sample-count-weighted mean
   of that class's support vectors (FedAvg row when a class has none).
4. Max-margin spread-out (Alg. 2): one Adam step (state persists across rounds, eps 1e-5)
   on ``sum_{k<k'} exp(-((w_k - w_k') . h_kk')^2 / (2 ||h_kk'||^2))`` with h the pairwise
   SVM normals held constant.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.svm import SVC

from algorithms.base import Aggregate, ClientState, Phase
from algorithms.fedavg import FedAvg
from algorithms.models import SplitModel, get_flat, n_params, set_flat
from algorithms.training import accuracy, train_local
from secagg.data import Dataset
from secagg.errors import ConfigurationError
from secagg.federation import derive_seed
from secagg.layers.base import Layer
from secagg.messages import DEFAULT_MAX_RECORDS, Bound, Field, UploadSpec

#: Why the embeddings cannot be securely summed (used when a layer refuses them).
EMBEDDINGS_REASON = "TurboSVM-FL's server needs each client's class embeddings"


@dataclass
class SVMSelection:
    """Result of the SVM fit and selective aggregation on one round's class embeddings.

    Attributes:
        rows: ``(C, d+1)`` aggregated class rows (NaN for a class with no point).
        support: indices (into the fitted points) of the support vectors.
        classes: the sorted class ids the SVM was fitted on.
        normals: ``(P, d+1)`` one-vs-one normals, ordered (0,1), (0,2), ..., over ``classes``.
        n_points: number of points the SVM was fitted on.
    """

    rows: np.ndarray
    support: np.ndarray
    classes: np.ndarray
    normals: np.ndarray
    n_points: int


def c_schedule(round: int, rounds: int) -> float:
    """The SVM penalty ``C_t = (T - t) / T`` for 0-based round ``t`` of ``T``."""
    if rounds < 1 or not 0 <= round < rounds:
        raise ConfigurationError(f"need 0 <= round < rounds, got round={round}, rounds={rounds}")
    return (rounds - round) / rounds


def svm_select(
    points: np.ndarray,
    labels: np.ndarray,
    weights: np.ndarray,
    n_classes: int,
    c_svm: float,
    max_iter: int = 50,
    tol: float = 1e-3,
) -> SVMSelection:
    """Fit the one-vs-one linear SVM and average each class's support vectors (Alg. 1).

    ``points`` are ``(n, d+1)`` class embeddings, ``labels`` their classes, ``weights`` the
    sample counts of the clients they came from.
    """
    x = np.asarray(points, dtype=np.float64)
    y = np.asarray(labels, dtype=np.int64)
    w = np.asarray(weights, dtype=np.float64)
    if x.ndim != 2 or y.shape != (len(x),) or w.shape != (len(x),):
        raise ConfigurationError("points (n, d), labels (n,) and weights (n,) must agree")
    classes = np.unique(y)
    if len(classes) < 2:
        raise ConfigurationError("the SVM needs embeddings of at least two classes")
    clf = SVC(kernel="linear", C=c_svm, max_iter=max_iter, tol=tol)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        clf.fit(x, y)
    support = np.asarray(clf.support_, dtype=np.int64)
    rows = np.full((n_classes, x.shape[1]), np.nan)
    for k in range(n_classes):
        idx = support[y[support] == k]
        if len(idx) and w[idx].sum() > 0:
            rows[k] = (w[idx, None] * x[idx]).sum(axis=0) / w[idx].sum()
    return SVMSelection(rows, support, np.asarray(clf.classes_), np.asarray(clf.coef_), len(x))


def pair_index(classes: Sequence[int]) -> list[tuple[int, int]]:
    """The (k, k') class pairs in libsvm's one-vs-one order: (0,1), (0,2), ..., (1,2), ..."""
    cl = list(classes)
    return [(cl[i], cl[j]) for i in range(len(cl)) for j in range(i + 1, len(cl))]


def spread_out_loss(
    rows: torch.Tensor, normals: torch.Tensor, pairs: Sequence[tuple[int, int]]
) -> torch.Tensor:
    """Max-margin spread-out loss (Eq. 10): ``sum_{k<k'} exp(-((w_k - w_k').h)^2 / (2||h||^2))``."""
    if len(pairs) != normals.shape[0]:
        raise ConfigurationError(f"{len(pairs)} pairs but {normals.shape[0]} normals")
    total = rows.new_zeros(())
    for (k, kp), h in zip(pairs, normals):
        hn = torch.dot(h, h)
        if hn <= 0:
            continue
        proj = torch.dot(rows[k] - rows[kp], h)
        total = total + torch.exp(-proj.pow(2) / (2.0 * hn))
    return total


class SpreadOut:
    """One Adam step per round on the spread-out loss, with state kept across rounds."""

    def __init__(self, n_classes: int, dim: int, lr: float = 1e-2, eps: float = 1e-5) -> None:
        """Create the persistent parameter ``(C, dim)`` and its Adam optimiser."""
        self.param = torch.nn.Parameter(torch.zeros(n_classes, dim, dtype=torch.float64))
        self.opt = torch.optim.Adam([self.param], lr=lr, eps=eps)

    def step(
        self, rows: np.ndarray, normals: np.ndarray, classes: Sequence[int]
    ) -> tuple[np.ndarray, float]:
        """Take one Adam step from ``rows`` (C, dim); returns (new rows, loss before the step)."""
        with torch.no_grad():
            self.param.copy_(torch.as_tensor(rows, dtype=torch.float64))
        self.opt.zero_grad()
        h = torch.tensor(np.array(normals, dtype=np.float64))
        loss = spread_out_loss(self.param, h, pair_index(classes))
        if loss.requires_grad:
            loss.backward()
            self.opt.step()
        return self.param.detach().numpy().copy(), float(loss.detach())


class TurboSVM(FedAvg):
    """TurboSVM-FL: FedAvg on the encoder, SVM selective aggregation + spread-out on the head.

    Args:
        local_epochs, lr, momentum: lazy clients by default (1 epoch of plain SGD).
        server_lr: Adam learning rate of the spread-out step (paper: 1e-2 for images).
        spread_out: take the spread-out step (paper's ``spreadout`` flag).
        select: replace head rows by SV means (paper's ``agg_svc`` flag); False keeps FedAvg's.
        held_classes_only: the SVM sees a client's row for class k only if the client holds
            k (default, as the issue asks); False feeds every row, as the authors' code does.
        svm_max_iter, svm_tol: libsvm's cap and tolerance (authors' code: 50, 1e-3).
        **kwargs: the rest of :class:`~algorithms.fedavg.FedAvg`'s arguments.

    Uploads in one phase ``"train"``: ``n`` and ``weighted_encoder`` (group ``"encoder"``,
    additive) and ``embeddings`` (C x (d+1), rows ``[w_k; b_k]``) with ``class_counts`` (group
    ``"embeddings"``, not additive). Route the groups with
    ``PerGroup({"encoder": SecureSum(...), "embeddings": Plaintext()})``. After each round
    :attr:`last_selection` holds the SVM's :class:`SVMSelection`.
    """

    name: ClassVar[str] = "turbosvm"
    #: ``server_lr`` is the spread-out step on the head, not the encoder's server optimizer
    #: (the CLI's ``--server-lr`` is refused for it; pass ``server_opt=`` for the encoder).
    server_lr_is_optimizer: ClassVar[bool] = False

    def __init__(self, local_epochs: int = 1, lr: float = 0.05, momentum: float = 0.0,
                 server_lr: float = 1e-2, spread_out: bool = True, select: bool = True,
                 held_classes_only: bool = True, svm_max_iter: int = 50, svm_tol: float = 1e-3,
                 **kwargs: Any) -> None:
        if kwargs.get("dpsgd") is not None:
            raise ConfigurationError(
                "TurboSVM does not train under DP-SGD (its local training and embeddings "
                "are not private); drop dpsgd= or use FedAvg/FedLog with DP-SGD")
        super().__init__(local_epochs=local_epochs, lr=lr, momentum=momentum, **kwargs)
        if server_lr <= 0:
            raise ConfigurationError(f"server_lr must be positive, got {server_lr}")
        self.server_lr = server_lr
        self.spread_out = spread_out
        self.select = select
        self.held_classes_only = held_classes_only
        self.svm_max_iter = svm_max_iter
        self.svm_tol = svm_tol
        self.n_classes = 0
        self.encoder: np.ndarray | None = None
        self.head: np.ndarray | None = None
        self.optimizer: SpreadOut | None = None
        self.last_selection: SVMSelection | None = None
        self.last_spread_loss: float | None = None

    def setup(self, dataset: Dataset, clients: Sequence[ClientState], seed: int) -> None:
        """Build the model; split its parameters into encoder and head rows."""
        super().setup(dataset, clients, seed)
        assert self.model is not None
        self.n_classes = dataset.n_classes
        lin = self.model.head
        if not isinstance(lin, torch.nn.Linear) or lin.bias is None:
            raise ConfigurationError("TurboSVM needs a linear head with a bias")
        if not any(True for _ in self.model.body.parameters()):
            raise ConfigurationError("TurboSVM averages the model's body (its encoder), and "
                                     "this model's body has no parameters (e.g. --model "
                                     "linear); give a model with a trainable body")
        self.encoder = get_flat(self.model.body)
        self.head = self._head_rows(self.model)
        self.optimizer = SpreadOut(self.n_classes, self.head.shape[1], self.server_lr)
        self.last_selection = None

    @staticmethod
    def _head_rows(model: SplitModel) -> np.ndarray:
        w = model.head.weight.detach().double().numpy()
        b = model.head.bias.detach().double().numpy()
        return np.concatenate([w, b[:, None]], axis=1)

    def _load(self, model: SplitModel, encoder: np.ndarray, head: np.ndarray) -> None:
        set_flat(model.body, encoder)
        with torch.no_grad():
            model.head.weight.copy_(torch.as_tensor(head[:, :-1], dtype=torch.float32))
            model.head.bias.copy_(torch.as_tensor(head[:, -1], dtype=torch.float32))

    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        """One phase per round."""
        return [_TurboPhase(self, round, rounds)]

    def evaluate(self, dataset: Dataset, clients: Sequence[ClientState]) -> float:
        """Global-model accuracy on the global test set."""
        assert self.model is not None and self.encoder is not None and self.head is not None
        self._load(self.model, self.encoder, self.head)
        self.params = get_flat(self.model)
        return accuracy(self.model, dataset.x_test, dataset.y_test)

    def describe(self) -> dict[str, Any]:
        """FedAvg's description plus TurboSVM's options."""
        return {**super().describe(), "server_lr": self.server_lr,
                "spread_out": self.spread_out, "select": self.select,
                "held_classes_only": self.held_classes_only, "svm_max_iter": self.svm_max_iter}

    def spec(self) -> UploadSpec:
        """Encoder fields (additive) and embedding fields (per client). With ``clip``, the
        encoder travels as DP-FedAvg's clipped ``update`` (group ``"encoder"``)."""
        assert self.encoder is not None and self.head is not None
        c, width = self.head.shape
        b = self.param_bound
        if self.clip_policy is not None:
            encoder = self.update_spec(self.encoder.size, group="encoder").fields
        else:
            encoder = (
                Field("n", (1,), "int64", bound=Bound(l2=1.0, linf=1.0), group="encoder",
                      additive=True),
                Field("weighted_encoder", (self.encoder.size,), self.upload_dtype,
                      bound=Bound(linf=b), group="encoder", additive=True))
        return UploadSpec((
            *encoder,
            Field("embeddings", (c, width), "float64", additive=False,
                  bound=Bound(l2=b * math.sqrt(c * width), linf=b, adjacency="client"),
                  group="embeddings", reason=EMBEDDINGS_REASON),
            Field("class_counts", (c,), "int64", additive=False,
                  bound=Bound(l2=1.0, linf=1.0), group="embeddings", reason=EMBEDDINGS_REASON),
        ))

    def check_layer(self, layer: Layer, max_records: int | None = None) -> None:
        """Ask ``layer`` whether it can carry this algorithm's upload; a summing layer
        refuses the embeddings quoting TurboSVM's reason (``EMBEDDINGS_REASON``, carried on
        the fields as :attr:`Field.reason <secagg.messages.Field.reason>`).

        Call after :meth:`setup` (the spec's shapes come from the model). ``max_records``
        is a public bound on records per client (default
        :data:`~secagg.messages.DEFAULT_MAX_RECORDS`, the engine's planning default; never
        the largest client's size, which is private).
        """
        if self.encoder is None:
            raise ConfigurationError("call setup() (or run a Federation) before check_layer")
        spec = replace(self.spec(), max_records=max_records or DEFAULT_MAX_RECORDS)
        layer.check(spec)

    def client_upload(self, client: ClientState, encoder: np.ndarray, head: np.ndarray,
                      round: int, clip: float | None = None) -> dict[str, np.ndarray]:
        """Lazy local training from the broadcast; the client's encoder and class rows."""
        assert self.model is not None
        # the broadcast fixes every parameter (encoder and head): one working copy serves
        # every client unless the model has buffers, state of the client's own
        model = self.model_copy(client, own=any(True for _ in self.model.buffers()))
        self._load(model, encoder, head)
        train_local(model, client.data.x, client.data.y, epochs=self.local_epochs,
                    batch_size=self.batch_size, lr=self.lr, momentum=self.momentum,
                    seed=derive_seed(self.seed, round, client.id))
        enc = get_flat(model.body)
        rows = self._head_rows(model)
        bnd = self.param_bound
        over = int(np.count_nonzero(np.abs(enc) > bnd) + np.count_nonzero(np.abs(rows) > bnd))
        if over:
            self.clamped += over
            enc, rows = np.clip(enc, -bnd, bnd), np.clip(rows, -bnd, bnd)
        n = client.n_records
        counts = np.bincount(client.data.y, minlength=self.n_classes).astype(np.int64)
        if self.clip_policy is not None:
            assert clip is not None
            return {**self.clipped_update(get_flat(model.body), encoder, clip),
                    "embeddings": rows, "class_counts": counts}
        return {"n": np.array([n], dtype=np.int64),
                "weighted_encoder": (enc.astype(np.float64) * n).astype(self.upload_dtype),
                "embeddings": rows, "class_counts": counts}

    def server_update(self, aggregate: Aggregate, round: int, rounds: int) -> None:
        """FedAvg on the encoder, then SVM selection and the spread-out step on the head."""
        assert self.head is not None and self.optimizer is not None
        assert self.encoder is not None
        if self.clip_policy is not None:
            self.encoder = self.apply_update(self.encoder, aggregate)
        else:
            total = float(aggregate["n"][0])
            if total <= 0:
                return
            self.encoder = (aggregate["weighted_encoder"] / total).astype(np.float32)
        emb = aggregate.values.get("embeddings", {})
        cnt = aggregate.values.get("class_counts", {})
        clients = [c for c in aggregate.contributors if c in emb and c in cnt]
        pts, labels, weights = [], [], []
        for c in clients:
            n_c = max(float(np.sum(cnt[c])), 0.0)
            for k in range(self.n_classes):
                if self.held_classes_only and cnt[c][k] <= 0:
                    continue
                pts.append(emb[c][k])
                labels.append(k)
                weights.append(n_c)
        if not pts:
            return
        x, y, w = np.array(pts), np.array(labels), np.array(weights)
        fedavg = self.head.copy()
        for k in range(self.n_classes):
            m = y == k
            if m.any() and w[m].sum() > 0:
                fedavg[k] = (w[m, None] * x[m]).sum(axis=0) / w[m].sum()
        new = fedavg
        if len(np.unique(y)) >= 2:
            sel = svm_select(x, y, w, self.n_classes, c_schedule(round, rounds),
                             self.svm_max_iter, self.svm_tol)
            self.last_selection = sel
            if self.select:
                new = np.where(np.isnan(sel.rows), fedavg, sel.rows)
            if self.spread_out:
                new, self.last_spread_loss = self.optimizer.step(new, sel.normals, sel.classes)
        self.head = np.nan_to_num(new, nan=1e-5, posinf=1e-5, neginf=1e-5)


class _TurboPhase(Phase):
    """One TurboSVM-FL round: lazy local training, encoder sum, SVM on the embeddings."""

    name: ClassVar[str] = "train"

    def __init__(self, algo: TurboSVM, round: int, rounds: int) -> None:
        self.algo = algo
        self.round = round
        self.rounds = rounds
        self.clip = algo.clip_value  # the bound this phase's spec and broadcast carry

    def spec(self) -> UploadSpec:
        return self.algo.spec()

    def broadcast(self) -> dict[str, np.ndarray]:
        assert self.algo.encoder is not None and self.algo.head is not None
        return {"encoder": self.algo.encoder, "head": self.algo.head,
                **self.algo.clip_broadcast()}

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: E501
        clip = float(np.asarray(broadcast["clip"])[0]) if "clip" in broadcast else None
        return self.algo.client_upload(client, broadcast["encoder"], broadcast["head"],
                                       self.round, clip)

    def server_step(self, aggregate: Aggregate) -> None:
        self.algo.server_update(aggregate, self.round, self.rounds)

    def measurements(self) -> dict[str, Any]:
        """With a clip: the bound in force and how many clients it clipped."""
        return self.algo.clip_measurements(self.clip)

    def client_flops(self, client: ClientState) -> float:
        assert self.algo.model is not None
        return 6.0 * n_params(self.algo.model) * client.n_records * self.algo.local_epochs

    training_note: ClassVar[str] = (
        "the encoder and the class embeddings are the model the client just trained on "
        "these records")

    def trained_fields(self) -> tuple[str, ...]:
        """The locally trained encoder and head rows; ``n`` and ``class_counts`` are
        counts. TurboSVM trains without DP-SGD, so record-level DP is refused for these."""
        if self.algo.clip_policy is not None:
            return ("update", "unclipped", "embeddings")
        return ("weighted_encoder", "embeddings")
