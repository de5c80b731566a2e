"""The statistics cache: a staged layer that sends each release to the DP layer or to its
inner layer, and records (or replays) what the inner layer gave the server, so that cells
which differ only in their noise re-noise one recording (see :mod:`secagg.sweep`).

A recording holds the clients' raw, un-noised statistics. On disk it is kept in the safe
format of :mod:`secagg.safestore` (``<key>.npz`` arrays loaded with ``allow_pickle=False``,
``<key>.json`` description, both with a SHA-256 checked on load, mode 0600):
:func:`save_tape` / :func:`load_tape`. Reading a cache folder never runs code; a file that
does not check is a cache miss, never loaded."""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from secagg.errors import ConfigurationError
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.messages import Upload, UploadSpec

# -- the staged layer: which releases are noised, recording and replay ----------------------


class _CacheMiss(Exception):
    """A replayed cell met a broadcast that differs from the recording."""


def _digest(payload: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(payload):
        a = np.ascontiguousarray(payload[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


@dataclass
class _Tape:
    """What a recording cell stores and a replaying cell reads back."""

    digests: dict[tuple[int, str], str] = field(default_factory=dict)
    uploads: dict[tuple[int, str], dict[int, dict[str, np.ndarray]]] = field(
        default_factory=dict)
    aggregates: dict[tuple[int, str], Aggregate] = field(default_factory=dict)
    rows: dict[tuple[int, str], list[Any]] = field(default_factory=dict)
    records: dict[tuple[int, str], list[dict[str, Any]]] = field(default_factory=dict)
    history: list[float] = field(default_factory=list)
    states: list[dict[str, Any]] | None = None
    #: read back from disk: the states' stored form, decoded into the replay's own
    #: clients' models (:func:`secagg.safestore.decode`) when they are needed
    stored_states: tuple[Any, dict[str, np.ndarray]] | None = None


_TAPE_PARTS = ("digests", "uploads", "aggregates", "rows", "records", "history")


def save_tape(tape: _Tape, path: str | Path) -> None:
    """Write ``tape`` at ``path`` (``.npz`` + ``.json``, mode 0600; no pickle)."""
    from secagg import safestore

    safestore.save(path, {**{k: getattr(tape, k) for k in _TAPE_PARTS},
                          "states": tape.states})


def load_tape(path: str | Path) -> _Tape:
    """The tape :func:`save_tape` wrote (digests checked; the client states kept in their
    stored form until the replay has clients to load them into).

    Raises:
        secagg.safestore.StoreError: missing, unreadable or altered files.
    """
    from secagg import safestore

    desc, arrays = safestore.load(path, lazy=True)
    if not isinstance(desc, dict) or any(k not in desc for k in (*_TAPE_PARTS, "states")):
        raise safestore.StoreError(f"{path}: not a statistics tape")
    states = desc.pop("states")
    tape = _Tape(**{k: safestore.decode(desc[k], arrays) for k in _TAPE_PARTS})
    if states is not None:
        tape.stored_states = (states, arrays)
    return tape


class _Staged(Layer):
    """Routes each release to the DP layer (selected releases) or to its inner layer, and
    records or replays the inner layer's results for the statistics cache."""

    name: ClassVar[str] = "staged"

    def __init__(self, dp: Layer | None, inner: Layer, select: Any, algorithm: Any,
                 rounds: int, tape: _Tape | None = None, replay: bool = False) -> None:
        self.dp, self.inner, self.select = dp, inner, select
        self.algorithm, self.rounds = algorithm, rounds
        self.tape, self.replay = tape, replay
        self.name = (dp or inner).name  # type: ignore[misc]

    def check(self, spec: UploadSpec) -> None:
        """The inner layer's checks (the DP layer checks its releases when it makes them)."""
        self.inner.check(spec)

    def dropout_stages(self) -> tuple[str, ...]:
        """The inner layer's stages."""
        return self.inner.dropout_stages()

    def describe(self) -> dict[str, Any]:
        """The DP (or inner) layer's description."""
        return (self.dp or self.inner).describe()

    def plan_releases(self, releases: int) -> None:
        """Plan the DP layer for the releases it noises (not the engine's total)."""
        if self.dp is None:
            return
        n = sum(1 for r in range(self.rounds) for p in self.algorithm.phases(r, self.rounds)
                if self.select(r, p.name) and p.spec().fields)  # local phases release nothing
        if n == 0:
            names = sorted({p.name for r in range(self.rounds)
                            for p in self.algorithm.phases(r, self.rounds)})
            raise ConfigurationError(f"sweep config: sweep.dp_phases: selects no release; the "
                                     f"algorithm's phases are {names}")
        self.dp.plan_releases(n)  # type: ignore[attr-defined]

    def unnoised_fields(self, spec: UploadSpec) -> dict[str, str]:
        """The DP layer's answer (or the inner layer's without DP); a release the DP layer
        does not select is marked not private when it is made (:meth:`aggregate`)."""
        return (self.dp or self.inner).unnoised_fields(spec)

    def make_privacy_ledger(self) -> Any:
        """The DP layer's ledger (None without DP)."""
        return None if self.dp is None else self.dp.make_privacy_ledger()  # type: ignore

    def aggregate(self, uploads: Mapping[int, Upload], spec: UploadSpec,
                  ctx: RoundContext) -> Aggregate:
        """Noise a selected release through the DP layer; otherwise the inner layer (or its
        recorded result)."""
        key = (ctx.round, ctx.phase)
        if self.dp is not None and self.select(ctx.round, ctx.phase):
            return self.dp.aggregate(uploads, spec, ctx)
        if self.dp is not None and ctx.privacy is not None:
            ctx.privacy.mark_not_private(
                f"sweep: phase {ctx.phase!r} (round {ctx.round}) released through "
                f"{self.inner.name!r} without DP noise (sweep.dp_phases / sweep.dp_rounds); "
                "epsilon covers the noised releases only")
        if self.replay:
            assert self.tape is not None
            ctx.ledger.rows.extend(copy.deepcopy(self.tape.rows[key]))
            ctx.transcript.extend(copy.deepcopy(self.tape.records[key]))
            return copy.deepcopy(self.tape.aggregates[key])
        n_rows, n_rec = len(ctx.ledger.rows), len(ctx.transcript.records)
        agg = self.inner.aggregate(uploads, spec, ctx)
        if self.tape is not None:
            self.tape.rows[key] = copy.deepcopy(ctx.ledger.rows[n_rows:])
            self.tape.records[key] = copy.deepcopy(ctx.transcript.records[n_rec:])
            self.tape.aggregates[key] = copy.deepcopy(agg)
        return agg


class _TapedPhase:
    """A phase whose client steps are recorded, or replayed after a broadcast check."""

    def __init__(self, phase: Any, round: int, owner: _TapedAlgorithm) -> None:
        self._phase, self._round, self._owner = phase, round, owner
        self.name = phase.name

    def __getattr__(self, item: str) -> Any:
        return getattr(self._phase, item)

    def client_step(self, client: Any, broadcast: Mapping[str, np.ndarray]) -> Any:
        o, key = self._owner, (self._round, self.name)
        if not self._phase.spec().fields:  # a local phase: no upload to record or replay
            if not o.replay:
                o.tape.digests[key] = _digest(broadcast)
                return self._phase.client_step(client, broadcast)
            if o.noised_yet or o.tape.digests.get(key) != _digest(broadcast):
                raise _CacheMiss(f"round {self._round}, local phase {self.name!r} follows a "
                                 "noised release (the clients' state depends on the noise)")
            return {}  # replayed like the uploads: the final states come from the tape
        selected = o.select(self._round, self.name)
        if selected:
            o.noised_yet = True
        if o.replay:
            if o.tape.digests.get(key) != _digest(broadcast):
                raise _CacheMiss(f"round {self._round}, phase {self.name!r}: broadcast differs")
            if selected:
                return o.tape.uploads[key][client.id]
            spec = self._phase.spec()
            return {f.name: np.zeros(f.shape, f.dtype) for f in spec.fields}
        o.tape.digests[key] = _digest(broadcast)
        values = self._phase.client_step(client, broadcast)
        if selected:
            o.tape.uploads.setdefault(key, {})[client.id] = {
                k: np.array(v, copy=True) for k, v in values.items()}
        return values


class _TapedAlgorithm:
    """Wraps an algorithm for recording (the real run, taped) or replay (client steps read
    back, evaluation before the first noised release read back too)."""

    def __init__(self, algorithm: Any, tape: _Tape, replay: bool, select: Any,
                 rounds: int) -> None:
        self._algo, self.tape, self.replay = algorithm, tape, replay
        self.select, self.rounds = select, rounds
        self.noised_yet = False
        self._evaluations = 0

    def __getattr__(self, item: str) -> Any:
        return getattr(self._algo, item)

    def phases(self, round: int, rounds: int) -> list[Any]:
        """The algorithm's phases, taped."""
        return [_TapedPhase(p, round, self) for p in self._algo.phases(round, rounds)]

    def evaluate(self, dataset: Any, clients: Sequence[Any]) -> float:
        """Evaluate (recording: also store the result, and the final client states)."""
        k = self._evaluations
        self._evaluations += 1
        last = k == self.rounds - 1
        if not self.replay:
            if last:
                self.tape.states = [copy.deepcopy(c.state) for c in clients]
            acc = float(self._algo.evaluate(dataset, clients))
            self.tape.history.append(acc)
            return acc
        if not self.noised_yet:
            return self.tape.history[k]
        if not last or (self.tape.states is None and self.tape.stored_states is None):
            raise _CacheMiss(f"evaluation after round {k} follows a noised release")
        if self.tape.states is not None:
            for c, st in zip(clients, self.tape.states, strict=True):
                c.state = copy.deepcopy(st)
        else:
            self._restore_states(clients)
        return float(self._algo.evaluate(dataset, clients))

    def _restore_states(self, clients: Sequence[Any]) -> None:
        """The recorded final client states, from their stored form: arrays and JSON as
        they are; a model's stored weights loaded into this replay's own model of that
        class (the client's, or a copy of the algorithm's ``model``)."""
        from secagg import safestore

        assert self.tape.stored_states is not None
        desc, arrays = self.tape.stored_states
        if not isinstance(desc, list) or len(desc) != len(clients):
            raise _CacheMiss("the recorded client states do not match the clients")
        for c, d in zip(clients, desc, strict=True):
            def module_for(path: str, cls: str, c: Any = c) -> Any:
                parts = path.strip("/").split("/")  # "states/<i>/<key>/..."
                key = parts[2] if len(parts) > 2 else ""
                mine = c.state.get(key) if isinstance(c.state, dict) else None
                if mine is not None and type(mine).__qualname__ == cls:
                    return mine
                base = getattr(self._algo, "model", None)
                return copy.deepcopy(base) if type(base).__qualname__ == cls else None

            try:
                c.state = safestore.decode(d, arrays, module_for)
            except safestore.StoreError as exc:
                raise _CacheMiss(f"client {getattr(c, 'id', '?')}: {exc}") from None
