"""Injected client dropouts, deterministic by seed.

A layer calls :meth:`DropoutModel.survivors` at each of its stages with the clients still
live; the model returns those that stay. Decisions depend only on (seed, round, phase,
stage, client), so a run is reproducible whatever the layer does in between.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Mapping, Sequence

import numpy as np


def _key(text: str) -> int:
    return zlib.crc32(text.encode())


class DropoutModel:
    """Each live client drops at each stage with a fixed probability.

    Args:
        rate: drop probability per client per stage, or a mapping stage -> probability
            (stages not named use ``default``).
        seed: the run seed.
        default: probability for stages missing from a mapping ``rate``.
    """

    def __init__(
        self, rate: float | Mapping[str, float] = 0.0, seed: int = 0, default: float = 0.0
    ) -> None:
        rates = dict(rate) if isinstance(rate, Mapping) else None
        for p in ([rate] if rates is None else list(rates.values())) + [default]:
            if not 0.0 <= float(p) < 1.0:  # type: ignore[arg-type]
                raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        self.rate = rate
        self.seed = seed
        self.default = default
        self.round = 0
        self.phase = ""

    def at(self, round: int, phase: str) -> DropoutModel:
        """Point the model at a (round, phase); returns self."""
        self.round, self.phase = round, phase
        return self

    def probability(self, stage: str) -> float:
        """Drop probability at ``stage``."""
        if isinstance(self.rate, Mapping):
            return float(self.rate.get(stage, self.default))
        return float(self.rate)

    def survivors(self, stage: str, clients: Sequence[int]) -> list[int]:
        """The clients among ``clients`` still live after ``stage`` (order kept)."""
        p = self.probability(stage)
        if p == 0.0 or not clients:
            return list(clients)
        out = []
        for c in clients:
            ss = np.random.SeedSequence(
                [self.seed, self.round, _key(self.phase), _key(stage), int(c)]
            )
            if np.random.default_rng(ss).random() >= p:
                out.append(c)
        return out


class ScheduledDropouts(DropoutModel):
    """Drop exactly the named clients at the named stages (for tests and what-if runs).

    Args:
        schedule: stage -> clients that drop at that stage (in every round and phase).
    """

    def __init__(self, schedule: Mapping[str, Collection[int]]) -> None:
        super().__init__(0.0)
        self.schedule = {k: set(v) for k, v in schedule.items()}

    def survivors(self, stage: str, clients: Sequence[int]) -> list[int]:
        """The clients among ``clients`` not scheduled to drop at ``stage``."""
        gone = self.schedule.get(stage, set())
        return [c for c in clients if c not in gone]
