"""Where a DP release's noise comes from and how far it reaches.

:func:`noise_source` gives every party of a release (a client id, or the aggregator) its
own noise stream; :func:`noise_tail` bounds how far one release's noise may reach, so that
a ring or a widened bound is planned with room for it (a 2^-40 tail, :data:`TAIL_PROBABILITY`).
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from secagg.privacy.samplers import (
    NoiseSource,
    noise_generator,
)

#: Probability that the noise of one release exceeds the headroom planned for it.
TAIL_PROBABILITY = 2.0 ** -40


def noise_tail(std: float, entries: int, mechanism: str = "gaussian",
               failure: float = TAIL_PROBABILITY) -> float:
    """A bound B with P[max over ``entries`` entries of |noise| > B] <= ``failure``.

    Gaussian and discrete Gaussian (sub-Gaussian with variance proxy std^2, Canonne-Kamath-
    Steinke 2020; sums of independent shares add their proxies): B = std sqrt(2 ln(2 n/p)).
    Skellam of variance v = std^2 (Chernoff: P[X >= a] <= exp(-(a asinh(a/v) - sqrt(v^2 + a^2)
    + v))): B solves that bound = p / (2 n) by bisection.
    """
    if entries < 1 or std <= 0:
        return 0.0
    per = failure / (2.0 * entries)
    if mechanism != "skellam":
        return std * math.sqrt(2.0 * math.log(1.0 / per))
    v = std * std

    def log_tail(a: float) -> float:
        return -(a * math.asinh(a / v) - math.sqrt(v * v + a * a) + v)

    lo, hi = 0.0, std * math.sqrt(2.0 * math.log(1.0 / per)) + 1.0
    while log_tail(hi) > math.log(per):
        hi *= 2.0
    for _ in range(100):
        mid = (lo + hi) / 2.0
        if log_tail(mid) > math.log(per):
            lo = mid
        else:
            hi = mid
    return hi


def _derived_seed(seed: int, *parts: Any) -> int:
    words = [seed] + [zlib.crc32(str(p).encode()) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(2, np.uint64).view(np.uint64)[0])


def noise_source(seed: int | None, round: int, phase: str, party: Any) -> NoiseSource:
    """The noise stream of ``party`` (a client id, or the aggregator) for one release:
    secret (a fresh OS-keyed AES-CTR generator) when ``seed`` is None; with a user seed, a
    reproducible stream derived from (seed, round, phase, party) -- the same wherever the
    party runs, and not private."""
    if seed is None:
        return noise_generator()
    return noise_generator(_derived_seed(seed, round, phase, party))
