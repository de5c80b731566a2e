"""Fixed-point encoding of bounded fields into an integer ring Z_{2^k}.

Secure summation, BFV encryption and distributed DP all add integers modulo 2^k. A
:class:`FixedPoint` plan maps a field's real values to integers with ``scale_bits``
fractional bits, chosen from the field's declared :class:`~secagg.messages.Bound`, the
cohort size and a precision target, so that the sum over the whole cohort cannot wrap.
After decoding, the ring sum equals the exact sum of the quantised inputs.

Bounds are checked before arithmetic: :func:`plan` refuses (``EncodingOverflow``) a field
whose bound times the cohort cannot fit the ring at the requested precision, and
:meth:`FixedPoint.encode` refuses a value outside the bound it was planned for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from secagg.errors import EncodingOverflow
from secagg.messages import UploadSpec

_MAX_RING_BITS = 64


@dataclass(frozen=True)
class FixedPoint:
    """The integer encoding of one field.

    Attributes:
        field: the field name.
        scale_bits: fractional bits f: a real x is encoded as round(x * 2^f).
        ring_bits: k: integers live modulo 2^k (k <= 64, held in uint64).
        client_bound: max |entry| of one client's value (real units).
        n_clients: cohort size the plan was made for.
        extra: additional headroom on the sum's magnitude, in real units (e.g. DP noise).
        integer: True for integer fields (scale_bits is 0 and decoding gives int64).
    """

    field: str
    scale_bits: int
    ring_bits: int
    client_bound: float
    n_clients: int
    extra: float = 0.0
    integer: bool = False

    @property
    def modulus(self) -> int:
        """2^ring_bits."""
        return 1 << self.ring_bits

    @property
    def step(self) -> float:
        """Quantisation step 2^-scale_bits (the largest rounding error is half of it)."""
        return math.ldexp(1.0, -self.scale_bits)

    @property
    def sum_bound_int(self) -> int:
        """Largest |sum| in ring units the plan allows (centred representation)."""
        return bound_to_int(self.client_bound, self.scale_bits) * self.n_clients + math.ceil(
            self.extra * (1 << self.scale_bits)
        )

    def _mask(self) -> np.uint64:
        return np.uint64((1 << self.ring_bits) - 1) if self.ring_bits < 64 else np.uint64(2**64 - 1)

    def to_int(self, x: np.ndarray) -> np.ndarray:
        """round(x * 2^f) as int64, checked against the client bound (no wrap possible)."""
        arr = np.asarray(x)
        limit = bound_to_int(self.client_bound, self.scale_bits)
        if self.integer:
            q = arr.astype(np.int64)
            if q.size and max(-int(q.min()), int(q.max())) > limit:
                self._out_of_bound(arr)
            return q
        a32 = self._scaled32(arr, limit)
        if a32 is not None:
            return a32.astype(np.int64)
        a = np.array(arr, dtype=np.float64)  # one copy; the rest is in place
        np.ldexp(a, self.scale_bits, out=a)
        np.rint(a, out=a)
        if a.size:
            lo, hi = float(a.min()), float(a.max())  # NaN/inf propagate into min/max
            if not (np.isfinite(lo) and np.isfinite(hi)):
                raise EncodingOverflow(f"field {self.field!r}: non-finite value cannot be encoded")
            if max(-lo, hi) > limit:
                self._out_of_bound(arr)
        return a.astype(np.int64)

    def _scaled32(self, arr: np.ndarray, limit: int) -> np.ndarray | None:
        """round(x * 2^f) in float32 when that is exact and in bound, else None.

        For float32 input with |round(x * 2^f)| <= limit < 2^24, scaling by 2^f and rounding
        are exact in float32, so this gives the float64 path's integers at half the memory
        traffic. Anything out of bound or non-finite gives None: the float64 path then
        raises its error."""
        if self.integer or arr.dtype != np.float32 or not 0 <= self.scale_bits < 128 \
                or limit >= 1 << 24:
            return None
        with np.errstate(over="ignore"):  # an overflow is an inf, refused below
            a32 = np.ldexp(arr, self.scale_bits, dtype=np.float32)
        np.rint(a32, out=a32)
        if a32.size:
            lo, hi = float(a32.min()), float(a32.max())
            if not (np.isfinite(lo) and np.isfinite(hi) and max(-lo, hi) <= limit):
                return None
        return a32

    def _out_of_bound(self, arr: np.ndarray) -> None:
        raise EncodingOverflow(
            f"field {self.field!r}: value {float(np.max(np.abs(arr))):.6g} exceeds the bound "
            f"{self.client_bound:.6g} the encoding was planned for"
        )

    def encode(self, x: np.ndarray) -> np.ndarray:
        """Encode values into the ring: uint64 in [0, 2^k), two's complement for negatives."""
        if self.ring_bits <= 32:
            a32 = self._scaled32(np.asarray(x), bound_to_int(self.client_bound, self.scale_bits))
            if a32 is not None:  # wrap through int32: two's complement mod 2^32 is the ring's
                w = a32.ravel().astype(np.int32).view(np.uint32)
                if self.ring_bits < 32:
                    w &= np.uint32((1 << self.ring_bits) - 1)
                return w.astype(np.uint64)
        u = self.to_int(x).ravel().view(np.uint64)
        if self.ring_bits < 64:
            u &= self._mask()
        return u

    def quantise(self, x: np.ndarray) -> np.ndarray:
        """What the encoding keeps of ``x``: round(x * 2^f) * 2^-f (float64 or int64)."""
        q = self.to_int(x)
        return q if self.integer else np.ldexp(q.astype(np.float64), -self.scale_bits)

    def lift(self, s: np.ndarray) -> np.ndarray:
        """Centred lift of ring elements to signed int64 (values in [-2^(k-1), 2^(k-1)))."""
        u = np.bitwise_and(np.asarray(s, dtype=np.uint64), self._mask())  # a fresh array
        if self.ring_bits == 64:
            return u.view(np.int64)
        shift = np.uint64(64 - self.ring_bits)
        u <<= shift  # the ring's sign bit becomes bit 63 ...
        signed = u.view(np.int64)
        signed >>= np.int64(shift)  # ... and the arithmetic shift back sign-extends it
        return signed

    def decode_sum(self, s: np.ndarray) -> np.ndarray:
        """Decode a ring sum to the sum of the quantised inputs (float64, or int64)."""
        q = self.lift(s)
        if self.integer:
            return q
        out = q.astype(np.float64)
        out *= math.ldexp(1.0, -self.scale_bits)  # exact: a power of two, no underflow
        return out


