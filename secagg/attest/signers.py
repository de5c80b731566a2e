"""Where statements are made: the clients' :class:`Signer` in one process, the server's
:class:`Collector` of the statements remote nodes send, a node's :func:`sign_reply`, and
every party's :func:`closing_statement`; each statement booked on the cost ledger.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secagg.attest.identities import public_hex
from secagg.attest.statement import (
    END_STAGE,
    SCHEME,
    STAGE,
    UNCLOSED,
    Statement,
    _signed,
    classify,
    message_digest,
    params_digest,
    record_size,
    sign,
)
from secagg.attest.terms import dp_terms
from secagg.attest.told import run_tag, told_digest, told_params


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


class Signer:
    """The clients' side in one process: one Ed25519 key per client (and the decryptor),
    fresh (or the pinned ``identities`` of ``SecureSum(identities=...)``), and a statement
    signed for every message a client sends (:meth:`sent`).

    Args:
        parties: the client ids (the decryptor is added).
        layer: the run's layer description (its digest, and the digest of the carrying
            layer's parameters the clients hold, :func:`secagg.attest.told.told_digest`,
            are in every statement).
        noise: the DP noise parameters the clients apply themselves (None: none).
        keys: pinned private keys by party (the rest are generated).
        run: the run tag (default: a fresh :func:`secagg.attest.told.run_tag`).
    """

    def __init__(self, *, parties: Iterable[int], layer: Any, noise: Any = None,
                 keys: Mapping[Any, Ed25519PrivateKey] | None = None,
                 run: str | None = None) -> None:
        pinned = dict(keys or {})
        self.keys: dict[Any, Ed25519PrivateKey] = {
            p: pinned.get(p) or Ed25519PrivateKey.generate()
            for p in [*parties, "decryptor"]}
        self.run = run or run_tag()
        self.params: dict[str, Any] = {"layer": params_digest(layer)}
        told = told_params(layer)  # what every runtime's client signs of its parameters
        if told is not None:
            self.params["told"] = told_digest(told)
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
