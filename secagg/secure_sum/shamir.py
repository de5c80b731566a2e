"""Shamir secret sharing over the prime field F_p, p = 2^127 - 1, vectorised.

Many secrets are shared at once: with a Vandermonde matrix V (holders x threshold) of the
holders' evaluation points and a coefficient matrix C (threshold x secrets) whose first row is
the secrets, the shares are V @ C mod p (one numpy object-array product; every entry is an
exact Python int). Reconstruction multiplies the shares by Lagrange coefficients at zero,
computed once per holder set and cached; the weights of a holder set of client-id points
(:func:`_denominators`) cost O(h^2) int64 work and one batch inversion, and the error check
and f(0) share them. Shares of 32-byte secrets are carried as three field
elements (11 + 11 + 10 bytes, each < p).

Decoding with error correction (:func:`decode`). The h shares of one secret, shared with
threshold t, are a codeword of the Reed-Solomon code of length h and dimension t (the values at
the holders' points of a polynomial of degree <= t - 1); its minimum distance is h - t + 1, so
up to ``max_errors(h, t)`` = floor((h - t) / 2) wrong shares can be corrected, and their
holders located. :func:`decode` first checks every column at once against one random
combination of the dual code's parity checks (a numpy product; a wrong column passes with
probability 1/p), and runs Berlekamp-Welch only on the columns that fail it.
"""

from __future__ import annotations

import math
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


_SMALL_POINT = 1 << 20  # differences of such points: three multiply below 2^63


def _check_points(xs: Sequence[int]) -> None:
    if len(set(xs)) != len(xs) or any(not 0 < x < P for x in xs):
        raise ValueError("evaluation points must be distinct and in [1, p)")


def _denominators(xs: Sequence[int]) -> list[int]:
    """D_i = prod_{k != i} (x_i - x_k) mod p, for every i.

    Client ids make small points (< 2^20): their differences are multiplied three at a time
    in int64 (exact, |product| < 2^60), each row's partial products once more as exact Python
    integers, and each row is reduced mod p once -- instead of h^2 modular multiplications in
    the interpreter. Other points take the plain loop."""
    h = len(xs)
    if 1 < h and max(xs) < _SMALL_POINT:
        pts = np.array(xs, dtype=np.int64)
        diff = pts[:, None] - pts[None, :]
        np.fill_diagonal(diff, 1)
        pad = (-h) % 3
        if pad:
            diff = np.concatenate([diff, np.ones((h, pad), np.int64)], axis=1)
        part = diff[:, 0::3] * diff[:, 1::3] * diff[:, 2::3]
        return [math.prod(row) % P for row in part.tolist()]
    out = []
    for i, xi in enumerate(xs):
        den = 1
        for k, xk in enumerate(xs):
            if k != i:
                den = den * (xi - xk) % P
        out.append(den)
    return out


def _invert_all(values: Sequence[int]) -> list[int]:
    """Inverses mod p of nonzero field elements: one modular exponentiation for all (batch
    inversion: prefix products, one inverse, then back)."""
    prefix = [1]
    for d in values:
        prefix.append(prefix[-1] * d % P)
    inv = pow(prefix[-1], P - 2, P)
    out = [0] * len(values)
    for i in range(len(values) - 1, -1, -1):
        out[i] = inv * prefix[i] % P
        inv = inv * values[i] % P
    return out


