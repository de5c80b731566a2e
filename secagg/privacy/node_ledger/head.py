"""A node ledger's head file, kept apart from the ledger: a ledger that does not hold the
head last written there (missing, truncated, replaced) is refused, never read as less
spent; a fresh ledger is started only explicitly (:func:`init_ledger`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from secagg.privacy.node_ledger.chain import (
    LedgerCorrupt,
    LedgerRolledBack,
    LedgerState,
    LedgerUninitialised,
    read_ledger,
)


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
    :mod:`secagg.privacy.node_ledger`): the file must hold the head last written there
    (later entries are fine: a crash between an append and the head's update, or entries
    only add).

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
