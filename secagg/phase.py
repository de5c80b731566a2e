"""What the engine asks of an algorithm and of its phases, declared once with defaults.

:class:`PhaseBase` and :class:`AlgorithmBase` are the contracts the round engine
(:mod:`secagg.engine`) and the client step (:mod:`secagg.client_step`) read: the engine
calls these methods and attributes directly, never probing whether a phase or an algorithm
has them. :class:`algorithms.base.Phase` and :class:`algorithms.base.Algorithm` derive from
them; an object that does not derive from them must define every member the engine reads.

Invariants a phase keeps:

- :meth:`PhaseBase.spec` is the same before and after :meth:`PhaseBase.client_step`
  unless the bound comes with the broadcast (then the spec after the step is the one
  checked);
- :meth:`PhaseBase.privacy_events` returns each DP-SGD event once (it clears them);
- :meth:`PhaseBase.prepare` and :meth:`PhaseBase.client_cpu_s` only move work and its
  CPU time between clients: the uploads are the same bit for bit without them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from secagg.data import ClientData, Dataset
from secagg.layers.base import Aggregate
from secagg.messages import UploadSpec

__all__ = ["AlgorithmBase", "ClientState", "PhaseBase"]


@dataclass
class ClientState:
    """One client during a run: its data and its persistent private state."""

    data: ClientData
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> int:
        """The client id."""
        return self.data.id

    @property
    def n_records(self) -> int:
        """Number of training records."""
        return len(self.data.y)


class PhaseBase(ABC):
    """One upload phase: broadcast, client step, layer, server step (see
    :class:`algorithms.base.Phase`), with the defaults of every optional part."""

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

    def prepare(self, clients: Sequence[ClientState],
                broadcast: Mapping[str, np.ndarray]) -> None:
        """The engine announces the clients about to step in one process (a phase may then
        compute a chunk of their steps at once, e.g. batched training). Default: nothing."""
        return None

    def client_cpu_s(self, client: ClientState, measured: float) -> float:
        """The client's CPU seconds for the cost ledger, given what its step measured
        (a phase that did shared work in :meth:`prepare` books it here). Default:
        ``measured``."""
        return measured

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

    def dp_covered_fields(self) -> tuple[str, ...]:
        """Fields that are post-processing of the phase's own DP-SGD output (so a layer
        that leaves them un-noised does not release them without DP). Default: none."""
        return ()

    def privacy_events(self) -> list[Any]:
        """The DP events the phase's local training spent since last asked (each returned
        once), composed by the run's privacy ledger before the release. Default: none."""
        return []

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


class AlgorithmBase(ABC):
    """A federated algorithm as the engine runs it (see :class:`algorithms.base.Algorithm`),
    with the defaults of every optional part."""

    name: ClassVar[str] = "algorithm"
    #: True when each client keeps its own model (accuracy: the mean local test accuracy).
    personalized: ClassVar[bool] = False
    #: The DP-FedAvg clip policy (a :class:`~secagg.privacy.clipping.ClipPolicy`), or None.
    clip_policy: Any = None

    @abstractmethod
    def setup(self, dataset: Dataset, clients: Sequence[ClientState], seed: int) -> None:
        """Initialise server (and client) state before the first round."""

    @abstractmethod
    def phases(self, round: int, rounds: int) -> Sequence[PhaseBase]:
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


def _members(base: type) -> tuple[str, ...]:
    """The public members ``base`` declares (what the engine may ask of an instance)."""
    return tuple(sorted(n for c in base.__mro__ if c is not object
                        for n in vars(c) if not n.startswith("_")))


def check_contract(algorithm: Any, phases: Sequence[Any]) -> None:
    """Refuse, before any client is contacted, an algorithm or phase that lacks a member
    the engine asks of it (:class:`AlgorithmBase`, :class:`PhaseBase`): derive from
    ``algorithms.base.Algorithm`` / ``Phase`` (or these bases), which give every optional
    member its default, or define the member.

    Raises:
        ConfigurationError: the missing members, named per object.
    """
    from secagg.errors import ConfigurationError

    for obj, base in ((algorithm, AlgorithmBase), *((p, PhaseBase) for p in phases)):
        if isinstance(obj, base):
            continue
        missing = [n for n in _members(base) if not hasattr(obj, n)]
        if missing:
            raise ConfigurationError(
                f"{type(obj).__name__} lacks {missing} that the engine asks of "
                f"{'an algorithm' if base is AlgorithmBase else 'a phase'}: derive it from "
                f"algorithms.base.{'Algorithm' if base is AlgorithmBase else 'Phase'} "
                f"(secagg.phase.{base.__name__}), which defines each with its default")