def _lagrange_from(xs: Sequence[int], inv_dens: Sequence[int]) -> list[int]:
    """l_i = prod_{j != i} x_j / (x_j - x_i), given 1 / D_i = 1 / prod_{j != i} (x_i - x_j)."""
    whole = math.prod(xs)  # exact: prod_{j != i} x_j = whole / x_i, one reduction each
    sign = -1 if (len(xs) - 1) % 2 else 1  # prod_{j != i}(x_j - x_i) = (-1)^(h-1) D_i
    return [(whole // x) % P * inv * sign % P for x, inv in zip(xs, inv_dens, strict=True)]


@lru_cache(maxsize=256)  # one holder set per client on a SecAgg+ graph: keep it small
def lagrange_at_zero(xs: tuple[int, ...]) -> tuple[int, ...]:
    """Lagrange coefficients l_i with f(0) = sum_i l_i f(x_i) for any f of degree < len(xs)."""
    _check_points(xs)
    return tuple(_lagrange_from(xs, _invert_all(_denominators(xs))))


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


def max_errors(holders: int, threshold: int) -> int:
    """The most wrong shares :func:`decode` corrects among ``holders`` shares of a secret
    shared with ``threshold`` t: floor((h - t) / 2) (half the code's distance h - t + 1,
    rounded down); 0 when h <= t + 1 (errors are then at best detected)."""
    return max(0, (holders - threshold) // 2)


class DecodingError(ValueError):
    """The shares of a column are not within :func:`max_errors` of any polynomial of degree
    below the threshold: more wrong shares than the code corrects (or fewer shares than the
    threshold).

    Attributes:
        column: the first column that did not decode.
        holders, threshold, max_errors: h, t and the bound floor((h - t) / 2).
    """

    def __init__(self, column: int, holders: int, threshold: int) -> None:
        self.column = column
        self.holders = holders
        self.threshold = threshold
        self.max_errors = max_errors(holders, threshold)
        super().__init__(
            f"column {column}: {holders} shares with threshold {threshold} are not within "
            f"{self.max_errors} errors of a polynomial of degree < {threshold}"
        )


class ParityPolynomial:
    """One random polynomial g = g_0 + g_1 x + ... for the parity checks of many holder sets:
    a holder set with h - t = e checks against its truncation g_e = g_0 + ... + g_{e-1}
    x^(e-1) (uniform among the polynomials of degree below e), whose value at each point is
    kept once computed -- O(e) per point for all the holder sets it is in, instead of O(e)
    per point per set (the server decodes one holder set per client, each point in ~k).

    Sound as long as g is drawn after the shares it checks are fixed (the server draws it at
    finish, from the OS CSPRNG by default): for a column that is not a codeword, the check
    is a nonzero linear function of g_e's coefficients, so it passes with probability 1/p,
    whichever other columns share g.
    """

    def __init__(self, rand: Callable[[int], bytes] = os.urandom) -> None:
        self._rand = rand
        self._coeffs: list[int] = []
        self._at: dict[int, tuple[list[int], int]] = {}  # x -> (g_0..g_e at x, x^e)

    def values(self, xs: Sequence[int], e: int) -> list[int]:
        """g_e(x) mod p for every x in ``xs``."""
        if e > len(self._coeffs):
            self._coeffs += random_elements(e - len(self._coeffs), self._rand)
        coeffs, out = self._coeffs, []
        for x in xs:
            prefix, power = self._at.get(x) or ([0], 1)
            if len(prefix) <= e:
                for j in range(len(prefix) - 1, e):
                    prefix.append((prefix[-1] + coeffs[j] * power) % P)
                    power = power * x % P
                self._at[x] = (prefix, power)
            out.append(prefix[e])
        return out


def _parity_weights(xs: tuple[int, ...], threshold: int, rand: Callable[[int], bytes],
                    inv_dens: Sequence[int] | None = None,
                    parity: ParityPolynomial | None = None) -> np.ndarray:
    """c_i = w_i g(x_i), w_i = 1 / prod_{k != i}(x_i - x_k), g a random polynomial of degree
    below h - t: sum_i c_i y_i = 0 for every codeword y (the dual code of a Reed-Solomon
    code is a generalised Reed-Solomon code with the column multipliers w_i). ``inv_dens``:
    the w_i when the caller has them; ``parity``: g shared with other holder sets."""
    h = len(xs)
    w = inv_dens if inv_dens is not None else _invert_all(_denominators(xs))
    if parity is not None:
        gx = parity.values(xs, h - threshold)
        return np.array([a * wi % P for a, wi in zip(gx, w, strict=True)], dtype=object)
    g = random_elements(h - threshold, rand)
    # g at every point at once (Horner over an object array, reduced once at the end: the
    # small points keep the intermediate integers short)
    pts = np.array(xs, dtype=object)
    acc = np.full(h, g[-1] if g else 0, dtype=object)
    every = 8 if max(xs) < _SMALL_POINT else 1  # reduce often enough to stay short
    for step, c in enumerate(reversed(g[:-1])):
        acc = acc * pts + c
        if step % every == every - 1:
            acc %= P
    return np.array([int(a) % P * wi % P for a, wi in zip(acc, w, strict=True)], dtype=object)


def _solve(rows: list[list[int]], rhs: list[int], unknowns: int) -> list[int] | None:
    """One solution of the linear system over F_p (free variables 0), None if inconsistent."""
    m = [r[:] + [b] for r, b in zip(rows, rhs, strict=True)]
    pivots: list[int] = []
    row = 0
    for col in range(unknowns):
        piv = next((i for i in range(row, len(m)) if m[i][col]), None)
        if piv is None:
            continue
        m[row], m[piv] = m[piv], m[row]
        inv = pow(m[row][col], P - 2, P)
        m[row] = [v * inv % P for v in m[row]]
        for i in range(len(m)):
            if i != row and m[i][col]:
                f = m[i][col]
                m[i] = [(a - f * b) % P for a, b in zip(m[i], m[row], strict=True)]
        pivots.append(col)
        row += 1
        if row == len(m):
            break
    if any(all(v == 0 for v in r[:unknowns]) and r[unknowns] for r in m[row:]):
        return None
    sol = [0] * unknowns
    for i, col in enumerate(pivots):
        sol[col] = m[i][unknowns]
    return sol


def _divide(num: list[int], den: list[int]) -> tuple[list[int], bool]:
    """num / den over F_p (coefficients lowest first, den monic): (quotient, exact?)."""
    num = num[:]
    q = [0] * max(1, len(num) - len(den) + 1)
    for i in range(len(num) - len(den), -1, -1):
        c = num[i + len(den) - 1]
        q[i] = c
        if c:
            for j, d in enumerate(den):
                num[i + j] = (num[i + j] - c * d) % P
    return q, not any(num)


def _evaluate(coeffs: list[int], x: int) -> int:
    acc = 0
    for c in reversed(coeffs):
        acc = (acc * x + c) % P
    return acc


def _berlekamp_welch(xs: tuple[int, ...], ys: list[int], threshold: int) -> tuple[int, set[int]]:
    """Decode one column: (f(0), the rows where f disagrees), for the polynomial f of degree
    < t within max_errors of ``ys``; raises ValueError when there is none."""
    h, e = len(xs), max_errors(len(xs), threshold)
    n_q = threshold + e
    rows, rhs = [], []
    for x, y in zip(xs, ys, strict=True):
        powers = [1]
        for _ in range(n_q):
            powers.append(powers[-1] * x % P)
        # Q(x) - y E(x) = y x^e, E monic of degree e
        rows.append(powers[:n_q] + [(-y * powers[k]) % P for k in range(e)])
        rhs.append(y * powers[e] % P)
    sol = _solve(rows, rhs, n_q + e)
    if sol is None:
        raise ValueError("no polynomial within the error bound")
    f, exact = _divide(sol[:n_q], sol[n_q:] + [1])
    f = f[:threshold] if len(f) > threshold else f
    if not exact:
        raise ValueError("no polynomial within the error bound")
    bad = {i for i in range(h) if _evaluate(f, xs[i]) != ys[i] % P}
    if len(bad) > e:
        raise ValueError("no polynomial within the error bound")
    return f[0] % P, bad


def decode(
    xs: Sequence[int], shares: np.ndarray, threshold: int,
    rand: Callable[[int], bytes] = os.urandom, *, parity: ParityPolynomial | None = None,
) -> tuple[list[int], list[set[int]]]:
    """Recover secrets from h >= t holders' shares, correcting wrong ones.

    Each column of ``shares`` is decoded on its own as a Reed-Solomon codeword of length h and
    dimension t: up to :func:`max_errors` (h, t) = floor((h - t) / 2) wrong shares per column
    are corrected and located. All columns are first checked together against a random
    parity check (drawn from ``rand``, default the OS CSPRNG, so that no share can be chosen
    to pass it); only a failing column is decoded with Berlekamp-Welch, after trying it
    without the rows already found wrong in another column (one liar usually spoils every
    column it holds a share of).

    Args:
        xs: the h holders' distinct evaluation points.
        shares: object array (h, n_secrets) (or a list of rows).
        threshold: t, the number of shares that reconstruct.
        parity: the random polynomial of the parity checks, shared by the holder sets of
            one reconstruction (drawn after every share arrived); None draws one here.

    Returns:
        (the secrets, and per column the set of row indices whose share was wrong).

    Raises:
        DecodingError: a column has more wrong shares than the bound (or h < t).
    """
    pts = tuple(int(x) for x in xs)
    arr = np.asarray(shares, dtype=object)
    h = len(pts)
    if arr.ndim != 2 or arr.shape[0] != h:
        raise ValueError(f"need a ({h}, n_secrets) array of shares, got {arr.shape}")
    if h < threshold:
        raise DecodingError(0, h, threshold)
    cols = arr.shape[1]
    if h == threshold:  # no redundancy: nothing to check or correct
        return reconstruct(pts, arr), [set() for _ in range(cols)]
    _check_points(pts)
    inv_dens = _invert_all(_denominators(pts))  # shared by the parity check and f(0)
    weights = _parity_weights(pts, threshold, rand, inv_dens, parity)
    ok = [int(v) % P == 0 for v in weights.dot(arr)]
    # f(0) of a column that passes the check: the interpolation through all h points has
    # degree < t there, so the weights of all h points give it (no second set of weights)
    whole = np.array(_lagrange_from(pts, inv_dens), dtype=object)
    values = [int(v) % P for v in whole.dot(arr)] if cols else []
    errors: list[set[int]] = [set() for _ in range(cols)]
    known: set[int] = set()
    sub_weights: dict[tuple[int, ...], np.ndarray] = {}
    for c in range(cols):
        if ok[c]:
            continue
        column = [int(v) % P for v in arr[:, c]]
        if known and len(known) <= max_errors(h, threshold):
            keep = [i for i in range(h) if i not in known]
            sub = tuple(pts[i] for i in keep)
            if sub not in sub_weights:  # one parity check per set of rows left
                sub_weights[sub] = _parity_weights(sub, threshold, rand, parity=parity)
            w = sub_weights[sub]
            if int(w.dot(np.array([column[i] for i in keep], dtype=object))) % P == 0:
                values[c] = reconstruct(sub[:threshold],
                                        np.array([[column[i]] for i in keep[:threshold]],
                                                 dtype=object))[0]
                errors[c] = {i for i in known
                             if _lagrange_at(sub[:threshold], [column[j] for j in
                                                               keep[:threshold]], pts[i])
                             != column[i]}
                if len(errors[c]) <= max_errors(h, threshold):
                    continue
        try:
            values[c], errors[c] = _berlekamp_welch(pts, column, threshold)
        except ValueError:
            raise DecodingError(c, h, threshold) from None
        known |= errors[c]
    return values, errors


def _lagrange_at(xs: tuple[int, ...], ys: list[int], x: int) -> int:
    """The value at ``x`` of the polynomial of degree < len(xs) through (xs, ys)."""
    total = 0
    for i, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * (x - xj) % P
                den = den * (xi - xj) % P
        total = (total + yi * num * pow(den, P - 2, P)) % P
    return total


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
