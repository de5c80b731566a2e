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

Scheme v2 (:data:`SCHEME`, the in-process signer's): each statement also carries ``seq``,
its signer's sequence number over the run, and every party closes the run with a signed
closing statement (stage :data:`END_STAGE`, no message) giving its count and the DP terms
the run applied (:func:`dp_terms`). :func:`verify` then requires, for every party in the
identities, the numbers 0 .. n-1 each once and in order, so a party erased, a message
dropped with its statement, or a moved or replayed statement fails; and the audit
recomputes every epsilon from the signed terms (:func:`recompute_dp`). Scheme v1
(:data:`SCHEME_V1`: a bare PKI mapping of keys) has no numbers.

Where statements are made: in one process, :meth:`secagg.layers.base.RoundContext.message`
(every client message passes there) hands the message to a :class:`Signer`; on Flower,
each node signs its reply's messages (:func:`sign_reply`), numbered from the counter it
keeps in its own ``Context.state``, and the server's :class:`Collector` puts the statement
that came with a message into the transcript when it books that message. Either way each
statement is one cost-ledger row of stage :data:`STAGE` (its bytes, and the signer's CPU
time). The closing statement is the same (:func:`closing_statement`): in one process the
signer closes every party with the run's DP terms; on Flower the server sends every node a
``close`` request with those terms (:meth:`Collector.close`), and each node first checks
them against the releases it noised itself (:func:`check_applied`; it refuses terms that
leave one out or describe less noise), then signs its count, the terms and those releases
(``applied``). A node that does not answer is recorded (:data:`UNCLOSED`) and the audit
names what it cannot check of it.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
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
#: The first scheme: statements without sequence numbers (an identities file that names no
#: scheme, e.g. a bare PKI mapping). An audit under it cannot see a party's records removed
#: whole, or a message removed with its statement, and says so.
SCHEME_V1 = "ed25519/secagg-attest-v1"
#: The scheme of the in-process signer and of Flower nodes: every statement carries its
#: signer's sequence number (0, 1, 2, ... over the run) and each party closes the run with
#: a signed closing statement (stage :data:`END_STAGE`) giving its count and the DP terms
#: applied, so a dropped party, a dropped message or a moved record fails the audit.
SCHEME = "ed25519/secagg-attest-v2"
#: The stage of a party's closing statement (no message: it closes the party's sequence).
END_STAGE = "end"
#: The transcript record of a party asked to close its sequence that did not (remote runtimes).
UNCLOSED = "unclosed"
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
    #: the signer's sequence number over the run (scheme v2); None under scheme v1
    seq: int | None = None

    @property
    def closing(self) -> bool:
        """Whether this is a party's closing statement (no message; see :data:`END_STAGE`)."""
        return self.stage == END_STAGE and self.form == "protocol" and not self.digest

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
                "noised": list(self.noised), "params": dict(self.params),
                **({} if self.seq is None else {"seq": self.seq})}

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
            st = cls(**d)
        except TypeError as exc:
            raise AttestationError(f"not a statement: {exc}") from None
        if st.seq is not None and (isinstance(st.seq, bool) or not isinstance(st.seq, int)
                                   or st.seq < 0):
            raise AttestationError(f"not a statement: sequence number {st.seq!r}")
        try:
            st.signed_bytes()
        except TypeError as exc:
            raise AttestationError(f"not a statement: {exc}") from None
        return st


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


class Identities(dict):  # type: ignore[type-arg]
    """``{party (as a string): Ed25519 public key}`` read from outside the transcript, with
    the attestation ``scheme`` the file names (:data:`SCHEME_V1` when it names none, as a
    bare PKI mapping) and the ``path`` it came from (None: built in memory)."""

    def __init__(self, keys: Mapping[str, Ed25519PublicKey], *, scheme: str = SCHEME_V1,
                 path: Path | None = None) -> None:
        super().__init__(keys)
        self.scheme = scheme
        self.path = path


