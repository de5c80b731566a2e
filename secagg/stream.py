"""Uploads computed when a layer reads them: a cohort's memory is one upload, not n.

In one process the engine hands a layer the cohort's uploads as an :class:`UploadStream`, a
read-only mapping client -> :class:`~secagg.messages.Upload` whose values are computed (the
client's step, then validation) when the layer first reads them. A layer that reads each
upload once and keeps nothing of it but what the server would keep (a running sum) -- one
whose :attr:`~secagg.layers.base.Layer.streams` is True -- then holds one model at a time
however large the cohort: the secure sum masks each vector as it is computed and the server
adds it to its total.

With ``keep=True`` (layers that read an upload more than once, or read them all before
doing anything) the stream computes every upload first, in cohort order, and holds them: the
behaviour of an engine without streaming. Either way every client of the cohort steps exactly
once: :meth:`UploadStream.finish` runs the steps the layer never asked for (clients that
dropped before sending, or all of them when the release aborted first), so a client's
state, clip counts and individual filter end as in a run that computed every upload first.
The aggregate is the same bit for bit (tested in tests/test_stream.py): the layers sum in
cohort order either way.

:class:`Lazy` is the layers' tool for the same idea one level down: a per-client transform
(noise, encoding) applied on access; :class:`Booked` is a :class:`Lazy` over uploads that
also books each client's work (its step and the transform) for its message's cost row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TypeVar

from secagg.errors import StreamConsumed
from secagg.messages import Upload

V = TypeVar("V")
W = TypeVar("W")


class UploadStream(Mapping[int, Upload]):
    """The cohort's uploads, each computed by ``make(client)`` when first read.

    Args:
        clients: the clients whose uploads the layer may read (iteration order).
        make: runs one client's step and returns its validated upload.
        keep: compute every upload up front and hold them (a layer that does not stream);
            False: compute on first read and hold nothing (a second read raises
            :class:`StreamConsumed`).
    """

    def __init__(self, clients: Sequence[int], make: Callable[[int], Upload], *,
                 keep: bool) -> None:
        self._clients = list(clients)
        self._members = set(self._clients)
        self._make = make
        self.keep = keep
        self._held: dict[int, Upload] = {}
        self._stepped: set[int] = set()
        if keep:
            for c in self._clients:
                self._held[c] = self._step(c)

    def _step(self, c: int) -> Upload:
        self._stepped.add(c)
        return self._make(c)

    def __getitem__(self, c: int) -> Upload:
        if c in self._held:
            return self._held[c]
        if c not in self._members:
            raise KeyError(c)
        if c in self._stepped:
            raise StreamConsumed(
                f"the upload of client {c} was already read; a layer that reads an upload "
                "twice must leave Layer.streams False")
        return self._step(c)

    def __iter__(self) -> Iterator[int]:
        return iter(self._clients)

    def __len__(self) -> int:
        return len(self._clients)

    def __contains__(self, c: object) -> bool:
        return c in self._members

    @property
    def unread(self) -> list[int]:
        """The clients whose step has not run yet."""
        return [c for c in self._clients if c not in self._stepped]

    def finish(self) -> int:
        """Run the steps the layer never asked for (their uploads are discarded) and let
        go of the held uploads; returns how many steps ran here."""
        late = self.unread
        for c in late:
            self._step(c)
        self._held.clear()
        return len(late)


class Lazy(Mapping[int, W]):
    """``fn(client, source[client])`` on access, nothing held: a per-client transform over
    a mapping (e.g. an :class:`UploadStream`) that reads each source value when its own
    value is read."""

    def __init__(self, source: Mapping[int, V], fn: Callable[[int, V], W]) -> None:
        self.source = source
        self.fn = fn

    def __getitem__(self, c: int) -> W:
        return self.fn(c, self.source[c])

    def __iter__(self) -> Iterator[int]:
        return iter(self.source)

    def __len__(self) -> int:
        return len(self.source)

    def __contains__(self, c: object) -> bool:
        return c in self.source


class Booked(Lazy[W]):
    """``fn(client, uploads[client])`` on access, like :class:`Lazy`, and the client's work
    booked as it goes: :attr:`costs` maps each client read so far to (the CPU seconds of its
    step plus those of ``fn``, its step's FLOPs), for the row of the message that carries
    the result (a secure sum's masked input)."""

    def __init__(self, uploads: Mapping[int, Upload], fn: Callable[[int, Upload], W]) -> None:
        super().__init__(uploads, self._booked)
        self._fn = fn
        self.costs: dict[int, tuple[float, float]] = {}

    def _booked(self, c: int, up: Upload) -> W:
        t0 = time.process_time()
        out = self._fn(c, up)
        self.costs[c] = (float(getattr(up, "cpu_s", 0.0)) + time.process_time() - t0,
                         float(getattr(up, "flops", 0.0)))
        return out

