"""The transcript: what each party actually observed, as JSON Lines.

Every layer records, for every field it handles, what a party (normally the server) saw:
its form (``clear``, ``masked``, ``encrypted``, ``noised``), what it was (one client's
``upload``, a ``sum``, ...), its shape, its size on the wire, a SHA-256 digest of the bytes,
and — only when the user asks — the values. ``secagg audit`` reads it back.

Record types (the ``type`` key): ``run`` (one header: algorithm, layer, seed, notes),
``observation`` (one per thing seen) and ``privacy`` (a DP guarantee, per field or total).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from secagg.wire import Message, is_message, message_size

FORMS = ("clear", "masked", "encrypted", "noised")


def digest(value: np.ndarray | Message) -> str:
    """SHA-256 hex digest of an array's bytes (C order), of raw bytes, or of a message's
    frames (the digest of their concatenation, computed without joining them)."""
    if isinstance(value, tuple | list):
        h = hashlib.sha256()
        for frame in value:
            h.update(frame)
        return h.hexdigest()
    data = value if isinstance(value, bytes | bytearray) else np.ascontiguousarray(value).tobytes()
    return hashlib.sha256(data).hexdigest()


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
        what: str = "upload",
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

    def privacy(self, **info: Any) -> None:
        """Record a DP guarantee (per field or total)."""
        self.records.append({"type": "privacy", **info})

    def observations(self) -> Iterator[dict[str, Any]]:
        """The observation records."""
        return (r for r in self.records if r.get("type") == "observation")

    def write(self, path: str | Path) -> Path:
        """Write the records as JSON Lines to ``path``."""
        p = Path(path)
        with p.open("w") as fh:
            for r in self.records:
                fh.write(json.dumps(r, default=_jsonable) + "\n")
        return p

    @classmethod
    def read(cls, path: str | Path) -> Transcript:
        """Read a transcript written by :meth:`write`.

        Raises:
            ValueError: a line is not a JSON object (the message gives the line number).
        """
        t = cls()
        with Path(path).open() as fh:
            for i, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{i}: not JSON ({exc.msg})") from None
                if not isinstance(rec, dict) or "type" not in rec:
                    raise ValueError(f"{path}:{i}: not a transcript record")
                t.records.append(rec)
        t.include_values = any("values" in r for r in t.records)
        return t

    def extend(self, records: Iterable[dict[str, Any]]) -> None:
        """Append records (e.g. from another transcript)."""
        self.records.extend(records)
