"""The nodes' evaluation of personalized models, for
:class:`~secagg.flower.server.FlowerFederation`: an evaluation request in flight, the fields it
adds to each node's next message, and the accuracies collected from the replies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from secagg.engine import (
    clients_evaluated,
)
from secagg.errors import ProtocolError
from secagg.flower.records import content
from secagg.flower.records import field as rfield
from secagg.stages import Key, Stage
from secagg.wire import pack_arrays


@dataclass
class _PendingEvaluation:
    """A personalized evaluation in flight: round, the evaluation state's wire bytes, the
    nodes to ask, those asked, and (accuracy, has a local test set) per node that answered."""

    round: int
    wire: bytes
    ask: list[int]
    sent: set[int] = field(default_factory=set)
    acc: dict[int, tuple[float, bool]] = field(default_factory=dict)


class FederationAttributes:
    """The :class:`~secagg.flower.server.FlowerFederation` attributes its mixins read
    (declared once; the federation sets them)."""

    algorithm: Any
    collector: Any
    dataset: Any
    node_evaluation: bool
    nodes: dict[int, Any]
    poll_interval: float
    round_wall_s: list[float]
    rounds: int
    seed: int
    stage_timeout: float
    stage_wall_s: list[dict[str, float]]
    step_timeout: float
    transport: Any
    _eval: Any


class NodeEvaluationMixin(FederationAttributes):
    """The :class:`~secagg.flower.server.FlowerFederation`'s methods for the nodes' evaluation
    (moved here from it unchanged; they read its attributes)."""
    _events: Any
    _grid: Any
    _round_drops: Any
    _run: Any
    _run_tag: Any

    def _evaluate(self, rnd: int) -> float:
        """The accuracy after round ``rnd``: computed here for a non-personalized algorithm;
        for a personalized one NaN for now, filled in by :meth:`_finish_evaluation` once
        the nodes have answered (see the class docstring's Evaluation)."""
        if not getattr(self.algorithm, "personalized", False):
            return float(self.algorithm.evaluate(self.dataset, []))
        if self.node_evaluation:
            state = self.algorithm.evaluation_state()  # type: ignore[attr-defined]
            ask = [c for c in sorted(self.nodes) if c not in self._round_drops]
            self._eval = _PendingEvaluation(rnd, pack_arrays(state) if state else b"", ask)
        return float("nan")

    def _evaluation_fields(self, c: int) -> dict[str, Any]:
        """The fields that ask node ``c``, in its first message of the round, to evaluate
        the previous round's model before its client step (empty when not pending)."""
        ev = self._eval
        if ev is None or c not in ev.ask or c in ev.sent:
            return {}
        ev.sent.add(c)
        self.transport.add(Stage.EVALUATE, ours=len(ev.wire))
        return {Key.EVALUATE: True, Key.EVAL_STATE: ev.wire}

    def _collect_evaluation(self, got: Mapping[int, Any],
                            ev: _PendingEvaluation | None = None) -> None:
        """Keep the accuracies that came back (with a client step, or alone in an
        ``evaluate`` reply); a malformed one is left out of the mean."""
        ev = ev if ev is not None else self._eval
        if ev is None:
            return
        for c, rec in got.items():
            if c in ev.sent and c not in ev.acc:
                try:
                    ev.acc[c] = (rfield(rec, Key.ACC, float), rfield(rec, Key.HAS_TEST, bool))
                except ProtocolError:
                    continue

    def _finish_evaluation(self) -> None:
        """Ask the nodes not yet asked (not in this round's cohort, or after the last
        round) in an ``evaluate`` message of their own, then set the pending round's
        accuracy: the mean over the nodes that answered and have a local test set."""
        ev, self._eval = self._eval, None
        if ev is None:
            return
        rest = [c for c in ev.ask if c not in ev.sent]
        if rest:
            payloads = {c: content(step=Stage.EVALUATE, run=self._run_tag, seed=self.seed,
                                   state=ev.wire) for c in rest}
            self.transport.add(Stage.EVALUATE, ours=len(ev.wire) * len(rest))
            got, _ = self._exchange(
                self._grid, Stage.EVALUATE, None, payloads, timeout=self.step_timeout,
                needs=((Key.ACC, float), (Key.HAS_TEST, bool), (Key.CPU_S, float)),
                tag=f"{ev.round}/evaluate")
            ev.sent.update(rest)
            self._collect_evaluation(got, ev)
        if self._run is not None:
            clients_evaluated(self._run, ev.round, ev.acc)
