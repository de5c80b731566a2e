"""Client-attested records: what each client signs about every message it sends, and
how an auditor checks the server's transcript against those statements.

The transcript is written by the server, the party whose view an audit is meant to check;
its running digest (:mod:`secagg.transcript`) has no key and protects against accidents
only. Here every client (and the HE decryptor) signs, with its own Ed25519 identity, one
small :class:`Statement` per message it sends:

``run`` (the run's tag), ``round``, ``phase``, ``stage``, ``sender``, ``receiver``,
``digest`` (SHA-256 of the message bytes, frames concatenated), ``form`` (what the upload
values in it were when they left: ``clear``, ``noised``, ``masked``, ``encrypted``, or
``protocol`` for a protocol message carrying none), ``fields`` (field name -> SHA-256 of
that field's array as sent, for ``clear``/``noised`` arrays) and ``params`` (the layer
parameters the client was told to use: a digest of the layer description, and the DP
noise parameters when it adds noise itself).

The signed bytes are :data:`DOMAIN` followed by the statement as canonical JSON (sorted
keys, no spaces). The server's transcript carries each statement and its signature as an
``attestation`` record; the run header names the scheme, the run tag and the public keys
the server claims (``attestation``). :func:`verify` checks a transcript against public
keys obtained elsewhere (``identities.json``; in a deployment a PKI or the pinned
identities of ``SecureSum(identities=...)``) and returns every :class:`Problem`.

Where statements are made: in one process, :meth:`secagg.layers.base.RoundContext.message`
(every client message passes there) hands the message to a :class:`Signer`; on Flower,
each node signs its reply's messages (:func:`sign_reply`) and the server's
:class:`Collector` puts the statement that came with a message into the transcript when
it books that message. Either way each statement is one cost-ledger row of stage
:data:`STAGE` (its bytes, and the signer's CPU time).
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from secagg.errors import ConfigurationError, SecaggError
from secagg.transcript import digest

#: Prefix of every signed statement (domain separation from other Ed25519 uses).
DOMAIN = b"secagg/attest/v1\n"
#: The scheme named in the run header.
SCHEME = "ed25519/secagg-attest-v1"
#: The cost-ledger stage of a statement.
STAGE = "attest"
#: Forms a statement may declare (the transcript's, plus messages that carry no values).
FORMS = ("clear", "noised", "masked", "encrypted", "protocol")
_SIG_BYTES = 64
#: observations not covered by statements: the accuracies Flower nodes report
#: (``secagg.engine.EVALUATION_PHASE``), measurements rather than protocol messages
UNSIGNED_PHASE = "evaluate"


class AttestationError(SecaggError, ValueError):
    """An identities file or a statement that cannot be read."""


@dataclass(frozen=True, kw_only=True)
class Statement:
    """What a client says about one message it sent (see the module docstring)."""

    run: str
    round: int
    phase: str
    stage: str
    sender: int | str
    receiver: int | str
    digest: str
    form: str
    fields: dict[str, str] = field(default_factory=dict)
    noised: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)

    def form_of(self, name: str) -> str:
        """The form field ``name`` left in: ``noised`` when the client noised it."""
        if name in self.noised:
            return "noised"
        return "clear" if self.form == "noised" else self.form

    def to_json(self) -> dict[str, Any]:
        """The statement as a JSON object (what :meth:`from_json` reads back)."""
        return {"run": self.run, "round": self.round, "phase": self.phase,
                "stage": self.stage, "sender": self.sender, "receiver": self.receiver,
                "digest": self.digest, "form": self.form, "fields": dict(self.fields),
                "noised": list(self.noised), "params": dict(self.params)}

    def signed_bytes(self) -> bytes:
        """:data:`DOMAIN` + the canonical JSON of the statement."""
        return _canonical(self.to_json())

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Statement:
        """The statement of an ``attestation`` record.

        Raises:
            AttestationError: keys missing or unexpected.
        """
        try:
            return cls(**d)
        except TypeError as exc:
            raise AttestationError(f"not a statement: {exc}") from None


def message_digest(message: bytes | bytearray | Iterable[bytes]) -> str:
    """SHA-256 hex of a message's bytes (frames: of their concatenation): the transcript's
    :func:`~secagg.transcript.digest` of the message, so a digest the transcript already
    computed stands for it."""
    if not isinstance(message, bytes | bytearray | tuple | list):
        message = tuple(message)
    return digest(message)


def params_digest(desc: Any) -> str:
    """SHA-256 hex of a layer description's canonical JSON (what a statement binds)."""
    return hashlib.sha256(json.dumps(desc, sort_keys=True, separators=(",", ":"),
                                     default=str).encode()).hexdigest()


