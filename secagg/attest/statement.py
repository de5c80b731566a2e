"""One signed statement about one message a party sent: the scheme's vocabulary, the
:class:`Statement` itself, the digests and form it binds (:func:`classify`), and its
signed record (:func:`sign`, :func:`record_size`) and the same records read back from a
transcript (:func:`attestation_records`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secagg.errors import SecaggError
from secagg.stages import Stage
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
UNSIGNED_PHASE = Stage.EVALUATE


class AttestationError(SecaggError, ValueError):
    """An identities file or a statement that cannot be read."""


@dataclass(frozen=True, kw_only=True)
class Statement:
    """What a client says about one message it sent (see :mod:`secagg.attest`)."""

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


class AttestationRecord(NamedTuple):
    """One ``attestation`` record of a transcript, parsed but not verified: its line
    (1-based), and its statement and signature, or why it cannot be read (``error``; the
    statement is then None and the signature empty)."""

    line: int
    statement: Statement | None
    signature: bytes
    error: str | None


def attestation_records(records: Iterable[Mapping[str, Any]]) -> Iterator[AttestationRecord]:
    """The ``attestation`` records of a transcript's records, in file order, each parsed
    (:meth:`Statement.from_json`, the signature from hex). An unreadable one is yielded
    with its ``error`` rather than raised, so that a caller can report or skip it and read
    on. Nothing is verified here: the signature is checked by the caller, against a key
    it holds."""
    for i, r in enumerate(records, 1):
        if r.get("type") != "attestation":
            continue
        try:
            st = Statement.from_json(r.get("statement") or {})
            sig = bytes.fromhex(str(r.get("signature", "")))
        except (AttestationError, ValueError) as exc:
            yield AttestationRecord(i, None, b"", str(exc))
            continue
        yield AttestationRecord(i, st, sig, None)


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
    """(form, field digests) of a message as its sender sees it: packed arrays (``secagg.wire``)
    are ``clear`` -- ``noised`` when their fields are among ``noised`` -- with each array's
    digest (as :func:`secagg.transcript.digest` computes it); a ciphertext message (``SHE``)
    is ``encrypted``; a secure-sum MASKED message and a validated-sum SHARE_X (an additive
    share of the update) are ``masked``; anything else is a ``protocol`` message. The third
    item: the fields the sender noised."""
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
    if head[:4] == b"VSUM" and len(head) > 5 and head[5] == 1:  # validated_sum.wire SHARE_X
        return "masked", {}, []
    return "protocol", {}, []


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
