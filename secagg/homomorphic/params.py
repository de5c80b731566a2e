"""Encryption parameters for additive aggregation under BFV and CKKS (TenSEAL / SEAL).

Only additions are ever computed on ciphertexts, so no multiplicative depth is needed: the
coefficient modulus is sized for the plaintext range plus the noise of one fresh
encryption times the cohort, nothing more. Ciphertext bytes per value are proportional to
the data modulus (``2 * bits(q_data) / 8`` for BFV, twice that for CKKS, whose slots are
N/2), so choosing it tightly is what keeps uploads small.

SEAL facts used here (SEAL 3.x/4.x, as shipped by TenSEAL 0.3):

* with more than one coefficient prime, the last one is the *special* prime: fresh
  public-key encryptions are made modulo q_data * p and then divided by p, so the data
  modulus q_data is the product of the other primes, and the public key's noise is divided
  by p. Every prime is at most 60 bits and congruent to 1 mod 2N.
* 128-bit security caps the total modulus at 109/218/438/881 bits for
  N = 4096/8192/16384/32768 (HomomorphicEncryption.org standard, SEAL's default check).
* BFV plaintexts are encoded as round(q m / t) ("scaling variant"), so a sum of n
  ciphertexts carries only n * (fresh noise + 1/2) of noise, with no t^2 term.
* BFV batching needs a prime plain modulus t = 1 mod 2N of at most 60 bits; slots = N.
  CKKS slots = N/2.

Noise model. Public-key encryption then division by p leaves, per coefficient, the
rounding error r0 + r1*s (r uniform in [-1/2, 1/2], s the ternary secret) plus
(public-key noise)/p. BFV decrypts correctly while the summed noise is below
q_data / (2t); the worst case of r0 + r1*s is (1 + ||s||_1)/2 <= (N + 1)/2, so BFV gets a
margin of log2(n) + log2(N) + 6 bits above t -- a worst-case, not a probabilistic, margin.
For CKKS the decoded slot error is the canonical embedding of that noise: per slot
sigma(r0)_j + sigma(r1)_j * sigma(s)_j (the product is what makes the tails heavy). With
each factor bounded at 8 standard deviations (probability of exceeding < 1e-11 per
ciphertext), the error of a sum of n fresh ciphertexts at scale Delta is at most

    ( 8 * sqrt(n N / 6) + 64 * N * sqrt(n / 18) + n * N * e_pk / p ) / Delta
      + S * log2(N) * 2^-52            (double-precision FFT of the decoder)

where S bounds |sum| and e_pk = 8 * 3.2 * sqrt(4N/3 + 1). See :func:`ckks_error_bound`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import tenseal as ts

from secagg.errors import EncodingOverflow

#: Largest total coefficient-modulus bits for 128-bit security (HE standard, SEAL tc128).
MAX_MODULUS_BITS: dict[int, int] = {4096: 109, 8192: 218, 16384: 438, 32768: 881}
#: Largest bit size of one coefficient prime or of the BFV plain modulus in SEAL.
MAX_PRIME_BITS = 60
#: Smallest special prime we accept (it divides the public-key noise).
MIN_SPECIAL_BITS = 20
#: Standard deviation of SEAL's error distribution.
SEAL_SIGMA = 3.2
#: BFV plain modulus cap: t <= 60 bits, so the largest fixed-point ring is 59 bits.
MAX_BFV_RING_BITS = MAX_PRIME_BITS - 1


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin primality test for n < 3.3e24 (all 64-bit integers)."""
    if n < 2:
        return False
    small = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for p in small:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in small:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def batching_prime(bits: int, poly_modulus_degree: int) -> int:
    """The smallest prime t = 1 (mod 2N) with exactly ``bits`` bits (so t > 2^(bits-1)).

    Searching upwards from 2^(bits-1) keeps t away from SEAL's coefficient primes, which
    SEAL searches downwards from 2^bits.

    Raises:
        EncodingOverflow: no such prime exists (bits too small for N, or above 60).
    """
    m = 2 * poly_modulus_degree
    if bits > MAX_PRIME_BITS or (1 << bits) <= m:
        raise EncodingOverflow(
            f"no {bits}-bit batching prime for N={poly_modulus_degree} (SEAL allows "
            f"{m.bit_length() + 1}..{MAX_PRIME_BITS} bits)"
        )
    k = (1 << (bits - 1)) // m + 1
    while True:
        p = k * m + 1
        if p.bit_length() > bits:
            raise EncodingOverflow(f"no {bits}-bit prime = 1 mod {m}")
        if is_prime(p):
            return p
        k += 1


