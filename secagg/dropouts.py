"""Injected client dropouts, deterministic by seed.

A layer calls :meth:`DropoutModel.survivors` at each of its stages with the clients still
live; the model returns those that stay. Decisions depend only on (seed, round, phase,
stage, client), so a run is reproducible whatever the layer does in between.

A rate is either per stage (each live client drops at each stage with that probability) or
per round (``per="round"``: the probability that a client drops somewhere in a phase, spread
evenly over the stages the layer declares in :meth:`~secagg.layers.base.Layer.dropout_stages`,
so a 10% rate drops about 10% of the cohort whatever the layer -- four stages of SecureSum or
one of Plaintext). :class:`~secagg.federation.Federation` and ``secagg run --dropout`` use
per-round rates.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Collection, Mapping, Sequence

import numpy as np

from secagg.stages import Stage


def _key(text: str) -> int:
    return zlib.crc32(text.encode())


class DropoutModel:
    """Each live client drops at each stage with a fixed probability.

    Args:
        rate: drop probability per client per stage (or per round, see ``per``), or a
            mapping stage -> per-stage probability (stages not named use ``default``).
        seed: the run seed.
        default: probability for stages missing from a mapping ``rate``.
        per: ``"stage"`` (``rate`` applies at every stage) or ``"round"`` (``rate`` is the
            probability of dropping somewhere in a phase: each of the k stages set by
            :meth:`for_stages` uses 1 - (1 - rate)^(1/k)). A mapping ``rate`` is per stage.
    """

    def __init__(
        self,
        rate: float | Mapping[str, float] = 0.0,
        seed: int = 0,
        default: float = 0.0,
        per: str = "stage",
    ) -> None:
        rates = dict(rate) if isinstance(rate, Mapping) else None
        for p in ([rate] if rates is None else list(rates.values())) + [default]:
            if not 0.0 <= float(p) < 1.0:  # type: ignore[arg-type]
                raise ValueError(f"dropout probability must be in [0, 1), got {p}")
        if per not in ("stage", "round"):
            raise ValueError(f"per must be 'stage' or 'round', got {per!r}")
        if per == "round" and rates is not None:
            raise ValueError("a per-stage mapping of rates cannot be per='round'")
        self.rate = rate
        self.seed = seed
        self.default = default
        self.per = per
        self.stages: tuple[str, ...] = (Stage.UPLOAD,)
        self.round = 0
        self.phase = ""

    def for_stages(self, stages: Sequence[str]) -> DropoutModel:
        """Declare the stages a per-round rate is spread over (the layer's
        :meth:`~secagg.layers.base.Layer.dropout_stages`); returns self."""
        if not stages:
            raise ValueError("at least one dropout stage is needed")
        self.stages = tuple(stages)
        return self

    def at(self, round: int, phase: str) -> DropoutModel:
        """Point the model at a (round, phase); returns self."""
        self.round, self.phase = round, phase
        return self

    def probability(self, stage: str) -> float:
        """Drop probability at ``stage`` for a client still live there."""
        if isinstance(self.rate, Mapping):
            return float(self.rate.get(stage, self.default))
        if self.per == "round":
            return -math.expm1(math.log1p(-float(self.rate)) / len(self.stages))
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
