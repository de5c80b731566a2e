"""The algorithm protocol: a federated algorithm is a sequence of phases of uploads.

An :class:`Algorithm` says which :class:`Phase` objects run in each round. A phase declares
its :class:`~secagg.messages.UploadSpec`, what the server broadcasts, what each client
computes from the broadcast and its own data (ordinary PyTorch/numpy), and what the server
does with the :class:`~secagg.layers.base.Aggregate` a privacy layer hands it. The engine
(:class:`secagg.federation.Federation`) runs them in that order; the layer in between is
the user's choice.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from secagg.federation import ClientState, Evaluation
from secagg.layers.base import Aggregate
from secagg.messages import UploadSpec
from secagg.phase import AlgorithmBase, PhaseBase

__all__ = ["Aggregate", "Algorithm", "ClientState", "Evaluation", "LocalPhase", "Phase"]


class Phase(PhaseBase):
    """One upload phase: broadcast, client step, layer, server step.

    A phase also says which of its fields are computed from model state trained on the
    client's own records (:meth:`trained_fields`), and whether that training ran under
    record-level DP-SGD (:meth:`trained_with_dpsgd`). The engine uses both, before the
    first release, to refuse a record-level DP sensitivity that does not hold
    (:func:`secagg.privacy.sensitivity.check_training_adjacency`). Every optional part and
    its default is declared on :class:`secagg.phase.PhaseBase`.
    """


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


class Algorithm(AlgorithmBase):
    """A federated algorithm written as phases of uploads.

    Subclasses set :attr:`name` (the CLI name) and :attr:`personalized` (True when each
    client keeps its own model and accuracy is the mean local test accuracy). What the
    engine reads and its defaults are declared on :class:`secagg.phase.AlgorithmBase`.
    """

    @classmethod
    def dp_defaults(cls, adjacency: str, given: Mapping[str, Any]) -> dict[str, Any]:
        """Constructor arguments this algorithm takes by default when its uploads go through
        a DP layer of ``adjacency`` (``"record"`` or ``"client"``); ``given`` holds the
        arguments the user chose, which always win. The command line and the sweep apply
        them (:func:`secagg.algorithm_registry.algorithm_arguments`). Default: none."""
        return {}