def _split_primes(data_bits: int, n_degree: int) -> list[int]:
    """Split ``data_bits`` into as few primes (<= 60 bits each) as possible, evenly."""
    k = max(1, math.ceil(data_bits / MAX_PRIME_BITS))
    base = math.ceil(data_bits / k)
    floor_bits = (2 * n_degree).bit_length() + 2
    return [max(base, floor_bits)] * k


@dataclass(frozen=True)
class HEParams:
    """One encryption parameter set.

    Attributes:
        scheme: ``"bfv"`` or ``"ckks"``.
        poly_modulus_degree: N (a power of two, 4096..32768).
        coeff_mod_bit_sizes: bit sizes of the coefficient primes; the last is the special
            prime, the others form the data modulus ciphertexts travel under.
        plain_modulus: BFV plain modulus t (prime, = 1 mod 2N); 0 for CKKS.
        scale_bits: CKKS scale Delta = 2^scale_bits; 0 for BFV.
        ring_bits: BFV: the fixed-point ring Z_{2^k} the plain modulus covers (t > 2^k).
        planned_clients: the cohort size the noise margin was sized for.
    """

    scheme: str
    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    plain_modulus: int = 0
    scale_bits: int = 0
    ring_bits: int = 0
    planned_clients: int = 1
    notes: dict[str, float] = field(default_factory=dict, compare=False, hash=False)

    @property
    def slots(self) -> int:
        """Values one ciphertext carries: N for BFV, N/2 for CKKS."""
        return self.poly_modulus_degree if self.scheme == "bfv" else self.poly_modulus_degree // 2

    @property
    def data_bits(self) -> int:
        """Bits of the data modulus q_data (all primes but the special one)."""
        return sum(self.coeff_mod_bit_sizes[:-1])

    def make_context(self, n_threads: int = 1) -> ts.Context:
        """Generate a fresh TenSEAL context (with its secret key) for these parameters."""
        if self.scheme == "bfv":
            ctx = ts.context(
                ts.SCHEME_TYPE.BFV, self.poly_modulus_degree, plain_modulus=self.plain_modulus,
                coeff_mod_bit_sizes=list(self.coeff_mod_bit_sizes), n_threads=n_threads,
            )
        else:
            ctx = ts.context(
                ts.SCHEME_TYPE.CKKS, self.poly_modulus_degree,
                coeff_mod_bit_sizes=list(self.coeff_mod_bit_sizes), n_threads=n_threads,
            )
            ctx.global_scale = float(2**self.scale_bits)
        return ctx

    def as_dict(self) -> dict[str, object]:
        """JSON-able description."""
        out: dict[str, object] = {
            "scheme": self.scheme,
            "poly_modulus_degree": self.poly_modulus_degree,
            "coeff_mod_bit_sizes": list(self.coeff_mod_bit_sizes),
            "slots": self.slots,
            "planned_clients": self.planned_clients,
        }
        if self.scheme == "bfv":
            out.update(plain_modulus=self.plain_modulus, ring_bits=self.ring_bits)
        else:
            out.update(scale_bits=self.scale_bits)
        return out


def _degrees(poly_modulus_degree: int | None) -> list[int]:
    if poly_modulus_degree is None:
        return sorted(MAX_MODULUS_BITS)
    if poly_modulus_degree not in MAX_MODULUS_BITS:
        raise ValueError(
            f"poly_modulus_degree must be one of {sorted(MAX_MODULUS_BITS)}, got "
            f"{poly_modulus_degree}"
        )
    return [poly_modulus_degree]


def _with_special(data: list[int], n_degree: int) -> tuple[int, ...] | None:
    """Append the largest special prime the 128-bit budget allows (None if < 20 bits)."""
    room = MAX_MODULUS_BITS[n_degree] - sum(data)
    special = min(MAX_PRIME_BITS, room)
    if special < max(MIN_SPECIAL_BITS, (2 * n_degree).bit_length() + 2):
        return None
    return (*data, special)


