"""Mask expansion: AES-256-CTR keystream written straight into preallocated integer buffers.

A mask is the keystream of AES-256 in counter mode (zero initial counter block) under a
256-bit key that is used for exactly one mask (keys are derived per session, round and pair,
see :mod:`secagg.secure_sum.keys`), reinterpreted as little-endian unsigned words. Words are
uniform over Z_{2^32} or Z_{2^64}, hence uniform over any Z_{2^k} after masking the low k bits.
No numpy generator and no short seed is involved.

:func:`add_masks` adds many masks to one vector a cache-sized block at a time (each key's
keystream continuing from block to block), so the vector is read and written once for all of
them: the client masks its input that way, the server removes the masks from the sum.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_ZERO_IV = bytes(16)
_zeros = memoryview(bytes(1 << 16))


def word_dtype(ring_bits: int) -> np.dtype:
    """The numpy word used for arithmetic in Z_{2^ring_bits}: uint32 for k <= 32, else uint64."""
    if not 1 <= ring_bits <= 64:
        raise ValueError(f"ring_bits must be in 1..64, got {ring_bits}")
    return np.dtype("<u4") if ring_bits <= 32 else np.dtype("<u8")


def _zero_bytes(n: int) -> memoryview:
    global _zeros
    if len(_zeros) < n:
        _zeros = memoryview(bytes(max(n, 2 * len(_zeros))))
    return _zeros[:n]


def expand_into(key: bytes, out: np.ndarray) -> np.ndarray:
    """Fill the C-contiguous unsigned array ``out`` with the AES-256-CTR keystream of ``key``.

    Args:
        key: 32 bytes, used for this one mask only.
        out: a C-contiguous uint32/uint64 array; overwritten in place (no copy is made).

    Returns:
        ``out``.
    """
    if len(key) != 32:
        raise ValueError("mask keys are 256-bit (32 bytes)")
    if not out.flags.c_contiguous or out.dtype.kind != "u":
        raise ValueError("out must be a C-contiguous unsigned integer array")
    nbytes = out.nbytes
    if nbytes == 0:
        return out
    enc = Cipher(algorithms.AES(key), modes.CTR(_ZERO_IV)).encryptor()
    buf = memoryview(out.reshape(-1).view(np.uint8))
    # update_into needs len(buf) >= len(data) + 15: write all but the last 15 bytes in place,
    # then the tail (the keystream continues where it stopped).
    head = max(0, nbytes - 15)
    if head:
        written = enc.update_into(_zero_bytes(head), buf)
        if written != head:  # pragma: no cover - CTR is a stream mode
            raise RuntimeError("short keystream write")
    if head < nbytes:
        buf[head:] = enc.update(_zero_bytes(nbytes - head))
    return out


def mask(key: bytes, length: int, ring_bits: int) -> np.ndarray:
    """A fresh mask of ``length`` words for Z_{2^ring_bits} (low ``ring_bits`` bits uniform)."""
    return expand_into(key, np.empty(length, dtype=word_dtype(ring_bits)))


class MaskAccumulator:
    """Adds and subtracts masks into one accumulator through a reusable scratch buffer.

    Args:
        acc: the accumulator (C-contiguous words; modified in place, arithmetic wraps).
    """

    def __init__(self, acc: np.ndarray) -> None:
        self.acc = acc
        self._scratch = np.empty_like(acc)

    def add(self, key: bytes, sign: int = 1) -> None:
        """acc <- acc + sign * PRG(key) (mod 2^word bits); sign is +1 or -1."""
        expand_into(key, self._scratch)
        if sign >= 0:
            np.add(self.acc, self._scratch, out=self.acc)
        else:
            np.subtract(self.acc, self._scratch, out=self.acc)


_OPEN = 1024

CHUNK_WORDS = 1 << 15
"""Words per block of :func:`add_masks`: 128 KiB of uint32 (256 KiB of uint64), so a block,
its keystream scratch and the cipher state stay in a core's L2 cache while every mask is
added to it."""


def add_masks(
    acc: np.ndarray,
    masks: Sequence[tuple[bytes, int]],
    *,
    before: Callable[[int, int, np.ndarray], None] | None = None,
    after: Callable[[int, int, np.ndarray], None] | None = None,
    chunk: int | None = None,
) -> np.ndarray:
    """acc <- acc + sum_i sign_i PRG(key_i) (wrapping), one cache-sized block at a time.

    The result is the same as one :meth:`MaskAccumulator.add` per mask over the whole vector
    (each key's AES-256-CTR keystream continues from block to block), but every block is read
    and written once for all the masks instead of once per mask: the memory traffic of the
    masks becomes that of the keystream alone.

    Args:
        acc: C-contiguous uint32/uint64 accumulator, modified in place.
        masks: (32-byte key, +1 or -1) per mask; each key is used for this one mask only.
        before: called as ``before(lo, hi, block)`` on each block (``acc[lo:hi]``) before its
            masks are added (e.g. to fill it from the input); it may raise to abort.
        after: called as ``after(lo, hi, block)`` once the block is fully masked (e.g. to
            reduce it mod 2^k and feed it to a hash).
        chunk: words per block (None: :data:`CHUNK_WORDS`).

    Returns:
        ``acc``.
    """
    if not acc.flags.c_contiguous or acc.dtype.kind != "u" or acc.ndim != 1:
        raise ValueError("acc must be a 1-D C-contiguous unsigned integer array")
    if any(len(key) != 32 for key, _ in masks):
        raise ValueError("mask keys are 256-bit (32 bytes)")
    if chunk is None:
        chunk = CHUNK_WORDS
    if chunk < 1:
        raise ValueError("chunk must be positive")
    n = acc.size
    if n == 0:
        return acc
    words = min(chunk, n)
    # update_into wants 15 bytes of slack past the data: one spare 16-byte block
    scratch = np.empty(words + 16 // acc.itemsize, dtype=acc.dtype)
    out = memoryview(scratch.view(np.uint8))
    # at most _OPEN cipher contexts at once (a server may unmask 10^5 pair masks): the
    # masks go in groups, each group in one blocked pass (before/after run on the first/last)
    groups = [masks[i : i + _OPEN] for i in range(0, len(masks), _OPEN)] or [[]]
    for g, group in enumerate(groups):
        encs = [(Cipher(algorithms.AES(key), modes.CTR(_ZERO_IV)).encryptor(), sign >= 0)
                for key, sign in group]
        for lo in range(0, n, chunk):
            hi = min(n, lo + chunk)
            block = acc[lo:hi]
            if before is not None and g == 0:
                before(lo, hi, block)
            ks = scratch[: hi - lo]
            zeros = _zero_bytes(block.nbytes)
            for enc, plus in encs:
                enc.update_into(zeros, out)
                if plus:
                    np.add(block, ks, out=block)
                else:
                    np.subtract(block, ks, out=block)
            if after is not None and g == len(groups) - 1:
                after(lo, hi, block)
    return acc


class SeededEntropy:
    """A deterministic byte source for experiments and tests ONLY (never for deployments).

    Bytes are the AES-256-CTR keystream under SHA-256(b"secagg-entropy" | seed | stream),
    so runs with the same seed and stream reproduce keys, seeds and Shamir coefficients.

    Args:
        seed: the experiment seed.
        stream: separates independent consumers (e.g. one per client).
    """

    def __init__(self, seed: int, stream: int | str = 0) -> None:
        import hashlib

        key = hashlib.sha256(f"secagg-entropy|{int(seed)}|{stream}".encode()).digest()
        self._enc = Cipher(algorithms.AES(key), modes.CTR(_ZERO_IV)).encryptor()

    def __call__(self, n: int) -> bytes:
        """The next ``n`` bytes."""
        return self._enc.update(bytes(n))