def bound_to_int(bound: float, scale_bits: int) -> int:
    """Largest |round(x * 2^f)| for |x| <= bound."""
    return math.floor(math.ldexp(bound, scale_bits) + 0.5)


def required_bits(sum_bound_int: int) -> int:
    """Ring bits needed to hold every integer in [-sum_bound_int, sum_bound_int]."""
    return max(2, int(sum_bound_int).bit_length() + 1)


def plan(
    spec: UploadSpec,
    n_clients: int,
    precision: float = 1e-9,
    ring_bits: int = 64,
    extra_bound: Mapping[str, float] | None = None,
) -> dict[str, FixedPoint]:
    """Plan a fixed-point encoding for every additive field of ``spec``.

    Each float field gets the fewest fractional bits whose step 2^-f is <= ``precision``;
    integer fields are encoded exactly. The plan then checks that the cohort's sum,
    ``n_clients * client_bound`` (+ ``extra_bound[field]``, e.g. DP noise headroom, in
    real units), fits the centred range of Z_{2^ring_bits}.

    Args:
        spec: the upload spec; every additive field needs a Bound (and record-level bounds
            need ``spec.max_records``).
        n_clients: the largest number of clients whose values can enter one sum.
        precision: the quantisation step target for float fields.
        ring_bits: k, 2..64.
        extra_bound: per-field extra magnitude allowed on the sum.

    Raises:
        EncodingOverflow: a field cannot fit; the message names it and the bits it needs.
        ValueError: bad arguments or a field without a usable bound.
    """
    if not 2 <= ring_bits <= _MAX_RING_BITS:
        raise ValueError(f"ring_bits must be in 2..64, got {ring_bits}")
    if n_clients < 1:
        raise ValueError(f"n_clients must be >= 1, got {n_clients}")
    if not (precision > 0 and math.isfinite(precision)):
        raise ValueError(f"precision must be a positive number, got {precision}")
    extra_bound = dict(extra_bound or {})
    unknown = set(extra_bound) - set(spec.names)
    if unknown:
        raise ValueError(f"extra_bound names unknown fields: {sorted(unknown)}")
    out: dict[str, FixedPoint] = {}
    for f in spec.additive:
        try:
            bound = spec.client_linf(f.name)
        except ValueError as exc:
            raise ValueError(f"cannot plan an integer encoding: {exc}") from exc
        scale = 0 if f.is_integer else max(0, math.ceil(-math.log2(precision)))
        fp = FixedPoint(
            field=f.name,
            scale_bits=scale,
            ring_bits=ring_bits,
            client_bound=float(bound),
            n_clients=n_clients,
            extra=float(extra_bound.get(f.name, 0.0)),
            integer=f.is_integer,
        )
        need = required_bits(fp.sum_bound_int)
        if need > ring_bits:
            raise EncodingOverflow(
                f"field {f.name!r}: {n_clients} clients x bound {bound:.6g}"
                + (f" (+ {fp.extra:.6g} headroom)" if fp.extra else "")
                + f" at precision {precision:g} ({scale} fractional bits) needs a "
                f"{need}-bit ring, but only {ring_bits} bits are available; loosen the "
                "precision, tighten the bound, or use a smaller cohort"
            )
        out[f.name] = fp
    return out


def plan_ring_bits(plans: Mapping[str, FixedPoint]) -> int:
    """The smallest ring width that holds every field of ``plans``."""
    return max((required_bits(p.sum_bound_int) for p in plans.values()), default=2)
