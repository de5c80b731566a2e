"""The three key roles of homomorphic aggregation, each holding exactly what it may hold.

* :class:`KeyHolder` generates the keys and keeps the secret context. It is the designated
  decryptor (``key_holder="decryptor"``) or stands for the clients' shared secret context
  (``key_holder="clients"``, as NVIDIA FLARE provisions it): then every client holds the
  secret key and one surviving client decrypts.
* :class:`Encryptor` is a client: it holds the context the key holder handed out (public
  context, or the shared secret context in ``"clients"`` mode) and encrypts packed uploads.
* :class:`Aggregator` is the server: it holds the *public* context only -- deserialized from
  bytes that never contained the secret key, and checked (:class:`KeyRoleError` otherwise)
  -- and adds ciphertexts in place, never copying a context or a ciphertext.

Contexts and ciphertexts always cross role boundaries as real serialized bytes, so their
sizes are the true wire sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tenseal as ts

from secagg.homomorphic.errors import CiphertextError, ForeignContextError, KeyRoleError
from secagg.homomorphic.packing import (
    KIND_AGGREGATE,
    KIND_UPLOAD,
    Frames,
    Packing,
    decode_message,
    encode_message,
    fingerprint,
)
from secagg.homomorphic.params import HEParams
from secagg.privacy.samplers import gaussian, noise_generator
from secagg.wire import Message

KEY_HOLDER_MODES = ("decryptor", "clients")


def _load(scheme: str, ctx: ts.Context, data: bytes) -> ts.CKKSVector | ts.BFVVector:
    """Load one serialized ciphertext against ``ctx`` (no copy of the context)."""
    try:
        if scheme == "ckks":
            return ts.ckks_vector_from(ctx, data)
        return ts.bfv_vector_from(ctx, data)
    except RuntimeError as exc:
        # SEAL's validity check: parms_id not in this context's chain, or coefficients out
        # of range for its moduli -- a ciphertext from other parameters.
        if "invalid" in str(exc):
            raise ForeignContextError(f"SEAL rejects the ciphertext for this context: {exc}") \
                from None
        raise CiphertextError(f"cannot load ciphertext: {exc}") from None
    except (ValueError, TypeError, MemoryError) as exc:
        raise CiphertextError(f"cannot load ciphertext: {exc}") from None


def _serialize_public(ctx: ts.Context) -> bytes:
    return ctx.serialize(save_public_key=True, save_secret_key=False, save_galois_keys=False,
                         save_relin_keys=False)


class KeyHolder:
    """Generates the keys for ``params`` and decrypts aggregated ciphertexts.

    Args:
        params: the encryption parameters.
        mode: ``"decryptor"`` (clients get the public context) or ``"clients"`` (clients
            get the secret context too).

    Attributes:
        public_context: serialized public context (public key and parameters only; no
            secret, relinearization or Galois keys -- additions need none).
        client_context: what each client receives (the public context, or in ``"clients"``
            mode the context with its secret key).
        fingerprint: 16-byte fingerprint of :attr:`public_context`.
    """

    def __init__(self, params: HEParams, mode: str = "decryptor") -> None:
        if mode not in KEY_HOLDER_MODES:
            raise ValueError(f"key holder mode must be one of {KEY_HOLDER_MODES}, got {mode!r}")
        self.params = params
        self.mode = mode
        self._ctx = params.make_context()
        self.public_context = _serialize_public(self._ctx)
        self.fingerprint = fingerprint(self.public_context)
        if mode == "clients":
            self.client_context = self._ctx.serialize(
                save_public_key=True, save_secret_key=True, save_galois_keys=False,
                save_relin_keys=False)
        else:
            self.client_context = self.public_context
        #: CKKS ciphertexts decrypted so far with this key (bounded by max_decryptions).
        self.decryptions = 0
        self._noise = noise_generator()  # cryptographic flooding noise (AES-CTR, OS key)

    def decrypt(self, message: Message, packing: Packing) -> np.ndarray:
        """Decrypt an aggregate message into the flat sum vector to release: for BFV the
        exact sum (int64, the centred representative modulo t); for CKKS the decryption
        plus fresh Gaussian flooding noise of std ``params.flood_sigma`` (AES-CTR noise,
        :func:`secagg.privacy.samplers.noise_generator`), rounded to multiples of
        ``params.grid`` -- never the raw decryption, whose error would reveal the secret
        key (Li-Micciancio; see :mod:`secagg.homomorphic.params`).

        A CKKS key answers at most ``params.max_decryptions`` ciphertext decryptions (the
        number of queries the flooding is sized for); :attr:`decryptions` counts them.

        Raises:
            CiphertextError, ForeignContextError: the message is malformed or foreign.
            KeyRoleError: this CKKS key has answered its quota of decryptions.
        """
        raw = self._decrypt_raw(message, packing)
        if self.params.scheme != "ckks":
            return raw
        p = self.params
        if p.flood_sigma <= 0 or p.grid <= 0:
            raise KeyRoleError("CKKS parameters without flooding noise: the decryption "
                               "would reveal the secret key; build them with ckks_params()")
        noisy = raw + gaussian(p.flood_sigma, raw.shape, self._noise.rng)
        return np.rint(noisy / p.grid) * p.grid  # grid is a power of two: exact multiples

    def _decrypt_raw(self, message: Message, packing: Packing) -> np.ndarray:
        """The raw decryption (for CKKS: m + e, key-dependent). Never released."""
        scheme = self.params.scheme
        cts = decode_message(message, KIND_AGGREGATE, scheme, self.fingerprint, packing)
        if scheme == "ckks":
            if self.decryptions + len(cts) > self.params.max_decryptions:
                raise KeyRoleError(
                    f"this CKKS key has answered {self.decryptions} ciphertext decryptions; "
                    f"{len(cts)} more would exceed the {self.params.max_decryptions} its "
                    "flooding noise is sized for (IND-CPA^D): generate a new key")
            self.decryptions += len(cts)
        out = np.empty(packing.total, dtype=np.float64 if scheme == "ckks" else np.int64)
        for (a, b), data in zip(packing.chunks(), cts, strict=True):
            vec = _load(scheme, self._ctx, data)
            if vec.size() != b - a:
                raise CiphertextError(f"aggregate ciphertext holds {vec.size()} values, "
                                      f"expected {b - a}")
            out[a:b] = vec.decrypt()
        return out


class Encryptor:
    """A client's encryption side: the context it was handed, deserialized once.

    Args:
        scheme: ``"ckks"`` or ``"bfv"``.
        context: the serialized context from the key holder.
        context_fingerprint: the key holder's fingerprint of the public context.
    """

    def __init__(self, scheme: str, context: bytes, context_fingerprint: bytes) -> None:
        self.scheme = scheme
        self._ctx = ts.context_from(context, n_threads=1)
        if not self._ctx.has_public_key():
            raise KeyRoleError("the client context has no public key to encrypt with")
        self.fingerprint = context_fingerprint

    def encrypt(self, flat: np.ndarray, packing: Packing) -> Frames:
        """Encrypt a packed upload: one ciphertext per chunk, framed with the fingerprint
        (header frame, then one frame per ciphertext)."""
        if flat.shape != (packing.total,):
            raise ValueError(f"flat upload has shape {flat.shape}, expected ({packing.total},)")
        make = ts.ckks_vector if self.scheme == "ckks" else ts.bfv_vector
        cts = [make(self._ctx, flat[a:b].tolist()).serialize() for a, b in packing.chunks()]
        return encode_message(KIND_UPLOAD, self.scheme, self.fingerprint, packing.total, cts)


class Aggregator:
    """The server: public context only; sums ciphertexts in place.

    Args:
        scheme: ``"ckks"`` or ``"bfv"``.
        public_context: the serialized public context received from the key holder.

    Raises:
        KeyRoleError: the context it was given holds a secret key.
    """

    def __init__(self, scheme: str, public_context: bytes) -> None:
        self.scheme = scheme
        self.context = ts.context_from(public_context, n_threads=1)
        self.assert_public()
        self.fingerprint = fingerprint(public_context)
        self.accumulators: list[ts.CKKSVector | ts.BFVVector] = []
        self.count = 0
        self._packing: Packing | None = None

    def assert_public(self) -> None:
        """Raise :class:`KeyRoleError` unless the aggregator's context is public."""
        if self.context.has_secret_key() or self.context.is_private():
            raise KeyRoleError("the aggregator's context holds a secret key; it must hold "
                               "only the public context")

    def start(self, packing: Packing) -> None:
        """Begin a new sum for uploads packed as ``packing``."""
        self.accumulators = []
        self.count = 0
        self._packing = packing

    def add(self, message: Message) -> None:
        """Check one client's upload message and add its ciphertexts into the running sum.

        The first upload's ciphertexts become the accumulators; later ones are added with
        TenSEAL's in-place ``add_`` (no context or ciphertext copy). A message is fully
        checked and loaded before any accumulator changes, so a bad upload leaves the sum
        untouched.

        Raises:
            CiphertextError, ForeignContextError: the message is malformed or foreign.
        """
        packing = self._packing
        if packing is None:
            raise RuntimeError("Aggregator.start() must be called before add()")
        cts = decode_message(message, KIND_UPLOAD, self.scheme, self.fingerprint, packing)
        vecs = []
        for (a, b), data in zip(packing.chunks(), cts, strict=True):
            vec = _load(self.scheme, self.context, data)
            if vec.size() != b - a:
                raise CiphertextError(f"ciphertext holds {vec.size()} values, expected {b - a}")
            vecs.append(vec)
        if not self.accumulators:
            self.accumulators = vecs
        else:
            done = 0
            try:
                for acc, vec in zip(self.accumulators, vecs, strict=True):
                    acc.add_(vec)
                    done += 1
            except ValueError as exc:  # e.g. a CKKS scale that differs from the context's
                for acc, vec in zip(self.accumulators[:done], vecs[:done], strict=True):
                    acc.sub_(vec)  # exact modular undo: the sum is left as it was
                raise CiphertextError(f"cannot add ciphertext: {exc}") from None
        self.count += 1

    def finish(self) -> Frames:
        """Serialize the aggregated ciphertexts as a framed message for the key holder."""
        packing = self._packing
        if packing is None or not self.accumulators:
            raise RuntimeError("nothing was added")
        cts: Sequence[bytes] = [acc.serialize() for acc in self.accumulators]
        return encode_message(KIND_AGGREGATE, self.scheme, self.fingerprint, packing.total, cts)
