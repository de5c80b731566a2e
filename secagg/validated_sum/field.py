"""Vectorised arithmetic in the prime field F_p, p = 2^61 - 1 (a Mersenne prime).

Elements are numpy ``uint64`` arrays holding canonical representatives in [0, p). Products
of two elements need 122 bits, so :func:`mul` splits each operand into a 31-bit and a
30-bit limb (every partial product < 2^61) and folds with 2^61 = 1 (mod p); :func:`matmul`
splits into three 21-bit limbs and lets BLAS do exact float64 products (each limb product
< 2^42, accumulated over at most 2^9 terms per block, < 2^51, and at most three products of
equal weight added, < 2^53, so every float is an exact integer). Randomness comes from
AES-256-CTR (:mod:`secagg.secure_sum.prg`) under keys derived with SHA-256 from >= 128-bit
seeds and a context string, so a share expanded for one (run, round, client, purpose) is
never the share of another.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np

from secagg.secure_sum.prg import expand_into

#: the field's modulus
P: int = (1 << 61) - 1
_P = np.uint64(P)
_M31 = np.uint64((1 << 31) - 1)
_M30 = np.uint64((1 << 30) - 1)
_S61 = np.uint64(61)
_LIMB = 21
_BLOCK = 1 << 9


def reduce(a: np.ndarray) -> np.ndarray:
    """Canonical form of uint64 values below 2^64 (fold 2^61 = 1 twice)."""
    a = (a & _P) + (a >> _S61)
    with np.errstate(over="ignore"):
        return np.where(a >= _P, a - _P, a)


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b mod p (canonical inputs)."""
    s = np.add(a, b, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return np.where(s >= _P, s - _P, s)


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a - b mod p (canonical inputs)."""
    s = np.add(a, _P - np.asarray(b, dtype=np.uint64), dtype=np.uint64)
    with np.errstate(over="ignore"):
        return np.where(s >= _P, s - _P, s)


def neg(a: np.ndarray) -> np.ndarray:
    """-a mod p."""
    return sub(np.zeros_like(np.asarray(a, dtype=np.uint64)), a)


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a * b mod p, elementwise with broadcasting (canonical inputs)."""
    a = np.asarray(a, dtype=np.uint64)
    b = np.asarray(b, dtype=np.uint64)
    a0, a1 = a & _M31, a >> np.uint64(31)
    b0, b1 = b & _M31, b >> np.uint64(31)
    hi = a1 * b1  # < 2^60, weight 2^62 = 2 (mod p)
    mid = a1 * b0 + a0 * b1  # < 2^62, weight 2^31
    lo = a0 * b0  # < 2^62
    # mid * 2^31 = (mid >> 30) * 2^61 + (mid & (2^30-1)) * 2^31 = (mid >> 30) + ...
    s = (hi << np.uint64(1)) + (mid >> np.uint64(30)) + ((mid & _M30) << np.uint64(31)) + lo
    return reduce(s)


def total(a: np.ndarray, axis: int | None = None) -> np.ndarray:
    """Sum mod p along ``axis`` (all of it by default)."""
    a = np.asarray(a, dtype=np.uint64)
    lo = np.sum(a & np.uint64(0xFFFFFFFF), axis=axis, dtype=np.uint64)  # < n * 2^32
    hi = np.sum(a >> np.uint64(32), axis=axis, dtype=np.uint64)  # < n * 2^29
    return add(mul(reduce(hi), np.uint64(1 << 32)), reduce(lo))


def dot(a: np.ndarray, b: np.ndarray) -> int:
    """Inner product of two vectors mod p."""
    return int(matmul(np.asarray(a, dtype=np.uint64)[None, :],
                      np.asarray(b, dtype=np.uint64)[:, None])[0, 0])


def _limbs(a: np.ndarray) -> list[np.ndarray]:
    mask = np.uint64((1 << _LIMB) - 1)
    return [((a >> np.uint64(_LIMB * i)) & mask).astype(np.float64) for i in range(3)]


def _fold(x: np.ndarray) -> np.ndarray:
    """float64 arrays of exact integers in (-2^53, 2^53) -> canonical field elements."""
    return np.mod(x.astype(np.int64), P).astype(np.uint64)


@lru_cache(maxsize=8)
def _pow2(k: int) -> np.uint64:
    return np.uint64(pow(2, k, P))


Prepared = list[tuple[int, list[np.ndarray]]]


def prepare(a: np.ndarray) -> Prepared:
    """The left operand of :func:`matmul` split once into column blocks of float limbs
    (for a matrix used many times)."""
    a = np.asarray(a, dtype=np.uint64)
    return [(start, _limbs(a[:, start:start + _BLOCK])) for start in range(0, a.shape[1], _BLOCK)]


def matmul(a: np.ndarray | Prepared, b: np.ndarray) -> np.ndarray:
    """Matrix product mod p of canonical (m, n) and (n, k) arrays, through exact float64
    BLAS products of 21-bit limbs (``a`` may be :func:`prepare`'d)."""
    blocks = a if isinstance(a, list) else prepare(a)
    b = np.asarray(b, dtype=np.uint64)
    out: np.ndarray | None = None
    for start, al in blocks:
        bl = _limbs(b[start:start + _BLOCK])
        for k in range(5):  # limb pairs of equal weight 2^(21k) summed first: < 3 * 2^52
            acc = None
            for i in range(max(0, k - 2), min(2, k) + 1):
                prod = al[i] @ bl[k - i]
                acc = prod if acc is None else acc + prod
            part = mul(_fold(acc), _pow2(_LIMB * k))
            out = part if out is None else add(out, part)
    assert out is not None
    return out


def signed_matmul(r: np.ndarray, a: np.ndarray) -> np.ndarray:
    """(R, n) matrix of small signed integers (|entry| <= 1) times field vector ``a`` mod p."""
    out = np.zeros(r.shape[0], dtype=np.uint64)
    rf = r.astype(np.float64)
    step = 1 << 30  # |sum| < step * 2^21 < 2^53
    for start in range(0, a.shape[0], step):
        al = _limbs(a[start:start + step])
        for i in range(3):
            part = _fold(rf[:, start:start + step] @ al[i])
            out = add(out, mul(part, _pow2(_LIMB * i)))
    return out


def from_signed(x: np.ndarray) -> np.ndarray:
    """Signed integers (|x| < 2^62) -> field elements."""
    return np.mod(np.asarray(x, dtype=np.int64), P).astype(np.uint64)


def to_signed(a: np.ndarray) -> np.ndarray:
    """Field elements -> representatives in (-p/2, p/2) as int64."""
    a = np.asarray(a, dtype=np.uint64).astype(np.int64)
    return np.where(a > P // 2, a - P, a)


def inv(a: int) -> int:
    """Multiplicative inverse of a nonzero element."""
    if a % P == 0:
        raise ZeroDivisionError("0 has no inverse in F_p")
    return pow(a, P - 2, P)


def derive_key(seed: bytes, context: bytes) -> bytes:
    """A 256-bit AES key for one purpose: SHA-256 over a length-prefixed seed and context."""
    if len(seed) < 16:
        raise ValueError("seeds are at least 128 bits")
    h = hashlib.sha256(b"secagg.validated_sum.prg\x00")
    h.update(len(seed).to_bytes(2, "big") + seed)
    h.update(len(context).to_bytes(4, "big") + context)
    return h.digest()


def expand(seed: bytes, context: bytes, n: int) -> np.ndarray:
    """``n`` uniform field elements from ``seed`` bound to ``context``: 61-bit words of the
    AES-256-CTR keystream, the single word equal to p rejected and replaced by the stream's
    continuation (so the result is exactly uniform over F_p)."""
    key = derive_key(seed, context)
    extra = 8
    while True:
        buf = np.empty(n + extra, dtype="<u8")
        expand_into(key, buf)
        words = buf & _P
        good = words[words != _P]
        if good.shape[0] >= n:
            return np.ascontiguousarray(good[:n]).astype(np.uint64)
        extra *= 2  # pragma: no cover - probability about n * 2^-61


def expand_ternary(seed: bytes, context: bytes, shape: tuple[int, int]) -> np.ndarray:
    """An int8 array of iid entries: 0 w.p. 1/2, +1 and -1 w.p. 1/4 each (two keystream
    bits per entry)."""
    count = shape[0] * shape[1]
    buf = np.empty((count + 7) // 8 + 1, dtype="<u8")
    expand_into(derive_key(seed, context), buf)
    byts = buf.view(np.uint8)[:count]
    nonzero = (byts & 1).astype(np.int8)
    sign = ((byts >> 1) & 1).astype(np.int8) * 2 - 1
    return (nonzero * sign).reshape(shape)


def expand_ints(seed: bytes, context: bytes, n: int, low: int, high: int) -> list[int]:
    """``n`` uniform integers in [low, high) by rejection from the field stream
    (``high - low <= p``)."""
    span = high - low
    if not 0 < span <= P:
        raise ValueError("bad range")
    out: list[int] = []
    counter = 0
    limit = (P // span) * span
    while len(out) < n:
        for w in expand(seed, context + b"|" + str(counter).encode(), 2 * n + 4).tolist():
            if w < limit and len(out) < n:
                out.append(low + w % span)
        counter += 1
    return out


class Lagrange:
    """Interpolation on the nodes 0, 1, ..., n-1 of F_p.

    ``weights[k] = 1 / prod_{m != k} (k - m)`` (barycentric weights), used both by the
    prover (extending a polynomial given by values to more nodes) and by the verifiers
    (the value at one random point as a linear form in the node values).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        fact = [1] * (n + 1)
        for i in range(1, n + 1):
            fact[i] = fact[i - 1] * i % P
        w = []
        for k in range(n):
            den = fact[k] * fact[n - 1 - k] % P
            if (n - 1 - k) % 2:
                den = P - den
            w.append(inv(den))
        self.weights = np.array(w, dtype=np.uint64)

    def at(self, r: int) -> np.ndarray:
        """The coefficients lambda_k(r), so that f(r) = sum_k lambda_k(r) f(k) for any f of
        degree < n. ``r`` must not be a node."""
        r %= P
        if r < self.n:
            raise ValueError("evaluation point is an interpolation node")
        diffs = [(r - k) % P for k in range(self.n)]
        ell = 1
        for v in diffs:
            ell = ell * v % P
        # batch inversion of the differences
        prefix = [1] * (self.n + 1)
        for i, v in enumerate(diffs):
            prefix[i + 1] = prefix[i] * v % P
        acc = inv(prefix[self.n])
        invs = [0] * self.n
        for i in range(self.n - 1, -1, -1):
            invs[i] = acc * prefix[i] % P
            acc = acc * diffs[i] % P
        lam = mul(self.weights, np.array(invs, dtype=np.uint64))
        return mul(lam, np.uint64(ell))

    @lru_cache(maxsize=8)  # noqa: B019 - instances are themselves cached, few and small
    def extension(self, m: int) -> Prepared:
        """The (m - n, n) matrix taking values at nodes 0..n-1 to values at n..m-1
        (:func:`prepare`'d)."""
        inv_small = [0] + [inv(i) for i in range(1, m)]
        ells = []
        v = 1
        for j in range(1, self.n + 1):
            v = v * j % P  # prod_{k<n} (n - k) = n!
        for t in range(self.n, m):
            ells.append(v)  # prod_{k<n} (t - k) = t! / (t-n)!
            v = v * (t + 1) % P * inv_small[t + 1 - self.n] % P
        inv_arr = np.array(inv_small, dtype=np.uint64)
        tt = np.arange(self.n, m)[:, None]
        kk = np.arange(self.n)[None, :]
        base = mul(inv_arr[tt - kk], self.weights[None, :])
        return prepare(mul(base, np.array(ells, dtype=np.uint64)[:, None]))


@lru_cache(maxsize=16)
def lagrange(n: int) -> Lagrange:
    """The cached :class:`Lagrange` for ``n`` nodes."""
    return Lagrange(n)
