"""Shamir secret sharing over the prime field F_p, p = 2^127 - 1, vectorised.

Many secrets are shared at once: with a Vandermonde matrix V (holders x threshold) of the
holders' evaluation points and a coefficient matrix C (threshold x secrets) whose first row is
the secrets, the shares are V @ C mod p (one numpy object-array product; every entry is an
exact Python int). Reconstruction multiplies the shares by Lagrange coefficients at zero,
computed once per holder set and cached. Shares of 32-byte secrets are carried as three field
elements (11 + 11 + 10 bytes, each < p).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from functools import lru_cache

import numpy as np

P = (1 << 127) - 1
ELEMENT_BYTES = 16
_CHUNKS = (11, 11, 10)
CHUNKS_PER_KEY = len(_CHUNKS)


def random_elements(count: int, rand: Callable[[int], bytes] = os.urandom) -> list[int]:
    """``count`` field elements from ``rand`` (default the OS CSPRNG): 127 uniform bits
    each, reduced mod p (the only non-uniformity: p itself maps to 0, probability 2^-127)."""
    raw = rand(ELEMENT_BYTES * count)
    return [
        (int.from_bytes(raw[i : i + ELEMENT_BYTES], "little") & P) % P
        for i in range(0, len(raw), ELEMENT_BYTES)
    ]


@lru_cache(maxsize=256)  # one holder set per client on a SecAgg+ graph: keep it small
def _vandermonde(xs: tuple[int, ...], threshold: int) -> np.ndarray:
    rows = []
    for x in xs:
        row, acc = [], 1
        for _ in range(threshold):
            row.append(acc)
            acc = acc * x % P
        rows.append(row)
    out = np.empty((len(xs), threshold), dtype=object)
    out[:, :] = rows
    return out


def share(
    secrets: Sequence[int],
    threshold: int,
    xs: Sequence[int],
    rand: Callable[[int], bytes] = os.urandom,
) -> np.ndarray:
    """Share each secret t-out-of-len(xs).

    Args:
        secrets: field elements in [0, p).
        threshold: t, the number of shares that reconstruct (1 <= t <= len(xs)).
        xs: distinct nonzero evaluation points in [1, p), one per holder.
        rand: byte source for the random coefficients (default the OS CSPRNG).

    Returns:
        An object array of shape (len(xs), len(secrets)): row j holds holder j's shares.
    """
    n, s = len(xs), len(secrets)
    if not 1 <= threshold <= n:
        raise ValueError(f"threshold must be in 1..{n}, got {threshold}")
    if len(set(xs)) != n or any(not 0 < x < P for x in xs):
        raise ValueError("evaluation points must be distinct and in [1, p)")
    if any(not 0 <= c < P for c in secrets):
        raise ValueError("secrets must be field elements in [0, p)")
    coeffs = np.empty((threshold, s), dtype=object)
    coeffs[0, :] = list(secrets)
    if threshold > 1:
        coeffs[1:, :] = np.array(random_elements((threshold - 1) * s, rand), dtype=object).reshape(
            threshold - 1, s
        )
    return _vandermonde(tuple(int(x) for x in xs), threshold).dot(coeffs) % P


@lru_cache(maxsize=256)  # one holder set per client on a SecAgg+ graph: keep it small
def lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """Lagrange coefficients l_i with f(0) = sum_i l_i f(x_i) for any f of degree < len(xs)."""
    if len(set(xs)) != len(xs) or any(not 0 < x < P for x in xs):
        raise ValueError("evaluation points must be distinct and in [1, p)")
    nums, dens = [], []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * xj % P
                den = den * (xj - xi) % P
        nums.append(num)
        dens.append(den)
    # batch inversion: one modular exponentiation for all denominators
    prefix = [1]
    for d in dens:
        prefix.append(prefix[-1] * d % P)
    inv = pow(prefix[-1], P - 2, P)
    invs = [0] * len(dens)
    for i in range(len(dens) - 1, -1, -1):
        invs[i] = inv * prefix[i] % P
        inv = inv * dens[i] % P
    return tuple(n * d % P for n, d in zip(nums, invs, strict=True))


def reconstruct(xs: Sequence[int], shares: np.ndarray) -> list[int]:
    """Recover the secrets from exactly t holders' shares.

    Args:
        xs: the t holders' evaluation points.
        shares: object array (t, n_secrets) (or a list of rows) of the holders' shares.

    Returns:
        The n_secrets secrets as Python ints.
    """
    lam = np.array(lagrange_at_zero(tuple(int(x) for x in xs)), dtype=object)
    arr = np.asarray(shares, dtype=object)
    if arr.ndim != 2 or arr.shape[0] != len(lam):
        raise ValueError(f"need a ({len(lam)}, n_secrets) array of shares, got {arr.shape}")
    return [int(v) % P for v in lam.dot(arr)]


def key_to_elements(key: bytes) -> list[int]:
    """Split a 32-byte key into three field elements (11 + 11 + 10 bytes, each < p)."""
    if len(key) != 32:
        raise ValueError("keys are 32 bytes")
    out, pos = [], 0
    for c in _CHUNKS:
        out.append(int.from_bytes(key[pos : pos + c], "little"))
        pos += c
    return out


def elements_to_key(elements: Sequence[int]) -> bytes:
    """Inverse of :func:`key_to_elements`.

    Raises:
        ValueError: an element does not fit its chunk (wrong shares were combined).
    """
    if len(elements) != CHUNKS_PER_KEY:
        raise ValueError(f"need {CHUNKS_PER_KEY} elements")
    parts = []
    for e, c in zip(elements, _CHUNKS, strict=True):
        if not 0 <= e < 1 << (8 * c):
            raise ValueError("reconstructed element does not fit a key chunk")
        parts.append(int(e).to_bytes(c, "little"))
    return b"".join(parts)


def element_bytes(e: int) -> bytes:
    """16-byte little-endian encoding of a field element."""
    return int(e).to_bytes(ELEMENT_BYTES, "little")


def element_from_bytes(raw: bytes) -> int:
    """Decode a 16-byte field element.

    Raises:
        ValueError: the value is not below p.
    """
    v = int.from_bytes(raw, "little")
    if v >= P:
        raise ValueError("field element out of range")
    return v