def bfv_params(
    ring_bits: int, n_clients: int, poly_modulus_degree: int | None = None
) -> HEParams:
    """BFV parameters whose plain modulus holds a ``ring_bits``-bit centred fixed-point sum
    of up to ``n_clients`` ciphertexts, decrypted exactly (worst-case noise margin).

    The smallest N (4096 first) whose 128-bit modulus budget fits is chosen, unless
    ``poly_modulus_degree`` fixes it.

    Raises:
        EncodingOverflow: the ring needs more than 59 bits (t is capped at 60 bits) or
            the noise margin does not fit the modulus budget of any allowed N.
    """
    if ring_bits > MAX_BFV_RING_BITS:
        raise EncodingOverflow(
            f"BFV plain modulus is at most {MAX_PRIME_BITS} bits, so the fixed-point sum "
            f"may use at most {MAX_BFV_RING_BITS} bits; the plan needs {ring_bits}. Loosen "
            "the precision or the bounds (this layer does not split values into limbs)"
        )
    for n_deg in _degrees(poly_modulus_degree):
        t_bits = max(ring_bits + 1, (2 * n_deg).bit_length() + 2)
        if t_bits > MAX_PRIME_BITS:
            continue
        margin = math.ceil(math.log2(max(n_clients, 1))) + int(math.log2(n_deg)) + 6
        coeffs = _with_special(_split_primes(t_bits + margin, n_deg), n_deg)
        if coeffs is None:
            continue
        t = batching_prime(t_bits, n_deg)
        return HEParams("bfv", n_deg, coeffs, plain_modulus=t, ring_bits=ring_bits,
                        planned_clients=n_clients)
    raise EncodingOverflow(
        f"no BFV parameters for a {ring_bits}-bit sum of {n_clients} clients within "
        f"128-bit security (N in {_degrees(poly_modulus_degree)})"
    )


def _ckks_noise(n_degree: int, n_clients: int, special_bits: int) -> float:
    """Numerator of the CKKS error bound: bound on |slot error| * Delta (see module doc)."""
    e_pk = 8 * SEAL_SIGMA * math.sqrt(4 * n_degree / 3 + 1)
    return (
        8 * math.sqrt(n_clients * n_degree / 6)
        + 64 * n_degree * math.sqrt(n_clients / 18)
        + n_clients * n_degree * e_pk / 2.0**special_bits
    )


def ckks_error_bound(params: HEParams, n_clients: int, sum_bound: float) -> float:
    """Bound on |decrypted sum - true sum| for every slot of a sum of ``n_clients`` fresh
    CKKS encryptions whose true sum is at most ``sum_bound`` in magnitude.

    It holds unless a noise factor exceeds 8 standard deviations (probability < 1e-11
    per ciphertext); see the module docstring for the derivation.
    """
    if params.scheme != "ckks":
        raise ValueError("ckks_error_bound needs CKKS parameters")
    noise = _ckks_noise(params.poly_modulus_degree, n_clients, params.coeff_mod_bit_sizes[-1])
    fft = sum_bound * math.log2(params.poly_modulus_degree) * 2.0**-52
    return noise / 2.0**params.scale_bits + fft


def ckks_params(
    sum_bound: float,
    n_clients: int,
    precision: float,
    poly_modulus_degree: int | None = None,
) -> HEParams:
    """CKKS parameters for sums of up to ``n_clients`` vectors with |sum| <= ``sum_bound``
    so that every decrypted entry is within ``precision`` of the true sum
    (:func:`ckks_error_bound` <= precision).

    Half the precision budget goes to encryption noise (it fixes the scale), the data
    modulus then holds Delta * sum_bound with 2 bits to spare.

    Raises:
        EncodingOverflow: no allowed N can reach that precision within 128-bit security,
            or the precision is below what float64 decoding can deliver for such sums.
    """
    if not (precision > 0 and math.isfinite(precision)):
        raise ValueError(f"precision must be a positive number, got {precision}")
    sum_bound = max(float(sum_bound), 1.0)
    for n_deg in _degrees(poly_modulus_degree):
        fft = sum_bound * math.log2(n_deg) * 2.0**-52
        if fft > precision / 2:
            raise EncodingOverflow(
                f"precision {precision:g} is finer than float64 decoding allows for sums up "
                f"to {sum_bound:g} (about {fft:.2g}); loosen it or use BFV"
            )
        # The special prime is unknown until the data modulus is; size the scale with the
        # smallest one allowed (a larger special prime only lowers the noise).
        noise = _ckks_noise(n_deg, n_clients, MIN_SPECIAL_BITS)
        scale_bits = math.ceil(math.log2(2 * noise / precision))
        data_bits = scale_bits + math.ceil(math.log2(sum_bound)) + 2
        coeffs = _with_special(_split_primes(data_bits, n_deg), n_deg)
        if coeffs is None:
            continue
        params = HEParams("ckks", n_deg, coeffs, scale_bits=scale_bits,
                          planned_clients=n_clients)
        bound = ckks_error_bound(params, n_clients, sum_bound)
        assert bound <= precision, (bound, precision)
        return HEParams("ckks", n_deg, coeffs, scale_bits=scale_bits, planned_clients=n_clients,
                        notes={"error_bound": bound, "sum_bound": sum_bound})
    raise EncodingOverflow(
        f"no CKKS parameters reach precision {precision:g} for sums up to {sum_bound:g} of "
        f"{n_clients} clients within 128-bit security (N in {_degrees(poly_modulus_degree)})"
    )