def classify(message: bytes | bytearray | Iterable[bytes], *, noised: Iterable[str] = ()
             ) -> tuple[str, dict[str, str], list[str]]:
    """(form, field digests) of a message as its sender sees it: packed arrays
    (``secagg.wire``) are ``clear`` -- ``noised`` when their fields are among ``noised`` --
    with each array's digest (as :func:`secagg.transcript.digest` computes it); a
    ciphertext message (``SHE``) is ``encrypted``; a secure-sum MASKED message is
    ``masked``; anything else is a ``protocol`` message. The third item: the fields the
    sender noised."""
    from secagg.transcript import digest
    from secagg.wire import MAGIC as ARRAYS
    from secagg.wire import unpack_arrays

    frames = [bytes(message)] if isinstance(message, bytes | bytearray) else list(message)
    head = frames[0] if frames else b""
    if head[:3] == ARRAYS and len(frames) == 1:
        arrays = unpack_arrays(head)
        names = sorted(set(noised) & set(arrays))
        form = "noised" if names and len(names) == len(arrays) else "clear"
        return form, {k: digest(v) for k, v in arrays.items()}, names
    if head[:3] == b"SHE":
        return "encrypted", {}, []
    if head[:2] == b"SS" and len(head) > 3 and head[3] == 6:  # secure_sum.wire MASKED
        return "masked", {}, []
    return "protocol", {}, []


# ---------------------------------------------------------------- keys


