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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message
from flwr.clientapp import ClientApp

from secagg import safestore
from secagg.client_step import reply_fields, run_step
from secagg.data import ClientData, Dataset, Partition
from secagg.engine import AlgorithmLike, ClientState
from secagg.errors import ConfigurationError, PrivacyError, ProtocolError
from secagg.flower.records import RECORD, content, field, read
from secagg.messages import UploadSpec
from secagg.node import UPLOADS as _UPLOADS
from secagg.node import leave, protocol_step, runs_client_step
from secagg.privacy.node_ledger import LedgerError, NodeLedger, check_head, release_id
from secagg.privacy.policy import NodePolicy
from secagg.stages import Key, Stage
from secagg.wire import unpack_arrays

PartitionLoader = Callable[[Context], tuple[Dataset, ClientData]]
"""Given the node's Flower ``Context``, its data set description and its own partition."""

_STATE = "secagg-node"  # ConfigRecord in Context.state (stays on the node)
_IDENTITY = "secagg-identity"  # the node's Ed25519 identity (kept across runs)
_ATTEST = "secagg-attest"  # per run tag: the node's statement numbers (kept across runs)
#: reply fields that are messages a node sends, signed (secagg.attest)
_SIGNED = (Key.MSG, Key.ACK, Key.FRAMES, Key.NEXT_MSG)
#: steps whose message is booked under another stage name by the server
_STAGE_OF_STEP = {Stage.HE_KEYGEN: Stage.KEYS, Stage.HE_DECRYPT: Stage.RESULT,
                  Stage.HE_UPLOAD: Stage.UPLOAD}


#: node config keys of the node's pinned identities
IDENTITY_KEY, PINNED_KEYS = "identity-key", "pinned-keys"


def load_identity_key(path: str | Path) -> Any:
    """A node's Ed25519 private key from the file at ``path``: PEM (PKCS#8), 32 raw bytes,
    or their 64 hex digits.

    Raises:
        ConfigurationError: the file is missing or holds no such key.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        raw = Path(path).expanduser().read_bytes()
        if raw.lstrip().startswith(b"-----BEGIN"):
            key = load_pem_private_key(raw, password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise ValueError("not an Ed25519 key")
            return key
        if len(raw) != 32:
            raw = bytes.fromhex(raw.decode("ascii").strip())
        return Ed25519PrivateKey.from_private_bytes(raw)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"node config {IDENTITY_KEY} {path}: not an Ed25519 private "
                                 f"key ({exc})") from None


def load_pinned_keys(path: str | Path) -> dict[int, bytes]:
    """Client id -> raw Ed25519 public key of every client a node may talk to, from
    outside the run (a PKI, or keys its operator exchanged): a JSON file ``{"ID": HEX}``, or
    a directory of ``ID.pub`` files (64 hex digits, or 32 raw bytes each).

    Raises:
        ConfigurationError: the path is missing, or an entry is not a client id and key.
    """
    p = Path(path).expanduser()
    try:
        if p.is_dir():
            items = {}
            for f in sorted(p.glob("*.pub")):
                raw = f.read_bytes()
                items[f.stem] = raw.hex() if len(raw) == 32 else raw.decode("ascii").strip()
        else:
            items = json.loads(p.read_text())
        if not isinstance(items, dict) or not items:
            raise ValueError("no keys")
        pins = {int(c): bytes.fromhex(str(h)) for c, h in items.items()}
        if any(len(k) != 32 for k in pins.values()):
            raise ValueError("a key is not 32 bytes")
        return pins
    except (OSError, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"node config {PINNED_KEYS} {path}: not a set of pinned "
                                 f"client keys ({exc})") from None


def _pinned(context: Context) -> dict[int, bytes] | None:
    """The pinned keys the node config names (None: not pinned)."""
    path = context.node_config.get(PINNED_KEYS)
    if path in (None, ""):
        return None
    try:
        return load_pinned_keys(str(path))
    except ConfigurationError as exc:
        raise ProtocolError(str(exc)) from None


def _identity(context: Context) -> Any:
    """The node's long-term Ed25519 key: the one its config names (``identity-key``: a
    key its operator holds, pinned by its peers), else one made on first use and kept in
    the node's own ``Context.state`` (the server learns its public half with the hello:
    trust on first use)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    path = context.node_config.get(IDENTITY_KEY)
    if path not in (None, ""):
        try:
            return load_identity_key(str(path))
        except ConfigurationError as exc:
            raise ProtocolError(str(exc)) from None
    if _IDENTITY not in context.state.config_records:
        key = Ed25519PrivateKey.generate()
        context.state.config_records[_IDENTITY] = ConfigRecord(
            {"ed25519": key.private_bytes_raw()})
    return Ed25519PrivateKey.from_private_bytes(
        context.state.config_records[_IDENTITY]["ed25519"])


