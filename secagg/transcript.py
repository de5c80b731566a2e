"""The transcript: what each party actually observed, as JSON Lines.

Every layer records, for every field it handles, what a party (normally the server) saw:
its form (``clear``, ``masked``, ``encrypted``, ``noised``), what it was (one client's
``upload``, a ``sum``, ...), its shape, its size on the wire, a SHA-256 digest of the bytes,
and — only when the user asks — the values. ``secagg audit`` reads it back.

Record types (the ``type`` key): ``run`` (one header: algorithm, layer, seed, notes),
``observation`` (one per thing seen), ``verdict`` (a validating layer's decision of one
phase: the clients in the sum and those rejected, with why), ``message`` (one per message
sent: sender, receiver, direction and framed wire size, the same figure the cost ledger
books), ``privacy`` (a DP guarantee, per field or total) and ``end`` (the closing record:
counts of records by type, rounds completed and a running SHA-256 digest chained over
every record before it). A transcript without a matching ``end`` record is incomplete
(truncated or altered): :meth:`Transcript.check` says so.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from secagg.errors import TranscriptError
from secagg.stages import Stage
from secagg.wire import Message, is_message, message_size

FORMS = ("clear", "masked", "encrypted", "noised")
#: Seed of the running digest (the digest of a transcript with no records).
_GENESIS = hashlib.sha256(b"secagg/transcript/v1").hexdigest()


def digest(value: np.ndarray | Message) -> str:
    """SHA-256 hex digest of an array's bytes (C order), of raw bytes, or of a message's
    frames (the digest of their concatenation, computed without joining them)."""
    if isinstance(value, tuple | list):
        h = hashlib.sha256()
        for frame in value:
            h.update(frame)
        return h.hexdigest()
    if isinstance(value, bytes | bytearray | memoryview):
        return hashlib.sha256(value).hexdigest()
    # the array's bytes in C order, hashed in place (no copy)
    return hashlib.sha256(np.ascontiguousarray(value).reshape(-1).view(np.uint8)).hexdigest()


def _jsonable(x: Any) -> Any:
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


class Transcript:
    """An in-memory list of records, written as JSON Lines.

    Args:
        include_values: also store the observed values (off by default: a transcript is
            meant to be shareable; values make it as sensitive as the data).
    """

    def __init__(self, include_values: bool = False) -> None:
        self.include_values = include_values
        self.records: list[dict[str, Any]] = []
        #: line number of a last line cut mid-record (set by :meth:`read`), else None.
        self.cut_line: int | None = None

    def meta(self, **info: Any) -> None:
        """Record the run header (algorithm, layer, seed, ...)."""
        self.records.append({"type": "run", **info})

    def observe(
        self,
        *,
        round: int,
        phase: str,
        stage: str,
        party: str,
        sender: Any,
        field: str,
        form: str,
        value: np.ndarray | Message,
        what: str = Stage.UPLOAD,
        nbytes: int | None = None,
        value_digest: str | None = None,
    ) -> None:
        """Record that ``party`` saw ``value`` of ``field`` from ``sender`` in ``form``.

        ``value`` is an array or a message (bytes, or a tuple of frames). ``value_digest``,
        if given, must be ``digest(value)``: a layer that records one message once per field
        computes it once.
        """
        if form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {form!r}")
        is_bytes = is_message(value)
        arr = None if is_bytes else np.asarray(value)
        size = message_size(value) if is_bytes else arr.nbytes  # type: ignore[arg-type,union-attr]
        rec: dict[str, Any] = {
            "type": "observation", "round": round, "phase": phase, "stage": stage,
            "party": party, "sender": sender, "field": field, "form": form, "what": what,
            "shape": [size] if is_bytes else list(arr.shape),  # type: ignore[union-attr]
            "dtype": "bytes" if is_bytes else str(arr.dtype),  # type: ignore[union-attr]
            "bytes": int(nbytes if nbytes is not None else size),
            "digest": value_digest or digest(value if is_bytes else arr),  # type: ignore[arg-type]
        }
        if self.include_values and not is_bytes:
            rec["values"] = arr.tolist()  # type: ignore[union-attr]
        self.records.append(rec)

    def message(self, *, round: int, phase: str, stage: str, sender: Any, receiver: Any,
                direction: str, nbytes: int, digest: str | None = None) -> None:
        """Record one message sent (its framed wire size, as booked in the cost ledger;
        with ``digest``, the SHA-256 of its bytes, which an attested run records)."""
        rec: dict[str, Any] = {
            "type": "message", "round": round, "phase": phase, "stage": stage,
            "sender": sender, "receiver": receiver, "direction": direction, "bytes": int(nbytes),
        }
        if digest is not None:
            rec["digest"] = digest
        self.records.append(rec)

    def verdict(self, *, round: int, phase: str, party: str, accepted: Iterable[int],
                rejected: dict[int, str]) -> None:
        """Record a validating layer's decision of one phase, as ``party`` took it: the
        clients whose uploads the released sum holds and the clients rejected (why)."""
        self.records.append({"type": "verdict", "round": round, "phase": phase,
                             "party": party, "accepted": sorted(int(c) for c in accepted),
                             "rejected": {str(c): str(w) for c, w in sorted(rejected.items())}})

    def privacy(self, **info: Any) -> None:
        """Record a DP guarantee (per field or total)."""
        self.records.append({"type": "privacy", **info})

    @staticmethod
    def _chain(records: Iterable[dict[str, Any]]) -> tuple[str, dict[str, int]]:
        """Running digest (SHA-256 chained over each record's JSON line) and counts by type."""
        h, counts = _GENESIS, {}
        for r in records:
            h = hashlib.sha256((h + json.dumps(r, default=_jsonable)).encode()).hexdigest()
            counts[r.get("type", "?")] = counts.get(r.get("type", "?"), 0) + 1
        return h, counts

    def close(self, rounds_completed: int | None = None, stopped: str | None = None) -> None:
        """Append (or replace) the closing ``end`` record: counts of records by type, rounds
        completed (default: the rounds observed), why the run stopped early if it did, and
        the running digest over every record before it."""
        self.records = [r for r in self.records if r.get("type") != "end"]
        if rounds_completed is None:
            rounds_completed = len({r["round"] for r in self.records if "round" in r
                                    and r.get("type") in ("observation", "message")})
        h, counts = self._chain(self.records)
        end: dict[str, Any] = {"type": "end", "records": len(self.records), "counts": counts,
                               "rounds_completed": int(rounds_completed), "digest": h}
        if stopped:
            end["stopped"] = stopped
        self.records.append(end)

    @property
    def closed(self) -> bool:
        """Whether the last record is the closing ``end`` record."""
        return bool(self.records) and self.records[-1].get("type") == "end"

    def check(self) -> str | None:
        """None when the transcript is complete (its closing record matches every record
        before it), else the reason it is not (missing closing record, counts or digest that
        do not match: truncated or altered)."""
        if self.cut_line is not None:
            return f"line {self.cut_line} is cut mid-record (the file was truncated)"
        ends = [i for i, r in enumerate(self.records) if r.get("type") == "end"]
        if not ends:
            return "no closing record (the transcript was truncated or never finished)"
        if ends != [len(self.records) - 1]:
            return "records after the closing record (appended or concatenated)"
        end, body = self.records[-1], self.records[:-1]
        h, counts = self._chain(body)
        if end.get("records") != len(body) or end.get("counts") != counts:
            return (f"the closing record counts {end.get('records')} records "
                    f"{end.get('counts')}, the file holds {len(body)} {counts}")
        if end.get("digest") != h:
            return "the running digest does not match the records (altered)"
        return None

    def observations(self) -> Iterator[dict[str, Any]]:
        """The observation records."""
        return (r for r in self.records if r.get("type") == "observation")

    def write(self, path: str | Path) -> Path:
        """Write the records as JSON Lines to ``path`` (closing the transcript first if it is
        not closed)."""
        if not self.closed:
            self.close()
        p = Path(path)
        with p.open("w") as fh:
            for r in self.records:
                fh.write(json.dumps(r, default=_jsonable) + "\n")
        return p

    @classmethod
    def read(cls, path: str | Path) -> Transcript:
        """Read a transcript written by :meth:`write`.

        Raises:
            TranscriptError: the file is a run's ``result.json`` (the message says what to pass
                instead), or a line is not a transcript record (the message gives the line).
        """
        t = cls()
        text = Path(path).read_text()
        try:
            whole = json.loads(text)
        except json.JSONDecodeError:
            whole = None
        if isinstance(whole, dict) and "type" not in whole and {"algorithm", "layer"} <= set(whole):
            raise TranscriptError(
                f"{path} is a run's result summary (result.json), not a transcript; pass the "
                f"transcript.jsonl beside it, or the run folder {Path(path).parent}")
        lines = text.splitlines()
        last = max((i for i, ln in enumerate(lines, 1) if ln.strip()), default=0)
        for i, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                if i == last and i > 1 and not text.endswith("\n"):
                    t.cut_line = i  # a write cut short: check() reports it as incomplete
                    break
                raise TranscriptError(
                    f"{path}:{i}: not a JSON Lines transcript ({exc.msg})") from None
            if not isinstance(rec, dict) or "type" not in rec:
                raise TranscriptError(f"{path}:{i}: not a transcript record (no 'type' key)")
            t.records.append(rec)
        t.include_values = any("values" in r for r in t.records)
        return t

    def extend(self, records: Iterable[dict[str, Any]]) -> None:
        """Append records (e.g. from another transcript)."""
        self.records.extend(records)
