"""The server side on Flower: the embedded engine's rounds, with the clients on SuperNodes.

:class:`FlowerFederation` runs what :class:`secagg.federation.Federation` runs -- cohort
sampling (the same :func:`~secagg.federation.sample_cohort` draws), per phase the broadcast,
the clients' steps, the layer and the server step, then evaluation -- but every client step
runs on the client's own node and every message crosses Flower's Grid. The ledger books the
same rows as the embedded engine (our wire bytes); what Flower's envelopes add is kept apart
in :attr:`FlowerFederation.transport`.

Each SecureSum session starts at its share stage: its ADVERTISE (fresh keys for its own
session id and round) travels with the previous exchange -- the ``hello`` for the run's first
session, the previous session's unmask for the others -- and its client step with its share
instruction, so a session costs four exchanges instead of five over a Flower transport where
every exchange costs seconds. A node whose unmask reply is lost has therefore not advertised
for the next session and drops out of it at ``advertise``. (When the cohort turns out other
than announced, e.g. a node missed the hello, the session advertises afresh.)

DP layers run each party's part where it belongs: CentralDP's noise is added here to the
inner layer's sums; LocalDP's by each node to its own upload before it leaves (the inner
layer carries the widened spec); DistributedDP's by each node to its encoded vector before
masking, sized from the release plan the node derives itself from the layer's parameters
(:meth:`~secagg.privacy.layers.DistributedDP.release_plan`), so the server never sees an
un-noised sum. The ledger books the events the embedded layer books, with the survivors
that actually contributed. The nodes draw from their own secret noise streams (a user seed
makes them reproducible, and the run is then reported not private).

Dropouts are real: a node that does not answer a stage within ``stage_timeout`` seconds (or
answers with an error) is dropped at that stage. SecureSum then recovers through its dropout
path (the server rebuilds a dropped client's mask key from the others' shares); every such
loss is booked as a zero-byte ledger row of stage ``"dropped:<stage>"`` from that client and
listed in the aggregate's ``notes["dropped"]``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid, ServerApp

from secagg.costs import SERVER, Ledger, he_flops, secure_sum_client_flops
from secagg.data import Dataset
from secagg.dropouts import DropoutModel
from secagg.errors import (
    ConfigurationError,
    ProtocolError,
    SecureSumAborted,
    UploadError,
)
from secagg.federation import (
    AlgorithmLike,
    Result,
    cohort_size,
    derive_seed,
    guard_phase,
    plan_privacy,
    run_spec,
    sample_cohort,
    solve,
)
from secagg.flower.records import MESSAGE_TYPE, content, flower_bytes, read
from secagg.flower.records import field as rfield
from secagg.homomorphic import Homomorphic
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.layers.plaintext import Plaintext
from secagg.messages import DEFAULT_MAX_RECORDS, ClipReport, Upload, UploadSpec
from secagg.privacy.layers import CentralDP, DistributedDP, LocalDP, relabel
from secagg.secure_sum import SecureSum
from secagg.secure_sum import wire as ss_wire
from secagg.secure_sum.graph import build
from secagg.secure_sum.server import Server
from secagg.transcript import Transcript
from secagg.wire import pack_arrays, unpack_arrays

SUPPORTED_LAYERS = (Plaintext, SecureSum, Homomorphic)
#: DP wrappers carried, each with the inner layers it may wrap over Flower
DP_LAYERS: dict[type, tuple[type, ...]] = {
    CentralDP: SUPPORTED_LAYERS, LocalDP: SUPPORTED_LAYERS, DistributedDP: (SecureSum,)}

#: where the transcript records the nodes' evaluation (phase, field)
EVALUATION_PHASE, EVALUATION_FIELD = "evaluate", "local test accuracy"

# what a reply to a client-step instruction must carry
_STEP_REPLY = (("msg", bytes), ("cpu_s", float), ("flops", float), ("clipped", str))


def check_layer(layer: Layer) -> None:
    """Refuse a layer the Flower runtime cannot carry yet (with what can be used): carried
    are Plaintext, SecureSum (without pinned identities), Homomorphic with a decryptor
    node, and CentralDP / LocalDP around any of them or DistributedDP around SecureSum."""
    inners = DP_LAYERS.get(type(layer))
    if inners is not None:
        inner = layer.inner  # type: ignore[attr-defined]
        if type(inner) not in inners:
            raise ConfigurationError(
                f"{type(layer).__name__} around {type(inner).__name__} does not run on "
                f"Flower yet: its inner layer must be one of "
                f"{[t.__name__ for t in inners]} there")
        check_layer(inner)
        return
    if type(layer) not in SUPPORTED_LAYERS:
        raise ConfigurationError(
            f"layer {getattr(layer, 'name', type(layer).__name__)!r} "
            f"({type(layer).__name__}) does not run on Flower yet: its client side would "
            "have to run on the nodes; use Plaintext, SecureSum or Homomorphic there (alone "
            "or inside CentralDP, LocalDP, or DistributedDP around SecureSum), or the "
            "embedded Federation"
        )
    if isinstance(layer, SecureSum) and layer.identities is not None:
        raise ConfigurationError(
            "SecureSum(identities=...) does not run on Flower yet: each node would need its "
            "own long-term Ed25519 key and every other node's public key pinned from outside "
            "the protocol; without identities the layer runs (honest-but-curious server model)"
        )
    if isinstance(layer, Homomorphic) and layer.key_holder != "decryptor":
        raise ConfigurationError(
            "Homomorphic(key_holder='clients') does not run on Flower: the shared secret "
            "context would have to reach the clients without passing through the server, "
            "and Flower routes every message through it; use key_holder='decryptor'"
        )


def send_and_receive(grid: Grid, messages: Sequence[Message], timeout: float,
                     poll_interval: float = 0.2) -> list[Message]:
    """Push ``messages`` and pull their replies every ``poll_interval`` seconds until all
    have come or ``timeout`` seconds have passed (Flower's own ``Grid.send_and_receive``
    pulls every 3 s on a deployment, which adds up to 3 s to every protocol stage; this
    is the same loop on the public ``push_messages``/``pull_messages`` API)."""
    pending = set(grid.push_messages(messages))
    end = time.monotonic() + timeout
    out: list[Message] = []
    while pending:
        got = list(grid.pull_messages(pending))
        out.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if not pending or time.monotonic() >= end:
            break
        time.sleep(poll_interval)
    return out


def _malformed(rec: Any, needs: Sequence[tuple[str, type]]) -> str | None:
    """Why a reply record lacks a field ``needs`` names (or has the wrong type); None if
    it has them all."""
    try:
        for name, kind in needs:
            rfield(rec, name, kind)
    except ProtocolError as exc:
        return f"malformed reply: {exc}"
    return None


def check_phase(phase: Any) -> None:
    """Refuse a phase whose spec has no fields (a "local-only" phase: clients compute and
    upload nothing, the layer is not called). The Flower runtime always asks the nodes for
    an upload through the layer's stages, so such a phase would have to become its own
    client-step exchange with no layer; it is refused here before any node is contacted for
    it, instead of running it through a layer that has nothing to carry.

    Raises:
        ConfigurationError: the phase uploads nothing.
    """
    if not phase.spec().fields:
        raise ConfigurationError(
            f"phase {phase.name!r} uploads no fields (a local-only phase); the Flower "
            "runtime does not run local-only phases yet: use the embedded Federation")


@dataclass
class _PendingEvaluation:
    """A personalized evaluation in flight: round, the evaluation state's wire bytes, the
    nodes to ask, those asked, and (accuracy, has a local test set) per node that answered."""

    round: int
    wire: bytes
    ask: list[int]
    sent: set[int] = field(default_factory=set)
    acc: dict[int, tuple[float, bool]] = field(default_factory=dict)


@dataclass
class _PreAdvertised:
    """The next secure-sum session's ADVERTISE, collected during the current session's
    unmask exchange: its (round, phase), session id, cohort, and per node either (ADVERTISE
    bytes, the node's CPU seconds) or why it has none."""

    round: int
    phase: str
    session: bytes
    cohort: tuple[int, ...]
    adverts: dict[int, tuple[bytes, float]] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)


