"""Deterministic seeds derived from a run's seed and labels."""

from __future__ import annotations

import zlib

import numpy as np


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed derived deterministically from ints and strings."""
    words = [p if isinstance(p, int) else zlib.crc32(p.encode()) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(2, np.uint32).view(np.uint64)[0] >> 1)