def write_identities(path: str | Path, keys: Mapping[Any, str], *,
                     scheme: str = SCHEME_V1) -> Path:
    """Write ``{party: public key hex}`` as an identities file (parties as strings), naming
    ``scheme`` (:data:`SCHEME` when every party signs sequence numbers and a closing
    statement: the audit then requires them)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"scheme": scheme, "keys": {str(k): v for k, v in keys.items()}},
                            indent=2, sort_keys=True) + "\n")
    return p


def read_identities(path: str | Path) -> Identities:
    """The :class:`Identities` of an identities file.

    Raises:
        AttestationError: not such a file, a key that is not 32 hex bytes, or an unknown
            scheme.
    """
    try:
        doc = json.loads(Path(path).read_text())
        keys = doc["keys"] if isinstance(doc, dict) and "keys" in doc else doc
        scheme = doc.get("scheme", SCHEME_V1) if isinstance(doc, dict) and "keys" in doc \
            else SCHEME_V1
        out = {str(k): Ed25519PublicKey.from_public_bytes(bytes.fromhex(v))
               for k, v in keys.items()}
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as exc:
        raise AttestationError(f"{path}: not an identities file ({exc})") from None
    if scheme not in (SCHEME_V1, SCHEME):
        raise AttestationError(f"{path}: unknown attestation scheme {scheme!r}")
    return Identities(out, scheme=scheme, path=Path(path))


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


def _closes(party: Any, signed: int) -> bool:
    """Whether ``party`` signs a closing statement: every client; the decryptor only when
    it took part (a run without a decryptor needs no decryptor key)."""
    return party != "decryptor" or signed > 0


def dp_terms(privacy: Any) -> dict[str, Any]:
    """The DP terms a privacy ledger (:class:`secagg.privacy.accountant.PrivacyLedger`)
    holds, as a party signs them in its closing statement: the accountant's settings, each
    release's mechanism and parameters (noise multiplier, noise share and survivor count,
    ...) with the fields and phase it covers and why it is not private (a fixed noise seed),
    the fields released without noise, and every reason the run is not private. The
    audit's own accountant recomputes every epsilon from these (:func:`recompute_dp`)."""
    from secagg.errors import PrivacyError
    from secagg.privacy.client_ledger import event_to_dict

    events = []
    for e in privacy.events:
        try:
            d = event_to_dict(e)
        except PrivacyError:
            d = {"mechanism": getattr(e, "mechanism", "?"), "count": e.count,
                 "unsupported": True}
        d.update(fields=list(e.fields), phase=e.phase, round=e.round,
                 not_private_reason=e.not_private_reason)
        events.append(d)
    return {"delta": privacy.delta, "accountant": privacy.accountant,
            "pld_discretization": privacy.pld_discretization, "events": events,
            "unnoised": [[p, f, why] for (p, f), why in sorted(
                privacy.unnoised.items(), key=lambda kv: (str(kv[0][0]), kv[0][1]))],
            "not_private": list(privacy.not_private_reasons)}


