"""The server side on Flower: the round engine's transport over Flower's Grid.

:class:`FlowerFederation` runs the round engine (:class:`secagg.engine.Engine`) that the
embedded :class:`~secagg.federation.Federation` runs -- the same cohorts, per phase the
broadcast, the clients' steps, the layer, the DP release and the server step, then
evaluation -- with the clients on SuperNodes. This module supplies only the transport:
Flower ``Message``/``RecordDict`` plumbing (:mod:`secagg.flower.records`), sending and
polling on the Grid, the hello that maps nodes to client ids, the nodes' evaluation of
personalized models, and timing. Each layer's protocol runs in the layer's own server
side (:func:`secagg.engine.layer_server`) over this runtime's
:class:`~secagg.link.Link` methods (:meth:`FlowerFederation.exchange` and friends); a DP
layer's release is split by party in :mod:`secagg.privacy.release`. The ledger books the
same rows as the embedded engine (our wire bytes); what Flower's envelopes add is kept
apart in :attr:`FlowerFederation.transport`.

Dropouts are real: a node that does not answer a stage within ``stage_timeout`` seconds (or
answers with an error, or without the fields the stage needs) is dropped at that stage.
SecureSum then recovers through its dropout path (the server rebuilds a dropped client's
mask key from the others' shares); every such loss is booked as a zero-byte ledger row of
stage ``"dropped:<stage>"`` from that client and listed in the aggregate's
``notes["dropped"]``.

The run ends with a ``close`` exchange (:meth:`FlowerFederation._close_nodes`): every node
that said hello is sent the run's DP terms and answers with its signed closing statement
(:mod:`secagg.attest`, scheme v2); a node that does not answer is recorded in the
transcript as ``unclosed``, with the reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from secagg.attest import Collector
from secagg.attest.told import run_tag
from secagg.data import Dataset
from secagg.dropouts import DropoutModel
from secagg.engine import (
    NODE_BUDGET_REFUSAL,
    AlgorithmLike,
    ClientState,
    Engine,
    RunState,
    TransportHooks,
    book_broadcast,
    check_phase,
    check_remote,
    is_dp,
)
from secagg.errors import ConfigurationError, SecaggError
from secagg.flower.node_evaluation import NodeEvaluationMixin, _PendingEvaluation
from secagg.flower.node_messages import NodeMessagesMixin, _Transport
from secagg.flower.node_messages import send_and_receive as send_and_receive
from secagg.flower.records import MESSAGE_TYPE, content, flower_bytes, read
from secagg.flower.records import field as rfield
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.link import PROTOCOL_REPLY, Dropped, LayerServer, Needs, Reply
from secagg.result import Result
from secagg.stages import Key, Stage
from secagg.wire import pack_arrays

#: the check every runtime makes before contacting a node (kept under its old name)
check_layer = check_remote


class FlowerFederation(NodeMessagesMixin, NodeEvaluationMixin, TransportHooks):
    """Run ``algorithm`` with ``layer`` over the SuperNodes a Flower Grid reaches.

    Args:
        algorithm: the algorithm (server side; the nodes run their own copies).
        layer: :class:`~secagg.layers.plaintext.Plaintext`,
            :class:`~secagg.secure_sum.SecureSum`, :class:`~secagg.homomorphic.Homomorphic`
            with ``key_holder="decryptor"``, or CentralDP / LocalDP around one of them, or
            DistributedDP around SecureSum (others raise ConfigurationError, see
            :func:`~secagg.engine.check_remote`). A DP layer's run has a privacy ledger
            (``Result.privacy``), planned and checked before any node is contacted; its
            noise is added where the embedded layer adds it
            (:mod:`secagg.privacy.release`).
        dataset: the data set description the server's ``algorithm.setup`` needs (classes,
            input shape; its global test set for non-personalized evaluation).
        rounds, fraction, seed, on_violation, on_abort, include_values, max_records: as
            :class:`~secagg.federation.Federation`. ``max_records`` is the public bound on
            records per client that fixed-point plans and client-level sensitivities are
            derived from (default :data:`~secagg.messages.DEFAULT_MAX_RECORDS`); nodes never
            report their record counts, and a node holding more refuses its upload.
        min_nodes: wait until this many nodes are connected (default: 1).
        connect_timeout: seconds to wait for them.
        stage_timeout: seconds a stage waits for replies; nodes silent past it are dropped.
        step_timeout: the same for the messages that run the client step (local training)
            or a node's evaluation, which take longer than a protocol stage (default:
            ``stage_timeout``).
        poll_interval: seconds between two pulls of the replies from the SuperLink.
        node_evaluation: personalized algorithms: compute the accuracy on the nodes after
            each round (see Evaluation below); False reports NaN. Default: on, except under
            a DP layer (each node's accuracy would reach the server un-noised).
        decryptor: Homomorphic: the client id of the node that generates the keys, keeps
            the secret context and decrypts the sum (default: the smallest id). It must
            not collude with the server (as the embedded layer's decryptor).
        pinned_keys: SecureSum with pinned node identities: the operator's copy of the public
            keys the nodes pin (node config ``pinned-keys``): a JSON file ``{"ID": HEX}``, a
            directory of ``ID.pub`` files, or a mapping client id -> 32 raw bytes. The
            server then refuses an ADVERTISE signed by any other key (one node advertising
            an unpinned key excludes only itself) and forwards every survivor signature, so
            the nodes can count the pinned signers on any graph. Without it a node that
            advertises an unpinned key makes every pinned node refuse the roster.
        hold: test hook: (stage, directory): after closing that secure-sum stage in round 0
            write ``reached`` into the directory and wait (up to 60 s) for a ``go`` file.

    Evaluation. A non-personalized algorithm is evaluated here, on the global test set.
    A personalized one (each client keeps its own model) is evaluated where the models
    live: after each round the server sends the algorithm's ``evaluation_state()`` (FedLog:
    the head eta, already public through the broadcast) to every node, each node scores its
    own model on its own local test set, and the accuracy is the mean over the nodes that
    have one, in client-id order -- the embedded engine's number bit for bit. The request
    rides on a node's first message of the next round (the node scores, then runs its
    step, in the embedded engine's order); the last round's, and nodes outside the next
    cohort, get an ``evaluate`` message of their own. Nodes that dropped out of the round
    are not asked (they may be gone), and nodes that do not answer are not in the mean.
    This traffic is measurement, not protocol: like the embedded engine's in-process
    evaluation it is not booked in the cost ledger (Flower's bytes for it are in
    :attr:`transport` under ``evaluate``). But it discloses each node's local test accuracy
    (of a model trained on its records) to the server, which no privacy layer covers, so
    the transcript records it: one clear observation per node and round, phase
    ``"evaluate"``, field ``"local test accuracy"``; under a DP layer the privacy ledger
    marks it released without DP noise, and the run is then not private. That is why it
    is off by default under a DP layer (the accuracy is then NaN); ``node_evaluation=True``
    turns it on there, ``False`` off everywhere.
    """

    def __init__(
        self,
        algorithm: AlgorithmLike,
        layer: Layer,
        dataset: Dataset,
        rounds: int = 10,
        fraction: float = 1.0,
        seed: int = 0,
        on_violation: Literal["raise", "clip"] = "raise",
        on_abort: Literal["raise", "skip"] = "raise",
        include_values: bool = False,
        min_nodes: int = 1,
        connect_timeout: float = 60.0,
        stage_timeout: float = 60.0,
        hold: tuple[str, str] | None = None,
        pinned_keys: str | Path | Mapping[int, bytes] | None = None,
        decryptor: int | None = None,
        poll_interval: float = 0.2,
        node_evaluation: bool | None = None,
        step_timeout: float | None = None,
        max_records: int | None = None,
    ) -> None:
        check_remote(layer)
        if node_evaluation is None:  # off under DP: the accuracies are un-noised releases
            node_evaluation = not is_dp(layer)
        if max_records is not None and (isinstance(max_records, bool)
                                        or not isinstance(max_records, int) or max_records < 1):
            raise ConfigurationError(
                f"max_records must be a positive integer (a public bound), got {max_records!r}")
        self.node_evaluation = node_evaluation and bool(getattr(algorithm, "personalized",
                                                                False))
        if self.node_evaluation and not (
                callable(getattr(algorithm, "evaluation_state", None))
                and callable(getattr(algorithm, "load_evaluation_state", None))):
            raise ConfigurationError(
                f"personalized algorithm {getattr(algorithm, 'name', algorithm)!r} has no "
                "evaluation_state()/load_evaluation_state(): its accuracy is computed on the "
                "nodes, which need the server's part of the model; add them (see FedLog) or "
                "pass node_evaluation=False (accuracy NaN)")
        if getattr(algorithm, "dpsgd", None) is not None:
            raise ConfigurationError(
                "DP-SGD in the clients' local training is not accounted over Flower yet (its "
                "events stay on the nodes); run it with the embedded Federation"
            )
        if rounds < 1:
            raise ConfigurationError(f"rounds must be >= 1, got {rounds}")
        if not 0.0 < fraction <= 1.0:
            raise ConfigurationError(f"fraction must be in (0, 1], got {fraction}")
        if on_violation not in ("raise", "clip") or on_abort not in ("raise", "skip"):
            raise ConfigurationError("on_violation must be raise|clip, on_abort raise|skip")
        step_timeout = stage_timeout if step_timeout is None else step_timeout
        if (min_nodes < 1 or connect_timeout <= 0 or stage_timeout <= 0 or step_timeout <= 0
                or poll_interval <= 0):
            raise ConfigurationError("min_nodes >= 1 and positive timeouts are required")
        self.algorithm, self.layer, self.dataset = algorithm, layer, dataset
        self.states: list[ClientState] = []  # the clients live on the nodes
        self.rounds, self.fraction, self.seed = rounds, fraction, seed
        self.on_violation, self.on_abort = on_violation, on_abort
        self.include_values = include_values
        self.min_nodes, self.connect_timeout = min_nodes, connect_timeout
        self.stage_timeout, self.poll_interval = stage_timeout, poll_interval
        self.step_timeout = step_timeout
        self.hold = hold
        if pinned_keys is None or isinstance(pinned_keys, Mapping):
            self.pinned_keys = dict(pinned_keys) if pinned_keys is not None else None
        else:
            from secagg.flower.client import load_pinned_keys

            self.pinned_keys = load_pinned_keys(pinned_keys)
        self.dropouts = DropoutModel(0.0, seed).for_stages(layer.dropout_stages())
        self.transport = _Transport()
        self.nodes: dict[int, int] = {}  # client id -> Flower node id
        self.max_records = max_records
        self._held = False
        self._run_tag = ""
        self._last_drops: Dropped = {}
        #: the nodes' ledger heads this run (transcript records, written at close)
        self._node_ledgers: list[dict[str, Any]] = []
        self._sizings: dict[str, set[int]] = {}  # share sizing -> the nodes that reported it
        self._events: dict[Any, Any] = {}  # the last release's node event (cached)
        self._round_drops: set[int] = set()  # clients dropped in the current round
        self._eval: _PendingEvaluation | None = None
        self._run: RunState | None = None  # the running run's (evaluation records)
        self._grid: Grid | None = None
        self._t_round = 0.0
        #: wall seconds of each round (its phases and, if any, the nodes' evaluation)
        self.round_wall_s: list[float] = []
        #: wall seconds spent waiting for each stage's replies, summed over the run
        self.stage_wall_s: dict[str, float] = {}
        self.decryptor = decryptor
        #: the layer's server side in the current run (:func:`~secagg.engine.layer_server`)
        self.layer_server: LayerServer | None = None
        #: the statements the nodes signed in the current run (secagg.attest)
        self.collector = Collector(run="")

    # ---------------------------------------------------------------- the Link

    @property
    def clients(self) -> Collection[int]:
        """The connected nodes' client ids."""
        return self.nodes.keys()

    def exchange(
        self, stage: str, ctx: RoundContext, instructions: Mapping[int, Mapping[str, Any]],
        *, needs: Needs = PROTOCOL_REPLY, step: bool = False,
    ) -> tuple[dict[int, Reply], dict[int, str]]:
        """One Flower message per client (the run's tag added), the replies back (see
        :meth:`secagg.link.Link.exchange`). ``step``: wait ``step_timeout``, and let a
        pending evaluation request ride on each node's message (its accuracy comes back
        with the reply)."""
        # att: the labels a node's signed statements carry (secagg.attest)
        labels = json.dumps([int(ctx.round), str(ctx.phase), stage])
        payloads = {c: content(run=self._run_tag, att=labels, **ins,
                               **(self._evaluation_fields(c) if step else {}))
                    for c, ins in instructions.items()}
        got, failed = self._exchange(self._grid, stage, ctx, payloads,  # type: ignore[arg-type]
                                     timeout=self.step_timeout if step else None, needs=needs)
        if step:
            self._collect_evaluation(got)
            for c, rec in got.items():  # how each node sized its DistributedDP share
                if isinstance(rec.get(Key.DP_SIZING), str):
                    self._sizings.setdefault(rec[Key.DP_SIZING], set()).add(int(c))
            for c, rec in got.items():  # the release each node charged on its own ledger
                if isinstance(rec.get(Key.LEDGER_HEAD), str):
                    self._node_ledgers.append({
                        "type": "node-ledger", "client": int(c), "head": rec[Key.LEDGER_HEAD],
                        "event": self._node_event(c, instructions[c], ctx,
                                                  rec.get(Key.DP_SIZING))})
            for c, why in failed.items():  # a node's budget refusal (an error reply)
                if NODE_BUDGET_REFUSAL in why:
                    self._node_ledgers.append({
                        "type": "node-ledger", "client": int(c), "head": None,
                        "refused": self._node_event(c, instructions[c], ctx,
                                                    action="refused", reason=why)})
        return got, failed

    def count(self, stage: str, nbytes: int) -> None:
        """Book secagg wire bytes in the transport table."""
        self.transport.add(stage, ours=nbytes)

    def lost(self, dropped: Dropped) -> None:
        """Remember the nodes dropped this round (not asked to evaluate) and this phase
        (named when its secure sum aborts)."""
        for clients in dropped.values():
            self._round_drops.update(clients)
        self._last_drops = dropped

    def open(self, run: RunState, hello: Callable[[int], dict[str, Any]],
             greeted: Callable[[int, Reply], None]) -> list[int]:
        """Wait for ``min_nodes`` SuperNodes and ask each for its client id (``hello``; a
        node's record count is private and never asked for). The hello also carries
        ``hello(number of nodes)`` (SecureSum: every node advertises for the first
        session), and each reply goes to ``greeted``. Returns the client ids, sorted."""
        self._run = run
        grid = self._grid
        assert grid is not None
        deadline = time.monotonic() + self.connect_timeout
        ids = list(grid.get_node_ids())
        while len(ids) < self.min_nodes:
            if time.monotonic() > deadline:
                raise ConfigurationError(
                    f"only {len(ids)} of min_nodes={self.min_nodes} SuperNodes connected "
                    f"within {self.connect_timeout:g} s"
                )
            time.sleep(0.5)
            ids = list(grid.get_node_ids())
        self.nodes = {}
        fields: dict[str, Any] = {Key.RUN: self._run_tag, **hello(len(ids))}
        msgs = [Message(content(step=Stage.HELLO, **fields), dst_node_id=node,
                        message_type=MESSAGE_TYPE, group_id=Stage.HELLO) for node in ids]
        for m in msgs:
            self.transport.add(Stage.HELLO, flower=flower_bytes(m))
        errors = []
        for rep in send_and_receive(grid, msgs, self.connect_timeout, self.poll_interval):
            if rep.has_error():
                errors.append(rep.error.reason)
                continue
            self.transport.add(Stage.HELLO, flower=flower_bytes(rep))
            rec = read(rep)
            cid = rfield(rec, "cid", int)
            if cid in self.nodes:
                raise ConfigurationError(
                    f"two SuperNodes report client id {cid}; give each node its own partition"
                )
            self.nodes[cid] = int(rep.metadata.src_node_id)
            if isinstance(rec.get("identity"), str):  # the node's public identity key
                self.collector.keys[str(cid)] = rec["identity"]
            if isinstance(rec.get(Key.LEDGER_HEAD), str):  # its own ledger, as the run begins
                self._node_ledgers.append({"type": "node-ledger", "client": cid,
                                           "head": rec[Key.LEDGER_HEAD], "event": None})
            self._statements(cid, rec)
            greeted(cid, rec)
        if len(self.nodes) < self.min_nodes:
            raise ConfigurationError(
                f"only {len(self.nodes)} of min_nodes={self.min_nodes} SuperNodes answered "
                f"within {self.connect_timeout:g} s"
                + (f" (first error reply: {errors[0]})" if errors else "")
            )
        return sorted(self.nodes)

    # ---------------------------------------------------------------- the Transport

    @property
    def link(self) -> FlowerFederation:  # type: ignore[override]
        """This runtime is its own :class:`~secagg.link.Link`."""
        return self

    def meta(self) -> dict[str, Any]:
        """The transcript header names the runtime."""
        return {"runtime": "flower"}

    def broadcast(self, payload: Mapping[str, np.ndarray], cohort: Sequence[int],
                  ctx: RoundContext) -> bytes:
        """Pack and book the broadcast; its bytes ride on each node's step instruction."""
        wire = pack_arrays(payload) if payload else b""
        if payload:
            book_broadcast(ctx, cohort, wire, payload)
        return wire

    def round_begins(self, round: int) -> None:
        """Start the round's clock and its record of dropped nodes."""
        self._t_round = time.perf_counter()
        self._round_drops = set()

    def phase_begins(self, index: int, run: RunState) -> None:
        """Round r-1's evaluation rode on the round's first phase: finish it before the
        second."""
        if index > 0:
            self._finish_evaluation()
        self._last_drops = {}

    def evaluate(self, round: int, run: RunState) -> float:
        """Finish the previous round's node evaluation, then start this round's (see the
        class docstring's Evaluation)."""
        self._finish_evaluation()
        return self._evaluate(round)

    def round_ends(self, round: int) -> None:
        """Record the round's wall seconds."""
        self.round_wall_s.append(time.perf_counter() - self._t_round)

    def aborted(self, exc: SecaggError) -> None:
        """Name the nodes lost on the failed session's error (an abort or a protocol error)."""
        if self._last_drops and hasattr(exc, "add_note"):  # Python >= 3.11
            exc.add_note(f"nodes lost (stage -> client -> why): {self._last_drops}")

    def close(self, run: RunState) -> None:
        """The last round's evaluation: a message of its own. Then the heads the nodes
        reported of their own ledger files go to the transcript (``node-ledger`` records:
        client, head, and the release it charged, None for the hello's), for ``secagg
        audit --node-ledger`` to reconcile (:func:`secagg.privacy.node_ledger.reconcile`)."""
        t_eval = time.perf_counter()
        self._finish_evaluation()
        if self.round_wall_s:
            self.round_wall_s[-1] += time.perf_counter() - t_eval
        run.transcript.extend(self._node_ledgers)

    # ---------------------------------------------------------------- the run

    def run(
        self, grid: Grid,
        on_aggregate: Callable[[int, str, Aggregate], None] | None = None,
    ) -> Result:
        """Run all rounds on ``grid`` and return the :class:`~secagg.result.Result`.

        Raises:
            SecureSumAborted: too few nodes stayed live (unless on_abort="skip").
            ConfigurationError: too few nodes connected, or duplicate client ids.
        """
        self._grid = grid
        self._run_tag = run_tag()  # nodes start fresh client state per run
        self._node_ledgers = []
        self._sizings = {}
        # the nodes' signed statements, closed at the end of the run (step "close")
        self.collector = Collector(run=self._run_tag, closer=self._close_nodes)
        engine = Engine(
            algorithm=self.algorithm, layer=self.layer, transport=self, rounds=self.rounds,
            fraction=self.fraction, seed=self.seed, dropouts=self.dropouts,
            on_violation=self.on_violation, on_abort=self.on_abort,
            include_values=self.include_values, max_records=self.max_records,
            on_aggregate=on_aggregate, decryptor=self.decryptor, pinned=self.pinned_keys)
        self.layer_server = engine.server
        result = engine.run()
        trusting = sorted(self._sizings.get("server", ()))
        if trusting and result.privacy is not None:
            # DistributedDP shares sized on this server's word: the guarantee says so
            result.privacy.holds_against = (*result.privacy.holds_against, (
                f"on Flower, only as far as this server follows the protocol: node(s) "
                f"{trusting} sized their noise shares for the cohort it announced (they "
                "pinned no identities and do not add their whole noise alone)"))
        return result

    def reached(self, ctx: RoundContext, stage: str) -> None:
        """The test hook ``hold``: wait in round 0 after closing its stage (see Args)."""
        if self.hold is None or self._held or self.hold[0] != stage or ctx.round != 0:
            return
        self._held = True
        d = Path(self.hold[1])
        (d / "reached").write_text(stage)
        deadline = time.monotonic() + 60.0
        while not (d / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.1)


def server_app(
    algorithm: AlgorithmLike,
    layer: Layer,
    dataset: Dataset,
    *,
    rounds: int = 10,
    fraction: float = 1.0,
    seed: int = 0,
    min_nodes: int = 1,
    stage_timeout: float = 60.0,
    result_dir: str | Path | None = None,
    on_result: Callable[[Result, FlowerFederation], None] | None = None,
    on_aggregate: Callable[[int, str, Aggregate], None] | None = None,
    **options: Any,
) -> ServerApp:
    """A Flower ServerApp that runs ``algorithm`` with ``layer`` over the connected nodes.

    Args:
        algorithm, layer, dataset, rounds, fraction, seed, min_nodes, stage_timeout: see
            :class:`FlowerFederation` (``options`` are passed on to it).
        result_dir: when given, the Result is saved there (result.json, costs.csv,
            transcript.jsonl) with ``flower_transport.json`` (Flower's bytes beside ours)
            and ``flower_timing.json`` (wall seconds per round and per stage).
        on_result: called with the Result and the runtime when the run ends.
        on_aggregate: called with (round, phase, Aggregate) after each phase.

    Raises:
        ConfigurationError: the layer does not run on Flower (checked here, before any
            node is contacted).
    """
    check_remote(layer)
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        fed = FlowerFederation(algorithm, layer, dataset, rounds=rounds, fraction=fraction,
                               seed=seed, min_nodes=min_nodes, stage_timeout=stage_timeout,
                               **options)
        result = fed.run(grid, on_aggregate=on_aggregate)
        save_result(result, fed, result_dir)
        if on_result is not None:
            on_result(result, fed)

    return app


def save_result(result: Result, fed: FlowerFederation, out: str | Path | None) -> None:
    """Save ``result`` and the transport table into ``out`` (nothing when None)."""
    if out is None:
        return
    result.save(out)
    Path(out, "flower_transport.json").write_text(
        json.dumps(fed.transport.to_dict(), indent=2) + "\n")
    Path(out, "flower_timing.json").write_text(json.dumps(
        {"round_wall_s": fed.round_wall_s, "stage_wall_s": fed.stage_wall_s}, indent=2) + "\n")


__all__: Sequence[str] = ("FlowerFederation", "check_layer", "check_phase", "save_result",
                          "send_and_receive", "server_app")
