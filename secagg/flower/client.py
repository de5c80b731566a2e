"""The client side on Flower: one secagg client per SuperNode, with its own data and keys.

:func:`client_app` returns a ``flwr.clientapp.ClientApp`` that answers the ServerApp of
:mod:`secagg.flower.server`. On each message it rebuilds the node's algorithm copy and its
:class:`~secagg.federation.ClientState` (the persistent private state -- e.g. FedLog's
body -- and any in-flight secure-sum party live in the node's ``Context.state``, which
Flower keeps on the node and never sends anywhere), runs the requested step, and replies
with secagg's wire bytes.

Each layer's node steps live with the layer, as its server side does
(:mod:`secagg.secure_sum.node`, :mod:`secagg.homomorphic.node`, and the node's part of a DP
release in :mod:`secagg.privacy.release`); this module is the transport: it reads the
Flower message, keeps the node's private store, runs the client step, and hands the
upload and every protocol stage to the layer's node step.

Steps (record field ``step``):

* ``hello``: the client id (its partition id) only. A node's number of records stays on
  the node: every step message carries the run's public ``max_records`` bound, and the
  node refuses its own upload when it holds more (as the embedded engine refuses it).
* ``upload`` (Plaintext): the phase's client step, ``Upload.validate``, and the upload
  packed with :func:`secagg.wire.pack_arrays`.
* ``advertise`` / ``share`` / ``masked-input`` / ``consistency`` / ``unmask`` (SecureSum):
  the stages of :class:`secagg.secure_sum.client.Client` (``consistency``: sign the survivor
  set the server shows); ``advertise`` first runs the client step and encodes the upload
  with the layer's fixed-point plan.
* Sessions are advertised ahead: the ``hello`` (for the run's first session) or an
  ``unmask`` instruction (for the next one) may carry a session's id, round and cohort
  size (``next_*`` fields); the node then also draws that session's keys and replies with
  its ADVERTISE (``next_msg``). A node of the next cohort outside this unmask gets
  ``advertise-next`` with the same fields. The session's ``share`` instruction then
  carries the client step (``with_step``): the node runs and encodes it, fixes its
  party's vector length and ring from the encoding, and shares its keys. A session thus
  costs four exchanges instead of five.
* The node's own ledger and budget (node config ``ledger-path``, ``client-budget``,
  ``client-budget-delta``; :mod:`secagg.privacy.node_budget`): before a message that runs
  the client step touches the node's data, the node checks its policy floor, refuses a
  release it already charged (a replay) or one that would take its epsilon past its
  budget (an error reply: no array leaves), else writes and syncs the release's intent in
  its ledger file (:mod:`secagg.privacy.node_ledger`); after the step it commits it and
  replies with the file's new head (``ledger_head``, also in the hello), which the server
  keeps in the transcript for ``secagg audit --node-ledger``. A node that holds a budget
  answers no ``evaluate`` request (its accuracy would leave it un-noised).
* The node's checks against a lying ServerApp (:mod:`secagg.privacy.policy`, docs/FLOWER.md):
  its policy on the whole instruction (noise, seed, public fields, adjacency, delta, clip,
  cohort, the epsilon it would be charged) before its data is touched; its pinned
  identities (node config ``identity-key``: its own key; ``pinned-keys``: its peers'),
  with which its secure-sum parties sign and check rosters and survivor signatures; how it
  sizes a DistributedDP noise share (``dp_sizing`` in the reply: ``pinned``, ``alone`` or
  ``server``); and its ledger's head file (``ledger-head``, ``ledger-init``), so a
  rolled-back ledger is refused.
* Signed statements (:mod:`secagg.attest`, scheme v2): every message a node sends carries
  its statement, numbered by the node's own counter of the run (kept in ``Context.state``,
  record ``secagg-attest``, which a new run does not clear and a restarted ClientApp
  process reads back), and the node remembers each release it noised itself. ``close``
  (the run's last message): the node checks the run's DP terms (``dp_terms``) against
  those releases (refusing terms that leave one out, describe less noise, or call seeded
  noise private) and replies with its signed closing statement (its count, the terms, its
  releases; the HE decryptor node closes as the decryptor too). It signs nothing more in
  that run afterwards.
* ``evaluate`` (personalized algorithms): the node's accuracy on its own local test set
  with its own model and the server's evaluation state, and whether it has a local test
  set. After every round but the last it rides on the node's first message of the next
  round (``evaluate=True`` and ``eval_state`` beside the client step's fields: the node
  scores its model first, then runs the step, as the embedded engine orders them); only
  the last round's, and nodes outside the next cohort, get a message of their own.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from secagg import safestore
from secagg.client_step import reply_fields, run_step
from secagg.data import ClientData, Dataset, Partition
from secagg.engine import AlgorithmLike, ClientState
from secagg.errors import ConfigurationError, ProtocolError
from secagg.flower.node_identity import IDENTITY_KEY as IDENTITY_KEY
from secagg.flower.node_identity import PINNED_KEYS as PINNED_KEYS
from secagg.flower.node_identity import _attest, _close, _identity, _pinned
from secagg.flower.node_identity import load_identity_key as load_identity_key
from secagg.flower.node_identity import load_pinned_keys as load_pinned_keys
from secagg.flower.node_privacy import (
    _NO_EVALUATION,
    _budgeted,
    _charged,
    _check_policy,
    _check_release,
    _ledger_head,
    _policy,
)
from secagg.flower.node_privacy import BUDGET_DELTA as BUDGET_DELTA
from secagg.flower.node_privacy import CLIENT_BUDGET as CLIENT_BUDGET
from secagg.flower.node_privacy import LEDGER_HEAD as LEDGER_HEAD
from secagg.flower.node_privacy import LEDGER_INIT as LEDGER_INIT
from secagg.flower.node_privacy import LEDGER_PATH as LEDGER_PATH
from secagg.flower.records import RECORD, content, field, read
from secagg.messages import UploadSpec
from secagg.node import leave, protocol_step, runs_client_step
from secagg.stages import Key, Stage
from secagg.wire import unpack_arrays

PartitionLoader = Callable[[Context], tuple[Dataset, ClientData]]
"""Given the node's Flower ``Context``, its data set description and its own partition."""