def recompute_dp(terms: Mapping[str, Any]) -> Any:
    """A fresh :class:`~secagg.privacy.accountant.PrivacyLedger` holding the releases that
    ``terms`` (:func:`dp_terms`, as signed) describe: the audit's own accountant.

    Raises:
        AttestationError: terms that no accountant can rebuild (the message says which).
    """
    import dataclasses

    from secagg.errors import PrivacyError
    from secagg.privacy.accountant import PrivacyLedger
    from secagg.privacy.client_ledger import event_from_dict

    try:
        led = PrivacyLedger(delta=terms.get("delta"),
                            accountant=str(terms.get("accountant", "auto")),
                            pld_discretization=float(terms.get("pld_discretization", 1e-4)))
        for d in terms.get("events", []):
            if d.get("unsupported"):
                raise AttestationError(f"a {d.get('mechanism')!r} release cannot be "
                                       "recomputed by any accountant")
            ev = dataclasses.replace(
                event_from_dict(d), fields=tuple(d.get("fields", ())), phase=d.get("phase"),
                round=d.get("round"), not_private_reason=str(d.get("not_private_reason", "")))
            led.extend([ev])
        for p, f, why in terms.get("unnoised", []):
            led.mark_unnoised(f, p, why)
        for why in terms.get("not_private", []):
            if why not in led.not_private_reasons:
                led.mark_not_private(why)
    except (PrivacyError, TypeError, ValueError, AttributeError) as exc:
        raise AttestationError(f"signed DP terms unreadable: {exc}") from None
    return led


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
        #: the next sequence number of each party
        self.seq: dict[Any, int] = dict.fromkeys(self.keys, 0)
        self._last_round = 0

    scheme = SCHEME

    def identities(self) -> dict[str, str]:
        """``{party: public key hex}``."""
        return {str(p): public_hex(k) for p, k in self.keys.items()}

    def header(self) -> dict[str, Any]:
        """The run header's ``attestation`` block."""
        return {"scheme": SCHEME, "run": self.run, "keys": self.identities()}

    def published(self) -> dict[str, str]:
        """``{party: public key hex}`` of the parties that close their sequence (every
        client; the decryptor only when it signed something): what the key directory
        publishes and the audit then requires."""
        return {str(p): public_hex(k) for p, k in self.keys.items()
                if _closes(p, self.seq[p])}

    def close(self, transcript: Any, privacy: Any | None = None) -> None:
        """Every party closes its sequence: one signed closing statement each (stage
        :data:`END_STAGE`, ``seq`` = how many statements it signed before, ``params``
        holding that count and the DP terms the run applied: :func:`dp_terms` of
        ``privacy``), appended to ``transcript``. Not on the cost ledger (one statement,
        about 500 bytes, per party per run)."""
        from secagg.privacy.accountant import PrivacyLedger

        params = {**self.params, "statements": 0}
        if isinstance(privacy, PrivacyLedger):
            params["dp"] = dp_terms(privacy)
        for party, key in self.keys.items():
            if not _closes(party, self.seq[party]):
                continue
            transcript.records.append(closing_statement(
                key, run=self.run, round=self._last_round, sender=party,
                count=self.seq[party], params=params))

    def sent(self, ctx: Any, sender: Any, receiver: Any, stage: str, message: Any,
             noised: Iterable[str] = (), digest: str | None = None) -> None:
        """``sender`` sent ``message``: sign its statement (clients and the decryptor
        only) and book it. ``digest``: the message's :func:`message_digest`, when the
        caller has it."""
        if not _is_signer(sender) or receiver != "server" or sender not in self.keys:
            return
        t0 = time.process_time()
        form, fields, mine = classify(message, noised=noised)
        seq = self.seq[sender]
        self.seq[sender] = seq + 1
        self._last_round = max(self._last_round, int(ctx.round))
        st = Statement(run=self.run, round=int(ctx.round), phase=str(ctx.phase), stage=stage,
                       sender=sender, receiver=receiver,
                       digest=digest or message_digest(message),
                       form=form, fields=fields, noised=mine, params=self.params, seq=seq)
        rec, size = _signed(self.keys[sender], st)
        _book(ctx, rec, time.process_time() - t0, size)


