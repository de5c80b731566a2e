"""A client's proof that its update's L2 norm is at most the bound, verified on shares.

The statement, over the field F_p (p = 2^61 - 1, :mod:`.field`): the client's encoded
update x in Z^d (fixed point, ``x = trunc(update * scale)``, truncation toward zero so that
encoding never grows the norm) satisfies ``sum_i x_i^2 <= B^2``, ``B = bound * scale``.
Aggregators A and B hold additive shares of x and of the proof; neither sees x.

What the client shares (besides x)
    * the bits a of N = sum x_i^2 and the bits a' of B^2 - N (n_b = bitlen(B^2) each);
    * for each of R wraparound projections (below), the w bits of z_k + H, H = 2^(w-1);
    * two fully linear proofs (Boneh, Boyle, Corrigan-Gibbs, Gilboa, Ishai, CRYPTO 2019):
      FLP1 for the squares and FLP2 for the bits (below).

Checks (all linear in the shares, except the two gadget tests on revealed values)
    1. Bits are bits: FLP2 proves p2(k) = f2(k)^2 - f2(k) at every bit's node k and the
       aggregators check sum_k gamma_k p2(k) = 0 with fresh random gamma.
    2. 0 <= N <= B^2: sum_j 2^j a_j + sum_j 2^j a'_j = B^2 (both sums < 2^n_b < p/2, so the
       identity holds over the integers).
    3. sum x_i^2 = N (mod p): FLP1 with the gadget G(u_1..u_c) = sum u_j^2 over L = d / c
       chunks of c = ceil(sqrt d) coordinates; p1(k) = G(chunk k) and sum_k p1(k) = N.
    4. No wraparound (PINE's concern, Rothblum et al. 2023): the field could hide a huge
       integer sum of squares that is = N mod p. After x is fixed, the aggregators draw R
       vectors r_k in {-1, 0, 1}^d (0 w.p. 1/2, +-1 w.p. 1/4) and the client shows
       z_k = <r_k, x> + H in [0, 2^w) by its w bits (identity checked linearly).

Exact mode (``Params(exact=True)``): the statement is ``sum x_i^2 = B^2`` exactly (for a
one-coordinate field: x = +-B, a centred bit such as adaptive clipping's count). Besides the
checks above the aggregators open their shares of B^2 - N = sum_j 2^j a'_j, which is 0 for
every honest client (so opening it reveals nothing) and nonzero for any other; soundness is
unchanged (one more linear identity on shares).

Parameters: w is the largest integer with d * 4^w <= 2^60, H = 2^(w-1), B = floor(H / alpha)
with alpha = 9, R = 41.

Soundness against a cheating client (robustness). As in Prio and the VDAF drafts it assumes
both aggregators follow the protocol: one that colludes with a client can open whatever
makes that client pass. Every challenge is the hash of both aggregators' committed halves,
drawn after what it tests is fixed (the wraparound vectors after every upload of the round,
the FLP points and weights after every proof), so it is uniform and unknown to the client
when it commits. Let x be the (signed, |x_i| < p/2) vector the shares define.
    (a) If some |x_j| >= 2^w: fix every entry of r_k but r_kj, and let c be the projection
        with r_kj = 0. The candidates c + x_j and c - x_j each differ from c by +-x_j, at
        least 2^w in absolute value, while two points of the accepted window [-H, H) differ
        by less than 2^w. So if c passes, neither other candidate does (pass iff r_kj = 0,
        prob 1/2); if c fails, passing needs r_kj != 0 (prob 1/2). Each projection passes
        w.p. <= 1/2, independently, all R of them w.p. <= 2^-R (check 1 and the bit
        identity make the window exact).
    (b) Otherwise sum x_i^2 < d * 4^w <= 2^60 < p as an integer, and check 3 with check 2
        makes it equal to N <= B^2 over the integers: the statement is true.
    FLP errors: if some p1(k) != G(chunk k), p1 - G(f1) is a nonzero polynomial of degree
    <= 2L, zero at the uniform point r1 in [2L+1, p) w.p. <= 2L / (p - 2L - 1); same for FLP2
    with L2 = 2 n_b + R w bits; a non-bit with p2 honest survives gamma w.p. <= 1/p.
    Total per client: 2^-41 + 2L/(p-2L-1) + 2L2/(p-2L2-1) + 1/p < 2^-41 + 2^-47 < 2^-40
    for d <= 2^40 (w <= 30 so L2 = 2 n_b + R w <= 4 * 30 + 41 * 30 = 1350; L <= 2^20).
    :meth:`Params.soundness_log2` computes the bound for given parameters (about -41.0).

Completeness: an honest z_k is a sum of independent terms in [-|x_i|, |x_i|] with mean 0,
so P(|z_k| >= H) <= 2 exp(-H^2 / (2 B^2)) <= 2 exp(-alpha^2 / 2) < 2^-57 (Hoeffding); an
honest client fails one of R projections w.p. < 2^-51 (it then refuses to prove).

Zero knowledge (against one honest-but-curious aggregator): its shares are uniform (the
other aggregator's share is the client's fresh randomness); it learns the other's opened
values: f1(r1), f2(r2), uniform because f1(0) and f2(0) are fresh random seeds and
lambda_0(r) != 0 off the nodes; p1(r1) and p2(r2), functions of those; and linear checks
that are 0 for an honest client. So it learns pass/fail only. An actively deviating
aggregator can learn one bit per client and run by the selective-failure attack (shift its
share of x by delta and watch whether the client still passes), as in Prio; it cannot bias
the challenges (commit, then open) and cannot read any update.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from secagg.validated_sum import field as F
from secagg.validated_sum.errors import BoundExceeded

#: wraparound projections (soundness 2^-R of that check)
REPS = 41
#: honest projections stay within alpha * B (Hoeffding)
ALPHA = 9


@dataclass(frozen=True)
class Params:
    """Public parameters of one validated sum: dimension, bound, and what follows from
    them (all derived, none chosen by hand)."""

    dim: int
    bound: float
    reps: int = REPS
    alpha: int = ALPHA
    #: the statement is sum x_i^2 = B^2 exactly (see the module docstring)
    exact: bool = False

    def __post_init__(self) -> None:
        if self.dim < 1:
            raise ValueError("dim must be >= 1")
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise ValueError("bound must be a positive finite number")
        if self.wbits < 2 or self.units < 1:
            raise ValueError(f"dim {self.dim} too large for the field")

    @property
    def wbits(self) -> int:
        """w: the largest integer with dim * 4^w <= 2^60."""
        w = 0
        while self.dim * 4 ** (w + 1) <= 1 << 60:
            w += 1
        return w

    @property
    def half(self) -> int:
        """H = 2^(w-1): the wraparound window is [-H, H)."""
        return 1 << (self.wbits - 1)

    @property
    def units(self) -> int:
        """B: the bound in fixed-point units."""
        return self.half // self.alpha

    @property
    def scale(self) -> float:
        """Fixed-point scale: x = trunc(update * scale)."""
        return self.units / self.bound

    @property
    def norm_bits(self) -> int:
        """n_b = bitlen(B^2)."""
        return (self.units * self.units).bit_length()

    @property
    def chunk(self) -> int:
        """c: the squares gadget's arity."""
        return math.isqrt(self.dim - 1) + 1

    @property
    def calls(self) -> int:
        """L: the squares gadget's calls."""
        return -(-self.dim // self.chunk)

    @property
    def nbits(self) -> int:
        """L2: how many bits the client shares."""
        return 2 * self.norm_bits + self.reps * self.wbits

    @property
    def proof_len(self) -> int:
        """Field elements of the proof vector u."""
        return self.chunk + 2 * self.calls + 1 + self.nbits + 1 + 2 * self.nbits + 1

    @property
    def check_len(self) -> int:
        """Field elements each aggregator opens per client."""
        return self.chunk + 2 + 2 + 1 + 1 + self.reps + int(self.exact)

    def soundness_log2(self) -> float:
        """log2 of the per-client soundness error bound (see the module docstring)."""
        p = F.P
        eps = (2.0 ** -self.reps + 2 * self.calls / (p - 2 * self.calls - 1)
               + 2 * self.nbits / (p - 2 * self.nbits - 1) + 1 / p)
        return math.log2(eps)

    def slices(self) -> dict[str, slice]:
        """Where each part lies in the proof vector u."""
        c, L, nb = self.chunk, self.calls, self.nbits
        o = 0
        out = {}
        for name, n in (("seed1", c), ("p1", 2 * L + 1), ("bits", nb), ("seed2", 1),
                        ("p2", 2 * nb + 1)):
            out[name] = slice(o, o + n)
            o += n
        return out


def encode(update: np.ndarray, params: Params) -> np.ndarray:
    """Fixed point, truncated toward zero (never grows the norm): int64 vector. Raises
    :class:`BoundExceeded` for a coordinate beyond the bound (the norm is then too)."""
    v = np.asarray(update, dtype=np.float64).reshape(-1)
    if v.shape[0] != params.dim:
        raise ValueError(f"update has {v.shape[0]} coordinates, expected {params.dim}")
    if not np.all(np.isfinite(v)):
        raise ValueError("update has a non-finite coordinate")
    if np.any(np.abs(v) > params.bound):  # then |x_i| <= B, and d B^2 < p: no wrap below
        raise BoundExceeded(float(np.linalg.norm(v)), params.bound)
    return np.trunc(v * params.scale).astype(np.int64)


def squared_norm(x: np.ndarray) -> int:
    """sum x_i^2 of an :func:`encode`'d vector, exactly (each |x_i| <= B and d B^2 < p)."""
    xf = F.from_signed(x)
    return int(F.total(F.mul(xf, xf)))


def decode(total: np.ndarray, params: Params) -> np.ndarray:
    """A field sum of encoded updates back to floats."""
    return F.to_signed(total).astype(np.float64) / params.scale


def _bits(value: int, n: int) -> list[int]:
    return [(value >> j) & 1 for j in range(n)]


def _flp_values(first: np.ndarray, lag: F.Lagrange, m: int) -> np.ndarray:
    """Values at nodes 0..m-1 of the polynomials (one per column) given at 0..n-1."""
    return np.vstack([first, F.matmul(lag.extension(m), first)])


def prove(x: np.ndarray, wrap: np.ndarray, params: Params, *, honest: bool = True,
          claimed_norm: int | None = None,
          randbytes: Callable[[int], bytes] = secrets.token_bytes) -> np.ndarray:
    """The proof vector u for the encoded update ``x`` (int64) and the wraparound
    projections ``wrap`` (R x d in {-1, 0, 1}).

    An honest prover (the default) raises :class:`BoundExceeded` for a statement that is
    false. ``honest=False`` is the attack hook of tests and demonstrations: it claims
    ``claimed_norm`` (default min(N, B^2)) and takes every bit modulo its range, which is
    the best a prover can do without breaking the checks' soundness.
    """
    c, L, nb = params.chunk, params.calls, params.nbits
    units2 = params.units * params.units
    xf = F.from_signed(x)
    norm = int(F.total(F.mul(xf, xf)))  # = sum x_i^2 over Z when there is no wraparound
    if honest and norm > units2:
        raise BoundExceeded(math.sqrt(norm) / params.scale, params.bound)
    if honest and params.exact and norm != units2:
        raise ValueError(f"exact mode: squared norm {norm} is not bound^2 = {units2} (an "
                         "honest client sends exactly +-bound)")
    if claimed_norm is None:
        claimed_norm = norm if honest else min(norm, units2)
    z = np.rint(wrap.astype(np.float64) @ x.astype(np.float64)).astype(np.int64) + params.half
    if honest and (np.any(z < 0) or np.any(z >= 1 << params.wbits)):
        raise BoundExceeded(math.sqrt(norm) / params.scale, params.bound)
    bits = _bits(claimed_norm % (1 << params.norm_bits), params.norm_bits)
    bits += _bits((units2 - claimed_norm) % (1 << params.norm_bits), params.norm_bits)
    for zk in z.tolist():
        bits += _bits(zk % (1 << params.wbits), params.wbits)
    assert len(bits) == nb

    # FLP1: the squares
    padded = np.zeros(L * c, dtype=np.uint64)
    padded[:params.dim] = xf
    seed1 = F.expand(randbytes(32), b"flp1-seed", c)
    first = np.vstack([seed1[None, :], padded.reshape(L, c)])
    vals = _flp_values(first, F.lagrange(L + 1), 2 * L + 1)
    p1 = F.total(F.mul(vals, vals), axis=1)

    return np.concatenate([seed1, p1, bits_proof(np.array(bits, dtype=np.uint64), randbytes)])


def bits_proof(bits: np.ndarray, randbytes: Callable[[int], bytes] = secrets.token_bytes
               ) -> np.ndarray:
    """The tail of the proof vector for the claimed ``bits`` (field elements): the bits, the
    seed f2(0) and p2 = f2^2 - f2 at the nodes 0..2 L2 (FLP2)."""
    nb = bits.shape[0]
    seed2 = F.expand(randbytes(32), b"flp2-seed", 1)
    first2 = np.concatenate([seed2, bits])[:, None]
    v2 = _flp_values(first2, F.lagrange(nb + 1), 2 * nb + 1)[:, 0]
    p2 = F.sub(F.mul(v2, v2), v2)
    return np.concatenate([bits, seed2, p2])


@dataclass(frozen=True)
class Challenge:
    """The verification randomness of one round (from the aggregators' joint coin, drawn
    after every proof of the round is fixed, so it is as good as fresh per client), with
    the Lagrange coefficients at the points computed once."""

    r1: int
    r2: int
    gamma: np.ndarray
    lam_f1: np.ndarray
    lam_p1: np.ndarray
    lam_f2: np.ndarray
    lam_p2: np.ndarray


def challenge(coin: bytes, context: bytes, params: Params) -> Challenge:
    """Derive the FLP points and bit-check weights from the joint coin."""
    L, nb = params.calls, params.nbits
    r1 = F.expand_ints(coin, context + b"|r1", 1, 2 * L + 1, F.P)[0]
    r2 = F.expand_ints(coin, context + b"|r2", 1, 2 * nb + 1, F.P)[0]
    gamma = F.expand(coin, context + b"|gamma", nb)
    return Challenge(r1, r2, gamma, F.lagrange(L + 1).at(r1), F.lagrange(2 * L + 1).at(r1),
                     F.lagrange(nb + 1).at(r2), F.lagrange(2 * nb + 1).at(r2))


def wrap_vectors(coin: bytes, context: bytes, params: Params) -> np.ndarray:
    """The R wraparound projections of one round, from the joint coin drawn after every
    update of the round is fixed."""
    return F.expand_ternary(coin, context + b"|wrap", (params.reps, params.dim))


def check_share(role: int, x_share: np.ndarray, u_share: np.ndarray, wrap: np.ndarray,
                ch: Challenge, params: Params) -> np.ndarray:
    """One aggregator's share of the opened check values (role 0 adds the constants)."""
    c, L, nb, w = params.chunk, params.calls, params.nbits, params.wbits
    s = params.slices()
    padded = np.zeros(L * c, dtype=np.uint64)
    padded[:params.dim] = x_share
    first = np.vstack([u_share[s["seed1"]][None, :], padded.reshape(L, c)])
    f1 = F.matmul(ch.lam_f1[None, :], first)[0]
    p1s = u_share[s["p1"]]
    p1r = F.dot(ch.lam_p1, p1s)
    bits = u_share[s["bits"]]
    nbits = params.norm_bits
    pow2n = np.array([pow(2, j, F.P) for j in range(max(nbits, w))], dtype=np.uint64)
    norm = F.dot(pow2n[:nbits], bits[:nbits])
    comp = F.dot(pow2n[:nbits], bits[nbits:2 * nbits])
    out1 = (int(F.total(p1s[1:L + 1])) - norm) % F.P
    first2 = np.concatenate([u_share[s["seed2"]], bits])
    f2 = F.dot(ch.lam_f2, first2)
    p2s = u_share[s["p2"]]
    p2r = F.dot(ch.lam_p2, p2s)
    out2 = F.dot(ch.gamma, p2s[1:nb + 1])
    units2 = params.units * params.units
    lin = (norm + comp - (units2 if role == 0 else 0)) % F.P
    z = F.signed_matmul(wrap, x_share)
    wb = bits[2 * nbits:].reshape(params.reps, w)
    zbits = F.matmul(wb, pow2n[:w, None])[:, 0]
    wrapc = F.sub(z, zbits)
    if role == 0:
        wrapc = F.add(wrapc, np.uint64(params.half))
    tail = [np.array([comp], dtype=np.uint64)] if params.exact else []
    return np.concatenate([f1, np.array([p1r, out1, f2, p2r, out2, lin], dtype=np.uint64),
                           wrapc, *tail])


def decide(share_a: np.ndarray, share_b: np.ndarray, params: Params, *,
           skip: frozenset[str] = frozenset()) -> str | None:
    """Both aggregators' opened shares -> None when the proof holds, else the failed check.

    ``skip`` is test-only: ``{"wrap"}`` or ``{"bits"}`` leaves the wraparound or the
    bits-are-bits check out, to show a test fails without it."""
    v = F.add(share_a, share_b)
    c = params.chunk
    f1 = v[:c]
    p1r, out1, f2, p2r, out2, lin = (int(t) for t in v[c:c + 6])
    wrapc = v[c + 6:c + 6 + params.reps]
    if p1r != int(F.total(F.mul(f1, f1))):
        return "squares proof (FLP1) fails at the random point"
    if out1 != 0:
        return "sum of squares differs from the claimed norm"
    if p2r != (f2 * f2 - f2) % F.P:
        return "bits proof (FLP2) fails at the random point"
    if "bits" not in skip and out2 != 0:
        return "a shared bit is not 0 or 1"
    if lin != 0:
        return "claimed squared norm is not within [0, bound^2]"
    if "wrap" not in skip and np.any(wrapc != 0):
        return "a wraparound projection is outside its window"
    if params.exact and "exact" not in skip and int(v[-1]) != 0:
        return "squared norm is not exactly bound^2 (not a centred bit)"
    return None
