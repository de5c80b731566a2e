"""One client's ledger on disk: its events appended as JSON lines, one file per client.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from secagg.errors import PrivacyError
from secagg.privacy.client_ledger.budget import Admission, ClientBudget, admit
from secagg.privacy.client_ledger.epsilon import ObserverEpsilon, client_epsilons
from secagg.privacy.client_ledger.events import ClientEvent


class ClientLedger:
    """One client's events, in memory and, when ``path`` is given, appended to a JSON-lines
    file (one :meth:`ClientEvent.to_json` per line, flushed and synced per append).

    Args:
        client: the client's id.
        path: the file (None: in memory only).
    """

    SUFFIX: ClassVar[str] = ".jsonl"

    def __init__(self, client: str | int, path: str | os.PathLike[str] | None = None) -> None:
        self.client = str(client)
        self.path = None if path is None else Path(path)
        self._events: list[ClientEvent] = []

    @classmethod
    def open(cls, client: str | int, path: str | os.PathLike[str]) -> ClientLedger:
        """The ledger in ``path`` (created on first append when absent).

        Raises:
            PrivacyError: a line that is not a valid event, or an event of another
                client."""
        led = cls(client, path)
        p = Path(path)
        if p.exists():
            for i, line in enumerate(p.read_text().splitlines(), 1):
                if not line.strip():
                    continue
                try:
                    ev = ClientEvent.from_json(line)
                except (ValueError, TypeError) as exc:
                    raise PrivacyError(f"{p}:{i}: not a client ledger event ({exc})") from None
                if ev.client != led.client:
                    raise PrivacyError(f"{p}:{i}: event of client {ev.client!r} in the "
                                       f"ledger of client {led.client!r}")
                led._events.append(ev)
        return led

    @property
    def events(self) -> tuple[ClientEvent, ...]:
        """Every event, in order."""
        return tuple(self._events)

    def __iter__(self) -> Iterator[ClientEvent]:
        return iter(self._events)

    def __len__(self) -> int:
        return len(self._events)

    def append(self, event: ClientEvent) -> None:
        """Record ``event`` (and write it to the file, synced, when there is one)."""
        if event.client != self.client:
            raise PrivacyError(f"event of client {event.client!r} for the ledger of "
                               f"{self.client!r}")
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(event.to_json() + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        self._events.append(event)

    def epsilons(self, delta: float) -> dict[str, ObserverEpsilon]:
        """:func:`client_epsilons` of this ledger."""
        return client_epsilons(self._events, delta)

    def extend(self, events: Sequence[ClientEvent]) -> None:
        """Record several events with one write (and one sync) of the file."""
        if any(e.client != self.client for e in events):
            raise PrivacyError(f"an event of another client for the ledger of "
                               f"{self.client!r}")
        if self.path is not None and events:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write("".join(e.to_json() + "\n" for e in events))
                fh.flush()
                os.fsync(fh.fileno())
        self._events.extend(events)

    def admit(self, terms: ClientEvent | Sequence[ClientEvent], budget: ClientBudget | None,
              delta: float, policy: Any | None = None) -> Admission:
        """:func:`admit` against this ledger's history."""
        return admit(self._events, terms, budget, delta, policy)

    def __repr__(self) -> str:
        return f"ClientLedger(client={self.client!r}, events={len(self)}, path={self.path})"


def open_ledgers(directory: str | os.PathLike[str] | None,
                 clients: Iterable[str | int]) -> dict[str, ClientLedger]:
    """Client id -> its ledger: ``<directory>/client-<id>.jsonl`` (read when present), or
    in memory when ``directory`` is None."""
    out: dict[str, ClientLedger] = {}
    for c in clients:
        cid = str(c)
        if directory is None:
            out[cid] = ClientLedger(cid)
        else:
            if not cid.replace("-", "").replace("_", "").isalnum():
                raise PrivacyError(f"client id {cid!r} cannot name a ledger file")
            out[cid] = ClientLedger.open(cid, Path(directory) / f"client-{cid}"
                                         f"{ClientLedger.SUFFIX}")
    return out
