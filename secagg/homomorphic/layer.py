"""The Homomorphic layer: additively homomorphic aggregation through TenSEAL. Its protocol is
its one driver's (:mod:`secagg.homomorphic.remote`); what its parameters plan is
:class:`~secagg.homomorphic.plan.HomomorphicPlan`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from secagg.costs import SERVER
from secagg.homomorphic.plan import DECRYPTOR, HomomorphicPlan
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.messages import Upload, UploadSpec
from secagg.stages import Stage

if TYPE_CHECKING:  # imported when first used: the driver's module imports the link's
    from secagg.homomorphic.remote import InProcess


class Homomorphic(HomomorphicPlan, Layer):
    """Additively homomorphic aggregation (TenSEAL): the server adds ciphertexts it cannot
    read; a key holder that is not the server decrypts only the sum.

    Key roles (``key_holder``):

    * ``"decryptor"`` (default): a designated decryptor party generates the keys, gives the
      server and every client the *public* context only, and decrypts the aggregated
      ciphertext; it sees the sum in the clear and returns it to the server. Trust: the
      decryptor must not collude with the server (together they could decrypt any upload).
      It runs on a client's node (``notes["decryptor_client"]``: the smallest connected id,
      for :meth:`aggregate` of its first call), booked as ``"decryptor"``.
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

    #: the in-process aggregate's driver and nodes, made by its first call and kept, so that
    #: keys persist across rounds as on a runtime (:class:`~secagg.homomorphic.remote.InProcess`)
    local: InProcess | None = None

    def aggregate(
        self, uploads: Mapping[int, Upload], spec: UploadSpec, ctx: RoundContext
    ) -> Aggregate:
        """The one driver over this process's clients (:class:`InProcess`): keys, uploads
        encrypted, added at the server (public context only), the sum decrypted."""
        from secagg.homomorphic.remote import InProcess

        if self.local is None:
            self.local = InProcess(self, min(uploads, default=0))
        return self.local.aggregate(uploads, spec, ctx)

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