@dataclass
class _Transport:
    """Bytes per stage: ours (secagg wire bytes) and Flower's serialized messages."""

    ours: dict[str, int] = field(default_factory=dict)
    flower: dict[str, int] = field(default_factory=dict)
    messages: dict[str, int] = field(default_factory=dict)

    def add(self, stage: str, ours: int = 0, flower: int = 0) -> None:
        """Add our wire bytes, or one Flower message (``flower`` > 0), to ``stage``."""
        self.ours[stage] = self.ours.get(stage, 0) + ours
        self.flower[stage] = self.flower.get(stage, 0) + flower
        self.messages[stage] = self.messages.get(stage, 0) + (1 if flower else 0)

    def to_dict(self) -> dict[str, Any]:
        return {s: {"messages": self.messages[s], "secagg_wire_bytes": self.ours[s],
                    "flower_message_bytes": self.flower[s]} for s in self.ours}


@dataclass
class _Release:
    """One phase's DP release over Flower, each party's part where the embedded layer runs
    it: the aggregator begins it (:meth:`begin`); under LocalDP the nodes noise their
    uploads (the inner layer carries the widened spec, the release is spent first); under
    DistributedDP they add noise shares to their encoded vectors before masking (the worst
    case is checked against the budget first, the noise actually added is spent in
    :meth:`finish_distributed`); under CentralDP the aggregator noises the inner layer's
    sums (:meth:`end`). Without a DP layer every part is a no-op.

    Attributes:
        dp: the DP layer, or None.
        spec: the phase's spec; ``carried``: the spec the inner layer carries.
        ctx: the context the inner layer records under (noised fields relabelled).
        ledger: the run's privacy ledger, from ``dp.begin``.
        node_params: JSON the nodes rebuild their noise side from (None: they add none).
        sigmas: LocalDP's noise per field; ``plan``: DistributedDP's release plan.
    """

    dp: Any
    spec: UploadSpec
    carried: UploadSpec
    ctx: RoundContext
    ledger: Any = None
    node_params: str | None = None
    sigmas: dict[str, float] = field(default_factory=dict)
    plan: Any = None

    @classmethod
    def begin(cls, dp: Any, spec: UploadSpec, ctx: RoundContext, n: int) -> _Release:
        """Begin the release of ``spec`` by a cohort of ``n`` under ``dp`` (or no DP)."""
        rel = cls(dp, spec, spec, ctx)
        if dp is None:
            return rel
        rel.ledger = dp.begin(spec, ctx)
        noised: list[str] = []
        if isinstance(dp, LocalDP):
            rel.sigmas, rel.carried = dp.noise_plan(spec)
            noised = list(rel.sigmas)
            if noised:
                dp.spend(rel.ledger, rel.sigmas, ctx)
                rel.node_params = json.dumps(dp.node_params())
        elif isinstance(dp, DistributedDP):
            rel.plan = dp.release_plan(spec, n)
            rel.ledger.check(*rel.plan.planned)  # the worst case fits, before any noise
            noised = [f.name for f in rel.plan.noised]
            if noised:
                rel.node_params = json.dumps(dp.node_params(rel.plan.z))
        if noised:
            dp.mark_seeded(rel.ledger, noised)
            rel.ctx = relabel(ctx, noised)
        return rel

    def finish_distributed(self, ring_sum: np.ndarray, contributors: Sequence[int],
                           ctx: RoundContext) -> Aggregate:
        """DistributedDP: account the contributors' noise, decode the noised sums."""
        return self.dp.finish(self.plan, self.spec, ring_sum, contributors, ctx, self.ledger,
                              self.dp.seed is None)

    def end(self, agg: Aggregate, spec: UploadSpec, ctx: RoundContext) -> Aggregate:
        """The aggregator's side after the inner layer: CentralDP noises the sums; LocalDP
        notes the noise the sum carries."""
        if isinstance(self.dp, CentralDP):
            return self.dp.release(agg, spec, ctx, self.ledger)
        if isinstance(self.dp, LocalDP) and self.sigmas:
            agg.notes["dp"] = self.dp.release_notes(spec, self.sigmas, self.dp.seed is None,
                                                    len(agg.contributors))
        return agg