class _AttestBook:
    """What a node keeps about its signed statements of one run, in its own
    ``Context.state`` (record :data:`_ATTEST`, one entry per run tag, never sent anywhere
    and never reset for a run: a ClientApp process restarted per message, or a message of
    another run in between, does not restart the numbers): the next sequence number of
    each party it signs as (its client id; ``decryptor`` for the HE decryptor), the
    releases it noised itself (:func:`secagg.attest.applied_release`), and whether it
    closed the run."""

    def __init__(self, context: Context, run: str) -> None:
        if _ATTEST not in context.state.config_records:
            context.state.config_records[_ATTEST] = ConfigRecord()
        self.record, self.run = context.state.config_records[_ATTEST], run
        raw = self.record.get(run)
        try:
            doc = json.loads(raw) if isinstance(raw, str) else {}
            self.seq: dict[str, int] = {str(k): int(v) for k, v in doc.get("seq", {}).items()}
            self.applied: list[dict[str, Any]] = [dict(a) for a in doc.get("applied", [])]
            self.closed: bool = bool(doc.get("closed", False))
        except (ValueError, TypeError, AttributeError):
            raise ProtocolError("the node's stored statement numbers do not read") from None

    def take(self, party: Any, count: int) -> int:
        """The first of ``count`` sequence numbers of ``party`` (they are then used);
        none after the party closed the run (its count is signed)."""
        if self.closed and count:
            raise ProtocolError(f"this node closed its signed statements of run {self.run}: "
                                "it signs no more messages in it")
        first = int(self.seq.get(str(party), 0))
        self.seq[str(party)] = first + int(count)
        return first

    def save(self) -> None:
        """Write the book back into the node's state."""
        self.record[self.run] = json.dumps({"seq": self.seq, "applied": self.applied,
                                            "closed": self.closed}, sort_keys=True)


def _close(rec: ConfigRecord, key: Any, context: Context, store: ConfigRecord
           ) -> dict[str, Any]:
    """The ``close`` step: sign one closing statement per party this node signed as
    (:func:`secagg.attest.closing_statement`: its statement count and the run's DP terms,
    ``dp_terms`` in the instruction), after checking those terms against every release
    the node noised itself (:func:`secagg.attest.check_applied`): terms that leave one
    out, describe less noise than the node added, or call seeded noise private are
    refused (an error reply: the node signs nothing, and the audit names it as
    unclosed)."""
    from secagg.attest import check_applied, closing_statement

    t0 = time.process_time()
    if "cid" not in store:
        raise ProtocolError("a closing request for a run this node did not join")
    book = _AttestBook(context, str(store[Key.RUN]))
    try:
        terms = json.loads(field(rec, Key.DP_TERMS, str)) if Key.DP_TERMS in rec else None
    except ValueError:
        raise ProtocolError("closing request: dp_terms is not JSON") from None
    if terms is not None and not isinstance(terms, dict):
        raise ProtocolError("closing request: dp_terms is not a JSON object")
    wrong = check_applied(terms, book.applied)
    if wrong:
        raise ProtocolError("closing request refused: the DP terms the server asks this node "
                            f"to sign misdescribe the noise it applied: {'; '.join(wrong)}")
    params: dict[str, Any] = {"applied": book.applied}
    if terms is not None:
        params[Key.DP] = terms
    rnd = field(rec, Key.ROUND, int) if Key.ROUND in rec else -1
    parties: list[Any] = [int(store["cid"])]
    if book.seq.get("decryptor", 0) > 0:
        parties.append("decryptor")
    atts = [closing_statement(key, run=str(store[Key.RUN]), round=rnd, sender=p,
                              count=book.seq.get(str(p), 0), params=params) for p in parties]
    book.closed = True
    book.save()
    return {Key.ATT: json.dumps(atts), Key.ATT_CPU_S: time.process_time() - t0}


