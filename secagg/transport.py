"""The transport: what a runtime supplies to the :class:`~secagg.engine.Engine` (the
:class:`Transport` protocol), the hooks a transport may leave alone (:class:`TransportHooks`),
and the embedded transport, whose clients live in this process (:class:`InProcess`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from secagg.data import Dataset, Partition
from secagg.errors import (
    SecaggError,
)
from secagg.layers.base import RoundContext
from secagg.link import Link, Reply
from secagg.phase import ClientState
from secagg.wire import pack_arrays, unpack_arrays

if TYPE_CHECKING:
    pass

from secagg.round_steps import AlgorithmLike, RunState, book_broadcast


class Transport(Protocol):
    """What a runtime supplies to the :class:`Engine`: its clients, how the broadcast
    reaches them and, for a remote runtime, a :class:`~secagg.link.Link` that carries every
    other message. :class:`TransportHooks` gives every hook a default."""

    #: the data set description (its global test set evaluates non-personalized models)
    dataset: Dataset
    #: the clients in this process (empty for a remote runtime)
    states: Sequence[ClientState]
    #: the link to the clients' nodes, or None when they run in this process
    link: Link | None

    def open(self, run: RunState, hello: Callable[[int], dict[str, Any]],
             greeted: Callable[[int, Reply], None]) -> list[int]:
        """Reach the clients; return their ids, sorted. A remote runtime sends each node a
        hello carrying ``hello(number of nodes)`` and hands each reply to ``greeted``."""
        ...

    def meta(self) -> dict[str, Any]:
        """Extra fields for the transcript's run header."""
        ...

    def broadcast(self, payload: Mapping[str, np.ndarray], cohort: Sequence[int],
                  ctx: RoundContext) -> Any:
        """Book the phase's broadcast and return what the clients' steps get: the decoded
        payload (in one process) or its wire bytes (remote: they ride on the step)."""
        ...

    def round_begins(self, round: int) -> None:
        """A round starts."""
        ...

    def phase_begins(self, index: int, run: RunState) -> None:
        """Phase ``index`` of the round starts."""
        ...

    def evaluate(self, round: int, run: RunState) -> float:
        """The accuracy after ``round`` (may be NaN until :meth:`close` fills it in)."""
        ...

    def round_ends(self, round: int) -> None:
        """A round ended."""
        ...

    def aborted(self, exc: SecaggError) -> None:
        """A phase over the link failed (an abort or a protocol error; the runtime may
        annotate ``exc``)."""
        ...

    def close(self, run: RunState) -> None:
        """The last round ended."""
        ...


class TransportHooks:
    """No-op defaults for :class:`Transport`'s hooks."""

    link: Link | None = None

    def open(self, run: RunState, hello: Callable[[int], dict[str, Any]],
             greeted: Callable[[int, Reply], None]) -> list[int]:
        """The clients in this process: ids 0..n-1."""
        return list(range(len(self.states)))  # type: ignore[attr-defined]

    def meta(self) -> dict[str, Any]:
        """No extra header fields."""
        return {}

    def round_begins(self, round: int) -> None:
        """Nothing to do."""

    def phase_begins(self, index: int, run: RunState) -> None:
        """Nothing to do."""

    def round_ends(self, round: int) -> None:
        """Nothing to do."""

    def aborted(self, exc: SecaggError) -> None:
        """Nothing to add."""

    def close(self, run: RunState) -> None:
        """Nothing to do."""


class InProcess(TransportHooks):
    """The embedded transport: the clients are :class:`ClientState` objects in this
    process; the broadcast is packed and unpacked as it would travel (its bytes booked);
    the accuracy is computed here."""

    def __init__(self, *, algorithm: AlgorithmLike, partition: Partition) -> None:
        self.algorithm = algorithm
        self.dataset = partition.dataset
        self.states = [ClientState(cd) for cd in partition]

    def broadcast(self, payload: Mapping[str, np.ndarray], cohort: Sequence[int],
                  ctx: RoundContext) -> dict[str, np.ndarray]:
        """Pack the payload (the server's CPU), unpack it (the clients'), book it."""
        if not payload:
            return {}
        t0 = time.process_time()
        wire = pack_arrays(payload)
        server_s = time.process_time() - t0
        t0 = time.process_time()
        decoded = unpack_arrays(wire)
        client_s = time.process_time() - t0
        book_broadcast(ctx, cohort, wire, payload, client_s, server_s)
        return decoded

    def evaluate(self, round: int, run: RunState) -> float:
        """The algorithm's own evaluation on the clients here."""
        return float(self.algorithm.evaluate(self.dataset, self.states))
