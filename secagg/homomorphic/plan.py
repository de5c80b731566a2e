"""What the Homomorphic layer's parameters plan for a cohort (encryption parameters, packing,
fixed-point encoding with BFV limbs, each upload's flat vector, the decoding of a sum, the
notes), read by the layer, its driver and its nodes without the protocol."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from secagg.encoding import FixedPoint, plan, plan_ring_bits, required_bits
from secagg.errors import ConfigurationError, EncodingOverflow, InadmissibleField
from secagg.homomorphic.keys import KEY_HOLDER_MODES
from secagg.homomorphic.packing import Packing
from secagg.homomorphic.params import (
    FLOOD_SECURITY_BITS,
    MAX_BFV_RING_BITS,
    MAX_DECRYPTIONS,
    MAX_MODULUS_BITS,
    HEParams,
    bfv_params,
    ckks_error_bound,
    ckks_params,
    required_flooding_sigma,
)
from secagg.messages import Upload, UploadSpec

#: Name of the designated decryptor in ledgers and transcripts.
DECRYPTOR = "decryptor"
#: Name of the provisioning step that hands out the shared secret context in "clients" mode.
PROVISIONER = "provisioner"


def _check_limbs(packing: Packing, fps: Mapping[str, FixedPoint]) -> None:
    """Refuse a packing that carries a field wider than the plain modulus in one limb."""
    for name, fp in fps.items():
        if fp.ring_bits > MAX_BFV_RING_BITS and packing.field_limbs(name) == 1:
            raise EncodingOverflow(
                f"field {name!r} needs a {fp.ring_bits}-bit ring, wider than the "
                f"{MAX_BFV_RING_BITS} bits one BFV slot holds, and this packing carries it "
                "in one limb; build the packing with Homomorphic.packing(spec, n_clients)")


def split_limbs(ring: np.ndarray, n_limbs: int, limb_bits: int) -> np.ndarray:
    """Ring elements (uint64) as ``n_limbs`` words of ``limb_bits`` bits, low word first:
    an int64 array of shape ``(n_limbs, *ring.shape)`` with entries in [0, 2^limb_bits)."""
    u = np.asarray(ring, dtype=np.uint64)
    mask = np.uint64((1 << limb_bits) - 1)
    return np.stack([((u >> np.uint64(limb_bits * j)) & mask).view(np.int64)
                     for j in range(n_limbs)])


def join_limbs(limb_sums: np.ndarray, limb_bits: int) -> np.ndarray:
    """The ring sum (uint64, modulo 2^64) from per-limb sums (int64, ``(L, ...)``, each
    non-negative): sum_j S_j * 2^(j limb_bits). Exact modulo 2^64, which is all a ring of
    at most 64 bits needs."""
    s = np.asarray(limb_sums)
    if s.size and int(s.min()) < 0:
        raise EncodingOverflow("a limb sum decrypted negative: it wrapped the plain modulus")
    out = np.zeros(s.shape[1:], dtype=np.uint64)
    for j in range(s.shape[0]):
        out += s[j].astype(np.uint64) << np.uint64(limb_bits * j)  # wraps modulo 2^64
    return out


def decode_sums(flat: np.ndarray, packing: Packing, spec: UploadSpec,
                fps: Mapping[str, FixedPoint] | None) -> dict[str, np.ndarray]:
    """The decrypted flat sum ``flat`` as one array per additive field of ``spec``: BFV
    (``fps``, the fields' fixed-point plans) decodes each field's ring elements, first
    recombining a field carried in limbs; CKKS rounds integer fields and keeps float
    fields as decrypted."""
    if fps is not None:
        _check_limbs(packing, fps)
    parts = packing.unflatten(flat)
    sums: dict[str, np.ndarray] = {}
    for f in spec.additive:
        if fps is not None:
            if packing.field_limbs(f.name) > 1:
                ring = join_limbs(parts[f.name].reshape(packing.field_limbs(f.name), -1),
                                  packing.limb_bits)
            else:
                ring = parts[f.name].ravel().view(np.uint64)
            sums[f.name] = fps[f.name].decode_sum(ring).reshape(f.shape)
        elif f.is_integer:
            sums[f.name] = np.rint(parts[f.name]).astype(np.int64)
        else:
            sums[f.name] = parts[f.name]
    return sums


class HomomorphicPlan:
    """The parameters of :class:`~secagg.homomorphic.layer.Homomorphic` (see it) and what
    they plan; raises ConfigurationError for one out of its range."""

    name: ClassVar[str] = "homomorphic"

    def __init__(
        self,
        scheme: str = "ckks",
        poly_modulus_degree: int | None = None,
        key_holder: str = "decryptor",
        precision: float | None = None,
        max_clients: int | None = None,
        max_decryptions: int = MAX_DECRYPTIONS,
        flood_security_bits: int = FLOOD_SECURITY_BITS,
    ) -> None:
        if scheme not in ("ckks", "bfv"):
            raise ConfigurationError(f"scheme must be 'ckks' or 'bfv', got {scheme!r}")
        if key_holder not in KEY_HOLDER_MODES:
            raise ConfigurationError(
                f"key_holder must be one of {KEY_HOLDER_MODES}, got {key_holder!r}")
        if poly_modulus_degree is not None and poly_modulus_degree not in MAX_MODULUS_BITS:
            raise ConfigurationError(
                f"poly_modulus_degree must be one of {sorted(MAX_MODULUS_BITS)}, got "
                f"{poly_modulus_degree}")
        if precision is None:
            precision = 1e-9 if scheme == "bfv" else 1e-6
        if not (isinstance(precision, int | float) and 0 < precision < 0.5):
            raise ConfigurationError(f"precision must be in (0, 0.5), got {precision!r}")
        if max_clients is not None and max_clients < 1:
            raise ConfigurationError(f"max_clients must be >= 1, got {max_clients}")
        for name, value in (("max_decryptions", max_decryptions),
                            ("flood_security_bits", flood_security_bits)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"{name} must be an integer >= 1, got {value!r}")
        self.scheme = scheme
        self.poly_modulus_degree = poly_modulus_degree
        self.key_holder = key_holder
        self.precision = float(precision)
        self.max_clients = max_clients
        self.max_decryptions = max_decryptions
        self.flood_security_bits = flood_security_bits

    # -- admissibility and parameters -------------------------------------------------

    def check(self, spec: UploadSpec) -> None:
        """Refuse non-additive fields and additive fields without a usable bound."""
        for f in spec.fields:
            if not f.additive:
                raise InadmissibleField(
                    self.name, f.name,
                    (f"{f.reason}; " if f.reason else "")
                    + "not additive: the server can only add ciphertexts, so it would need "
                    "each client's value, which it cannot decrypt")
            try:
                spec.client_linf(f.name)
            except ValueError as exc:
                raise InadmissibleField(
                    self.name, f.name,
                    f"no per-client bound to size the encryption parameters ({exc})") from None

    def planned_clients(self, cohort: int) -> int:
        """The cohort size parameters are sized for (``max_clients``, or ``cohort`` rounded
        up to a power of two)."""
        if self.max_clients is not None:
            if cohort > self.max_clients:
                raise ConfigurationError(
                    f"cohort of {cohort} clients exceeds max_clients={self.max_clients}")
            return self.max_clients
        return 1 << max(0, math.ceil(math.log2(max(cohort, 1))))

    def fixed_point(self, spec: UploadSpec, n_clients: int, *,
                    limbs: bool = False) -> dict[str, FixedPoint]:
        """BFV: the fixed-point plan of the additive fields for a sum of ``n_clients``
        uploads. When every field fits a 59-bit ring, all share the smallest ring that
        holds them (one limb each). Otherwise, with ``limbs=True`` (the layer's own use,
        with :meth:`packing`), the fields that fit take the 59-bit ring and each wider
        field its own ring (<= 64 bits), carried in limbs (:meth:`limbs`).

        Raises:
            EncodingOverflow: a field's sum needs more than 64 bits, or more than 59 bits
                and ``limbs`` is False (a caller that packs one value per slot)."""
        wide = plan(spec, n_clients, self.precision, ring_bits=64)
        ring = plan_ring_bits(wide)
        if ring <= MAX_BFV_RING_BITS:
            return {name: replace(fp, ring_bits=ring) for name, fp in wide.items()}
        if not limbs:
            names = [n for n, fp in wide.items()
                     if required_bits(fp.sum_bound_int) > MAX_BFV_RING_BITS]
            raise EncodingOverflow(
                f"field(s) {', '.join(map(repr, names))}: the sum of {n_clients} clients needs "
                f"a {ring}-bit ring, wider than the {MAX_BFV_RING_BITS} bits one BFV slot "
                "holds; the Homomorphic layer carries such fields in limbs "
                "(Homomorphic.packing, fixed_point(..., limbs=True)), a caller that packs one "
                "value per slot cannot")
        return {name: replace(fp, ring_bits=max(MAX_BFV_RING_BITS,
                                                required_bits(fp.sum_bound_int)))
                for name, fp in wide.items()}

    @staticmethod
    def limb_bits(n_clients: int) -> int:
        """Bits per limb for a cohort of ``n_clients``: the sum of n limbs of w bits stays
        below 2^58, the centred half of a 59-bit ring, so w = 58 - ceil(log2 n)."""
        w = MAX_BFV_RING_BITS - 1 - math.ceil(math.log2(max(n_clients, 1)))
        if w < 1:
            raise EncodingOverflow(f"a cohort of {n_clients} clients leaves no bits for a limb")
        return w

    def limbs(self, spec: UploadSpec, n_clients: int) -> dict[str, int]:
        """BFV: the number of limbs of each additive field whose ring is wider than one
        slot holds (fields carried whole are left out)."""
        w = self.limb_bits(n_clients)
        return {name: math.ceil(fp.ring_bits / w)
                for name, fp in self.fixed_point(spec, n_clients, limbs=True).items()
                if fp.ring_bits > MAX_BFV_RING_BITS}

    def packing(self, spec: UploadSpec, n_clients: int) -> Packing:
        """How one upload of ``spec`` is laid out in ciphertext slots for a planned cohort
        of ``n_clients`` (BFV: wide fields in limbs)."""
        params = self.params_for(spec, n_clients)
        if self.scheme != "bfv":
            return Packing.from_spec(spec, params.slots)
        limbs = self.limbs(spec, n_clients)
        return Packing.from_spec(spec, params.slots, limbs,
                                 self.limb_bits(n_clients) if limbs else 0)

    def sum_bound(self, spec: UploadSpec, n_clients: int) -> float:
        """Largest |entry| of a sum of ``n_clients`` uploads over all additive fields."""
        return n_clients * max((spec.client_linf(f.name) for f in spec.additive), default=1.0)

    def params_for(self, spec: UploadSpec, n_clients: int) -> HEParams:
        """The encryption parameters this layer uses for ``spec`` and a planned cohort."""
        if self.scheme == "bfv":
            ring = min(plan_ring_bits(self.fixed_point(spec, n_clients, limbs=True)),
                       MAX_BFV_RING_BITS)
            return bfv_params(ring, n_clients, self.poly_modulus_degree)
        return ckks_params(self.sum_bound(spec, n_clients), n_clients, self.precision,
                           self.poly_modulus_degree, self.max_decryptions,
                           self.flood_security_bits)


    def _flatten(self, up: Upload, spec: UploadSpec, packing: Packing,
                 fps: dict[str, FixedPoint] | None) -> np.ndarray:
        if fps is None:
            for f in spec.additive:  # CKKS would wrap modulo q silently beyond the bound
                x = np.asarray(up[f.name])
                if x.size and not float(np.max(np.abs(x))) <= spec.client_linf(f.name):
                    raise EncodingOverflow(
                        f"client {up.client}, field {f.name!r}: max |entry| "
                        f"{float(np.max(np.abs(x))):.6g} exceeds the per-client bound "
                        f"{spec.client_linf(f.name):.6g} the CKKS parameters were sized for")
            return packing.flatten({f.name: up[f.name] for f in spec.additive}, np.float64)
        _check_limbs(packing, fps)
        values = {}
        for f in spec.additive:
            n_limbs = packing.field_limbs(f.name)
            if n_limbs == 1:
                values[f.name] = fps[f.name].to_int(up[f.name])
            else:
                values[f.name] = split_limbs(fps[f.name].encode(up[f.name]), n_limbs,
                                             packing.limb_bits)
        return packing.flatten(values, np.int64)

    def notes(self, params: HEParams, packing: Packing, spec: UploadSpec,
              n_live: int) -> dict[str, Any]:
        """The aggregate's notes on a release by ``n_live`` clients (the same on every
        runtime): the parameters, key roles, packing, BFV limbs and the CKKS error bound
        and flooding."""
        notes: dict[str, Any] = {
            "he_params": params.as_dict(),
            "key_holder": self.key_holder,
            "ciphertexts_per_upload": packing.n_ciphertexts,
            "slot_utilisation": packing.utilisation,
        }
        if packing.limbs:
            notes["limbs"] = {"limb_bits": packing.limb_bits,
                              "fields": {n: packing.field_limbs(n) for n in packing.names
                                         if packing.field_limbs(n) > 1}}
        if self.scheme == "ckks":
            n = max(n_live, 1)
            notes["error_bound"] = ckks_error_bound(params, n, self.sum_bound(spec, n))
            notes["flooding"] = {
                "sigma": params.flood_sigma,
                "required_sigma": required_flooding_sigma(params, n),
                "grid": params.grid,
                "statistical_security_bits": params.flood_security_bits,
                "max_decryptions_per_key": params.max_decryptions,
                "sizing": "Li, Micciancio, Schultz, Sorrell (CRYPTO 2022), Corollary 2",
            }
        return notes