class Collector:
    """The server's side on a remote runtime: the statements the nodes sent with their
    replies (:meth:`received`), each put in the transcript when the server books the
    message it is about (:meth:`sent`, from ``RoundContext.message``)."""

    def __init__(self, *, run: str,
                 closer: Callable[[dict[str, Any] | None], Mapping[Any, str]] | None = None
                 ) -> None:
        self.run = run
        self.keys: dict[str, str] = {}
        self._pool: dict[tuple[str, str], list[tuple[dict[str, Any], float]]] = {}
        #: the runtime's closing request (:meth:`close`): sends every node the DP terms,
        #: feeds their replies to :meth:`received`, returns why each silent node failed
        self.closer = closer

    scheme = SCHEME

    def header(self) -> dict[str, Any]:
        """The run header's ``attestation`` block: the keys the nodes announced (trust on
        first use: ``announced``, never a trust root)."""
        return {"scheme": SCHEME, "run": self.run, "keys": self.keys,  # filled in as the
                "announced": True}  # decryptor is known (written out at the end of the run)

    def close(self, transcript: Any, privacy: Any | None = None) -> None:
        """The end of the run: every node is asked to close its signed sequence with the
        DP terms of the run (:func:`dp_terms` of ``privacy``; each node checks them
        against the noise it applied itself before it signs), and the closing statements
        they return go into ``transcript``; a node that does not answer is recorded as
        such (an ``unclosed`` record: the audit then says what it cannot check of it)."""
        if self.closer is None:
            return
        from secagg.privacy.accountant import PrivacyLedger

        failed = self.closer(dp_terms(privacy) if isinstance(privacy, PrivacyLedger)
                             else None)
        for key in sorted(self._pool, key=lambda k: (k[0] != "decryptor", k[0].zfill(12))):
            if key[1]:
                continue
            for rec, _ in self._pool.pop(key):
                if (rec.get("statement") or {}).get("stage") == END_STAGE:
                    transcript.records.append(rec)
        for party, why in sorted(failed.items(), key=lambda kv: str(kv[0]).zfill(12)):
            transcript.records.append({"type": UNCLOSED, "party": str(party),
                                       "reason": str(why)})

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
               noised: Iterable[str] = (), first_seq: int | None = None) -> str:
    """A node's statements for the messages of one reply (``messages``: reply field ->
    (stage, message)), as the JSON list the reply carries; ``first_seq``: the sender's
    next sequence number (scheme :data:`SCHEME`: the statements are numbered from it, in
    reply-field order; None: unnumbered, scheme v1)."""
    out = []
    for i, (_, (stage, msg)) in enumerate(sorted(messages.items())):
        form, fields, mine = classify(msg, noised=noised)
        st = Statement(run=run, round=int(round), phase=phase, stage=stage, sender=sender,
                       receiver="server", digest=message_digest(msg), form=form,
                       fields=fields, noised=mine, params=dict(params),
                       seq=None if first_seq is None else int(first_seq) + i)
        out.append(sign(key, st))
    return json.dumps(out)


def closing_statement(key: Ed25519PrivateKey, *, run: str, round: int, sender: Any,
                      count: int, params: Mapping[str, Any]) -> dict[str, Any]:
    """The record of ``sender``'s closing statement (stage :data:`END_STAGE`, no message):
    ``seq`` = ``count``, the statements it signed before, and ``params`` with that count
    (``statements``) beside the terms given (the DP terms, ``dp``). The same statement in
    one process (:meth:`Signer.close`) and on a Flower node."""
    n = int(count)
    st = Statement(run=run, round=int(round), phase="", stage=END_STAGE, sender=sender,
                   receiver="server", digest="", form="protocol",
                   params={**params, "statements": n}, seq=n)
    return sign(key, st)


def applied_release(round: int, phase: str, layer: str, fields: Iterable[str],
                    noise_multiplier: float | None, seeded: bool) -> dict[str, Any]:
    """What a node keeps about one release it noised itself (in its own state), checked
    against the DP terms it is asked to sign at the end of the run
    (:func:`check_applied`)."""
    return {"round": int(round), "phase": str(phase), "layer": str(layer),
            "fields": sorted(map(str, fields)),
            "noise_multiplier": None if noise_multiplier is None else float(noise_multiplier),
            "seeded": bool(seeded)}


