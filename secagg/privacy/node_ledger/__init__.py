"""A node's own privacy ledger file: append-only, digest-chained, crash-safe.

One concept per module: the file's format, chain and verified reading (:mod:`.chain`), its
head file against rollback (:mod:`.head`), the one writer and the repair of a torn line
(:mod:`.writer`), and its reconciliation with a run's transcript (:mod:`.reconciliation`).
Every public name is importable from this package.

A Flower node keeps the privacy events it was charged in a file its node config names
(``ledger-path``). The file outlives a run and a restart of the node, so the node's
budget (:mod:`secagg.flower.client`) is enforced across both.

Format: one JSON object per line (canonical: sorted keys, no spaces, ASCII)::

    {"id": RELEASE_ID, "kind": "intent" | "commit" | "refusal", "payload": {...},
     "prev": DIGEST}

``prev`` is the SHA-256 (hex) of the previous line's bytes (without its newline); the
first line's is :data:`GENESIS`. The *head* of a ledger is the digest of its last line
(:data:`GENESIS` when empty): it names the whole history, so a copy of it held by
someone else (the server records each node's reported head in its transcript) pins the
file -- any later rewrite of a line changes every digest after it.

Invariants a writer keeps (:class:`NodeLedger`):

* **Intent before the upload.** Before a node touches its data for a release it appends
  an ``intent`` entry (the event it will be charged) and ``os.fsync``\\ s the file; only
  then does the step run. After the upload is handed to the transport it appends a
  ``commit`` entry. An intent without a commit (the node crashed in between) counts as
  spent: the upload may have left.
* **Charged once per release.** Entries carry an id (a Flower node uses the release's
  run, round and phase, :func:`release_id`); a second intent for an id already in the file
  (a replayed message, or a second message asking for the same release) is not written
  and not charged, and the node does not answer it again (a fresh answer would be a
  second release).
* **Refusals are kept, not charged.** A release the node refused before touching its data
  (over budget) is a ``refusal`` entry: part of the history, charged nothing.
* **One writer.** A writer holds an exclusive lock on ``PATH.lock``
  (:class:`LedgerLocked` otherwise); the lock dies with the process, so a crash never
  leaves the ledger locked.

* **No silent rollback.** A writer given a *head file* (``head_path``; a Flower node keeps
  it beside its identity key, :mod:`secagg.flower.client`) writes the ledger's head there,
  synced, after every append. On opening, the ledger file must hold that head in its
  chain: a ledger file that is missing, shorter (truncated, even at a line boundary),
  replaced, or a fresh file at a new path is refused (:class:`LedgerRolledBack`), never
  read as less spent. A ledger without a head file is started only on an explicit
  ``init`` (:func:`init_ledger`; a Flower node's ``ledger-init=true``), and only where
  neither the head file nor a non-empty ledger exists (:class:`LedgerUninitialised`
  otherwise). A ledger file moved with its contents keeps its history, and is accepted.

Reading (:func:`read_ledger`) verifies the chain: a line that is not a ledger entry, or
whose ``prev`` does not match, is a :class:`LedgerCorrupt` naming the line. A final line
without its newline is what a crash in the middle of an append leaves: it is reported
(:class:`LedgerTorn`, or :attr:`LedgerState.torn` when asked to tolerate it), never
silently dropped or accepted; :func:`repair_torn_tail` cuts it off (saving the bytes
beside the file) once an operator has looked. A torn line never stands for a release:
the step runs only after its intent is synced.
"""

from __future__ import annotations

from secagg.privacy.node_ledger.chain import (
    GENESIS,
    KINDS,
    Entry,
    LedgerConflict,
    LedgerCorrupt,
    LedgerError,
    LedgerLocked,
    LedgerRolledBack,
    LedgerState,
    LedgerTorn,
    LedgerUninitialised,
    read_ledger,
    release_id,
)
from secagg.privacy.node_ledger.head import check_head, init_ledger
from secagg.privacy.node_ledger.reconciliation import format_reconcile, reconcile
from secagg.privacy.node_ledger.writer import NodeLedger, repair_torn_tail

__all__ = [
    "GENESIS",
    "KINDS",
    "Entry",
    "LedgerConflict",
    "LedgerCorrupt",
    "LedgerError",
    "LedgerLocked",
    "LedgerRolledBack",
    "LedgerState",
    "LedgerTorn",
    "LedgerUninitialised",
    "NodeLedger",
    "check_head",
    "format_reconcile",
    "init_ledger",
    "read_ledger",
    "reconcile",
    "release_id",
    "repair_torn_tail",
]