def _attest(rec: ConfigRecord, step: str, out: dict[str, Any], key: Any,
            store: ConfigRecord, context: Context) -> dict[str, Any]:
    """Sign a statement for every message of the reply ``out`` (the one place a node's
    messages leave it; :func:`secagg.attest.sign_reply`): labelled with the round, phase
    and stage the instruction names (``att``), the form read from the message itself,
    the noise parameters this node applied (``dp``) and the noised fields, and numbered
    with the node's own sequence numbers (:class:`_AttestBook`, in its ``Context.state``:
    scheme :data:`secagg.attest.SCHEME`)."""
    from secagg.attest import params_digest, sign_reply

    t0 = time.process_time()
    labels = json.loads(rec[Key.ATT]) if isinstance(rec.get(Key.ATT), str) else [-1, "", step]
    rnd, phase, stage = int(labels[0]), str(labels[1]), str(labels[2])
    stage = _STAGE_OF_STEP.get(step, stage)
    sender: Any = "decryptor" if step in (Stage.HE_KEYGEN, Stage.HE_DECRYPT) else int(store["cid"])
    params: dict[str, Any] = {}
    if Key.LAYER in rec:
        params["told"] = params_digest(json.loads(field(rec, Key.LAYER, str)))
    if Key.DP in rec:
        params["noise"] = json.loads(field(rec, Key.DP, str))
    noised = json.loads(store["att_noised"]) if "att_noised" in store else []
    msgs = {k: (stage, out[k]) for k in _SIGNED if k in out and k != "next_msg"}
    book = _AttestBook(context, str(store[Key.RUN]))
    if "att_release" in store:  # a release this node noised, now sent
        if step in _UPLOADS:
            book.applied.append(json.loads(store["att_release"]))
        del store["att_release"]
    atts = json.loads(sign_reply(key, run=str(store[Key.RUN]), round=rnd, phase=phase,
                                 sender=sender, messages=msgs, params=params,
                                 noised=noised if step in _UPLOADS else (),
                                 first_seq=book.take(sender, len(msgs))))
    if Key.NEXT_MSG in out:  # ADVERTISE ahead for the next session
        atts += json.loads(sign_reply(
            key, run=str(store[Key.RUN]), round=int(rec.get(Key.NEXT_ROUND, -1)), phase="",
            sender=sender, messages={Key.NEXT_MSG: (Stage.ADVERTISE, out[Key.NEXT_MSG])},
            params={}, first_seq=book.take(sender, 1)))
    book.save()
    if atts:
        out[Key.ATT] = json.dumps(atts)
        out[Key.ATT_CPU_S] = time.process_time() - t0
    return out


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


def _policy(context: Context) -> NodePolicy:
    """The node's own privacy floor from its node config (:mod:`secagg.privacy.policy`);
    a malformed one is a ProtocolError (the node drops rather than guess)."""
    try:
        return NodePolicy.from_node_config(context.node_config)
    except PrivacyError as exc:
        raise ProtocolError(f"node config: {exc}") from None


def _check_policy(policy: NodePolicy, rec: ConfigRecord, bcast: dict[str, np.ndarray],
                  pins: dict[int, bytes] | None = None) -> None:
    """Refuse an instruction whose terms are weaker than the node's floor (noise, seed,
    public fields, adjacency, delta, clip, cohort bounds; :meth:`NodePolicy.check`): the
    node adds the noise under LocalDP and DistributedDP and applies the clip, so a
    ServerApp cannot lower either below what the node accepts. With pinned identities a
    cohort larger than the clients pinned is refused too (the server would be inventing
    clients). The refusal is an error reply: the node drops and sends nothing."""
    try:
        dp = json.loads(field(rec, Key.DP, str)) if Key.DP in rec else None
        clip = float(np.asarray(bcast["clip"]).ravel()[0]) if "clip" in bcast else None
        n = rec.get(Key.N)
        policy.check(dp, clip, cohort=n)
        if pins is not None and isinstance(n, int) and n > len(pins):
            raise PrivacyError(f"a cohort of {n} clients, but only {len(pins)} are pinned "
                               f"({PINNED_KEYS}): the server counts clients that do not exist")
    except (PrivacyError, ValueError, TypeError) as exc:
        raise ProtocolError(f"instruction refused by this node's privacy policy: {exc}") \
            from None


