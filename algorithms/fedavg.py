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

Client-level DP (DP-FedAvg, McMahan et al., ICLR 2018): with ``clip=C`` each client
uploads instead its *update* (local model minus the broadcast) scaled down on the client to
L2 norm <= C, with weight 1 (field ``update``, a client-level ``Bound(l2=C)``), so one
client moves the sum by at most C whatever its data and training: a DP layer with
``adjacency="client"`` noises it with standard deviation z * C and needs no
``max_records``. The server divides the (noised) sum by the sampled cohort's size, a fixed
denominator (:attr:`~secagg.layers.base.Aggregate.cohort`), never by the survivors, so
dropouts do not scale the noise up, and takes a step of its server optimizer
(:mod:`algorithms.server_opt`: SGD with a server learning rate, FedAvgM, FedAdam). With
``clip="adaptive"`` (Andrew et al., NeurIPS 2021) the bound follows a quantile of the
update norms through a noised count of clients under the clip, uploaded beside the update
(field ``unclipped``; :mod:`secagg.privacy.clipping`). Each round's measurements
(:attr:`secagg.federation.Result.measurements`) give the clip bound in force and, in the
embedded engine, how many clients' updates it clipped (a simulation diagnostic: no server
ever sees that count; under adaptive clipping it sees only the noised one).

Batched local training: in the embedded engine, the clients of a cohort train ``chunk`` at
a time in one vectorised call (:func:`algorithms.batched.train_batched`): the phase's
:meth:`~_TrainPhase.prepare` hook learns the cohort, and the first client step of a chunk
trains the whole chunk and caches its models, so the cache holds at most one chunk and
each client step still returns that client's own upload, clipped and clamped as before.
The batched models equal the per-client loop's up to float32 rounding (1e-5 in
``tests/test_batched.py``). The loop stays the reference and the fallback: it runs where
:meth:`FedAvg.batching_reason` names a reason (DP-SGD, a subclass's own loss or
parameters, a model with buffers, batch norm or dropout, ``batched=False``) and where no
cohort was announced (a Flower node trains its one client).

Subclasses (FedProx, FedUV, SphereFed, CCVR) override :meth:`FedAvg.build_model` and
:meth:`FedAvg.loss_fn`, and inherit both uploads (their local training runs in the loop).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch

