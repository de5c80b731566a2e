"""The Homomorphic layer: additively homomorphic aggregation through TenSEAL."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from secagg.costs import SERVER, he_flops
from secagg.encoding import FixedPoint, plan, plan_ring_bits, required_bits
from secagg.errors import (
    ConfigurationError,
    EncodingOverflow,
    InadmissibleField,
    SecureSumAborted,
)
from secagg.homomorphic.keys import KEY_HOLDER_MODES, Aggregator, Encryptor, KeyHolder
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
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.messages import Upload, UploadSpec
from secagg.stages import Stage
from secagg.transcript import digest
from secagg.wire import message_size, pack_arrays

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


@dataclass
class _Keyset:
    """One generation of keys and the parties holding it."""

    params: HEParams
    holder: KeyHolder
    encryptor: Encryptor
    aggregator: Aggregator
    keygen_s: float
    clients_with_context: set[int] = field(default_factory=set)
    server_has_context: bool = False


class Homomorphic(Layer):
    """Additively homomorphic aggregation (TenSEAL): the server adds ciphertexts it cannot
    read; a key holder that is not the server decrypts only the sum.

    Key roles (``key_holder``):

    * ``"decryptor"`` (default): a designated decryptor party generates the keys, gives the
      server and every client the *public* context only, and decrypts the aggregated
      ciphertext; it sees the sum in the clear and returns it to the server. Trust: the
      decryptor must not collude with the server (together they could decrypt any upload).
    * ``"clients"``: the clients share one secret context, handed out by a provisioning step
      (as NVIDIA FLARE does); the server gets the public context. One surviving client
      decrypts the aggregate and returns the sum. Trust: no client may collude with the
      server (every client holds the secret key).

    In both modes the server's context is deserialized from bytes that never held the secret
    key, and this is checked (:class:`~secagg.homomorphic.errors.KeyRoleError`). The
    transcript records: the server sees each upload ``encrypted``; the server holds the
    aggregate ``encrypted`` (what="sum"); the decrypting party (``"decryptor"``, or the
    decrypting client's id) sees it ``encrypted`` then in the ``clear``; the server
    receives the ``clear`` sum.

    Schemes:

    * ``"bfv"``: exact. Fields are encoded with the fixed-point plan of
      :func:`secagg.encoding.plan` (from their bounds, the cohort size and ``precision``,
      the quantisation step), into the smallest ring Z_{2^k} that holds the cohort's sum;
      the plain modulus t is a prime > 2^k, so the integer sum cannot wrap and the decoded
      sum equals the sum of the quantised inputs bit for bit. t is at most 60 bits, so a
      slot holds a ring of k <= 59 bits; a field whose sum needs a wider ring (up to 64
      bits) is split into limbs (its ring element cut into words of
      ``59 - 1 - ceil(log2 n)`` bits, low word first, each summed in its own slot, so no
      limb sum of ``n`` clients can wrap) and recombined exactly after decryption
      (:meth:`packing`). Beyond 64 bits the plan is refused with
      :class:`~secagg.errors.EncodingOverflow`.
    * ``"ckks"``: approximate. The key holder never releases the raw decryption (its error
      reveals the secret key: Li and Micciancio, EUROCRYPT 2021); it adds fresh Gaussian
      flooding noise sized by Li, Micciancio, Schultz and Sorrell (CRYPTO 2022) for
      IND-CPA^D security (``flood_security_bits`` of statistical security against
      ``max_decryptions`` decryptions per key; keys are replaced when used up) and rounds
      to a power-of-two grid below ``precision`` (see :mod:`secagg.homomorphic.params`).
      The scale and modulus are chosen so that every *released* entry is within
      ``precision`` of the true sum, by the bound of
      :func:`secagg.homomorphic.params.ckks_error_bound` (encryption noise and flooding
      noise at 8 standard deviations, half the grid, float64 decoding); integer fields are
      rounded back to integers (exact, since the bound is < 1/2). The bound for the actual
      contributors is reported in ``aggregate.notes["error_bound"]``, the flooding in
      ``aggregate.notes["flooding"]``.

    Packing: all additive fields of an upload are flattened into one vector and cut into
    ``ceil(values / slots)`` ciphertexts (slots = N for BFV, N/2 for CKKS). Parameters are
    sized for the cohort size rounded up to a power of two (or ``max_clients``), so keys are
    reused across rounds; they are regenerated (and re-distributed, booked in the ledger)
    only when the parameters change. Dropouts: stage ``"upload"`` (any pattern is tolerated;
    no threshold) and, in ``"clients"`` mode, stage ``"decrypt"`` (at least one client must
    survive it to decrypt; otherwise :class:`~secagg.errors.SecureSumAborted`).

    Only additive fields are admissible: the server can only add ciphertexts.

    Args:
        scheme: ``"ckks"`` or ``"bfv"``.
        poly_modulus_degree: N in {4096, 8192, 16384, 32768}; None picks the smallest that
            fits the precision and cohort within 128-bit security.
        key_holder: ``"decryptor"`` or ``"clients"`` (see above).
        precision: BFV: quantisation step of float fields (default 1e-9, as
            :func:`secagg.encoding.plan`); CKKS: bound on the absolute error of every entry
            of the sum (default 1e-6). Must be < 0.5.
        max_clients: size the parameters for at most this many clients (None: the cohort
            size rounded up to a power of two).
        max_decryptions: CKKS: ciphertext decryptions one key answers before a new key is
            generated (tau of the flooding sizing; default 1024).
        flood_security_bits: CKKS: statistical security s of the flooding (default 40).
    """

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
        self._keysets: dict[HEParams, _Keyset] = {}

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

    def keyset(self, params: HEParams) -> _Keyset:
        """The keys for ``params`` (generated by the key holder on first use)."""
        ks = self._keysets.get(params)
        if ks is None:
            t0 = time.process_time()
            holder = KeyHolder(params, self.key_holder)
            keygen_s = time.process_time() - t0
            ks = _Keyset(
                params=params, holder=holder,
                encryptor=Encryptor(params.scheme, holder.client_context, holder.fingerprint),
                aggregator=Aggregator(params.scheme, holder.public_context),
                keygen_s=keygen_s,
            )
            self._keysets[params] = ks
        return ks

    # -- the protocol -------------------------------------------------------------------

    def _distribute(self, ks: _Keyset, cohort: list[int], ctx: RoundContext) -> None:
        sender = DECRYPTOR if self.key_holder == "decryptor" else PROVISIONER
        if not ks.server_has_context:
            ctx.message(sender, SERVER, Stage.KEYS, wire_bytes=bytes(ks.holder.public_context),
                        client_cpu_s=ks.keygen_s)
            ks.server_has_context = True
        for c in cohort:
            if c not in ks.clients_with_context:
                ctx.message(sender, c, Stage.KEYS, wire_bytes=len(ks.holder.client_context))
                ks.clients_with_context.add(c)

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

    def aggregate(
        self, uploads: Mapping[int, Upload], spec: UploadSpec, ctx: RoundContext
    ) -> Aggregate:
        """Encrypt each surviving client's packed upload, add the ciphertexts at the server
        (public context only), decrypt the sum at the key holder, return it to the server."""
        self.check(spec)
        cohort = sorted(uploads)
        n_plan = self.planned_clients(len(cohort))
        params = self.params_for(spec, n_plan)
        fps = self.fixed_point(spec, n_plan, limbs=True) if self.scheme == "bfv" else None
        packing = self.packing(spec, n_plan)
        ks = self.keyset(params)
        if self.scheme == "ckks":
            if packing.n_ciphertexts > params.max_decryptions:
                raise ConfigurationError(
                    f"one CKKS sum is {packing.n_ciphertexts} ciphertexts, more than "
                    f"max_decryptions={params.max_decryptions} decryptions per key")
            if ks.holder.decryptions + packing.n_ciphertexts > params.max_decryptions:
                # This key has answered all the decryptions its flooding is sized for:
                # a new key, distributed (and booked) like the first.
                del self._keysets[params]
                ks = self.keyset(params)
        ks.aggregator.assert_public()
        self._distribute(ks, cohort, ctx)
        live = ctx.dropouts.survivors(Stage.UPLOAD, cohort)
        notes = self.notes(params, packing, spec, len(live))
        sums = {f.name: np.zeros(f.shape, dtype=np.int64 if f.is_integer else np.float64)
                for f in spec.additive}
        if not live or packing.total == 0:
            return Aggregate(ctx.phase, ctx.round, sums, {}, tuple(live), notes)

        agg = ks.aggregator
        agg.start(packing)
        share = {f.name: f.size * packing.field_limbs(f.name) / packing.total
                 for f in spec.additive}
        for c in live:
            up = uploads[c]
            t0 = time.process_time()
            wire = ks.encryptor.encrypt(self._flatten(up, spec, packing, fps), packing)
            client_s = time.process_time() - t0
            t0 = time.process_time()
            agg.add(wire)
            server_s = time.process_time() - t0
            size = message_size(wire)
            ctx.message(c, SERVER, Stage.UPLOAD, wire_bytes=wire, plaintext_bytes=spec.nbytes,
                        fields={f.name: f.nbytes for f in spec.additive},
                        client_cpu_s=client_s + up.cpu_s, server_cpu_s=server_s,
                        flops=up.flops + he_flops("encrypt", params.poly_modulus_degree,
                                                  len(params.coeff_mod_bit_sizes),
                                                  packing.n_ciphertexts),
                        step_flops=up.flops)
            wire_digest = digest(wire)  # one message, recorded once per field it carries
            for f in spec.additive:
                ctx.observe(SERVER, c, Stage.UPLOAD, f.name, "encrypted", wire,
                            nbytes=round(size * share[f.name]), value_digest=wire_digest)
        t0 = time.process_time()
        agg_wire = agg.finish()
        finish_s = time.process_time() - t0

        party: str | int = DECRYPTOR
        if self.key_holder == "clients":
            able = ctx.dropouts.survivors(Stage.DECRYPT, live)
            if not able:
                raise SecureSumAborted(Stage.DECRYPT, 0, 1)
            party = able[0]
        agg_size = message_size(agg_wire)
        ctx.message(SERVER, party, Stage.DECRYPT, wire_bytes=agg_wire, server_cpu_s=finish_s)
        agg_digest = digest(agg_wire)
        for f in spec.additive:
            n = round(agg_size * share[f.name])
            ctx.observe(SERVER, SERVER, "sum", f.name, "encrypted", agg_wire, what="sum", nbytes=n,
                        value_digest=agg_digest)
            ctx.observe(party, SERVER, Stage.DECRYPT, f.name, "encrypted", agg_wire, what="sum",
                        nbytes=n, value_digest=agg_digest)

        t0 = time.process_time()
        flat = ks.holder.decrypt(agg_wire, packing)
        sums.update(decode_sums(flat, packing, spec, fps))
        decrypt_s = time.process_time() - t0
        result = pack_arrays(sums)
        ctx.message(party, SERVER, Stage.RESULT, wire_bytes=result,
                    plaintext_bytes=sum(int(s.nbytes) for s in sums.values()),
                    fields={k: int(v.nbytes) for k, v in sums.items()}, client_cpu_s=decrypt_s,
                    flops=he_flops("decrypt", params.poly_modulus_degree,
                                   len(params.coeff_mod_bit_sizes) - 1, packing.n_ciphertexts))
        for f in spec.additive:
            ctx.observe(party, SERVER, Stage.DECRYPT, f.name, "clear", sums[f.name], what="sum")
            ctx.observe(SERVER, party, Stage.RESULT, f.name, "clear", sums[f.name], what="sum")
        return Aggregate(ctx.phase, ctx.round, sums, {}, tuple(live), notes)

    def dropout_stages(self) -> tuple[str, ...]:
        """Upload, and in ``"clients"`` mode also the decrypting client's turn."""
        return (Stage.UPLOAD, Stage.DECRYPT) if self.key_holder == "clients" else (Stage.UPLOAD,)

    def describe(self) -> dict[str, Any]:
        """Parameters and key roles (read by threat models and written to results)."""
        decrypts = DECRYPTOR if self.key_holder == "decryptor" else "one surviving client"
        return {
            "name": self.name,
            "scheme": self.scheme,
            "poly_modulus_degree": self.poly_modulus_degree,
            "precision": self.precision,
            "max_clients": self.max_clients,
            "key_holder": self.key_holder,
            "secret_key_held_by": [DECRYPTOR] if self.key_holder == "decryptor"
            else ["every client"],
            "decrypting_party": decrypts,
            "server_holds": "public context only (no secret key; checked)",
            "server_sees": "encrypted uploads and the encrypted sum; then the clear sum",
            "clear_sum_seen_by": [decrypts, SERVER],
            "must_not_collude_with_server": [DECRYPTOR] if self.key_holder == "decryptor"
            else ["any client"],
            "exact": self.scheme == "bfv",
            "ckks_release": None if self.scheme == "bfv" else (
                "decryption + Gaussian flooding noise (IND-CPA^D, "
                f"{self.flood_security_bits}-bit statistical security, "
                f"{self.max_decryptions} decryptions per key), rounded to a power-of-two "
                "grid below the precision"),
            "dropout_threshold": None if self.key_holder == "decryptor" else 1,
            "active_security": False,
        }
