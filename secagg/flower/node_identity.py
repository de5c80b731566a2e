"""A Flower node's identity and attestation: its Ed25519 identity key and the peers' pinned
keys (:func:`load_identity_key`, :func:`load_pinned_keys`, from its node config), the
statement numbers it keeps across runs, and the signed statements it attaches to its replies
(secagg.attest). Used by the node (:mod:`secagg.flower.client`)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context

from secagg.errors import ConfigurationError, ProtocolError
from secagg.flower.records import field
from secagg.node import UPLOADS as _UPLOADS
from secagg.stages import Key, Stage

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


def _told(rec: ConfigRecord, name: str) -> str:
    """What the node signs about the layer parameters the instruction's field ``name``
    (``layer``, or ``next_layer`` for a key advertisement made ahead) told it: their
    :func:`secagg.attest.told.told_digest`, the value every runtime's client signs.

    Raises:
        ProtocolError: the field is not a JSON object.
    """
    from secagg.attest.told import told_digest

    try:
        told = json.loads(field(rec, name, str))
    except ValueError:
        raise ProtocolError(f"instruction field {name!r} is not JSON") from None
    if not isinstance(told, dict):
        raise ProtocolError(f"instruction field {name!r} is not a JSON object")
    return told_digest(told)


def _attest(rec: ConfigRecord, step: str, out: dict[str, Any], key: Any,
            store: ConfigRecord, context: Context) -> dict[str, Any]:
    """Sign a statement for every message of the reply ``out`` (the one place a node's
    messages leave it; :func:`secagg.attest.sign_reply`): labelled with the round, phase
    and stage the instruction names (``att``), the form read from the message itself,
    the layer parameters the instruction told the node (``told``: on every stage whose
    instruction carries them, the advertisement made ahead included; :func:`_told`),
    the noise parameters this node applied (``dp``) and the noised fields, and numbered
    with the node's own sequence numbers (:class:`_AttestBook`, in its ``Context.state``:
    scheme :data:`secagg.attest.SCHEME`)."""
    from secagg.attest import sign_reply

    t0 = time.process_time()
    labels = json.loads(rec[Key.ATT]) if isinstance(rec.get(Key.ATT), str) else [-1, "", step]
    rnd, phase, stage = int(labels[0]), str(labels[1]), str(labels[2])
    stage = _STAGE_OF_STEP.get(step, stage)
    sender: Any = "decryptor" if step in (Stage.HE_KEYGEN, Stage.HE_DECRYPT) else int(store["cid"])
    params: dict[str, Any] = {}
    if Key.LAYER in rec:
        params["told"] = _told(rec, Key.LAYER)
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
            params={"told": _told(rec, Key.NEXT_LAYER)} if Key.NEXT_LAYER in rec else {},
            first_seq=book.take(sender, 1)))
    book.save()
    if atts:
        out[Key.ATT] = json.dumps(atts)
        out[Key.ATT_CPU_S] = time.process_time() - t0
    return out
