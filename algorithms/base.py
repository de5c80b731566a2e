"""The algorithm protocol: a federated algorithm is a sequence of phases of uploads.

An :class:`Algorithm` says which :class:`Phase` objects run in each round. A phase declares
its :class:`~secagg.messages.UploadSpec`, what the server broadcasts, what each client
computes from the broadcast and its own data (ordinary PyTorch/numpy), and what the server
does with the :class:`~secagg.layers.base.Aggregate` a privacy layer hands it. The engine
(:class:`secagg.federation.Federation`) runs them in that order; the layer in between is
the user's choice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from secagg.data import Dataset
from secagg.federation import ClientState, Evaluation
from secagg.layers.base import Aggregate
from secagg.messages import UploadSpec

__all__ = ["Aggregate", "Algorithm", "ClientState", "Evaluation", "LocalPhase", "Phase"]


class Phase(ABC):
    """One upload phase: broadcast, client step, layer, server step.

    A phase also says which of its fields are computed from model state trained on the
    client's own records (:meth:`trained_fields`), and whether that training ran under
    record-level DP-SGD (:meth:`trained_with_dpsgd`). The engine uses both, before the
    first release, to refuse a record-level DP sensitivity that does not hold
    (:func:`secagg.privacy.sensitivity.check_training_adjacency`).
    """

    name: ClassVar[str] = "phase"
    #: How the trained fields depend on the client's records (quoted when refused).
    training_note: ClassVar[str] = ""

    @abstractmethod
    def spec(self) -> UploadSpec:
        """The fields each client uploads in this phase."""

    def broadcast(self) -> dict[str, np.ndarray]:
        """What the server sends each selected client (counted as downlink bytes)."""
        return {}

    @abstractmethod
    def client_step(
        self, client: ClientState, broadcast: Mapping[str, np.ndarray]
    ) -> dict[str, np.ndarray]:
        """Compute one client's upload from the broadcast and its private data/state."""

    @abstractmethod
    def server_step(self, aggregate: Aggregate) -> None:
        """Update the server state from what the layer let the server see."""

    def client_flops(self, client: ClientState) -> float:
        """Estimated FLOPs of the client's statistic (for the cost ledger); 0 if unknown."""
        return 0.0

    def trained_fields(self) -> tuple[str, ...]:
        """Fields whose value is computed from a model trained on this client's records
        (locally in this phase, earlier, or through a global model the client's records
        trained in earlier rounds). Removing one record changes such a model, so a
        per-record bound on these fields is not a record-level sensitivity. Default: none."""
        return ()

    @property
    def upload_depends_on_training(self) -> bool:
        """True when some field of the upload depends on trained state."""
        return bool(self.trained_fields())

    def trained_with_dpsgd(self) -> bool:
        """True when the training behind :meth:`trained_fields` ran under record-level
        DP-SGD, whose events the run's privacy ledger composes. Default: False."""
        return False

    def round_invariant_fields(self) -> tuple[str, ...]:
        """Fields whose value for one client is the same in every round it takes part in
        (a function of its data alone, e.g. its record count or label histogram; not of a
        model that moves between rounds). Two exact sums of such a field over cohorts that
        differ by one client give that client's value by subtraction, and more samplings
        solve for more clients: :mod:`threat_models.differencing` flags an exact (un-noised)
        release of one in two or more rounds whose cohorts can differ, and
        :mod:`threat_models.attacks.differencing` recovers the values. Declare a field here
        when its value does not change between rounds; a DP layer's noise on it (composed
        over the releases by the ledger) is what protects it. Default: none."""
        return ()

    def measurements(self) -> dict[str, Any]:
        """What this phase reports after its server step, for :attr:`Result.measurements
        <secagg.federation.Result.measurements>` (JSON-able; e.g. the clip bound in force).
        Called by the engine once per phase run, after :meth:`server_step`. Default: {}."""
        return {}


class LocalPhase(Phase):
    """A phase in which every selected client computes on its own data and sends nothing.

    Its spec has no fields: the engine sends the broadcast (booked as downlink bytes), runs
    :meth:`client_step` on each selected client and books that work as a zero-byte
    ``"local"`` row of the cost ledger; it calls no layer and no :meth:`server_step`, and
    the phase is no release (DP layers do not count it when they split their budget).
    Typical use: personalisation after the last release (FedLog's bodies trained against a
    head that no longer changes). :meth:`client_step` returns ``{}``.
    """

    def spec(self) -> UploadSpec:
        """No fields: nothing leaves the client."""
        return UploadSpec(())

    def server_step(self, aggregate: Aggregate) -> None:
        """Never called: a local phase has no aggregate."""
        raise RuntimeError(f"local phase {self.name!r} has no server step")


class Algorithm(ABC):
    """A federated algorithm written as phases of uploads.

    Subclasses set :attr:`name` (the CLI name) and :attr:`personalized` (True when each
    client keeps its own model and accuracy is the mean local test accuracy).
    """

    name: ClassVar[str] = "algorithm"
    personalized: ClassVar[bool] = False

    @abstractmethod
    def setup(self, dataset: Dataset, clients: Sequence[ClientState], seed: int) -> None:
        """Initialise server (and client) state before the first round."""

    @abstractmethod
    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        """The phases to run in ``round`` (0-based) of ``rounds``."""

    @abstractmethod
    def evaluate(self, dataset: Dataset, clients: Sequence[ClientState]) -> float:
        """Accuracy now: on the global test set, or the mean local test accuracy when
        :attr:`personalized`."""

    def describe(self) -> dict[str, Any]:
        """JSON-able description (name and hyper-parameters)."""
        return {"name": self.name}

    def export_model(self, clients: Sequence[ClientState]) -> Any | None:
        """The trained model as the run's output (a :class:`secagg.model_io.TrainedModel`:
        a recipe to rebuild the module and the global model, or each client's for a
        personalized algorithm), as :meth:`evaluate` scored it last; None (default) when
        the algorithm has no PyTorch model to save."""
        return None

    @classmethod
    def dp_defaults(cls, adjacency: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """Constructor arguments this algorithm takes by default when its uploads go through
        a DP layer of ``adjacency`` (``"record"`` or ``"client"``); ``given`` holds the
        arguments the user chose, which always win. The command line and the sweep apply
        them (:func:`secagg.algorithm_registry.algorithm_arguments`). Default: none."""
        return {}
