"""The one writer of a node ledger file (:class:`NodeLedger`, under an exclusive lock):
intent before the upload, commit after, refusals kept; and the operator's repair of a
torn final line (:func:`repair_torn_tail`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from secagg.privacy.node_ledger.chain import (
    GENESIS,
    Entry,
    Kind,
    LedgerConflict,
    LedgerError,
    LedgerLocked,
    LedgerState,
    _digest,
    _line,
    read_ledger,
)
from secagg.privacy.node_ledger.head import _sync_dir, _write_head, check_head


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
    """The writer of a node's ledger file (see :mod:`secagg.privacy.node_ledger`): open it,
    then :meth:`intend` before a release and :meth:`commit` after; :meth:`close` (or use it
    as a context manager) releases the lock.

    Args:
        path: the ledger file (created, with its directory, when missing).
        head_path: its head file (see :mod:`secagg.privacy.node_ledger`; None: none
            kept, the file alone is trusted).
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