class FlowerFederation:
    """Run ``algorithm`` with ``layer`` over the SuperNodes a Flower Grid reaches.

    Args:
        algorithm: the algorithm (server side; the nodes run their own copies).
        layer: :class:`~secagg.layers.plaintext.Plaintext`,
            :class:`~secagg.secure_sum.SecureSum`, :class:`~secagg.homomorphic.Homomorphic`
            with ``key_holder="decryptor"``, or CentralDP / LocalDP around one of them, or
            DistributedDP around SecureSum (others raise ConfigurationError, see
            :func:`check_layer`). A DP layer's run has a privacy ledger
            (``Result.privacy``), planned and checked before any node is contacted; its
            noise is added where the embedded layer adds it (module docstring).
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
        decryptor: int | None = None,
        poll_interval: float = 0.2,
        node_evaluation: bool | None = None,
        step_timeout: float | None = None,
        max_records: int | None = None,
    ) -> None:
        check_layer(layer)
        if node_evaluation is None:  # off under DP: the accuracies are un-noised releases
            node_evaluation = type(layer) not in DP_LAYERS
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
        #: the DP wrapper (CentralDP, LocalDP or DistributedDP), or None
        self.dp: CentralDP | LocalDP | DistributedDP | None = (
            layer if type(layer) in DP_LAYERS else None)  # type: ignore[assignment]
        #: the layer that carries the uploads (the DP wrapper's inner layer, or the layer)
        self.carrier: Layer = layer.inner if self.dp is not None else layer  # type: ignore
        self.rounds, self.fraction, self.seed = rounds, fraction, seed
        self.on_violation, self.on_abort = on_violation, on_abort
        self.include_values = include_values
        self.min_nodes, self.connect_timeout = min_nodes, connect_timeout
        self.stage_timeout, self.poll_interval = stage_timeout, poll_interval
        self.step_timeout = step_timeout
        self.hold = hold
        self.dropouts = DropoutModel(0.0, seed).for_stages(layer.dropout_stages())
        self.transport = _Transport()
        self.nodes: dict[int, int] = {}  # client id -> Flower node id
        self.max_records = max_records
        self._held = False
        self._run_tag = ""
        self._last_drops: dict[str, dict[int, str]] = {}
        self._round_drops: set[int] = set()  # clients dropped in the current round
        self._eval: _PendingEvaluation | None = None
        self._transcript: Transcript | None = None  # the running run's (evaluation records)
        self._privacy: Any | None = None
        self._pre: _PreAdvertised | None = None
        #: wall seconds of each round (its phases and, if any, the nodes' evaluation)
        self.round_wall_s: list[float] = []
        #: wall seconds spent waiting for each stage's replies, summed over the run
        self.stage_wall_s: dict[str, float] = {}
        self.decryptor = decryptor
        self._he_keys: dict[str, tuple[bytes, Any, set[int], set[int]]] = {}
        self._he_decryptions: dict[str, int] = {}  # CKKS: decryptions of the current key

    # ---------------------------------------------------------------- transport

    def _exchange(
        self, grid: Grid, stage: str, ctx: RoundContext | None,
        payloads: Mapping[int, RecordDict], timeout: float | None = None,
        needs: Sequence[tuple[str, type]] = (("msg", bytes), ("cpu_s", float)),
        tag: str | None = None,
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Send one message per client, wait for the replies; returns (client -> reply
        record, client -> why it failed) for every addressed client that did not answer,
        answered with an error, or answered without the fields ``needs`` names (a
        malformed reply counts as that client dropping, never as a crash)."""
        if tag is None:
            tag = "hello" if ctx is None else f"{ctx.round}/{ctx.phase}/{stage}"
        msgs = []
        for c, rd in payloads.items():
            m = Message(rd, dst_node_id=self.nodes[c], message_type=MESSAGE_TYPE, group_id=tag)
            self.transport.add(stage, flower=flower_bytes(m))
            msgs.append(m)
        by_node = {n: c for c, n in self.nodes.items()}
        got: dict[int, Any] = {}
        failed: dict[int, str] = {}
        t0 = time.perf_counter()
        for rep in send_and_receive(grid, msgs, timeout or self.stage_timeout,
                                    self.poll_interval):
            c = by_node.get(rep.metadata.src_node_id)
            if c is None or c not in payloads:
                continue
            if rep.has_error():
                failed[c] = f"error reply: {rep.error.reason}"
                continue
            try:
                rec = read(rep)
                bad = _malformed(rec, needs)
                if bad is None and "clipped" in rec:
                    clipped = json.loads(rfield(rec, "clipped", str))
                    if not isinstance(clipped, dict) or not all(
                            isinstance(v, int) for v in clipped.values()):
                        bad = "malformed reply: 'clipped' is not a JSON object of counts"
            except (ProtocolError, ValueError) as exc:
                bad = f"malformed reply: {exc}"
            if bad is not None:
                failed[c] = bad
                continue
            got[c] = rec
            self.transport.add(stage, flower=flower_bytes(rep))
        for c in payloads:
            if c not in got and c not in failed:
                failed[c] = f"no reply within {timeout or self.stage_timeout:g} s"
        self.stage_wall_s[stage] = self.stage_wall_s.get(stage, 0.0) + (
            time.perf_counter() - t0)
        return got, failed

    def _book_drops(self, ctx: RoundContext, stage: str, failed: Mapping[int, str],
                    dropped: dict[str, dict[int, str]]) -> None:
        for c, why in sorted(failed.items()):
            self._round_drops.add(c)
            ctx.message(c, SERVER, f"dropped:{stage}", 0)
            dropped.setdefault(stage, {})[c] = why
        self._last_drops = dropped

    def _ss_params(self) -> str:
        """What a node needs to rebuild the SecureSum layer, as JSON (its identity keys, if
        any, never travel)."""
        return json.dumps({k: getattr(self.carrier, k) for k in ("threshold", "graph", "k",
                                                                "precision", "ring_bits")})

    def _connect(self, grid: Grid, ahead: _PreAdvertised | None = None) -> int:
        """Wait for ``min_nodes`` SuperNodes and ask each for its client id (``hello``; a
        node's record count is private and never asked for). With ``ahead`` (SecureSum),
        the hello also asks every node to advertise for the first session, sized for the
        cohort that as many nodes give; the ADVERTISEs are kept in ``ahead.adverts``.
        Returns that cohort size."""
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
        n = cohort_size(len(ids), self.fraction)
        fields: dict[str, Any] = {"run": self._run_tag}
        if ahead is not None:
            fields.update(next_session=ahead.session, next_round=ahead.round, next_n=n,
                          next_layer=self._ss_params())
        msgs = [Message(content(step="hello", **fields), dst_node_id=node,
                        message_type=MESSAGE_TYPE, group_id="hello") for node in ids]
        for m in msgs:
            self.transport.add("hello", flower=flower_bytes(m))
        errors = []
        for rep in send_and_receive(grid, msgs, self.connect_timeout, self.poll_interval):
            if rep.has_error():
                errors.append(rep.error.reason)
                continue
            self.transport.add("hello", flower=flower_bytes(rep))
            rec = read(rep)
            cid = rfield(rec, "cid", int)
            if cid in self.nodes:
                raise ConfigurationError(
                    f"two SuperNodes report client id {cid}; give each node its own partition"
                )
            self.nodes[cid] = int(rep.metadata.src_node_id)
            if ahead is not None:
                if (bad := _malformed(rec, (("next_msg", bytes),
                                            ("next_cpu_s", float)))) is not None:
                    ahead.failed[cid] = bad
                else:
                    ahead.adverts[cid] = (rfield(rec, "next_msg", bytes),
                                          rfield(rec, "next_cpu_s", float))
        if len(self.nodes) < self.min_nodes:
            raise ConfigurationError(
                f"only {len(self.nodes)} of min_nodes={self.min_nodes} SuperNodes answered "
                f"within {self.connect_timeout:g} s"
                + (f" (first error reply: {errors[0]})" if errors else "")
            )
        return n

    # ---------------------------------------------------------------- the run

    def run(
        self, grid: Grid,
        on_aggregate: Callable[[int, str, Aggregate], None] | None = None,
    ) -> Result:
        """Run all rounds on ``grid`` and return the :class:`~secagg.federation.Result`.

        Raises:
            SecureSumAborted: too few nodes stayed live (unless on_abort="skip").
            ConfigurationError: too few nodes connected, or duplicate client ids.
        """
        t_start = time.perf_counter()
        self._run_tag = secrets.token_hex(8)  # nodes start fresh client state per run
        self.algorithm.setup(self.dataset, [], self.seed)
        # before any node is contacted: noise calibrated for the run's releases, DP
        # sensitivities checked against what the clients train, the run's privacy ledger
        privacy = plan_privacy(self.algorithm, self.layer, self.rounds,
                               self.max_records is not None)
        # SecureSum: the first session's ADVERTISE rides on the hello
        first = (list(self.algorithm.phases(0, self.rounds))[:1]
                 if isinstance(self.carrier, SecureSum) else [])
        ahead = (_PreAdvertised(0, first[0].name, secrets.token_bytes(ss_wire.SESSION_BYTES),
                                ()) if first else None)
        announced = self._connect(grid, ahead)
        ledger, transcript = Ledger(), Transcript(self.include_values)
        self._transcript, self._privacy = transcript, privacy
        cids = sorted(self.nodes)
        # public, never derived from the nodes' data (issue 10's rule for the embedded engine)
        max_records = DEFAULT_MAX_RECORDS if self.max_records is None else self.max_records
        transcript.meta(
            algorithm=self.algorithm.describe(), layer=self.layer.describe(), seed=self.seed,
            rounds=self.rounds, clients=len(cids), fraction=self.fraction, runtime="flower",
        )
        rng = np.random.default_rng(derive_seed(self.seed, "cohort"))
        cohorts: list[list[int]] = []

        def cohort_of(r: int) -> list[int]:
            """Round r's cohort: the embedded engine's draws, in round order, each once (a
            round's cohort is drawn early when the previous round pre-advertises to it)."""
            while len(cohorts) <= r:
                cohorts.append([cids[i] for i in sample_cohort(rng, len(cids), self.fraction)])
            return cohorts[r]

        history: list[float] = []
        clips = ClipReport()
        self._measurements: list[dict[str, Any]] = []
        aborted: list[tuple[int, str, str]] = []
        participation: list[tuple[int, str, int, int]] = []
        checked: set[str] = set()
        self._pre = None
        if ahead is not None and len(cohort_of(0)) == announced:  # else: advertise afresh
            ahead.cohort = tuple(cohort_of(0))
            ahead.failed = {c: why for c, why in ahead.failed.items() if c in ahead.cohort}
            ahead.adverts = {c: a for c, a in ahead.adverts.items() if c in ahead.cohort}
            self._pre = ahead
        for r in range(self.rounds):
            t_round = time.perf_counter()
            cohort = cohort_of(r)
            stopped = False
            self._round_drops = set()
            phases = list(self.algorithm.phases(r, self.rounds))
            for i, phase in enumerate(phases):
                if i > 0:  # round r-1's evaluation rode on this round's first phase
                    self._finish_evaluation(grid, history)
                check_phase(phase)
                spec = run_spec(phase, self.layer, max_records, checked)
                ctx = RoundContext(r, phase.name, derive_seed(self.seed, r, phase.name),
                                   ledger, transcript, self.dropouts, privacy)
                if privacy is not None:  # fields the layer releases without DP noise
                    for name, why in self.layer.unnoised_fields(spec).items():
                        privacy.mark_unnoised(name, phase.name, why)
                # the session after this one, whose ADVERTISE rides on this one's unmask
                if i + 1 < len(phases):
                    nxt: tuple[int, str, list[int]] | None = (r, phases[i + 1].name, cohort)
                elif r + 1 < self.rounds:
                    first = list(self.algorithm.phases(r + 1, self.rounds))[:1]
                    nxt = (r + 1, first[0].name, cohort_of(r + 1)) if first else None
                else:
                    nxt = None
                step = partial(self._guarded_phase, grid, phase, spec, cohort, max_records,
                               ctx, clips, nxt, on_aggregate)
                if not guard_phase(step, r, phase.name, len(cohort), self.on_abort, aborted,
                                   participation):
                    stopped = True
                    break
            self._finish_evaluation(grid, history)
            history.append(self._evaluate(r))
            self.round_wall_s.append(time.perf_counter() - t_round)
            if stopped:
                break
        t_eval = time.perf_counter()
        self._finish_evaluation(grid, history)  # the last round's: a message of its own
        if self.round_wall_s:
            self.round_wall_s[-1] += time.perf_counter() - t_eval
        if privacy is not None:
            privacy.record_in(transcript)
        kind = ("mean local test" if getattr(self.algorithm, "personalized", False)
                else "global test")
        return Result(
            algorithm=self.algorithm.describe(), layer=self.layer.describe(),
            rounds=len(history), seed=self.seed, accuracy=history[-1], accuracy_kind=kind,
            history=history, costs=ledger, transcript=transcript, privacy=privacy,
            clips=dict(clips.counts), aborted=aborted, participation=participation,
            measurements=self._measurements, n_clients=len(cids),
            wall_s=time.perf_counter() - t_start,
        )

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
        self.transport.add("evaluate", ours=len(ev.wire))
        return {"evaluate": True, "eval_state": ev.wire}

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
                    ev.acc[c] = (rfield(rec, "acc", float), rfield(rec, "has_test", bool))
                except ProtocolError:
                    continue

    def _finish_evaluation(self, grid: Grid, history: list[float]) -> None:
        """Ask the nodes not yet asked (not in this round's cohort, or after the last
        round) in an ``evaluate`` message of their own, then set the pending round's
        accuracy: the mean over the nodes that answered and have a local test set."""
        ev, self._eval = self._eval, None
        if ev is None:
            return
        rest = [c for c in ev.ask if c not in ev.sent]
        if rest:
            payloads = {c: content(step="evaluate", run=self._run_tag, seed=self.seed,
                                   state=ev.wire) for c in rest}
            self.transport.add("evaluate", ours=len(ev.wire) * len(rest))
            got, _ = self._exchange(
                grid, "evaluate", None, payloads, timeout=self.step_timeout,
                needs=(("acc", float), ("has_test", bool), ("cpu_s", float)),
                tag=f"{ev.round}/evaluate")
            ev.sent.update(rest)
            self._collect_evaluation(got, ev)
        self._disclose(ev)
        accs = [ev.acc[c][0] for c in sorted(ev.acc) if ev.acc[c][1]]
        # as the personalized evaluate's mean over clients with a local test set
        history[ev.round] = float(np.mean(accs)) if accs else float("nan")

    def _disclose(self, ev: _PendingEvaluation) -> None:
        """What the nodes' evaluation showed the server, on the record: each node's
        (accuracy, has a local test set) as a clear observation in the transcript, and,
        under a DP layer, the field marked released without DP noise in the ledger."""
        if self._transcript is None or not ev.acc:
            return
        for c in sorted(ev.acc):
            self._transcript.observe(
                round=ev.round, phase=EVALUATION_PHASE, stage="evaluate", party=SERVER,
                sender=c, field=EVALUATION_FIELD, form="clear",
                value=np.array(ev.acc[c], dtype=np.float64))
        if self._privacy is not None:
            self._privacy.mark_unnoised(
                EVALUATION_FIELD, EVALUATION_PHASE,
                "node evaluation: each node sent the server its local test accuracy, of a "
                "model trained on its records, in the clear (FlowerFederation("
                "node_evaluation=False) keeps it on the nodes)")

    def _guarded_phase(
        self, grid: Grid, phase: Any, spec: UploadSpec, cohort: list[int], max_records: int,
        ctx: RoundContext, clips: ClipReport, nxt: tuple[int, str, list[int]] | None,
        on_aggregate: Callable[[int, str, Aggregate], None] | None,
    ) -> int:
        """Run one phase (for :func:`~secagg.federation.guard_phase`): an aborted secure sum
        carries a note of the nodes lost; returns how many uploads the aggregate holds."""
        try:
            agg = self._run_phase(grid, phase, spec, cohort, max_records, ctx, clips, nxt)
        except SecureSumAborted as exc:
            if self._last_drops and hasattr(exc, "add_note"):  # Python >= 3.11
                exc.add_note(f"nodes lost (stage -> client -> why): {self._last_drops}")
            raise
        if on_aggregate is not None:
            on_aggregate(ctx.round, phase.name, agg)
        return len(agg.contributors)

    def _run_phase(
        self, grid: Grid, phase: Any, spec: UploadSpec, cohort: list[int], max_records: int,
        ctx: RoundContext, clips: ClipReport, nxt: tuple[int, str, list[int]] | None = None,
    ) -> Aggregate:
        self._last_drops = {}
        payload = phase.broadcast()
        wire = pack_arrays(payload) if payload else b""
        if payload:
            plain = int(sum(np.asarray(v).nbytes for v in payload.values()))
            for c in cohort:
                ctx.message(SERVER, c, "broadcast", len(wire), plaintext_bytes=plain,
                            fields={k: int(np.asarray(v).nbytes) for k, v in payload.items()})
        carrier = self.carrier
        if payload and not isinstance(carrier, SecureSum):  # it rides in the upload
            self.transport.add("upload", ours=len(wire) * len(cohort))
        rel = _Release.begin(self.dp, spec, ctx, len(cohort))
        common = dict(run=self._run_tag, round=ctx.round, rounds=self.rounds, phase=phase.name,
                      seed=self.seed, max_records=max_records, on_violation=self.on_violation,
                      broadcast=wire, dp=rel.node_params)
        if isinstance(carrier, SecureSum):
            agg = self._secure_sum_phase(grid, cohort, common, ctx, clips, nxt, rel)
        elif isinstance(carrier, Homomorphic):
            agg = self._homomorphic(grid, rel.carried, cohort, common, rel.ctx, clips)
        else:
            agg = self._plaintext(grid, rel.carried, cohort, common, rel.ctx, clips)
        agg = rel.end(agg, spec, ctx)
        solve(phase, agg, ctx, self._measurements, len(cohort))
        return agg

    def _secure_sum_phase(self, grid: Grid, cohort: list[int], common: dict,
                          ctx: RoundContext, clips: ClipReport,
                          nxt: tuple[int, str, list[int]] | None, rel: _Release) -> Aggregate:
        """One SecureSum session and its decoding: the layer's fixed-point plan, or, under
        DistributedDP, the release plan (noised vectors; the DP layer decodes and accounts
        the noise the contributors actually added)."""
        layer: SecureSum = self.carrier  # type: ignore[assignment]
        if rel.plan is None:
            plans, bits, segments, fields = layer.layout(rel.carried, len(cohort))
        else:
            plans, bits, segments = {}, rel.plan.ring_bits, rel.plan.segments
            fields = {f.name: f.nbytes for f in rel.plan.additive}
        total, contributors, notes = self._secure_sum(
            grid, cohort, common, rel.ctx, clips, nxt, bits, segments, fields)
        if rel.plan is not None:
            agg = rel.finish_distributed(total, contributors, ctx)
            agg.notes.update(notes)
            return agg
        sums = {f.name: plans[f.name].decode_sum(total[segments[f.name]]).reshape(f.shape)
                for f in rel.carried.additive}
        notes["secure_sum"]["scale_bits"] = {n: p.scale_bits for n, p in plans.items()}
        return Aggregate(ctx.phase, ctx.round, sums, {}, contributors, notes)

    def _plaintext(self, grid: Grid, spec: UploadSpec, cohort: list[int], common: dict,
                   ctx: RoundContext, clips: ClipReport) -> Aggregate:
        got, failed = self._exchange(
            grid, "upload", ctx, {c: content(step="upload", **common,
                                             **self._evaluation_fields(c)) for c in cohort},
            needs=_STEP_REPLY, timeout=self.step_timeout)
        self._collect_evaluation(got)
        dropped: dict[str, dict[int, str]] = {}
        self._book_drops(ctx, "upload", failed, dropped)
        uploads: dict[int, Upload] = {}
        for c, rec in sorted(got.items()):
            raw = rfield(rec, "msg", bytes)
            self.transport.add("upload", ours=len(raw))
            # the server re-checks what arrived against the spec (a node may be hostile)
            # with the public per-client bound (the spec's max_records records: a node's own
            # count is private); an upload that breaks it is refused, its client dropped
            try:
                up = Upload.validate(spec, unpack_arrays(raw), c, int(spec.max_records or 1),
                                     "raise")
            except (ProtocolError, UploadError) as exc:
                self._book_drops(ctx, "upload", {c: f"refused: {exc}"}, dropped)
                continue
            up.cpu_s, up.flops = rfield(rec, "cpu_s", float), rfield(rec, "flops", float)
            up.clipped = json.loads(rfield(rec, "clipped", str))
            clips.add(up)
            uploads[c] = up
        agg = self.carrier.aggregate(uploads, spec, ctx)
        agg.notes["dropped"] = dropped
        return agg

    def _maybe_hold(self, ctx: RoundContext, stage: str) -> None:
        if self.hold is None or self._held or self.hold[0] != stage or ctx.round != 0:
            return
        self._held = True
        d = Path(self.hold[1])
        (d / "reached").write_text(stage)
        deadline = time.monotonic() + 60.0
        while not (d / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _secure_sum(self, grid: Grid, cohort: list[int], common: dict, ctx: RoundContext,
                    clips: ClipReport, nxt: tuple[int, str, list[int]] | None, bits: int,
                    segments: Mapping[str, slice], fields: Mapping[str, int],
                    ) -> tuple[np.ndarray, tuple[int, ...], dict[str, Any]]:
        """One SecureSum session over Flower: five exchanges, or four when the previous
        session's unmask exchange carried this one's ADVERTISE (``nxt`` names the session
        after this one, to advertise for in stage 5); the client step then rides on the
        share instruction instead of the advertise one. The nodes' vectors are ``bits``-bit
        ring elements, one slice per field (``segments``; ``fields``: plaintext bytes per
        field). Returns (the ring sum, the contributors, the aggregate's notes)."""
        layer: SecureSum = self.carrier  # type: ignore[assignment]
        off = sum(sl.stop - sl.start for sl in segments.values())
        g = build(cohort, layer.threshold, layer.graph, layer.k, None)
        params = self._ss_params()
        dropped: dict[str, dict[int, str]] = {}
        word = (bits + 7) // 8
        wire = common.get("broadcast", b"")
        pre, self._pre = self._pre, None
        if pre is not None and (pre.round, pre.phase, pre.cohort) != (
                ctx.round, ctx.phase, tuple(cohort)):
            pre = None  # not this session's (the nodes' parties are replaced below)

        def to_server(u: int, stage: str, msg: bytes, handler: Callable[[bytes], Any],
                      cpu: float, **row: Any) -> Any:
            t0 = time.process_time()
            try:
                out = handler(msg)
            except ProtocolError as exc:
                dropped.setdefault(stage, {})[u] = f"refused: {exc}"
                out = None
            ctx.message(u, SERVER, stage, msg, client_cpu_s=cpu,
                        server_cpu_s=time.process_time() - t0, **row)
            self.transport.add(stage, ours=len(msg))
            return out

        def deliver(stage: str, got: Mapping[int, Any], handler: Callable[[bytes], Any],
                    flops: Callable[[int], float] = lambda u: 0.0) -> None:
            """Hand each reply's protocol message to the server, booked as it arrives."""
            for u, rec in got.items():
                to_server(u, stage, rfield(rec, "msg", bytes), handler,
                          rfield(rec, "cpu_s", float), flops=flops(u))

        def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
            t0 = time.process_time()
            return fn(), time.process_time() - t0

        def book_out(stage: str, inbox: Mapping[int, bytes], close_s: float) -> None:
            share = close_s / max(len(inbox), 1)
            for v, m in inbox.items():
                ctx.message(SERVER, v, stage, m, server_cpu_s=share)
                self.transport.add(stage, ours=len(m))

        def survive(stage: str, got: Mapping[int, Any], failed: dict[int, str]
                    ) -> dict[int, Any]:
            live = set(ctx.dropouts.survivors(stage, sorted(got)))
            failed.update({c: "injected dropout" for c in got if c not in live})
            self._book_drops(ctx, stage, failed, dropped)
            return {c: got[c] for c in sorted(live)}

        def round_trip(stage: str, inbox: Mapping[int, bytes], close_s: float,
                       needs: Sequence[tuple[str, type]] = (("msg", bytes), ("cpu_s", float)),
                       timeout: float | None = None,
                       per_node: Callable[[int], dict[str, Any]] = lambda v: {},
                       ) -> dict[int, Any]:
            book_out(stage, inbox, close_s)
            got, failed = self._exchange(
                grid, stage, ctx, {v: content(**{"run": self._run_tag, **per_node(v),
                                                 "step": stage, "msg": m})
                                   for v, m in inbox.items()}, needs=needs, timeout=timeout)
            return survive(stage, got, failed)

        def stepped(u: int, rec: Any, cpu_field: str) -> None:
            """Keep a client step's costs (booked with its masked input) and clip counts."""
            costs[u] = (rfield(rec, cpu_field, float), rfield(rec, "flops", float))
            clips.counts.update({k: clips.counts.get(k, 0) + v
                                 for k, v in json.loads(rfield(rec, "clipped", str)).items()})

        # stage 1: ADVERTISE -- with the client step and encoding in one message, or
        # already collected during the previous session's unmask exchange
        costs: dict[int, tuple[float, float]] = {}
        if pre is None:
            session = secrets.token_bytes(ss_wire.SESSION_BYTES)
            if wire:
                self.transport.add("advertise", ours=len(wire) * len(cohort))
            got, failed = self._exchange(grid, "advertise", ctx, {
                c: content(step="advertise", session=session, n=len(cohort), layer=params,
                           **common, **self._evaluation_fields(c))
                for c in cohort},
                needs=_STEP_REPLY, timeout=self.step_timeout)
            self._collect_evaluation(got)
            got = survive("advertise", got, failed)
            for u, rec in got.items():
                stepped(u, rec, "cpu_s")
            adverts = {u: (rfield(rec, "msg", bytes), 0.0) for u, rec in got.items()}
        else:
            session = pre.session
            adverts = survive("advertise", pre.adverts, dict(pre.failed))
        server = Server(session, ctx.round, g, bits, off)
        for u, (msg, cpu) in adverts.items():
            to_server(u, "advertise", msg, server.receive_advertise, cpu,
                      flops=secure_sum_client_flops("advertise", len(g.neighbours[u])))
        rosters, dt = timed(server.close_advertise)
        self._maybe_hold(ctx, "advertise")

        # stage 2: share keys (with the client step when ADVERTISE came early)
        def share_flops(u: int) -> float:
            return secure_sum_client_flops("share", len(g.neighbours[u]), g.share_threshold)

        if pre is None:
            deliver("share", round_trip("share", rosters, dt), server.receive_shares,
                    share_flops)
        else:
            if wire:
                self.transport.add("share", ours=len(wire) * len(rosters))
            got = round_trip(
                "share", rosters, dt, needs=(*_STEP_REPLY, ("step_cpu_s", float)),
                timeout=self.step_timeout,
                per_node=lambda v: dict(with_step=True, n=len(cohort), layer=params, **common,
                                        **self._evaluation_fields(v)))
            self._collect_evaluation(got)
            for u, rec in got.items():
                stepped(u, rec, "step_cpu_s")
            deliver("share", got, server.receive_shares, share_flops)
        forwards, dt = timed(server.close_shares)
        self._maybe_hold(ctx, "share")

        # stage 3: ACK, then the masked vector (one Flower message carries both)
        got = round_trip("masked-input", forwards, dt,
                         needs=(("msg", bytes), ("cpu_s", float), ("ack", bytes),
                                ("ack_cpu_s", float)))
        acked = [u for u, rec in got.items()
                 if to_server(u, "masked-input", rfield(rec, "ack", bytes), server.receive_ack,
                              rfield(rec, "ack_cpu_s", float),
                              flops=secure_sum_client_flops("ack", len(g.neighbours[u])))
                 is not None]
        for u in acked:
            rec = got[u]
            extra_cpu, flops = costs.get(u, (0.0, 0.0))
            res = to_server(u, "masked-input", rfield(rec, "msg", bytes), server.receive_masked,
                            rfield(rec, "cpu_s", float) + extra_cpu,
                            plaintext_bytes=sum(fields.values()), fields=dict(fields),
                            flops=flops + secure_sum_client_flops(
                                "masked", len(g.neighbours[u]), vector_bytes=off * word,
                                word_bytes=word))
            if res is not None:
                for name, sl in segments.items():
                    part = res[1][sl]
                    ctx.observe(SERVER, u, "masked-input", name, "masked", part,
                                nbytes=int(part.size) * word)
        survivors, dt = timed(server.close_masked)
        self._maybe_hold(ctx, "masked-input")

        # stage 4: consistency check (each survivor signs the survivor set it was shown;
        # Bonawitz et al.'s active-security round, as the embedded engine runs it)
        deliver("consistency", round_trip("consistency", survivors, dt),
                server.receive_signature)
        requests, dt = timed(server.close_consistency)
        self._maybe_hold(ctx, "consistency")

        # stage 5: unmasking, with the next session's ADVERTISE in the same exchange (a node
        # of the next cohort that is not asked to unmask gets an instruction of its own,
        # sent alongside): the next session then starts at its share stage
        book_out("unmask", requests, dt)
        ahead = None if nxt is None else _PreAdvertised(
            nxt[0], nxt[1], secrets.token_bytes(ss_wire.SESSION_BYTES), tuple(nxt[2]))
        payloads = {v: content(step="unmask", msg=m, run=self._run_tag)
                    for v, m in requests.items()}
        if ahead is not None:
            nf = dict(next_session=ahead.session, next_round=ahead.round,
                      next_n=len(ahead.cohort), next_layer=params, run=self._run_tag)
            for v in ahead.cohort:
                payloads[v] = (content(step="unmask", msg=requests[v], **nf) if v in requests
                               else content(step="advertise-next", **nf))
        got, failed = self._exchange(grid, "unmask", ctx, payloads, needs=())
        mine = {v: rec for v, rec in got.items() if v in requests}
        why = {v: w for v, w in failed.items() if v in requests}
        for v in list(mine):
            if (bad := _malformed(mine[v], (("msg", bytes), ("cpu_s", float)))) is not None:
                why[v] = bad
                del mine[v]
        deliver("unmask", survive("unmask", mine, why), server.receive_unmask)
        if ahead is not None:
            for v in ahead.cohort:
                if v not in got:
                    ahead.failed[v] = failed.get(v, "no reply")
                elif (bad := _malformed(got[v], (("next_msg", bytes),
                                                 ("next_cpu_s", float)))) is not None:
                    ahead.failed[v] = bad
                else:
                    ahead.adverts[v] = (rfield(got[v], "next_msg", bytes),
                                        rfield(got[v], "next_cpu_s", float))
            self._pre = ahead
        (total, contributors), _ = timed(server.finish)
        for name, sl in segments.items():
            part = total[sl]
            ctx.observe(SERVER, SERVER, "unmask", name, "clear", part, what="sum",
                        nbytes=int(part.size) * word)
        notes = {"secure_sum": {
            "ring_bits": bits, "graph": g.kind, "k": g.k, "threshold": g.threshold,
            "share_threshold": g.share_threshold, "live": dict(server.live),
            "excluded": sorted(server.excluded), "recovered": sorted(server.dropped),
            "refused": dict(server.refused), "server_model": "honest-but-curious",
        }, "dropped": dropped}
        return total, tuple(contributors), notes


    def _homomorphic(self, grid: Grid, spec: UploadSpec, cohort: list[int], common: dict,
                     ctx: RoundContext, clips: ClipReport) -> Aggregate:
        """Keys from the decryptor node (once per parameter set), encrypted uploads from
        the clients, the sum of ciphertexts here (public context only), the clear sum from
        the decryptor."""
        import dataclasses

        from secagg.homomorphic.keys import Aggregator
        from secagg.homomorphic.layer import DECRYPTOR, decode_sums
        from secagg.homomorphic.packing import Packing
        from secagg.transcript import digest

        layer: Homomorphic = self.carrier  # type: ignore[assignment]
        layer.check(spec)
        n_plan = layer.planned_clients(len(cohort))
        params = layer.params_for(spec, n_plan)
        fps = layer.fixed_point(spec, n_plan) if layer.scheme == "bfv" else None
        pjson = json.dumps(dataclasses.asdict(params))
        dec = self.decryptor if self.decryptor is not None else min(self.nodes)
        if dec not in self.nodes:
            raise ConfigurationError(f"decryptor client {dec} is not connected")
        packing = Packing.from_spec(spec, params.slots)
        if params.scheme == "ckks":
            # a CKKS key answers at most max_decryptions ciphertext decryptions (the flooding
            # is sized for them): past that, new keys, generated and provisioned like the first
            if packing.n_ciphertexts > params.max_decryptions:
                raise ConfigurationError(
                    f"one CKKS sum is {packing.n_ciphertexts} ciphertexts, more than "
                    f"max_decryptions={params.max_decryptions} decryptions per key")
            used = self._he_decryptions.get(pjson, 0)
            if pjson in self._he_keys and \
                    used + packing.n_ciphertexts > params.max_decryptions:
                del self._he_keys[pjson]
        keys = self._he_keys.get(pjson)
        if keys is None:
            self._he_decryptions[pjson] = 0
            got, failed = self._exchange(grid, "keys", ctx, {dec: content(
                step="he-keygen", params=pjson, run=self._run_tag)})
            if dec not in got:
                raise SecureSumAborted("keys", 0, 1)
            pub = rfield(got[dec], "msg", bytes)
            agg = Aggregator(params.scheme, pub)  # refuses a context with a secret key
            ctx.message(DECRYPTOR, SERVER, "keys", len(pub),
                        client_cpu_s=rfield(got[dec], "cpu_s", float))
            self.transport.add("keys", ours=len(pub))
            keys = self._he_keys[pjson] = (pub, agg, set(), set())
        pub, agg, provisioned, sent = keys
        agg.assert_public()
        for c in cohort:
            if c not in provisioned:
                ctx.message(DECRYPTOR, c, "keys", wire_bytes=len(pub))
                provisioned.add(c)
        desc = {k: getattr(layer, k) for k in
                ("scheme", "poly_modulus_degree", "key_holder", "precision", "max_clients",
                 "max_decryptions", "flood_security_bits")}
        got, failed = self._exchange(grid, "upload", ctx, {c: content(
            step="he-upload", layer=json.dumps(desc), n_plan=n_plan, params=pjson,
            context=None if c in sent else pub, **common, **self._evaluation_fields(c))
            for c in cohort},
            needs=(("cpu_s", float), ("flops", float), ("clipped", str), ("enc_cpu_s", float)),
            timeout=self.step_timeout)
        self._collect_evaluation(got)
        self.transport.add("upload", ours=len(pub) * len(set(cohort) - sent))
        sent.update(got)  # a node keeps the public context for the rest of the run
        live = set(ctx.dropouts.survivors("upload", sorted(got)))
        failed.update({c: "injected dropout" for c in got if c not in live})
        dropped: dict[str, dict[int, str]] = {}
        self._book_drops(ctx, "upload", failed, dropped)
        notes: dict[str, Any] = {
            "he_params": params.as_dict(), "key_holder": layer.key_holder,
            "decryptor_client": dec, "ciphertexts_per_upload": packing.n_ciphertexts,
            "slot_utilisation": packing.utilisation, "dropped": dropped,
        }
        sums = {f.name: np.zeros(f.shape, dtype=np.int64 if f.is_integer else np.float64)
                for f in spec.additive}
        agg.start(packing)
        share = {f.name: f.size / max(packing.total, 1) for f in spec.additive}
        contributors = []
        for c in sorted(live):
            rec = got[c]
            frames = rec.get("frames")
            if not isinstance(frames, list) or not all(isinstance(f, bytes) for f in frames):
                self._book_drops(ctx, "upload", {c: "reply without ciphertext frames"},
                                 dropped)
                continue
            t0 = time.process_time()
            try:
                agg.add(frames)
            except ProtocolError as exc:
                self._book_drops(ctx, "upload", {c: f"refused: {exc}"}, dropped)
                continue
            server_s = time.process_time() - t0
            contributors.append(c)
            size = sum(len(f) for f in frames)
            self.transport.add("upload", ours=size)
            clips.counts.update({k: clips.counts.get(k, 0) + v
                                 for k, v in json.loads(rfield(rec, "clipped", str)).items()})
            ctx.message(c, SERVER, "upload", wire_bytes=frames, plaintext_bytes=spec.nbytes,
                        fields={f.name: f.nbytes for f in spec.additive},
                        client_cpu_s=rfield(rec, "cpu_s", float)
                        + rfield(rec, "enc_cpu_s", float),
                        server_cpu_s=server_s,
                        flops=rfield(rec, "flops", float) + he_flops(
                            "encrypt", params.poly_modulus_degree,
                            len(params.coeff_mod_bit_sizes), packing.n_ciphertexts))
            d = digest(frames)
            for f in spec.additive:
                ctx.observe(SERVER, c, "upload", f.name, "encrypted", frames,
                            nbytes=round(size * share[f.name]), value_digest=d)
        if contributors and packing.total:
            t0 = time.process_time()
            agg_wire = [bytes(f) for f in agg.finish()]
            finish_s = time.process_time() - t0
            agg_size = sum(len(f) for f in agg_wire)
            ctx.message(SERVER, DECRYPTOR, "decrypt", wire_bytes=agg_wire,
                        server_cpu_s=finish_s)
            self.transport.add("decrypt", ours=agg_size)
            d = digest(agg_wire)
            for f in spec.additive:
                n = round(agg_size * share[f.name])
                ctx.observe(SERVER, SERVER, "sum", f.name, "encrypted", agg_wire, what="sum",
                            nbytes=n, value_digest=d)
                ctx.observe(DECRYPTOR, SERVER, "decrypt", f.name, "encrypted", agg_wire,
                            what="sum", nbytes=n, value_digest=d)
            got, failed = self._exchange(grid, "decrypt", ctx, {dec: content(
                step="he-decrypt", params=pjson, run=self._run_tag, frames=agg_wire,
                packing=json.dumps(dataclasses.asdict(packing)))})
            if dec not in got:
                raise SecureSumAborted("decrypt", 0, 1)
            if params.scheme == "ckks":
                self._he_decryptions[pjson] = (self._he_decryptions.get(pjson, 0)
                                               + packing.n_ciphertexts)
            raw = rfield(got[dec], "msg", bytes)
            flat = unpack_arrays(raw)["flat"]
            sums.update(decode_sums(flat, packing, spec, fps))
            ctx.message(DECRYPTOR, SERVER, "result", wire_bytes=len(raw),
                        plaintext_bytes=sum(int(s.nbytes) for s in sums.values()),
                        fields={k: int(v.nbytes) for k, v in sums.items()},
                        client_cpu_s=rfield(got[dec], "cpu_s", float),
                        flops=he_flops("decrypt", params.poly_modulus_degree,
                                       len(params.coeff_mod_bit_sizes) - 1,
                                       packing.n_ciphertexts))
            self.transport.add("decrypt", ours=len(raw))
            for f in spec.additive:
                ctx.observe(DECRYPTOR, SERVER, "decrypt", f.name, "clear", sums[f.name],
                            what="sum")
                ctx.observe(SERVER, DECRYPTOR, "result", f.name, "clear", sums[f.name],
                            what="sum")
        return Aggregate(ctx.phase, ctx.round, sums, {}, tuple(contributors), notes)


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
    check_layer(layer)
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