def _check_release(policy: NodePolicy, rec: ConfigRecord, spec: UploadSpec, client: int,
                   sizing: str) -> None:
    """Refuse the release the instruction asks for when the event this node would be
    charged for it breaks its policy (:meth:`NodePolicy.check_release`: its epsilon, and
    noise resting on the server's word), before the step touches the data."""
    if Key.DP not in rec or not policy.holds_floor:  # nothing to hold the event against
        return
    from secagg.privacy.node_budget import node_event

    try:
        dp = json.loads(field(rec, Key.DP, str))
        event = node_event(client, field(rec, Key.RUN, str), field(rec, Key.ROUND, int),
                           field(rec, Key.PHASE, str), dp, spec=spec, cohort=rec.get(Key.N),
                           layer=rec.get(Key.LAYER), sizing=sizing)
        policy.check_release(event, dp.get("delta") if policy.max_delta is None else None)
    except (PrivacyError, ValueError, TypeError) as exc:
        raise ProtocolError(f"instruction refused by this node's privacy policy: {exc}") \
            from None


#: node config keys of the node's own ledger and budget
LEDGER_PATH, CLIENT_BUDGET, BUDGET_DELTA = "ledger-path", "client-budget", "client-budget-delta"
#: node config keys of the ledger's head file (:mod:`secagg.privacy.node_ledger`) and of
#: the explicit start of a fresh ledger
LEDGER_HEAD, LEDGER_INIT = "ledger-head", "ledger-init"


def _head_path(context: Context, ledger: Path) -> Path:
    """Where the node keeps its ledger's head: ``ledger-head``, else beside its identity
    key (``identity-key``), else beside the ledger file (which catches a truncated or
    deleted file, not one at a new path: name ``ledger-head`` to keep it elsewhere)."""
    for key, suffix in ((LEDGER_HEAD, ""), (IDENTITY_KEY, ".ledger-head")):
        v = context.node_config.get(key)
        if v not in (None, ""):
            if not isinstance(v, str):
                raise ProtocolError(f"node config {key} must be a file path, got {v!r}")
            return Path(v + suffix).expanduser()
    return Path(f"{ledger}.head")


def _ledger_init(context: Context) -> bool:
    """Whether the node config starts a fresh ledger where none exists (``ledger-init``)."""
    v = context.node_config.get(LEDGER_INIT, False)
    return v is True or (isinstance(v, str) and v.lower() == "true")


def _ledger_path(context: Context) -> Path | None:
    path = context.node_config.get(LEDGER_PATH)
    if path is None or path == "":
        return None
    if not isinstance(path, str):
        raise ProtocolError(f"node config {LEDGER_PATH} must be a file path, got {path!r}")
    return Path(path).expanduser()


_NO_EVALUATION = ("this node holds a privacy budget (client-budget): its local test "
                  "accuracy would leave it un-noised, outside the budget, so it does not "
                  "answer evaluation requests")


def _budgeted(context: Context) -> bool:
    """Whether the node holds a privacy budget (then nothing un-noised leaves it: no
    evaluation answers)."""
    return context.node_config.get(CLIENT_BUDGET) not in (None, "")


def _ledger_head(context: Context) -> str | None:
    """The head of the node's ledger file (None without one); a ledger that does not
    verify is an error reply (the node does not join a run it cannot account for)."""
    path = _ledger_path(context)
    if path is None:
        return None
    try:
        return check_head(path, _head_path(context, path), init=_ledger_init(context)).head
    except LedgerError as exc:
        raise ProtocolError(f"this node's privacy ledger: {exc}") from None