def public_hex(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    """The raw 32-byte public key, hex."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def write_identities(path: str | Path, keys: Mapping[Any, str]) -> Path:
    """Write ``{party: public key hex}`` as ``identities.json`` (parties as strings)."""
    p = Path(path)
    p.write_text(json.dumps({"scheme": SCHEME, "keys": {str(k): v for k, v in keys.items()}},
                            indent=2, sort_keys=True) + "\n")
    return p


def read_identities(path: str | Path) -> dict[str, Ed25519PublicKey]:
    """``{party (as a string): public key}`` from an identities file.

    Raises:
        AttestationError: not such a file, or a key that is not 32 hex bytes.
    """
    try:
        doc = json.loads(Path(path).read_text())
        keys = doc["keys"] if isinstance(doc, dict) and "keys" in doc else doc
        return {str(k): Ed25519PublicKey.from_public_bytes(bytes.fromhex(v))
                for k, v in keys.items()}
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        raise AttestationError(f"{path}: not an identities file ({exc})") from None


def sign(key: Ed25519PrivateKey, st: Statement) -> dict[str, Any]:
    """The transcript record of ``st`` signed with ``key``."""
    return _signed(key, st)[0]


def _canonical(statement: Mapping[str, Any]) -> bytes:
    """:data:`DOMAIN` + a statement's canonical JSON (sorted keys, no spaces)."""
    return DOMAIN + json.dumps(statement, sort_keys=True, separators=(",", ":")).encode()


def _signed(key: Ed25519PrivateKey, st: Statement) -> tuple[dict[str, Any], int]:
    """(the record of ``st`` signed with ``key``, its :func:`record_size`), the statement
    serialised once."""
    body = st.to_json()
    data = _canonical(body)
    rec = {"type": "attestation", "statement": body, "signature": key.sign(data).hex()}
    return rec, len(data) - len(DOMAIN) + _SIG_BYTES


def record_size(rec: Mapping[str, Any]) -> int:
    """Bytes a statement costs on the wire: its canonical JSON and the signature."""
    return len(Statement.from_json(rec["statement"]).signed_bytes()) - len(DOMAIN) + _SIG_BYTES


def _book(ctx: Any, rec: dict[str, Any], cpu_s: float, size: int | None = None) -> None:
    """Put a statement in the transcript and its cost on the ledger (stage STAGE);
    ``size``: its :func:`record_size`, when known."""
    from secagg.costs import CostRow

    st = rec["statement"]
    size = record_size(rec) if size is None else size
    row = CostRow(round=ctx.round, phase=ctx.phase, stage=STAGE, sender=st["sender"],
                  receiver=st["receiver"], wire_bytes=size, client_cpu_s=float(cpu_s))
    ctx.ledger.record(row)
    ctx.transcript.records.append(rec)
    ctx.transcript.message(round=ctx.round, phase=ctx.phase, stage=STAGE, sender=st["sender"],
                           receiver=st["receiver"], direction=row.direction, nbytes=size)


def _is_signer(party: Any) -> bool:
    """Clients (int ids) and the decryptor sign what they send; the server does not."""
    return (isinstance(party, int) and not isinstance(party, bool)) or party == "decryptor"


class Signer:
    """The clients' side in one process: one Ed25519 key per client (and the decryptor),
    fresh (or the pinned ``identities`` of ``SecureSum(identities=...)``), and a statement
    signed for every message a client sends (:meth:`sent`).

    Args:
        parties: the client ids (the decryptor is added).
        layer: the run's layer description (its digest is in every statement).
        noise: the DP noise parameters the clients apply themselves (None: none).
        keys: pinned private keys by party (the rest are generated).
        run: the run tag (default: 16 random bytes, hex).
    """

    def __init__(self, *, parties: Iterable[int], layer: Any, noise: Any = None,
                 keys: Mapping[Any, Ed25519PrivateKey] | None = None,
                 run: str | None = None) -> None:
        pinned = dict(keys or {})
        self.keys: dict[Any, Ed25519PrivateKey] = {
            p: pinned.get(p) or Ed25519PrivateKey.generate()
            for p in [*parties, "decryptor"]}
        self.run = run or secrets.token_hex(16)
        self.params: dict[str, Any] = {"layer": params_digest(layer)}
        if noise is not None:
            self.params["noise"] = noise

    def identities(self) -> dict[str, str]:
        """``{party: public key hex}``."""
        return {str(p): public_hex(k) for p, k in self.keys.items()}

    def header(self) -> dict[str, Any]:
        """The run header's ``attestation`` block."""
        return {"scheme": SCHEME, "run": self.run, "keys": self.identities()}

    def sent(self, ctx: Any, sender: Any, receiver: Any, stage: str, message: Any,
             noised: Iterable[str] = (), digest: str | None = None) -> None:
        """``sender`` sent ``message``: sign its statement (clients and the decryptor
        only) and book it. ``digest``: the message's :func:`message_digest`, when the
        caller has it."""
        if not _is_signer(sender) or receiver != "server" or sender not in self.keys:
            return
        t0 = time.process_time()
        form, fields, mine = classify(message, noised=noised)
        st = Statement(run=self.run, round=int(ctx.round), phase=str(ctx.phase), stage=stage,
                       sender=sender, receiver=receiver,
                       digest=digest or message_digest(message),
                       form=form, fields=fields, noised=mine, params=self.params)
        rec, size = _signed(self.keys[sender], st)
        _book(ctx, rec, time.process_time() - t0, size)


class Collector:
    """The server's side on a remote runtime: the statements the nodes sent with their
    replies (:meth:`received`), each put in the transcript when the server books the
    message it is about (:meth:`sent`, from ``RoundContext.message``)."""

    def __init__(self, *, run: str) -> None:
        self.run = run
        self.keys: dict[str, str] = {}
        self._pool: dict[tuple[str, str], list[tuple[dict[str, Any], float]]] = {}

    def header(self) -> dict[str, Any]:
        """The run header's ``attestation`` block (the keys the nodes announced)."""
        return {"scheme": SCHEME, "run": self.run, "keys": self.keys}  # filled in as the
        # decryptor is known (the header is written out at the end of the run)

    def received(self, sender: Any, raw: str, cpu_s: float = 0.0) -> None:
        """Keep the statements (JSON list of records) node ``sender`` sent with a reply
        (as itself, or as the HE decryptor: that node's key is then the decryptor's)."""
        try:
            recs = json.loads(raw)
        except ValueError:
            return  # the audit reports the statements as missing
        for rec in recs if isinstance(recs, list) else []:
            st = rec.get("statement", {}) if isinstance(rec, dict) else {}
            who = st.get("sender")
            if who == "decryptor" and str(sender) in self.keys:
                self.keys.setdefault("decryptor", self.keys[str(sender)])
            elif who != sender:
                continue
            self._pool.setdefault((str(who), str(st.get("digest"))), []).append(
                (rec, cpu_s / max(len(recs), 1)))

    def sent(self, ctx: Any, sender: Any, receiver: Any, stage: str, message: Any,
             noised: Iterable[str] = (), digest: str | None = None) -> None:
        """The server books ``message`` from ``sender``: its statement goes in."""
        if not _is_signer(sender) or receiver != "server":
            return
        got = self._pool.get((str(sender), digest or message_digest(message)))
        if got:
            rec, cpu = got.pop(0)
            _book(ctx, rec, cpu)


def sign_reply(key: Ed25519PrivateKey, *, run: str, round: int, phase: str, sender: Any,
               messages: Mapping[str, tuple[str, Any]], params: Mapping[str, Any],
               noised: Iterable[str] = ()) -> str:
    """A node's statements for the messages of one reply (``messages``: reply field ->
    (stage, message)), as the JSON list the reply carries."""
    out = []
    for _, (stage, msg) in sorted(messages.items()):
        form, fields, mine = classify(msg, noised=noised)
        st = Statement(run=run, round=int(round), phase=phase, stage=stage, sender=sender,
                       receiver="server", digest=message_digest(msg), form=form,
                       fields=fields, noised=mine, params=dict(params))
        out.append(sign(key, st))
    return json.dumps(out)


# ---------------------------------------------------------------- verification


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One failed check: the transcript line (1-based) and what is wrong."""

    line: int
    kind: str  # missing | forged | contradicted | key
    text: str

    def __str__(self) -> str:
        return f"record {self.line}: {self.kind}: {self.text}"


def _same_party(a: Any, b: Any) -> bool:
    return str(a) == str(b)


def verify(records: list[dict[str, Any]], identities: Mapping[str, Ed25519PublicKey]
           ) -> list[Problem]:
    """Check a transcript's records against public keys held outside it.

    Every ``attestation`` record must carry a valid signature by its sender's key in
    ``identities`` on a statement of this run; the header's keys must be those keys;
    every message a client or the decryptor sent must have its statement (same round,
    phase, stage, sender, receiver); and every server observation of something a client
    sent must agree with that client's statements of the stage: the same form, and for
    arrays the same digest per field (encrypted: the message's digest).
    """
    problems: list[Problem] = []
    header_i, header = next(((i, r) for i, r in enumerate(records, 1)
                             if r.get("type") == "run"), (0, {}))
    block = header.get("attestation") if isinstance(header, dict) else None
    if not isinstance(block, dict):
        return [Problem(line=header_i or 1, kind="missing",
                        text="the transcript carries no client attestation")]
    run = block.get("run")
    for party, key in sorted((block.get("keys") or {}).items()):
        want = identities.get(str(party))  # (a party absent from the file: any
        if want is not None and public_hex(want) != key:  # statement of it is refused)
            problems.append(Problem(line=header_i, kind="key", text=(
                f"run header: the key of party {party} is not its key in the identities "
                "file (replaced)")))
    good: dict[tuple[Any, ...], list[Statement]] = {}
    for i, r in enumerate(records, 1):
        if r.get("type") != "attestation":
            continue
        try:
            st = Statement.from_json(r.get("statement") or {})
            sig = bytes.fromhex(str(r.get("signature", "")))
        except (AttestationError, ValueError) as exc:
            problems.append(Problem(line=i, kind="forged", text=f"unreadable statement: {exc}"))
            continue
        key = identities.get(str(st.sender))
        if key is None:
            problems.append(Problem(line=i, kind="forged", text=(
                f"statement of {st.sender}, who has no key in the identities file")))
            continue
        try:
            key.verify(sig, st.signed_bytes())
        except InvalidSignature:
            problems.append(Problem(line=i, kind="forged", text=(
                f"the signature of {st.sender}'s statement (round {st.round}, phase "
                f"{st.phase!r}, stage {st.stage!r}) does not verify")))
            continue
        if st.run != run:
            problems.append(Problem(line=i, kind="forged", text=(
                f"{st.sender}'s statement is from another run ({st.run})")))
            continue
        if "layer" in st.params and "layer" in header and \
                st.params["layer"] != params_digest(header["layer"]):
            problems.append(Problem(line=i, kind="contradicted", text=(
                f"{st.sender} was told other layer parameters than the run header states")))
        good.setdefault((st.round, st.phase, st.stage, str(st.sender), str(st.receiver)),
                        []).append(st)
    # every message a client sent has its statement (as many as messages): the one
    # with its digest where the record has one, else one with its labels
    by_digest: dict[tuple[str, str, str], int] = {}
    for v in good.values():
        for st in v:
            k = (str(st.sender), str(st.receiver), st.digest)
            by_digest[k] = by_digest.get(k, 0) + 1
    counts: dict[tuple[Any, ...], int] = {}
    for i, r in enumerate(records, 1):
        if r.get("type") != "message" or r.get("stage") == STAGE:
            continue
        if not _is_signer(r.get("sender")) or r.get("receiver") != "server" \
                or str(r.get("stage", "")).startswith("dropped:"):
            continue
        if "digest" in r:
            key = (str(r["sender"]), str(r["receiver"]), str(r["digest"]))
            have = by_digest.get(key, 0)  # type: ignore[arg-type]
        else:
            key = (r["round"], r["phase"], r["stage"], str(r["sender"]), str(r["receiver"]))
            have = len(good.get(key, []))
        counts[key] = counts.get(key, 0) + 1
        if counts[key] > have:
            problems.append(Problem(line=i, kind="missing", text=(
                f"message from {r['sender']} to {r['receiver']} (round {r['round']}, phase "
                f"{r['phase']!r}, stage {r['stage']!r}) has no signed statement")))
    # every observation of what a client sent agrees with the client's statements
    for i, r in enumerate(records, 1):
        if r.get("type") != "observation" or not _is_signer(r.get("sender")):
            continue
        if r.get("phase") == UNSIGNED_PHASE:
            continue  # a node's evaluation reply is a measurement, not a signed message
        if _same_party(r.get("sender"), r.get("party")):
            continue  # a party's view of its own value
        sts = [s for k, v in good.items() if k[:4] == (r["round"], r["phase"], r["stage"],
                                                         str(r["sender"])) for s in v]
        sts = [s for s in sts if s.form != "protocol"]
        what = (f"{r.get('party')} saw {r['form']} {r['field']!r} from {r['sender']} "
                f"(round {r['round']}, phase {r['phase']!r}, stage {r['stage']!r})")
        if not sts:
            problems.append(Problem(line=i, kind="missing", text=(
                f"{what}, but {r['sender']} signed no such message")))
            continue
        name = r["field"]
        same = [s for s in sts if s.form_of(name) == r["form"]]
        if not same:
            forms = sorted({s.form_of(name) for s in sts})
            problems.append(Problem(line=i, kind="contradicted", text=(
                f"{what}; {r['sender']} signed it as sent {'/'.join(forms)}")))
            continue
        if r["form"] == "encrypted":
            ok = any(s.digest == r.get("digest") for s in same)
        elif r["form"] in ("clear", "noised"):
            # a field the statement does not name (the flat vector a Flower decryptor
            # returns): bound by the message digest only
            ok = any(s.fields.get(name, r.get("digest")) == r.get("digest") for s in same)
        else:
            ok = True  # masked slices: the statement binds the whole MASKED message
        if not ok:
            problems.append(Problem(line=i, kind="contradicted", text=(
                f"{what}: its digest is not the one {r['sender']} signed")))
    return problems


def load_pinned(keys: Mapping[Any, Any] | None) -> dict[Any, Ed25519PrivateKey]:
    """Private keys usable as identities (``SecureSum(identities=...)``), else {}."""
    if not keys:
        return {}
    if not all(isinstance(k, Ed25519PrivateKey) for k in keys.values()):
        raise ConfigurationError("identities must map parties to Ed25519 private keys")
    return dict(keys)