def check_applied(terms: Mapping[str, Any] | None, applied: Iterable[Mapping[str, Any]]
                  ) -> list[str]:
    """Why DP terms (:func:`dp_terms`) misdescribe releases a party noised itself
    (:func:`applied_release`); [] when they cover every one: a release of that round and
    phase covering its fields, for ``local-dp`` a Gaussian event of the noise multiplier
    applied (an event of more noise would understate epsilon), and a release noised from
    a fixed seed marked not private."""
    def names(x: Any) -> set[str]:
        return {str(v) for v in x} if isinstance(x, list | tuple) else set()

    out: list[str] = []
    got = (terms or {}).get("events", []) if isinstance(terms or {}, Mapping) else []
    events = [e for e in got if isinstance(e, Mapping)] if isinstance(got, list) else []
    for a in applied:
        what = f"round {a.get('round')}, phase {a.get('phase')!r}"
        mine = [e for e in events if e.get("round") == a.get("round")
                and e.get("phase") == a.get("phase")
                and names(a.get("fields")) <= names(e.get("fields"))]
        if not mine:
            out.append(f"the terms leave out the release this party noised ({what}, fields "
                       f"{a.get('fields')})")
            continue
        z = a.get("noise_multiplier")
        if a.get("layer") == "local-dp" and z is not None and not any(
                e.get("mechanism") == "gaussian" and isinstance(
                    e.get("noise_multiplier"), int | float)
                and abs(float(e["noise_multiplier"]) - float(z)) <= 1e-9 * max(1.0, float(z))
                for e in mine):
            out.append(f"the terms describe the release of {what} with other noise than "
                       f"this party added (noise multiplier {z})")
        if a.get("seeded") and not (any(e.get("not_private_reason") for e in mine)
                                    or (terms or {}).get("not_private")):
            out.append(f"the terms call the release of {what} private, but this party's "
                       "noise came from a fixed seed")
    return out


# ---------------------------------------------------------------- verification


@dataclass(frozen=True, kw_only=True)
class Problem:
    """One failed check: the transcript line (1-based) and what is wrong."""

    line: int
    kind: str  # missing | forged | contradicted | key | unverified
    text: str

    def __str__(self) -> str:
        return f"record {self.line}: {self.kind}: {self.text}"


def _same_party(a: Any, b: Any) -> bool:
    return str(a) == str(b)


def _label(st: Statement) -> str:
    return f"round {st.round}, phase {st.phase!r}, stage {st.stage!r}"


def verify(records: list[dict[str, Any]], identities: Mapping[str, Ed25519PublicKey], *,
           scheme: str | None = None,
           closings: dict[int, Statement] | None = None) -> list[Problem]:
    """Check a transcript's records against public keys held outside it.

    Every ``attestation`` record must carry a valid signature by its sender's key in
    ``identities`` on a statement of this run; the header's keys must be those keys. Then
    completeness, both ways: every message a client or the decryptor sent has its
    statement (same round, phase, stage, sender, receiver and digest) and every statement
    its message; every server observation of something a client sent agrees with the
    client's statements of the stage (the same form; for arrays the same digest per
    field, encrypted: the message's digest) and every statement of an upload has its
    observations (each field it names, in the form it left, with its digest).

    Under ``scheme`` :data:`SCHEME` (default: the scheme ``identities`` names, else
    :data:`SCHEME_V1`) every party in ``identities`` must also have signed one closing
    statement, and its statements must be numbered 0 .. n-1 with no gap, no repeat and in
    file order: a party's records removed whole, a message removed with its statement,
    or a statement moved, all fail.

    ``closings``, when given, receives every closing statement whose signature verified
    (line -> statement), so that a caller reading their DP terms
    (:func:`secagg.audit.signed_dp`) need not parse and verify them again.
    """
    scheme = scheme or getattr(identities, "scheme", SCHEME_V1)
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
    signed: list[tuple[int, Statement]] = []  # (line, statement), in file order
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
                f"the signature of {st.sender}'s statement ({_label(st)}) does not "
                "verify")))
            continue
        if st.run != run:
            problems.append(Problem(line=i, kind="forged", text=(
                f"{st.sender}'s statement is from another run ({st.run})")))
            continue
        if "layer" in st.params and "layer" in header and \
                st.params["layer"] != params_digest(header["layer"]):
            problems.append(Problem(line=i, kind="contradicted", text=(
                f"{st.sender} was told other layer parameters than the run header states")))
        signed.append((i, st))
        if st.closing and closings is not None:
            closings[i] = st
        if not st.closing:
            good.setdefault((st.round, st.phase, st.stage, str(st.sender), str(st.receiver)),
                            []).append(st)
    problems += _messages_match(records, good)
    problems += _observations_match(records, good)
    unclosed = {str(r.get("party")): (i, str(r.get("reason", "")))
                for i, r in enumerate(records, 1) if r.get("type") == UNCLOSED}
    problems += _sequences(signed, identities, scheme, unclosed,
                           remote=bool(block.get("announced")))
    problems.sort(key=lambda p: (p.line == 0, p.line))  # records first, then wholes
    return problems


