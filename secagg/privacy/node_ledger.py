"""A node's own privacy ledger file: append-only, digest-chained, crash-safe.

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

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from secagg.errors import PrivacyError

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


def _read_head(head_path: Path) -> dict[str, Any] | None:
    """The head file's record (None when there is none)."""
    if not head_path.exists():
        return None
    try:
        rec = json.loads(head_path.read_bytes())
        if not isinstance(rec, dict) or not isinstance(rec.get("head"), str) or \
                not isinstance(rec.get("entries"), int) or rec["entries"] < 0:
            raise ValueError("not a head record")
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise LedgerCorrupt(head_path, 0, f"the ledger's head file does not read: {exc}") \
            from None
    return rec


def _write_head(head_path: Path, ledger: Path, state: LedgerState) -> None:
    """Write the head record atomically and durably (a fresh temporary name, never a
    followed link; renamed over the old one; file and folder synced)."""
    import secrets

    body = json.dumps({"head": state.head, "entries": len(state.entries),
                       "ledger": str(ledger.resolve())}, sort_keys=True).encode()
    head_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = head_path.with_name(f".{head_path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, head_path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_dir(head_path.parent)


def _create_empty(p: Path) -> None:
    """Create an empty ledger file (and its folder) where none exists, durably."""
    if p.exists():
        return
    p.parent.mkdir(parents=True, exist_ok=True)
    os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    _sync_dir(p.parent)


def check_head(path: str | Path, head_path: str | Path, *, init: bool = False
               ) -> LedgerState:
    """Read the ledger at ``path`` and check it against its head file ``head_path`` (see
    the module docstring): the file must hold the head last written there (later entries
    are fine: a crash between an append and the head's update, or entries only add).

    Args:
        init: start a fresh ledger (and its head file) when neither exists.

    Raises:
        LedgerRolledBack: the file is missing, or does not hold the recorded head.
        LedgerUninitialised: no head file, and no ``init`` (or a non-empty ledger exists).
        LedgerCorrupt, LedgerConflict, LedgerTorn: as :func:`read_ledger`.
    """
    p, hp = Path(path), Path(head_path)
    rec = _read_head(hp)
    if rec is None:
        state = read_ledger(p)
        if state.entries or not init:
            raise LedgerUninitialised(
                p, 0, f"no head file {hp}" + (
                    f", yet the file holds {len(state.entries)} entries: restore the head "
                    "file, or adopt this file explicitly (secagg.privacy.node_ledger."
                    "init_ledger(path, head, adopt=True))" if state.entries else
                    ": a fresh ledger is started only explicitly (ledger-init=true, or "
                    "secagg.privacy.node_ledger.init_ledger)"))
        _create_empty(p)
        _write_head(hp, p, state)
        return state
    if not p.exists():
        raise LedgerRolledBack(
            p, 0, f"missing, but its head file {hp} records {rec['entries']} entries (head "
            f"{rec['head'][:16]}..., last written at {rec.get('ledger')}): a deleted or moved "
            "ledger is never read as zero spent; restore it")
    state = read_ledger(p)
    at = state.head_after(rec["head"])
    if at is None or at + 1 != rec["entries"]:
        raise LedgerRolledBack(
            p, 0, f"holds {len(state.entries)} entries and not the head its head file {hp} "
            f"records ({rec['entries']} entries, head {rec['head'][:16]}...): truncated or "
            "replaced; a rolled-back ledger is never read as less spent")
    if at + 1 != len(state.entries) or rec.get("ledger") != str(p.resolve()):
        _write_head(hp, p, state)  # entries after it, or the file was moved with them
    return state


def init_ledger(path: str | Path, head_path: str | Path, *, adopt: bool = False
                ) -> LedgerState:
    """Start a ledger at ``path`` with its head file ``head_path`` (the explicit step
    :class:`NodeLedger` asks for); ``adopt``: anchor an existing ledger file as it stands
    (when its head file was lost: the operator vouches for the file).

    Raises:
        LedgerUninitialised: the head file exists already (never re-initialised), or the
            ledger file holds entries and ``adopt`` is not given.
    """
    p, hp = Path(path), Path(head_path)
    if hp.exists():
        raise LedgerUninitialised(p, 0, f"its head file {hp} exists: a ledger is never "
                                  "re-initialised over its head")
    state = read_ledger(p)
    if state.entries and not adopt:
        raise LedgerUninitialised(p, 0, f"holds {len(state.entries)} entries: pass "
                                  "adopt=True to anchor it as it stands")
    _create_empty(p)
    _write_head(hp, p, state)
    return state


def repair_torn_tail(path: str | Path) -> bytes:
    """Cut a torn final line off the ledger at ``path`` (after verifying everything before
    it), saving its bytes to ``PATH.torn`` for the record. Returns the bytes cut (empty
    when the file ends cleanly). Take the writer's lock first: repairing a ledger a
    running node writes is refused (:class:`LedgerLocked`)."""
    p = Path(path)
    with _Lock(p):
        state = read_ledger(p, allow_torn=True)
        if state.torn is None:
            return b""
        keep = p.stat().st_size - len(state.torn)
        with Path(f"{p}.torn").open("ab") as fh:
            fh.write(state.torn + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
        with p.open("r+b") as fh:
            fh.truncate(keep)
            fh.flush()
            os.fsync(fh.fileno())
        return state.torn


class _Lock:
    """An exclusive, non-blocking lock on ``PATH.lock`` (``fcntl.flock``: released when
    the holder dies; where there is no ``fcntl``, an ``O_EXCL`` lock file removed on
    release)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(f"{path}.lock")
        self.ledger = path
        self.fd: int | None = None
        self.excl = False

    def __enter__(self) -> _Lock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            try:
                self.fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                raise LedgerLocked(self.ledger, 0, f"another writer holds {self.path} "
                                   "(remove it only if no node runs)") from None
            self.excl = True
            return
        fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise LedgerLocked(self.ledger, 0, "another writer (a node process) holds its "
                               f"lock {self.path}: one ledger file per node") from None
        self.fd = fd

    def release(self) -> None:
        if self.fd is None:
            return
        os.close(self.fd)  # closing the descriptor drops the flock
        self.fd = None
        if self.excl:  # pragma: no cover - not POSIX
            self.path.unlink(missing_ok=True)


@dataclass
class NodeLedger:
    """The writer of a node's ledger file (see the module docstring): open it, then
    :meth:`intend` before a release and :meth:`commit` after; :meth:`close` (or use it as
    a context manager) releases the lock.

    Args:
        path: the ledger file (created, with its directory, when missing).
        head_path: its head file (see the module docstring; None: none kept, the file
            alone is trusted).
        init: with ``head_path``, start a fresh ledger when neither file exists.

    Raises:
        LedgerLocked: another writer holds it.
        LedgerRolledBack, LedgerUninitialised: as :func:`check_head`.
        LedgerCorrupt, LedgerConflict, LedgerTorn: as :func:`read_ledger` (a torn final
            line must be repaired by an operator before the node writes again).
    """

    path: Path
    head_path: Path | None = None
    init: bool = False
    state: LedgerState = field(init=False, default_factory=LedgerState)
    _lock: _Lock | None = field(init=False, default=None, repr=False)

    def __post_init__(self) -> None:
        self.path = Path(self.path)
        self.head_path = None if self.head_path is None else Path(self.head_path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = _Lock(self.path)
        lock.acquire()
        try:
            self.state = read_ledger(self.path) if self.head_path is None else check_head(
                self.path, self.head_path, init=self.init)
        except BaseException:
            lock.release()
            raise
        self._lock = lock

    def __enter__(self) -> NodeLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the writer's lock (the file is already synced)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    @property
    def head(self) -> str:
        """The digest of the last line written (:data:`GENESIS` when none)."""
        return self.state.head

    def charged(self) -> list[dict[str, Any]]:
        """The events charged so far (see :meth:`LedgerState.charged`)."""
        return self.state.charged()

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.state.entries)

    def _append(self, kind: Kind, message_id: str, payload: Mapping[str, Any]) -> str:
        if self._lock is None:
            raise LedgerError(self.path, 0, "the ledger is closed")
        if not isinstance(message_id, str) or not message_id:
            raise LedgerError(self.path, 0, f"message id must be a non-empty string, got "
                              f"{message_id!r}")
        try:
            line = _line(self.head, kind, message_id, payload)
        except (TypeError, ValueError) as exc:
            raise LedgerError(self.path, 0, f"payload is not JSON: {exc}") from None
        new = not self.path.exists()
        try:
            with self.path.open("ab") as fh:
                fh.write(line + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:  # the line may be torn: nothing more is written on top of it
            self.close()
            raise
        if new:  # the file's own directory entry must survive a crash too
            _sync_dir(self.path.parent)
        digest = _digest(line)
        entry = Entry(kind=kind, message_id=message_id,
                      payload=json.loads(line)["payload"], prev=self.head, digest=digest,
                      line=len(self.state.entries) + 1)
        self.state = LedgerState(entries=(*self.state.entries, entry), head=digest)
        if self.head_path is not None:  # the head, apart from the file, synced
            _write_head(self.head_path, self.path, self.state)
        return digest

    def intend(self, message_id: str, event: Mapping[str, Any]) -> bool:
        """Charge ``event`` for message ``message_id``, durably, before the step runs.

        Returns:
            True when written (and synced); False when the message id is already charged
            (a replay): nothing is written and the caller must not release again.

        Raises:
            LedgerConflict: the id was charged with a different event.
        """
        done = self.state.intents().get(message_id)
        if done is not None:
            canon = json.loads(_line(GENESIS, "intent", message_id, event))["payload"]
            if done.payload != canon:
                raise LedgerConflict(self.path, done.line, f"message {message_id!r} was "
                                     "charged with other terms: a replay must not change them")
            return False
        self._append("intent", message_id, event)
        return True

    def refuse(self, message_id: str, event: Mapping[str, Any]) -> str:
        """Record that the release ``message_id`` was refused before the node touched its
        data (charged nothing). Returns the new head."""
        return self._append("refusal", message_id, event)

    def commit(self, message_id: str, outcome: Mapping[str, Any] | None = None) -> str:
        """Record that message ``message_id``'s upload was handed on. Returns the new head.

        Raises:
            LedgerConflict: no intent for it, or it is already committed.
        """
        if message_id not in self.state.intents() or message_id in self.state.commits():
            raise LedgerConflict(self.path, 0, f"commit of message {message_id!r} without "
                                 "its intent, or committed twice")
        return self._append("commit", message_id, outcome or {})


def _sync_dir(path: Path) -> None:
    """fsync a directory (POSIX; a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def reconcile(path: str | Path, records: Sequence[Mapping[str, Any]], client: int
              ) -> dict[str, Any]:
    """Reconcile node ``client``'s ledger file at ``path`` with the server's copy in a run's
    transcript ``records`` (its ``node-ledger`` records: the heads the node reported, and
    the release each reply charged, and the releases it refused over its budget).

    Checks: the file's chain verifies; every head the server holds is a head of the file,
    in the same order (so the file was not rewritten after the node reported it); the
    events the node committed in this run equal, in order, the releases the server
    recorded for it; the releases it refused are those the server saw refused. An intent
    of this run without a commit (a crash between the two) is charged by the node and
    unknown to the server: counted, not a mismatch.

    Returns:
        ``client``, ``ok`` (no problems), ``problems`` (text), ``server_head`` (the last
        head the server holds, or None), ``file_head``, ``later_entries`` (entries the file
        holds after the server's last head: later runs), ``committed`` and ``uncommitted``
        (this run's counts), ``refusals`` (this run's, by the node's budget), ``run``.
    """
    out: dict[str, Any] = {"client": int(client), "problems": [], "server_head": None,
                           "file_head": None, "later_entries": 0, "committed": 0,
                           "uncommitted": 0, "run": None}
    problems: list[str] = out["problems"]
    header = next((r for r in records if r.get("type") == "run"), {})
    run = (header.get("attestation") or {}).get("run")
    out["run"] = run
    mine = [r for r in records if r.get("type") == "node-ledger"
            and r.get("client") == int(client)]
    try:
        state = read_ledger(path)
    except LedgerError as exc:
        problems.append(str(exc))
        out["ok"] = False
        return out
    out["file_head"] = state.head
    if not mine:
        problems.append(f"the transcript holds no ledger head of client {client} (the node "
                        "kept no ledger in this run, or the server did not record it)")
    at = -2
    heads = [r for r in mine if isinstance(r.get("head"), str)]
    for r in heads:
        i = state.head_after(r["head"])
        if i is None:
            problems.append(f"the server's copy of client {client}'s head {r.get('head')} is "
                            "not in the file (rewritten or replaced since the node reported "
                            "it)")
        elif i < at:
            problems.append(f"client {client}'s reported heads go backwards in the file")
        else:
            at = i
    if heads and at >= -1:
        out["server_head"] = heads[-1]["head"]
        out["later_entries"] = len(state.entries) - 1 - at
    if run is None:
        problems.append("the transcript names no run (no attestation header): its releases "
                        "cannot be matched with the file's")
    commits = state.commits()
    ours = [(e, e.message_id in commits) for e in state.intents().values()
            if e.payload.get("run") == run]
    committed = [dict(e.payload) for e, done in ours if done]
    out["committed"], out["uncommitted"] = len(committed), len(ours) - len(committed)
    server = [dict(r["event"]) for r in mine if isinstance(r.get("event"), Mapping)]
    if committed != server:
        problems.append(f"client {client}: the file commits {len(committed)} release(s) of "
                        f"this run, the server recorded {len(server)}"
                        + ("" if len(committed) != len(server) else " (with other terms)"))
    def keys(events: Sequence[Mapping[str, Any]]) -> list[tuple[Any, Any]]:
        return [(e.get("round"), e.get("phase")) for e in events]

    refused = keys([e.payload for e in state.entries
                    if e.kind == "refusal" and e.payload.get("run") == run])
    told = keys([r["refused"] for r in mine if isinstance(r.get("refused"), Mapping)])
    out["refusals"] = len(refused)
    if refused != told:
        problems.append(f"client {client}: the file records refusals in (round, phase) "
                        f"{refused}, the server {told}")
    out["ok"] = not problems
    return out


def format_reconcile(results: Sequence[Mapping[str, Any]]) -> str:
    """:func:`reconcile` results as text, one block per node."""
    lines = []
    for r in results:
        if r["ok"]:
            tail = (f"; {r['later_entries']} later entr{'y' if r['later_entries'] == 1 else 'ies'}"
                    " (later runs)" if r["later_entries"] else "")
            lines.append(f"node ledger of client {r['client']}: reconciled - chain verified, "
                         f"head {str(r['server_head'])[:16]}... as the server recorded, "
                         f"{r['committed']} release(s) of this run committed as recorded"
                         + (f", {r['uncommitted']} charged without commit (crash)"
                            if r["uncommitted"] else "")
                         + (f", {r['refusals']} refused over budget" if r["refusals"] else "")
                         + tail)
        else:
            lines.append(f"node ledger of client {r['client']}: DOES NOT RECONCILE")
            lines.extend(f"  {p}" for p in r["problems"])
    return "\n".join(lines)