from algorithms.base import Aggregate, Algorithm, ClientState, Phase
from algorithms.batched import batching_unsupported, train_batched
from algorithms.models import SplitModel, get_flat, model_recipe, n_params, set_flat
from algorithms.server_opt import OptimizerState, ServerOptimizer
from algorithms.training import LossFn, accuracy, cross_entropy, train_local
from secagg.data import Dataset
from secagg.errors import ConfigurationError
from secagg.federation import derive_seed
from secagg.messages import Bound, Field, UploadSpec
from secagg.privacy.clipping import AdaptiveClip, ClipPolicy, clip_l2, parse_clip


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
        clip: None (default: the classic upload of ``n`` and ``n * theta``), a number C
            (upload the update clipped to L2 <= C: DP-FedAvg), ``"adaptive"`` or
            ``"adaptive:QUANTILE"``, or a :class:`~secagg.privacy.clipping.ClipPolicy`.
        server_opt: the server optimizer on the mean update with ``clip``: ``"sgd"``,
            ``"momentum"`` (FedAvgM) or ``"adam"`` (FedAdam), or a
            :class:`~algorithms.server_opt.ServerOptimizer`. Without ``clip`` the mean model
            minus the broadcast is the update it steps along (``sgd`` at lr 1 is plain
            FedAvg, exactly).
        server_lr: the server learning rate (default 1.0).
        server_momentum: beta1 of ``momentum`` and ``adam`` (default 0.9).
        batched: train the clients of a cohort ``chunk`` at a time in one vectorised call
            (the embedded engine; same models as the loop up to float32 rounding). None
            (default): when :meth:`batching_reason` finds no reason against it (it leaves
            convolutional models to the loop, where batching was measured no faster on
            CPU); True: batch any model it applies to, and refuse (at setup) where it
            does not; False: always the per-client loop.
        chunk: clients per batched call (memory grows with it: one model, its optimizer
            state and its gradient per client of the chunk).
        model: the model trained: None (default: an MLP for flat inputs, a CNN for
            1x28x28 images), ``"mlp"``, ``"cnn"``, ``"linear"``, or ``"module:factory"``
            naming a function ``factory(input_shape, n_classes) -> nn.Module``
            (:func:`algorithms.models.model_recipe`). Subclasses that build their own model
            (SphereFed) ignore it.
    """

    name: ClassVar[str] = "fedavg"

    def __init__(self, local_epochs: int = 2, lr: float = 0.05, momentum: float = 0.9,
                 batch_size: int = 32, param_bound: float = 10.0, feature_dim: int = 128,
                 upload_dtype: str = "float32", dpsgd: Any | None = None,
                 clip: float | str | ClipPolicy | None = None,
                 server_opt: str | ServerOptimizer = "sgd", server_lr: float = 1.0,
                 server_momentum: float = 0.9, batched: bool | None = None,
                 chunk: int = 64, model: str | None = None) -> None:
        if model is not None and not isinstance(model, str):
            raise ConfigurationError(f"model must be a name or 'module:factory', got {model!r}")
        self.model_name = model
        #: how :meth:`build_model` built the model (:func:`algorithms.models.model_recipe`)
        self.model_recipe: dict[str, Any] | None = None
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ConfigurationError(f"chunk must be an integer >= 1, got {chunk!r}")
        self.batched = batched
        self.chunk = chunk
        self.clip_policy = parse_clip(clip)
        if self.clip_policy is not None and dpsgd is not None:
            raise ConfigurationError(
                "clip (client-level DP-FedAvg) and dpsgd (record-level DP-SGD) are two "
                "ways to bound the training's effect; choose one")
        if isinstance(server_opt, ServerOptimizer):
            self.server_optimizer = server_opt
        else:
            self.server_optimizer = ServerOptimizer(server_opt, lr=server_lr,
                                                    beta1=server_momentum)
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
        self._work_model: SplitModel | None = None
        self.params: np.ndarray | None = None
        self.seed = 0
        self.clamped = 0
        self.clip_value = None if self.clip_policy is None else self.clip_policy.initial()
        self.opt_state = OptimizerState()
        self.round_clipped = 0
        self.round_clients = 0

    # -- hooks for subclasses ---------------------------------------------------------
    def build_model(self, dataset: Dataset) -> SplitModel:
        """The model every client trains: the one ``model`` names (default:
        :func:`algorithms.models.build_model`), built from its recipe (kept in
        :attr:`model_recipe`, so that a saved run can rebuild it)."""
        from secagg.model_io import build_from_recipe

        try:
            recipe = model_recipe(self.model_name, dataset.input_shape, dataset.n_classes,
                                  self.feature_dim)
            model = build_from_recipe(recipe)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        if not isinstance(model, torch.nn.Module):
            raise ConfigurationError(f"model factory {self.model_name!r} returned "
                                     f"{type(model).__name__}, not a torch.nn.Module")
        self.model_recipe = recipe
        if self.model_name is not None and isinstance(model, SplitModel):
            self.feature_dim = model.feature_dim  # what feature statistics (CCVR) are sized by
        return model

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
        self._work_model = None  # see client_model
        self.params = get_flat(self.shared_parameters(self.model))
        self.clip_value = None if self.clip_policy is None else self.clip_policy.initial()
        self.opt_state = OptimizerState()
        if self.batched:
            why = self.batching_reason()
            if why is not None:
                raise ConfigurationError(f"batched=True, but batched local training does not "
                                         f"apply: {why}; use batched=None or False")

    def batching_reason(self) -> str | None:
        """Why the local training runs client by client rather than batched (None when
        it can be batched): ``batched=False``, a subclass's own local update, loss or
        shared parameters (its loss closes over one model), DP-SGD, or a model that
        :func:`algorithms.batched.batching_unsupported` refuses."""
        if self.batched is False:
            return "batched=False"
        cls = type(self)
        for hook in ("local_update", "loss_fn", "shared_parameters", "client_model"):
            if getattr(cls, hook) is not getattr(FedAvg, hook):
                return (f"{cls.__name__} overrides {hook}, which the batched trainer (plain "
                        "cross-entropy on all of the model's parameters) does not reproduce")
        if self.model is None:
            return "no model yet (setup has not run)"
        why = batching_unsupported(self.model, dpsgd=self.dpsgd)
        if why is None and self.batched is None and any(
                isinstance(m, torch.nn.Conv2d) for m in self.model.modules()):
            return ("batched=None leaves convolutional models to the loop: on CPU their "
                    "batched (grouped) convolutions were measured no faster than the loop "
                    "(docs in algorithms/batched.py); batched=True forces it")
        return why

    def train_chunk(self, clients: Sequence[ClientState], params: np.ndarray,
                    round: int) -> list[np.ndarray]:
        """Train every client of ``clients`` from the broadcast ``params`` in one batched
        call; each result is what :meth:`local_update` returns for that client (up to
        float32 rounding). Call only where :meth:`batching_reason` is None."""
        assert self.model is not None
        template = copy.deepcopy(self.model)
        set_flat(self.shared_parameters(template), params)
        res = train_batched(template, [(c.data.x, c.data.y) for c in clients],
                            [derive_seed(self.seed, round, c.id) for c in clients],
                            epochs=self.local_epochs, batch_size=self.batch_size, lr=self.lr,
                            momentum=self.momentum)
        return list(res.flats())

    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        """One training phase per round."""
        return [_TrainPhase(self, round)]

    def evaluate(self, dataset: Dataset, clients: Sequence[ClientState]) -> float:
        """Global-model accuracy on the global test set."""
        assert self.model is not None and self.params is not None
        set_flat(self.shared_parameters(self.model), self.params)
        return accuracy(self.model, dataset.x_test, dataset.y_test)

    def export_model(self, clients: Sequence[ClientState]) -> Any | None:
        """The global model as :meth:`evaluate` scored it last (a
        :class:`secagg.model_io.TrainedModel`); None when the model was built without a
        recipe (a subclass's own :meth:`build_model`)."""
        from secagg.model_io import TrainedModel

        if self.model is None or self.model_recipe is None:
            return None
        return TrainedModel(recipe=self.model_recipe, model=copy.deepcopy(self.model).eval())

    def describe(self) -> dict[str, Any]:
        """Name and hyper-parameters."""
        return {"name": self.name, "local_epochs": self.local_epochs, "lr": self.lr,
                "momentum": self.momentum, "batch_size": self.batch_size,
                "param_bound": self.param_bound, "upload_dtype": self.upload_dtype,
                "dpsgd": None if self.dpsgd is None else vars(self.dpsgd),
                "clip": None if self.clip_policy is None else self.clip_policy.describe(),
                "server_opt": self.server_optimizer.describe()}

    # -- pieces the phase uses ----------------------------------------------------------
    def spec(self) -> UploadSpec:
        """Fields ``n`` and ``weighted_params``; with a clip, :meth:`update_spec`."""
        assert self.params is not None
        if self.clip_policy is not None:
            return self.update_spec(self.params.size)
        return UploadSpec((
            Field("n", (1,), "int64", bound=Bound(l2=1.0, linf=1.0), additive=True),
            Field("weighted_params", (self.params.size,), self.upload_dtype,
                  bound=Bound(linf=self.param_bound), additive=True),
        ))

    def update_spec(self, size: int, group: str = "default") -> UploadSpec:
        """DP-FedAvg's upload: ``update`` (``size`` entries, client-level L2 bound = the
        clip in force) and, under adaptive clipping, ``unclipped`` (1[norm <= C] - 1/2,
        client-level bound 1/2, with the policy's share of the DP budget)."""
        assert self.clip_policy is not None and self.clip_value is not None
        fields = [Field("update", (size,), self.upload_dtype, group=group, additive=True,
                        bound=Bound(l2=self.clip_value, adjacency="client"))]
        if isinstance(self.clip_policy, AdaptiveClip):
            fields.append(Field("unclipped", (1,), "float64", group=group, additive=True,
                                bound=Bound(l2=0.5, linf=0.5, adjacency="client"),
                                dp_weight=self.clip_policy.count_weight))
        return UploadSpec(tuple(fields))

    def clipped_update(self, local: np.ndarray, broadcast: np.ndarray,
                       clip: float) -> dict[str, np.ndarray]:
        """One client's DP-FedAvg upload: its update ``local - broadcast`` clipped to L2
        <= ``clip`` (the broadcast bound, never the server's belief of it), plus the
        centred under-the-clip bit under adaptive clipping. Counts the clip for the
        round's measurements."""
        delta = np.asarray(local, dtype=np.float64) - np.asarray(broadcast, dtype=np.float64)
        clipped, norm, was = clip_l2(delta, clip, self.upload_dtype)
        self.clip_value = clip  # a node's copy declares the bound it was told to apply
        self.round_clients += 1
        self.round_clipped += int(was)
        out = {"update": clipped}
        if isinstance(self.clip_policy, AdaptiveClip):
            out["unclipped"] = np.array([0.5 if norm <= clip else -0.5])
        return out

    def clip_broadcast(self) -> dict[str, np.ndarray]:
        """The clip bound the clients must apply this round (empty without a clip)."""
        if self.clip_policy is None:
            return {}
        assert self.clip_value is not None
        return {"clip": np.array([self.clip_value], dtype=np.float64)}

    def apply_update(self, params: np.ndarray, aggregate: Aggregate,
                     field: str = "update") -> np.ndarray:
        """The server's side of DP-FedAvg: the mean update over the sampled cohort (a
        fixed denominator: :attr:`~secagg.layers.base.Aggregate.cohort`, the contributors
        outside an engine), one server-optimizer step from ``params``, and, under adaptive
        clipping, the next clip bound from the noised count. Returns the new parameters."""
        m = aggregate.cohort if aggregate.cohort else len(aggregate.contributors)
        if m < 1:
            return params
        mean = np.asarray(aggregate[field], dtype=np.float64) / m
        self.opt_state, new = self.server_optimizer.step(self.opt_state, params, mean)
        if isinstance(self.clip_policy, AdaptiveClip) and "unclipped" in aggregate:
            assert self.clip_value is not None
            frac = (float(aggregate["unclipped"][0]) + 0.5 * m) / m
            self.clip_value = self.clip_policy.next_clip(self.clip_value, frac)
        return new.astype(np.float32)

    def clip_measurements(self, clip: float | None) -> dict[str, Any]:
        """The round's clip report (and reset): the bound in force, and, where this process
        ran the client steps (the embedded engine), how many of the clients it clipped."""
        if self.clip_policy is None:
            return {}
        out: dict[str, Any] = {"clip": clip}
        if self.round_clients:
            out.update(clipped=self.round_clipped, clients=self.round_clients)
        if isinstance(self.clip_policy, AdaptiveClip):
            out["next_clip"] = self.clip_value
        self.round_clipped = self.round_clients = 0
        return out

    def keeps_model_state(self, model: torch.nn.Module) -> bool:
        """Whether a client's model holds state the broadcast does not fix: a buffer (e.g.
        batch-norm statistics) or a trainable parameter outside :meth:`shared_parameters`.
        Without such state every client trains the same model from the broadcast, and one
        working copy serves them all (:meth:`client_model`)."""
        if any(True for _ in model.buffers()):
            return True
        shared = {id(p) for p in self.shared_parameters(model)}
        return any(p.requires_grad and id(p) not in shared for p in model.parameters())

    def client_model(self, client: ClientState, params: np.ndarray) -> SplitModel:
        """The model ``client`` trains, loaded with the broadcast ``params``: when the model
        keeps no state of the client's own (:meth:`keeps_model_state`), one working copy of
        the global model shared by every client (so n clients cost one model's memory, not
        n); otherwise the client's own copy, made on first use and kept in its state."""
        assert self.model is not None
        model = self.model_copy(client, own=self.keeps_model_state(self.model))
        set_flat(self.shared_parameters(model), params)
        return model

    def model_copy(self, client: ClientState, own: bool) -> SplitModel:
        """A copy of the global model for ``client`` to load and train: its own (made on
        first use and kept in its state) when ``own``, else the one working copy every
        client shares (made on first use)."""
        assert self.model is not None
        if own:
            if "model" not in client.state:
                client.state["model"] = copy.deepcopy(self.model)
            return client.state["model"]
        if self._work_model is None:
            self._work_model = copy.deepcopy(self.model)
        return self._work_model

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
        """New global parameters: with a clip, :meth:`apply_update`; else the weighted mean
        sum(n w) / sum(n) (kept if no record contributed), directly for plain FedAvg
        (``sgd`` at lr 1) or as the server optimizer's step along mean - current."""
        assert self.params is not None
        if self.clip_policy is not None:
            self.params = self.apply_update(self.params, aggregate)
            return
        total = float(aggregate["n"][0])
        if total > 0:
            mean = (aggregate["weighted_params"] / total).astype(np.float32)
            if self.server_optimizer.is_plain_average:
                self.params = mean
            else:
                self.opt_state, new = self.server_optimizer.step(
                    self.opt_state, self.params,
                    mean.astype(np.float64) - self.params.astype(np.float64))
                self.params = new.astype(np.float32)


def weighted(w: np.ndarray, n: int, dtype: str) -> np.ndarray:
    """``n * w`` in ``dtype``, rounded once from the exact product.

    For float32 parameters and a float32 upload with ``n < 2**24`` this multiplies in
    float32: ``n`` is then exact in float32 and IEEE multiplication rounds the exact product
    once, which is what casting the (exact) float64 product to float32 does, so the result
    is the same bit for bit without the two float64 temporaries. Otherwise the product is
    taken in float64 and cast.
    """
    if dtype == "float32" and w.dtype == np.float32 and 0 <= n < 2**24:
        return w * np.float32(n)
    return (w.astype(np.float64) * n).astype(dtype)


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

    def __init__(self, algo: FedAvg, round: int = 0) -> None:
        super().__init__(algo, round)
        self.clip = algo.clip_value  # the bound this phase's spec and broadcast carry
        self._chunks: _ChunkCache | None = None
        self._n_params: int | None = None

    def spec(self) -> UploadSpec:
        return self.algo.spec()

    def broadcast(self) -> dict[str, np.ndarray]:
        """The global parameters and, with DP-FedAvg, the clip bound."""
        return {**super().broadcast(), **self.algo.clip_broadcast()}

    def prepare(self, clients: Sequence[ClientState],
                broadcast: Mapping[str, np.ndarray]) -> None:
        """The engine announces the cohort before its client steps: when the training can
        be batched, the steps then train it a chunk at a time (see the module docstring)."""
        self._chunks = None
        if self.algo.batching_reason() is None and clients:
            self._chunks = _ChunkCache(self.algo, list(clients), broadcast["params"],
                                       self.round)

    def client_cpu_s(self, client: ClientState, measured: float) -> float:
        """The client's CPU seconds for the cost ledger: what its step measured, with a
        batched chunk's time moved from the step that ran it to each client of the chunk
        in proportion to its local steps."""
        if self._chunks is None:
            return measured
        return self._chunks.cpu_s(client, measured)

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:  # noqa: E501
        w = None if self._chunks is None else self._chunks.take(client, broadcast["params"])
        if w is None:
            w = self.algo.local_update(client, broadcast["params"], self.round)
        if self.algo.clip_policy is not None:
            return self.algo.clipped_update(w, broadcast["params"],
                                            float(np.asarray(broadcast["clip"])[0]))
        b = self.algo.param_bound
        over = int(np.count_nonzero(np.abs(w) > b))
        if over:
            self.algo.clamped += over
            w = np.clip(w, -b, b)
        n = client.n_records
        return {"n": np.array([n], dtype=np.int64),
                "weighted_params": weighted(w, n, self.algo.upload_dtype)}

    def server_step(self, aggregate: Aggregate) -> None:
        self.algo.apply_average(aggregate)

    def measurements(self) -> dict[str, Any]:
        """With DP-FedAvg: the clip bound in force and how many clients it clipped."""
        return self.algo.clip_measurements(self.clip)

    def round_invariant_fields(self) -> tuple[str, ...]:
        """``n`` (the client's record count, the same in every round) in the classic
        upload; nothing under DP-FedAvg (the update moves with the model)."""
        return () if self.algo.clip_policy is not None else ("n",)

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
        """``weighted_params`` or ``update`` (the locally trained model); ``n`` is a plain
        count, ``unclipped`` a bit of it."""
        return ("update", "unclipped") if self.algo.clip_policy is not None else (
            "weighted_params",)

    def trained_with_dpsgd(self) -> bool:
        """True when local training runs under DP-SGD."""
        return self.algo.dpsgd is not None

    def client_flops(self, client: ClientState) -> float:
        # forward + backward ~ 6 FLOPs per parameter per sample per epoch
        assert self.algo.model is not None
        if self._n_params is None:  # once per phase, not once per client
            self._n_params = n_params(self.algo.model)
        return 6.0 * self._n_params * client.n_records * self.algo.local_epochs


class _ChunkCache:
    """A cohort's batched local training, a chunk at a time: the first step of a client
    of chunk k trains all of chunk k; each client's model is handed out once."""

    def __init__(self, algo: FedAvg, clients: list[ClientState], params: np.ndarray,
                 round: int) -> None:
        self.algo = algo
        self.clients = clients
        self.params = np.array(params, copy=True)
        self.round = round
        self.pos = {c.id: i for i, c in enumerate(clients)}
        self.trained: set[int] = set()
        self.models: dict[int, np.ndarray] = {}
        self.share: dict[int, float] = {}  # CPU seconds attributed to each client
        self.spent: dict[int, float] = {}  # CPU seconds of a chunk run inside a client step

    def take(self, client: ClientState, params: np.ndarray) -> np.ndarray | None:
        """The client's trained parameters (None: not in the announced cohort or another
        broadcast, so the caller trains it in the loop)."""
        i = self.pos.get(client.id)
        if i is None or not np.array_equal(params, self.params):
            return None
        k = i // self.algo.chunk
        if k not in self.trained:
            self.trained.add(k)
            members = self.clients[k * self.algo.chunk:(k + 1) * self.algo.chunk]
            t0 = time.process_time()
            flats = self.algo.train_chunk(members, self.params, self.round)
            spent = time.process_time() - t0
            bs, ep = self.algo.batch_size, self.algo.local_epochs
            work = [ep * math.ceil(c.n_records / bs) for c in members]
            total = sum(work)
            for c, f, wk in zip(members, flats, work, strict=True):
                self.models[c.id] = f
                self.share[c.id] = spent * (wk / total if total else 1 / len(members))
            self.spent[client.id] = spent
        return self.models.pop(client.id, None)

    def cpu_s(self, client: ClientState, measured: float) -> float:
        """``measured`` less any chunk training it ran, plus the client's share of it."""
        return max(0.0, measured - self.spent.pop(client.id, 0.0)) + self.share.pop(
            client.id, 0.0)