_STATE = "secagg-node"  # ConfigRecord in Context.state (stays on the node)


def node_partition_loader(make_partition: Callable[[], Partition]) -> PartitionLoader:
    """A loader that picks the node's partition by ``node_config["partition-id"]`` (as
    ``flwr run``'s simulation and ``flower-supernode --node-config`` set it).

    Args:
        make_partition: builds the (deterministic) split of the data; called once per
            process and cached.
    """
    cache: dict[str, Partition] = {}

    def load(context: Context) -> tuple[Dataset, ClientData]:
        if "p" not in cache:
            cache["p"] = make_partition()
        part = cache["p"]
        pid = context.node_config.get("partition-id")
        if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < len(part):
            raise ConfigurationError(
                f"node_config partition-id must be an int in 0..{len(part) - 1}, got {pid!r} "
                "(start the SuperNode with --node-config 'partition-id=K')"
            )
        return part.dataset, part[pid]

    return load


class _Node:
    """The ClientApp's logic (kept apart from Flower's decorators for clarity)."""

    def __init__(
        self, algorithm: AlgorithmLike | Callable[[], AlgorithmLike], loader: PartitionLoader
    ) -> None:
        self._algorithm = algorithm
        self.loader = loader
        self._data: dict[int, tuple[Dataset, ClientData]] = {}

    def _load(self, context: Context) -> tuple[Dataset, ClientData]:
        key = int(context.node_id)
        if key not in self._data:
            self._data[key] = self.loader(context)
        return self._data[key]

    @property
    def algorithm(self) -> AlgorithmLike:
        """The algorithm (built on first use when a factory or a class was given: a class
        has ``phases`` too, as a plain function, so it is told apart by being a type)."""
        if isinstance(self._algorithm, type) or not hasattr(self._algorithm, "phases"):
            self._algorithm = self._algorithm()  # type: ignore[operator]
        return self._algorithm  # type: ignore[return-value]

    def _store(self, context: Context) -> ConfigRecord:
        if _STATE not in context.state.config_records:
            context.state.config_records[_STATE] = ConfigRecord()
        return context.state.config_records[_STATE]

    def handle(self, msg: Message, context: Context) -> Message:
        rec = read(msg)
        step = field(rec, Key.STEP, str)
        store = self._store(context)
        tag = field(rec, Key.RUN, str)
        if store.get(Key.RUN) != tag:  # a new run: forget the previous run's private state
            for k in list(store.keys()):
                del store[k]
            store[Key.RUN] = tag
        key = _identity(context)
        pins = _pinned(context)
        if pins is not None:  # the secure-sum parties sign with the pinned key, check peers'
            store["pinned"] = json.dumps({str(c): k.hex() for c, k in pins.items()})
            store["signing"] = key.private_bytes_raw()
        if step == Stage.HELLO:  # with SecureSum, ADVERTISE for the run's first session too
            _, data = self._load(context)
            store["cid"] = int(data.id)
            out: dict[str, Any] = {"cid": int(data.id)}  # no record count: it is private
            from secagg.attest import public_hex

            out["identity"] = public_hex(key)  # the public half of the node's identity
            head = _ledger_head(context)
            if head is not None:  # where the node's ledger stands as the run begins
                out[Key.LEDGER_HEAD] = head
            if Key.NEXT_SESSION in rec:
                out.update(self._advertise_next(rec, context, store))
            return Message(content(**_attest(rec, step, out, key, store, context)),
                           reply_to=msg)
        if step == Stage.CLOSE:  # the end of the run: the node's closing statements
            return Message(content(**_close(rec, key, context, store)), reply_to=msg)
        if runs_client_step(step, rec):
            # the node's own checks, before its data is touched: its policy floor, then its
            # budget (the release is charged, durably, before the step runs)
            raw = rec.get(Key.BROADCAST, b"")
            bcast = unpack_arrays(raw) if raw else {}
            policy = _policy(context)
            _check_policy(policy, rec, bcast, pins)
            sizing = "pinned" if pins is not None else (
                "alone" if policy.noise_alone else "server")
            store[Key.DP_SIZING] = sizing
            with _charged(context, rec, lambda: self._cid(context, store)) as charge:
                if charge is not None:
                    charge.sizing = sizing

                def check(spec: UploadSpec) -> None:  # the release as it would be charged
                    _check_release(policy, rec, spec, self._cid(context, store), sizing)

                out = self._client_step(rec, *self._load(context), store, bcast,
                                        None if charge is None else charge.admit,
                                        score=not _budgeted(context), check=check)
                if charge is not None:
                    out.update(charge.commit())
            if Key.DP in rec:  # how this node sized its noise (the server's copy of its event)
                out[Key.DP_SIZING] = sizing
        elif step == Stage.EVALUATE:
            if _budgeted(context):
                raise ProtocolError(_NO_EVALUATION)
            out = self._evaluate(field(rec, Key.STATE, bytes), field(rec, Key.SEED, int),
                                 *self._load(context), store)
        else:  # a layer's protocol stage (advertise-next included)
            out = protocol_step(step, rec, store, self._cid(context, store))
        if "cid" not in store:
            store["cid"] = int(self._load(context)[1].id)
        return Message(content(**_attest(rec, step, out, key, store, context)), reply_to=msg)

    def _cid(self, context: Context, store: ConfigRecord) -> int:
        """This node's client id (from its hello, else its partition)."""
        return int(store["cid"]) if "cid" in store else int(self._load(context)[1].id)

    def _advertise_next(self, rec: ConfigRecord, context: Context,
                        store: ConfigRecord) -> dict[str, Any]:
        """ADVERTISE ahead for the next secure-sum session
        (:func:`secagg.secure_sum.node.advertise_next`)."""
        from secagg.secure_sum.node import advertise_next

        cid = store["cid"] if "cid" in store else int(self._load(context)[1].id)
        return advertise_next(rec, cid, store)

    def _client_step(
        self, rec: ConfigRecord, dataset: Dataset, data: ClientData, store: ConfigRecord,
        bcast: dict[str, np.ndarray], admit: Callable[[UploadSpec], None] | None = None,
        score: bool = True, check: Callable[[UploadSpec], None] | None = None,
    ) -> dict[str, Any]:
        """Run the phase's client step on the broadcast ``bcast`` and hand the upload to
        the layer's node side;
        ``admit`` (the node's budget step) is called with the phase's spec after the phase
        is known and before its step touches the data. ``score``: answer an evaluation
        request riding on the message (False: leave it unanswered). ``check`` (the node's
        policy on the release as it would be charged) is called with the phase's spec
        before ``admit``."""
        rnd, rounds = field(rec, Key.ROUND, int), field(rec, Key.ROUNDS, int)
        seed = field(rec, Key.SEED, int)
        if "att_release" in store:  # (left by a step that failed after its noise)
            del store["att_release"]
        scored: dict[str, Any] = {}
        if rec.get(Key.EVALUATE) is True and score:  # the previous round's, before this step
            scored = self._evaluate(field(rec, Key.EVAL_STATE, bytes), seed, dataset, data, store)
            scored = {Key.ACC: scored[Key.ACC], Key.HAS_TEST: scored[Key.HAS_TEST]}
        algo = copy.deepcopy(self.algorithm)  # one private copy per node and message
        st = ClientState(data)
        algo.setup(dataset, [st], seed)
        if "client_state" in store:
            st.state = _thaw_state(store["client_state"], st, algo)
        name = field(rec, Key.PHASE, str)
        phases = [p for p in algo.phases(rnd, rounds) if p.name == name]
        if not phases:
            raise ProtocolError(f"round {rnd} has no phase {name!r} on this client")
        phase = phases[0]
        declared = phase.spec()
        if declared.max_records is None:
            declared = replace(declared, max_records=field(rec, "max_records", int))
        if check is not None:  # refused before the step touches the data
            check(declared)
        if admit is not None:  # charged (or refused) before the step touches the data
            admit(declared)
        on_violation = field(rec, "on_violation", str)  # (read before the data is touched)

        def spec_after() -> UploadSpec:
            """The spec after the step: a phase whose bounds come with the broadcast
            (DP-FedAvg's clip) declares the bound it was told to apply."""
            after = phase.spec()
            if after.max_records is None:
                after = replace(after, max_records=field(rec, "max_records", int))
            if admit is not None and after != declared:  # the charge must describe it
                raise ProtocolError("the phase's spec changed during its step, so the "
                                    "release charged on this node's ledger does not describe "
                                    "it: nothing is sent (the charge stands)")
            return after

        up = run_step(phase, st, bcast, spec_after, on_violation=on_violation)
        spec, cpu = up.spec, up.cpu_s
        store["client_state"] = safestore.dumps(st.state)
        out: dict[str, Any] = {**reply_fields(up), **scored}
        # the wrapping layer's node part, on the node, from the node's own noise stream
        # (e.g. LocalDP noises the upload before it leaves, the inner layer then carrying
        # the widened spec; DistributedDP adds this node's noise share when it encodes)
        part = None
        if Key.DP in rec:  # (imported here: a node's messages without DP skip the accountant)
            from secagg.privacy.release import node_part

            t0 = time.process_time()
            part = node_part(rec, st.id, str(store.get(Key.DP_SIZING, "server")))
            up, spec = part.prepare(up, spec)
            out[Key.CPU_S] = cpu = cpu + time.process_time() - t0
            from secagg.attest import applied_release

            mine: list[str] = []
            if part.upload_noised is not None:  # the fields it noised (attested)
                mine = list(part.upload_noised)
                store["att_noised"] = json.dumps(mine)
            # the release as this node noised it, checked against the run's DP terms at
            # the end (kept once the reply is signed; a noise share: its round and phase)
            store["att_release"] = json.dumps(applied_release(
                rnd, name, part.name, mine, part.noise_multiplier if mine else None,
                part.seeded))
        elif "att_noised" in store:
            del store["att_noised"]
        # the upload leaves the node the layer's way
        return leave(rec, spec, up, st.id, part, out, cpu, store)

    def _evaluate(
        self, raw: bytes, seed: int, dataset: Dataset, data: ClientData, store: ConfigRecord
    ) -> dict[str, Any]:
        """A personalized algorithm's accuracy for this client: its own model (as its last
        client step left it) with the server's evaluation state ``raw`` (packed arrays,
        e.g. FedLog's head)."""
        algo = copy.deepcopy(self.algorithm)
        st = ClientState(data)
        algo.setup(dataset, [st], seed)
        if "client_state" in store:
            st.state = _thaw_state(store["client_state"], st, algo)
        algo.load_evaluation_state(unpack_arrays(raw) if raw else {})
        t0 = time.process_time()
        acc = float(algo.evaluate(dataset, [st]))
        cpu = time.process_time() - t0
        # the embedded engine keeps whatever evaluation leaves in the client's state
        store["client_state"] = safestore.dumps(st.state)
        has_test = data.y_test is not None and len(data.y_test) > 0
        return {Key.ACC: acc, Key.HAS_TEST: bool(has_test), Key.CPU_S: cpu}



