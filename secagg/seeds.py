"""Deterministic seeds derived from a run's seed and labels.

One function, imported by the engine, the DP-SGD trainer, the algorithms and the threat
models alike, so that none of them has to import another to share it.
"""

from __future__ import annotations

import zlib

import numpy as np

__all__ = ["derive_seed"]


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed derived deterministically from ints and strings (strings enter as
    their CRC-32): the same parts give the same seed in every process and platform."""
    words = [p if isinstance(p, int) else zlib.crc32(p.encode()) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(2, np.uint32).view(np.uint64)[0] >> 1)
