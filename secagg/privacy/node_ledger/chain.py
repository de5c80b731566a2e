"""A node ledger file's format and its reading: the entries, the SHA-256 digest chain that
links them, the verified read (:func:`read_ledger`), and the errors a file can raise.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from secagg.errors import PrivacyError

#: ``prev`` of a ledger's first line (and the head of an empty ledger).
GENESIS = hashlib.sha256(b"secagg/node-ledger/v1").hexdigest()
#: The entry kinds.
KINDS = ("intent", "commit", "refusal")
_KEYS = frozenset({"id", "kind", "payload", "prev"})

Kind = Literal["intent", "commit", "refusal"]


class LedgerError(PrivacyError):
    """A node ledger file cannot be used as it is.

    Attributes:
        path: the ledger file.
        line: the 1-based line the problem is on (0: the file as a whole).
    """

    def __init__(self, path: str | Path, line: int, problem: str) -> None:
        self.path, self.line = str(path), int(line)
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"node ledger {where}: {problem}")


class LedgerCorrupt(LedgerError):
    """A line is not a ledger entry, or the digest chain breaks at it (altered, removed or
    inserted lines)."""


class LedgerTorn(LedgerError):
    """The last line was cut mid-write (a crash during an append); ``repair_torn_tail``
    removes it once inspected."""


class LedgerLocked(LedgerError):
    """Another writer holds the ledger."""


class LedgerConflict(LedgerError):
    """An entry contradicts the file: an intent for a message id already charged under
    different terms, a commit without its intent, or a second commit."""


class LedgerRolledBack(LedgerError):
    """The ledger file does not hold the head this node last wrote (its head file): it
    is missing, shorter, replaced, or a new file at another path. Never read as less
    spent: restore the file the head names."""


class LedgerUninitialised(LedgerError):
    """A ledger with no head file: start one only explicitly (:func:`init_ledger`, a
    Flower node's ``ledger-init=true``), never by reading a missing file as empty."""


def release_id(run: str, round: int, phase: str) -> str:
    """The id a node's ledger charges a release under: the run, round and phase it was
    asked for. Stricter than a transport message id: a replayed message, and a fresh
    message asking for the same release again, are both charged once and answered once
    (a second answer would be a second noisy release)."""
    return f"{run}/{int(round)}/{phase}"


def _line(prev: str, kind: str, message_id: str, payload: Mapping[str, Any]) -> bytes:
    return json.dumps({"id": message_id, "kind": kind, "payload": dict(payload), "prev": prev},
                      sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def _digest(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


@dataclass(frozen=True)
class Entry:
    """One verified ledger line.

    Attributes:
        kind: ``"intent"``, ``"commit"`` or ``"refusal"``.
        message_id: the message the entry is about.
        payload: the event (intent, refusal) or the outcome (commit), as JSON.
        prev: the digest of the line before (:data:`GENESIS` for the first).
        digest: the SHA-256 of this line (the head after it).
        line: its 1-based line number.
    """

    kind: Kind
    message_id: str
    payload: dict[str, Any]
    prev: str
    digest: str
    line: int


@dataclass(frozen=True)
class LedgerState:
    """A ledger as read and verified (:func:`read_ledger`).

    Attributes:
        entries: the verified entries, in order.
        head: the digest of the last verified line (:data:`GENESIS` when none).
        torn: the bytes of a torn final line, when the reader was asked to tolerate one
            (None: the file ends cleanly).
    """

    entries: tuple[Entry, ...] = ()
    head: str = GENESIS
    torn: bytes | None = None

    def intents(self) -> dict[str, Entry]:
        """The intent entry of each message id (one per id, in file order)."""
        return {e.message_id: e for e in self.entries if e.kind == "intent"}

    def commits(self) -> dict[str, Entry]:
        """The commit entry of each committed message id."""
        return {e.message_id: e for e in self.entries if e.kind == "commit"}

    def refusals(self) -> list[dict[str, Any]]:
        """The events of the releases refused (charged nothing)."""
        return [dict(e.payload) for e in self.entries if e.kind == "refusal"]

    def charged(self) -> list[dict[str, Any]]:
        """The events the node is charged: one per intent, committed or not (an intent
        without its commit is a crash between the two, and counts as spent), a replayed
        message id once."""
        return [dict(e.payload) for e in self.intents().values()]

    def committed(self) -> list[dict[str, Any]]:
        """The events of the intents that were committed (the uploads handed on)."""
        done = self.commits()
        return [dict(e.payload) for i, e in self.intents().items() if i in done]

    def uncommitted(self) -> list[dict[str, Any]]:
        """The events charged without a commit (crashes between intent and commit)."""
        done = self.commits()
        return [dict(e.payload) for i, e in self.intents().items() if i not in done]

    def head_after(self, digest: str) -> int | None:
        """The index of the entry whose digest is ``digest`` (-1 for :data:`GENESIS`),
        None when no entry has it."""
        if digest == GENESIS:
            return -1
        return next((i for i, e in enumerate(self.entries) if e.digest == digest), None)


def _parse(path: Path, data: bytes, allow_torn: bool) -> LedgerState:
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a newline
    torn: bytes | None = None
    if tail:
        if not allow_torn:
            raise LedgerTorn(path, len(lines) + 1,
                             f"the last line ({len(tail)} bytes) has no newline: an append "
                             "was cut by a crash; it never stands for a release (the step "
                             "runs after its intent is synced). Inspect it, then call "
                             "secagg.privacy.node_ledger.repair_torn_tail(path)")
        torn = tail
    head = GENESIS
    entries: list[Entry] = []
    intents: dict[str, dict[str, Any]] = {}
    commits: set[str] = set()
    for i, raw in enumerate(lines, 1):
        try:
            rec = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise LedgerCorrupt(path, i, "not a JSON ledger entry") from None
        if not isinstance(rec, dict) or set(rec) != _KEYS:
            raise LedgerCorrupt(path, i, f"an entry has exactly the keys {sorted(_KEYS)}")
        kind, mid, payload, prev = rec["kind"], rec["id"], rec["payload"], rec["prev"]
        if kind not in KINDS or not isinstance(mid, str) or not mid \
                or not isinstance(payload, dict):
            raise LedgerCorrupt(path, i, "kind must be intent|commit|refusal, id a non-empty "
                                "string, payload an object")
        if prev != head:
            raise LedgerCorrupt(path, i, "the digest chain breaks here (prev does not match "
                                "the line before: a line was altered, removed or inserted)")
        if kind == "intent":
            if mid in intents:
                raise LedgerConflict(path, i, f"a second intent for message {mid!r}")
            intents[mid] = payload
        elif kind == "refusal":
            pass
        elif mid not in intents or mid in commits:
            raise LedgerConflict(path, i, f"commit of message {mid!r} without its intent, "
                                 "or committed twice")
        else:
            commits.add(mid)
        head = _digest(raw)
        entries.append(Entry(kind=kind, message_id=mid, payload=payload, prev=prev,
                             digest=head, line=i))
    return LedgerState(entries=tuple(entries), head=head, torn=torn)


def read_ledger(path: str | Path, *, allow_torn: bool = False) -> LedgerState:
    """Read and verify the ledger at ``path`` (a missing file is an empty ledger).

    Args:
        path: the ledger file.
        allow_torn: report a torn final line in :attr:`LedgerState.torn` instead of
            raising (the verified entries before it are returned).

    Raises:
        LedgerCorrupt: a line is not an entry, or the chain breaks (the line is named).
        LedgerConflict: an intent repeated or a commit without its intent.
        LedgerTorn: the last line was cut mid-write (unless ``allow_torn``).
    """
    p = Path(path)
    if not p.exists():
        return LedgerState()
    return _parse(p, p.read_bytes(), allow_torn)