def _messages_match(records: list[dict[str, Any]],
                    good: Mapping[tuple[Any, ...], list[Statement]]) -> list[Problem]:
    """Every message a signer sent has its statement and every statement its message,
    one to one, on (round, phase, stage, sender, receiver, digest)."""
    problems: list[Problem] = []
    # a numbered statement (scheme v2) names its message exactly; an unnumbered one
    # (scheme v1), or one without a phase (a Flower node's advertise ahead of a phase it
    # does not know yet; its number still fixes its place), by sender, receiver and digest
    unmatched: dict[tuple[Any, ...], list[Statement]] = {}
    for k, v in good.items():
        for st in v:
            key = (*k, st.digest) if st.seq is not None and st.phase \
                else (k[3], k[4], st.digest)
            unmatched.setdefault(key, []).append(st)
    for i, r in enumerate(records, 1):
        if r.get("type") != "message" or r.get("stage") == STAGE:
            continue
        if not _is_signer(r.get("sender")) or r.get("receiver") != "server" \
                or str(r.get("stage", "")).startswith("dropped:"):
            continue
        base = (r.get("round"), r.get("phase"), r.get("stage"), str(r.get("sender")),
                str(r.get("receiver")))
        if "digest" in r:
            pool = unmatched.get((*base, str(r["digest"])), []) or unmatched.get(
                (*base[3:], str(r["digest"])), [])
        else:  # a record without a digest: one statement of the same labels
            pool = next((v for k, v in unmatched.items() if k[:5] == base and v), [])
        if pool:
            pool.pop(0)
            continue
        problems.append(Problem(line=i, kind="missing", text=(
            f"message from {r.get('sender')} to {r.get('receiver')} (round {r.get('round')}, "
            f"phase {r.get('phase')!r}, stage {r.get('stage')!r}) has no signed statement "
            "(of that round, phase, stage and digest)")))
    for v in unmatched.values():
        for st in v:
            problems.append(Problem(line=0, kind="missing", text=(
                f"{st.sender} signed a message ({_label(st)}, digest {st.digest[:12]}...) "
                "that the server's transcript does not record (removed or moved)")))
    return problems