class _Charge:
    """The node's budget step around one client step (:mod:`secagg.privacy.node_ledger`,
    :mod:`secagg.privacy.node_budget`), opened by :func:`_charged`.

    :meth:`admit` runs after the phase is known and before its step touches the data: it
    refuses a release that would take the node's epsilon, projected under the terms the
    instruction declares over every release its ledger charges, past its budget (a
    ``refusal`` entry is written; nothing is charged), else writes and syncs the release's
    intent. :meth:`commit` runs after the step and returns the reply's ``ledger_head``.
    A step that fails after :meth:`admit` leaves the intent uncommitted: spent. Every
    refusal is a ProtocolError: an error reply, no array sent."""

    def __init__(self, context: Context, rec: ConfigRecord, client: int) -> None:
        self.rec, self.client, self.ledger = rec, client, None
        self.sizing = "server"  # how the node sizes a DistributedDP share (set by the caller)
        self.path = _ledger_path(context)
        from secagg.privacy.node_budget import budget_from_node_config

        try:
            self.budget = budget_from_node_config(context.node_config)
        except PrivacyError as exc:
            raise ProtocolError(f"node config: {exc}") from None
        if self.path is None:
            raise ProtocolError(f"node config {CLIENT_BUDGET} needs {LEDGER_PATH} (a budget "
                                "kept in memory would reset with the process)")
        self.run = field(rec, Key.RUN, str)
        self.round, self.phase = field(rec, Key.ROUND, int), field(rec, Key.PHASE, str)
        self.rid = release_id(self.run, self.round, self.phase)
        try:
            self.ledger = NodeLedger(self.path, _head_path(context, self.path),
                                     init=_ledger_init(context))
        except LedgerError as exc:
            raise ProtocolError(f"this node's privacy ledger: {exc}") from None
        try:
            self._check()
        except BaseException:
            self.close()
            raise

    def _check(self) -> None:
        """Refuse a replay, and a file that holds another client's releases."""
        assert self.ledger is not None
        client = self.client
        if self.rid in self.ledger.state.intents():
            raise ProtocolError(
                f"release {self.rid} is already charged on this node's ledger (a replayed "
                "message): refused, neither charged nor answered again")
        others = {str(p.get("client")) for p in self.ledger.charged()} - {str(client)}
        if others:  # one file per node: another client's history is not this one's
            raise ProtocolError(f"this node's privacy ledger {self.path} holds releases of "
                                f"client(s) {sorted(others)}, this node is client "
                                f"{client}: give each node its own ledger-path")

    def admit(self, spec: UploadSpec) -> None:
        """Charge the release, or refuse it (see the class docstring); ``spec``: the
        phase's spec, with the run's public bounds (public: shapes and bounds only)."""
        from secagg.privacy.node_budget import node_admit, node_event

        assert self.ledger is not None
        rec = self.rec
        try:
            event = node_event(self.client, self.run, self.round, self.phase, rec.get(Key.DP),
                               spec=spec, cohort=rec.get(Key.N), layer=rec.get(Key.LAYER),
                               sizing=self.sizing)
            ok = None if self.budget is None else node_admit(
                self.ledger.charged(), event, *self.budget)
        except PrivacyError as exc:
            raise ProtocolError(f"this node's privacy ledger: {exc}") from None
        if ok is not None and not ok.admitted:
            self.ledger.refuse(self.rid, replace(event, action="refused",
                                                 reason=ok.reason).to_dict())
            raise ProtocolError(f"refused by this node's privacy budget: {ok.reason}")
        self.ledger.intend(self.rid, event.to_dict())  # synced: from here, spent

    def commit(self) -> dict[str, Any]:
        """After the step: commit the release; the reply's ``ledger_head``."""
        assert self.ledger is not None
        return {Key.LEDGER_HEAD: self.ledger.commit(self.rid, {"status": "uploaded"})}

    def close(self) -> None:
        """Release the ledger's lock."""
        if self.ledger is not None:
            self.ledger.close()


@contextmanager
def _charged(context: Context, rec: ConfigRecord, client: Callable[[], int]
             ) -> Iterator[_Charge | None]:
    """The node's :class:`_Charge` for one client step, or None when its config names
    neither a ledger nor a budget (then nothing is charged)."""
    if _ledger_path(context) is None and context.node_config.get(CLIENT_BUDGET) in (None, ""):
        yield None
        return
    charge = _Charge(context, rec, client())
    try:
        yield charge
    finally:
        charge.close()


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
