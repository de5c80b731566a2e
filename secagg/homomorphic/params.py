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

where S bounds |sum| and e_pk = 8 * 3.2 * sqrt(4N/3 + 1).

Flooding before release (CKKS). A raw CKKS decryption m + e reveals the error e, a
function of the secret key: with the ciphertext and the decryption, a passive adversary
recovers the key (Li and Micciancio, "On the Security of Homomorphic Encryption on
Approximate Numbers", EUROCRYPT 2021: CKKS is not IND-CPA^D secure). Li, Micciancio,
Schultz and Sorrell ("Securing Approximate Homomorphic Encryption Using Differential
Privacy", CRYPTO 2022, eprint 2022/816) prove that adding Gaussian noise to the decryption
restores IND-CPA^D security with s bits of statistical security against tau decryption
queries when, in the coefficient domain, sigma_coef = sqrt(24 N tau) 2^(s/2) t, t a bound
on every coefficient of the decryption error (their Corollary 2; OpenFHE's documentation
of its NOISE_FLOODING_DECRYPT mode uses sqrt(12 tau) 2^(s/2) t, arguing that the sqrt(2N)
factor is not needed -- we keep the published, larger value). Here:

* t (:func:`ckks_coeff_error`): a coefficient of the error of a sum of n fresh encryptions
  is the sum over the n ciphertexts of r0 + (r1 * s) + (e1 + e2 * s - e * u) / p, of
  variance n (1/12 + N/18 + (4N/3 + 1) 3.2^2 / p^2); t is 8 of its standard deviations.
* The noise is added to the decoded slots, which TenSEAL hands us, not to coefficients.
  The canonical embedding is sqrt(N/2) times an orthogonal map from the N coefficients to
  the real and imaginary parts of the N/2 slots, so i.i.d. N(0, sigma_slot^2) noise on
  every slot component is exactly i.i.d. coefficient noise of sigma_slot Delta / sqrt(N/2);
  releasing only the real parts of the used slots is post-processing. So the slot noise
  must be sigma_slot >= sqrt(N/2) sigma_coef / Delta (:func:`flooding_sigma`).
* The scale Delta is chosen so that this required sigma_slot is at most precision / 16;
  the decryptor floods with sigma_slot = precision / 16, then rounds to a grid of
  g = 2^floor(log2(precision / 4)) (a power of two, so released values are exact multiples
  of g, and the noise's floating-point low bits never leave the decryptor).
* Every key answers at most ``max_decryptions`` (tau, default 1024) ciphertext decryptions;
  the layer then generates a new key (:class:`~secagg.homomorphic.keys.KeyHolder` refuses
  further decryptions). s defaults to 40 bits.

So the released error of every entry is at most
encryption noise + 8 sigma_slot + g/2 + float64 decoding <= precision
(:func:`ckks_error_bound`).
"""

from __future__ import annotations

import dataclasses
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
#: Default statistical security s (bits) of the CKKS flooding noise.
FLOOD_SECURITY_BITS = 40
#: Default number of ciphertext decryptions (tau) one CKKS key answers before it is replaced.
MAX_DECRYPTIONS = 1024


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
        flood_sigma: CKKS: std of the Gaussian noise the decryptor adds to every released
            entry (0 for BFV); see the module docstring.
        grid: CKKS: released entries are rounded to multiples of this power of two.
        flood_security_bits: CKKS: statistical security s the flooding is sized for.
        max_decryptions: CKKS: ciphertext decryptions one key may answer (tau).
    """

    scheme: str
    poly_modulus_degree: int
    coeff_mod_bit_sizes: tuple[int, ...]
    plain_modulus: int = 0
    scale_bits: int = 0
    ring_bits: int = 0
    planned_clients: int = 1
    flood_sigma: float = 0.0
    grid: float = 0.0
    flood_security_bits: int = 0
    max_decryptions: int = 0
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
            out.update(scale_bits=self.scale_bits, flood_sigma=self.flood_sigma,
                       grid=self.grid, flood_security_bits=self.flood_security_bits,
                       max_decryptions=self.max_decryptions)
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


def ckks_coeff_error(n_degree: int, n_clients: int, special_bits: int) -> float:
    """t: bound (times Delta) on every coefficient of the decryption error of a sum of
    ``n_clients`` fresh CKKS encryptions, at 8 standard deviations (module docstring)."""
    var = n_clients * (1.0 / 12 + n_degree / 18
                       + (4 * n_degree / 3 + 1) * SEAL_SIGMA**2 / 4.0**special_bits)
    return 8.0 * math.sqrt(var)


def flooding_sigma(n_degree: int, coeff_error: float, decryptions: int,
                   security_bits: int) -> float:
    """Slot-domain flooding std (times Delta) that Li-Micciancio-Schultz-Sorrell (CRYPTO
    2022, Corollary 2) require for IND-CPA^D security with ``security_bits`` of statistical
    security against ``decryptions`` queries, when every error coefficient is at most
    ``coeff_error``: sqrt(N/2) * sqrt(24 N tau) 2^(s/2) t (module docstring)."""
    coeff = math.sqrt(24.0 * n_degree * decryptions) * 2.0 ** (security_bits / 2) * coeff_error
    return math.sqrt(n_degree / 2.0) * coeff


def required_flooding_sigma(params: HEParams, n_clients: int) -> float:
    """The flooding std a release of a sum of ``n_clients`` ciphertexts under ``params``
    needs (value units); ``params.flood_sigma`` is at least this for the planned cohort."""
    t = ckks_coeff_error(params.poly_modulus_degree, n_clients, params.coeff_mod_bit_sizes[-1])
    need = flooding_sigma(params.poly_modulus_degree, t, params.max_decryptions,
                          params.flood_security_bits)
    return need / 2.0**params.scale_bits


def ckks_error_bound(params: HEParams, n_clients: int, sum_bound: float) -> float:
    """Bound on |released sum - true sum| for every entry of a sum of ``n_clients`` fresh
    CKKS encryptions whose true sum is at most ``sum_bound`` in magnitude, as the decryptor
    releases it: encryption noise + flooding noise (8 sigma) + rounding to the grid (g/2)
    + float64 decoding.

    It holds unless a noise factor exceeds 8 standard deviations (probability < 1e-11
    per ciphertext); see the module docstring for the derivation.
    """
    if params.scheme != "ckks":
        raise ValueError("ckks_error_bound needs CKKS parameters")
    noise = _ckks_noise(params.poly_modulus_degree, n_clients, params.coeff_mod_bit_sizes[-1])
    fft = sum_bound * math.log2(params.poly_modulus_degree) * 2.0**-52
    return noise / 2.0**params.scale_bits + 8.0 * params.flood_sigma + params.grid / 2 + fft


def ckks_params(
    sum_bound: float,
    n_clients: int,
    precision: float,
    poly_modulus_degree: int | None = None,
    max_decryptions: int = MAX_DECRYPTIONS,
    flood_security_bits: int = FLOOD_SECURITY_BITS,
) -> HEParams:
    """CKKS parameters for sums of up to ``n_clients`` vectors with |sum| <= ``sum_bound``
    so that every *released* entry (flooded and rounded, see the module docstring) is
    within ``precision`` of the true sum (:func:`ckks_error_bound` <= precision).

    The budget: flooding noise sigma = precision / 16 (8 sigma = precision / 2), the
    rounding grid g <= precision / 4 (error g / 2), float64 decoding <= precision / 4, and
    the encryption noise, which the scale makes negligible: Delta = 2^scale_bits is the
    smallest power of two for which the flooding the literature requires for
    ``max_decryptions`` decryptions at ``flood_security_bits`` is at most precision / 16.
    The data modulus then holds Delta * sum_bound with 2 bits to spare.

    Raises:
        EncodingOverflow: no allowed N can reach that precision within 128-bit security,
            or the precision is below what float64 decoding can deliver for such sums.
    """
    if not (precision > 0 and math.isfinite(precision)):
        raise ValueError(f"precision must be a positive number, got {precision}")
    if max_decryptions < 1 or flood_security_bits < 1:
        raise ValueError("max_decryptions and flood_security_bits must be >= 1")
    sum_bound = max(float(sum_bound), 1.0)
    flood = precision / 16
    grid = 2.0 ** math.floor(math.log2(precision / 4))
    for n_deg in _degrees(poly_modulus_degree):
        fft = sum_bound * math.log2(n_deg) * 2.0**-52
        if fft > precision / 4:
            raise EncodingOverflow(
                f"precision {precision:g} is finer than float64 decoding allows for sums up "
                f"to {sum_bound:g} (about {fft:.2g}); loosen it or use BFV"
            )
        # The special prime is unknown until the data modulus is; size the scale with the
        # smallest one allowed (a larger special prime only lowers the noise).
        t = ckks_coeff_error(n_deg, n_clients, MIN_SPECIAL_BITS)
        need = flooding_sigma(n_deg, t, max_decryptions, flood_security_bits)
        scale_bits = math.ceil(math.log2(need / flood))
        data_bits = scale_bits + math.ceil(math.log2(sum_bound)) + 2
        coeffs = _with_special(_split_primes(data_bits, n_deg), n_deg)
        if coeffs is None:
            continue
        params = HEParams("ckks", n_deg, coeffs, scale_bits=scale_bits,
                          planned_clients=n_clients, flood_sigma=flood, grid=grid,
                          flood_security_bits=flood_security_bits,
                          max_decryptions=max_decryptions)
        bound = ckks_error_bound(params, n_clients, sum_bound)
        assert bound <= precision, (bound, precision)
        assert required_flooding_sigma(params, n_clients) <= flood
        return dataclasses.replace(params, notes={"error_bound": bound,
                                                  "sum_bound": sum_bound})
    raise EncodingOverflow(
        f"no CKKS parameters reach precision {precision:g} for sums up to {sum_bound:g} of "
        f"{n_clients} clients within 128-bit security (N in {_degrees(poly_modulus_degree)}), "
        f"with flooding sized for {max_decryptions} decryptions at {flood_security_bits}-bit "
        "statistical security; loosen the precision, lower max_decryptions, or use BFV"
    )