def _observations_match(records: list[dict[str, Any]],
                        good: Mapping[tuple[Any, ...], list[Statement]]) -> list[Problem]:
    """Every server observation of what a signer sent agrees with its statements, and
    every statement of values (clear, noised, encrypted, masked) has its observations."""
    problems: list[Problem] = []
    seen: list[dict[str, Any]] = []
    for i, r in enumerate(records, 1):
        if r.get("type") != "observation" or not _is_signer(r.get("sender")):
            continue
        if r.get("phase") == UNSIGNED_PHASE:
            continue  # a node's evaluation reply is a measurement, not a signed message
        if _same_party(r.get("sender"), r.get("party")):
            continue  # a party's view of its own value
        seen.append(r)
        sts = good.get((r.get("round"), r.get("phase"), r.get("stage"), str(r.get("sender")),
                        "server"), [])
        sts = [s for s in sts if s.form != "protocol"]
        what = (f"{r.get('party')} saw {r.get('form')} {r.get('field')!r} from "
                f"{r.get('sender')} (round {r.get('round')}, phase {r.get('phase')!r}, stage "
                f"{r.get('stage')!r})")
        if not sts:
            problems.append(Problem(line=i, kind="missing", text=(
                f"{what}, but {r.get('sender')} signed no such message")))
            continue
        name = r.get("field")
        same = [s for s in sts if s.form_of(str(name)) == r.get("form")]
        if not same:
            forms = sorted({s.form_of(str(name)) for s in sts})
            problems.append(Problem(line=i, kind="contradicted", text=(
                f"{what}; {r.get('sender')} signed it as sent {'/'.join(forms)}")))
            continue
        if r.get("form") == "encrypted":
            ok = any(s.digest == r.get("digest") for s in same)
        elif r.get("form") in ("clear", "noised"):
            # a field the statement does not name (the flat vector a Flower decryptor
            # returns): bound by the message digest only
            ok = any(s.fields.get(str(name), r.get("digest")) == r.get("digest")
                     for s in same)
        else:
            ok = True  # masked slices: the statement binds the whole MASKED message
        if not ok:
            problems.append(Problem(line=i, kind="contradicted", text=(
                f"{what}: its digest is not the one {r.get('sender')} signed")))
    # the other way: what a signer says it sent, the server's transcript shows it saw
    by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in seen:
        if r.get("party") != "server":
            continue
        by_key.setdefault((r.get("round"), r.get("phase"), r.get("stage"),
                           str(r.get("sender"))), []).append(r)
    # (an observation that exists but disagrees is reported above as contradicted)
    for k, v in good.items():
        obs = by_key.get(k[:4], [])
        names = {str(o.get("field")) for o in obs}
        for st in v:
            if st.form == "protocol":
                continue
            if st.form in ("masked", "encrypted") or not names & set(st.fields):
                # masked: bound through the whole message; a field the server's record does
                # not name (a Flower decryptor's flat vector): any observation of the message
                if not obs:
                    problems.append(Problem(line=0, kind="missing", text=(
                        f"{st.sender} signed a {st.form} upload ({_label(st)}) that the "
                        "server's transcript never records seeing (deleted: the audit would "
                        "under-report what the server saw)")))
                continue
            for name in sorted(set(st.fields) - names):
                problems.append(Problem(line=0, kind="missing", text=(
                    f"{st.sender} signed {name!r} as sent {st.form_of(name)} ({_label(st)}); "
                    "the server's transcript has no observation of it (deleted: the audit "
                    "would under-report what the server saw)")))
    return problems