def _thaw_state(raw: bytes, st: ClientState, algo: Any) -> dict[str, Any]:
    """The client state a previous message stored (:func:`secagg.safestore.dumps`: arrays
    and JSON, never pickle); a stored model's weights are loaded into this message's own
    model of that class (the one setup made, or a copy of the algorithm's ``model``).

    Raises:
        ProtocolError: the stored state does not check (the node drops rather than guess).
    """
    def module_for(path: str, cls: str) -> Any:
        mine = st.state.get(path.strip("/").split("/")[0])
        if mine is not None and type(mine).__qualname__ == cls:
            return mine
        base = getattr(algo, "model", None)
        return copy.deepcopy(base) if type(base).__qualname__ == cls else None

    try:
        state = safestore.loads(bytes(raw), module_for)
    except safestore.StoreError as exc:
        raise ProtocolError(f"the node's stored client state: {exc}") from None
    return state if isinstance(state, dict) else {}


def client_app(
    algorithm: AlgorithmLike | Callable[[], AlgorithmLike], partition_loader: PartitionLoader
) -> ClientApp:
    """A Flower ClientApp that plays one secagg client of ``algorithm`` on each SuperNode.

    Args:
        algorithm: the same algorithm (and hyper-parameters) the ServerApp runs, or a
            zero-argument factory of it (then heavy imports such as torch happen only in
            the messages that run a client step, not in every secure-sum stage); each node
            works on its own copy.
        partition_loader: ``(context) -> (dataset, client_data)``; the node's own data
            (e.g. :func:`node_partition_loader`). ``client_data.id`` is the client id the
            server sees (ids must be unique across nodes).
    """
    node = _Node(algorithm, partition_loader)
    app = ClientApp()

    @app.train("secagg")
    def _secagg(msg: Message, context: Context) -> Message:
        return node.handle(msg, context)

    return app


__all__ = ["PartitionLoader", "client_app", "load_identity_key", "load_pinned_keys",
           "node_partition_loader", "RECORD"]
