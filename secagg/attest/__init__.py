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
parameters the client was told to use: ``told``, the digest of the carrying layer's
parameters as the client holds them, one definition on every runtime
(:func:`secagg.attest.told.told_digest`); in one process also ``layer``, a digest of the
whole layer description; and the DP noise parameters when it adds noise itself).

What the audit proves about those parameters, and against whom: with the parties' keys
held outside the run, a server that tells a client other carrying-layer parameters than
its run header states (e.g. a lower secure-sum threshold for one node), or rewrites the
header afterwards, is caught on both runtimes: every statement whose ``told`` differs from
the digest the audit derives from the header's layer description (whatever DP layer wraps
it) is reported ``contradicted``, naming its signer (:mod:`secagg.attest.told` says what
is and is not covered).

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

One concept per module, every public name importable from this package: the statement,
its vocabulary and signed record (:mod:`.statement`), the parties' keys and identities
files (:mod:`.identities`), the DP terms a party signs (:mod:`.terms`), where statements
are made (:mod:`.signers`), what a client signs about the layer parameters it was told and
the run tag format (:mod:`.told`, imported from there) and the auditor's check
(:mod:`.verification`).
"""

from __future__ import annotations

from secagg.attest.identities import (
    Identities,
    load_pinned,
    public_hex,
    read_identities,
    write_identities,
)
from secagg.attest.signers import Collector, Signer, closing_statement, sign_reply
from secagg.attest.statement import (
    DOMAIN,
    END_STAGE,
    FORMS,
    SCHEME,
    SCHEME_V1,
    STAGE,
    UNCLOSED,
    UNSIGNED_PHASE,
    AttestationError,
    AttestationRecord,
    Statement,
    attestation_records,
    classify,
    message_digest,
    params_digest,
    record_size,
    sign,
)
from secagg.attest.terms import applied_release, check_applied, dp_terms, recompute_dp
from secagg.attest.verification import Problem, verify

__all__ = [
    "DOMAIN",
    "END_STAGE",
    "FORMS",
    "SCHEME",
    "SCHEME_V1",
    "STAGE",
    "UNCLOSED",
    "UNSIGNED_PHASE",
    "AttestationError",
    "AttestationRecord",
    "Collector",
    "Identities",
    "Problem",
    "Signer",
    "Statement",
    "applied_release",
    "attestation_records",
    "check_applied",
    "classify",
    "closing_statement",
    "dp_terms",
    "load_pinned",
    "message_digest",
    "params_digest",
    "public_hex",
    "read_identities",
    "recompute_dp",
    "record_size",
    "sign",
    "sign_reply",
    "verify",
    "write_identities",
]