def _sequences(signed: list[tuple[int, Statement]], identities: Mapping[str, Any],
               scheme: str, unclosed: Mapping[str, tuple[int, str]] | None = None,
               remote: bool = False) -> list[Problem]:
    """Per-party sequence numbers (scheme :data:`SCHEME`): each party in ``identities``
    closes with one statement whose ``seq`` counts those before it, numbered 0 .. n-1,
    each once, in file order; under :data:`SCHEME_V1`, only the numbers present. A party
    the server records as not answering its closing request (``unclosed``: party ->
    (line, reason)) is a problem too (``unverified``): what it cannot check is named.
    ``remote``: the signers were remote nodes (a gap may be a reply lost in transit, which
    the text then says)."""
    unclosed = unclosed or {}
    problems: list[Problem] = []
    by_party: dict[str, list[tuple[int, Statement]]] = {}
    for i, st in signed:
        by_party.setdefault(str(st.sender), []).append((i, st))
    parties = sorted(set(by_party) | (set(map(str, identities)) if scheme == SCHEME
                                      else set()))
    for party in parties:
        mine = by_party.get(party, [])
        if scheme != SCHEME and all(st.seq is None for _, st in mine):
            continue
        if any(st.seq is None for _, st in mine):
            problems.append(Problem(line=next(i for i, st in mine if st.seq is None),
                                    kind="forged", text=(
                f"party {party}: a statement without a sequence number under scheme "
                f"{scheme}")))
            continue
        closes = [(i, st) for i, st in mine if st.closing]
        if not closes:
            n = 1 + max((st.seq for _, st in mine), default=-1)  # type: ignore[type-var]
            if party in unclosed:
                line, why = unclosed[party]
                problems.append(Problem(line=line, kind="unverified", text=(
                    f"party {party} signed no closing statement; the server records that it "
                    f"did not answer the closing request ({why}). Unverifiable for it: how "
                    f"many statements it signed (so whether any after number {n - 1} were "
                    "removed with their messages) and the DP terms it applied")))
            else:
                problems.append(Problem(line=0, kind="missing", text=(
                    f"party {party} signed no closing statement: "
                    + ("all its records were removed" if not mine else
                       f"its last statements were removed (it has {len(mine)} left)"))))
        else:
            if len(closes) > 1:
                problems.append(Problem(line=closes[1][0], kind="forged", text=(
                    f"party {party}: {len(closes)} closing statements (replayed)")))
            n = int(closes[0][1].seq)  # type: ignore[arg-type]
            if closes[0][1].params.get("statements") != n:
                problems.append(Problem(line=closes[0][0], kind="contradicted", text=(
                    f"party {party}: its closing statement counts "
                    f"{closes[0][1].params.get('statements')} statements at number {n}")))
        counts: dict[int, int] = {}
        for _, st in mine:
            if not st.closing:
                counts[int(st.seq)] = counts.get(int(st.seq), 0) + 1  # type: ignore[arg-type]
        gone = [k for k in range(n) if k not in counts]
        if gone:
            problems.append(Problem(line=0, kind="missing", text=(
                f"party {party}: statements number {_spans(gone)} of its 0-{n - 1} are "
                "missing (its messages were removed with their statements"
                + ("; or, on this remote runtime, replies that reached the server after "
                   "their stage's timeout or not at all: the audit cannot tell those from "
                   "deleted ones" if remote else "") + ")")))
        extra = sorted(k for k, c in counts.items() if c > 1 or k >= n)
        if extra:
            problems.append(Problem(line=0, kind="forged", text=(
                f"party {party}: statements number {_spans(extra)} repeat or lie past its "
                f"closing count {n} (replayed)")))
        last = -1
        for i, st in mine:
            if st.seq is not None and st.seq < last:  # type: ignore[operator]
                problems.append(Problem(line=i, kind="contradicted", text=(
                    f"party {party}: statement number {st.seq} stands after number {last} "
                    "(records moved)")))
                break
            last = max(last, st.seq if st.seq is not None else last)
    return problems


def _spans(nums: list[int]) -> str:
    """``0-3,7`` of sorted ints."""
    out: list[str] = []
    for k in sorted(nums):
        if out and out[-1].endswith(f"-{k - 1}") or out and out[-1] == str(k - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{k}"
        else:
            out.append(str(k))
    return ",".join(out)


def load_pinned(keys: Mapping[Any, Any] | None) -> dict[Any, Ed25519PrivateKey]:
    """Private keys usable as identities (``SecureSum(identities=...)``), else {}."""
    if not keys:
        return {}
    if not all(isinstance(k, Ed25519PrivateKey) for k in keys.values()):
        raise ConfigurationError("identities must map parties to Ed25519 private keys")
    return dict(keys)
