"""Key agreement and key derivation for the secure-sum protocol.

Each client holds two X25519 key pairs (Bonawitz et al. 2017): ``enc`` for the channel keys
that encrypt its Shamir shares, and ``mask`` for the pairwise mask keys. They must differ: the
mask private key is revealed to the server when the client drops out, which must not open its
share ciphertexts. A third key, Ed25519 (``sign``), signs the client's advertised X25519 keys
and, in the consistency round, the survivor set it was shown (Bonawitz et al.'s active-security
variant); it protects against a malicious server only where the verifier knows the signer's
public key from outside the protocol (pinned keys, a PKI). Every derived key goes through
HKDF-SHA256 with the session id as salt and an ``info`` string that binds the purpose, the
round and the two party ids (domain separation).
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from secagg.secure_sum.errors import MalformedMessage

KEY_BYTES = 32
SIGNATURE_BYTES = 64
_DOMAIN = b"secagg/secure-sum/v1"

PURPOSE_SHARE_KEY = b"share-aead-key"
PURPOSE_PAIR_MASK = b"pairwise-mask-key"
PURPOSE_SELF_MASK = b"self-mask-key"
PURPOSE_MASKED_TAG = b"masked-input-tag-key"
PURPOSE_PAIR_DIGEST = b"share-key-pair-digest"


def derive(secret: bytes, purpose: bytes, session: bytes, round: int, a: int, b: int) -> bytes:
    """HKDF-SHA256 of ``secret`` to a 256-bit key bound to (purpose, session, round, a, b).

    For keys two parties share, pass the ids in a fixed order (see :func:`pair`).
    """
    info = _DOMAIN + b"|" + purpose + b"|" + struct.pack(">QII", round & (2**64 - 1), a, b)
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=session, info=info).derive(
        secret
    )


def pair(u: int, v: int) -> tuple[int, int]:
    """The two ids of a pair in canonical (ascending) order."""
    return (u, v) if u < v else (v, u)


def private_bytes(key: X25519PrivateKey) -> bytes:
    """Raw 32-byte encoding of an X25519 private key."""
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def public_bytes(key: X25519PublicKey) -> bytes:
    """Raw 32-byte encoding of an X25519 public key."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def agree(private: X25519PrivateKey | bytes, peer_public: bytes) -> bytes:
    """X25519 shared secret with a peer's raw public key.

    Raises:
        MalformedMessage: the public key is not 32 bytes or is a low-order point.
    """
    if len(peer_public) != KEY_BYTES:
        raise MalformedMessage(f"X25519 public key must be 32 bytes, got {len(peer_public)}")
    if isinstance(private, bytes | bytearray):
        private = X25519PrivateKey.from_private_bytes(bytes(private))
    try:
        shared = private.exchange(_x25519_key(bytes(peer_public)))
    except ValueError as exc:  # all-zero shared secret: low-order public key
        raise MalformedMessage(
            f"unusable X25519 public key: a low-order point ({exc})"
        ) from None
    if shared == bytes(KEY_BYTES):  # a backend that returns the all-zero secret
        raise MalformedMessage("unusable X25519 public key: all-zero shared secret (low order)")
    return shared


@lru_cache(maxsize=1 << 14)  # the server agrees with each live neighbour of a dropped client
def _x25519_key(public: bytes) -> X25519PublicKey:
    """The decoded X25519 public key (decoded once per key, not once per agreement)."""
    return X25519PublicKey.from_public_bytes(public)


_PROBE = X25519PrivateKey.from_private_bytes(bytes(range(1, 33)))


def is_low_order(public: bytes) -> bool:
    """True when a raw X25519 public key lies in the small-order subgroup (order 1, 2, 4 or 8,
    on the curve or its twist, in any encoding): X25519 clamps every scalar to a multiple of
    the cofactor 8, so such a point gives the all-zero shared secret with ANY private key and
    the pairwise secret would be public. Checked by one exchange with a fixed scalar."""
    if len(public) != KEY_BYTES:
        return True
    try:
        return _PROBE.exchange(X25519PublicKey.from_public_bytes(public)) == bytes(KEY_BYTES)
    except ValueError:
        return True


def signing_key(rand: Callable[[int], bytes] | None = None) -> Ed25519PrivateKey:
    """A fresh Ed25519 signing key from the OS CSPRNG (or from ``rand``, for tests)."""
    if rand is None or rand is os.urandom:
        return Ed25519PrivateKey.generate()
    return Ed25519PrivateKey.from_private_bytes(rand(32))


def verify_signature(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``message`` under the raw 32-byte
    ``public`` key (an undecodable key or signature counts as invalid)."""
    if len(public) != KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        return False
    try:
        _ed25519_key(bytes(public)).verify(signature, message)
    except (InvalidSignature, ValueError):
        return False
    return True


@lru_cache(maxsize=1 << 14)  # a client checks each neighbour's key at two stages
def _ed25519_key(public: bytes) -> Ed25519PublicKey:
    """The decoded Ed25519 public key (decoding is a fifth of a verification's cost)."""
    return Ed25519PublicKey.from_public_bytes(public)


def sign_public(key: Ed25519PrivateKey) -> bytes:
    """Raw 32-byte encoding of an Ed25519 private key's public key."""
    return key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def advertise_statement(session: bytes, round: int, cid: int, enc: bytes, mask: bytes) -> bytes:
    """What a client signs at ADVERTISE: its two X25519 public keys, bound to the session,
    the round and its id (a verifier holding the client's pinned Ed25519 key then knows the
    keys in a ROSTER are that client's, not the server's)."""
    head = struct.pack(">QI", round & (2**64 - 1), cid)
    return _DOMAIN + b"|advertise|" + session + head + enc + mask


def survivors_statement(
    session: bytes, round: int, survivors: list[int] | tuple[int, ...]
) -> bytes:
    """What a client signs in the consistency round: the survivor set U3 it was shown (the
    clients whose masked input the server says it holds), bound to the session and round.
    The set enters as the SHA-256 of its sorted ids (with its size), so the statement is
    O(1) bytes whatever n: two sets with one statement would be a SHA-256 collision."""
    ids = sorted(survivors)
    digest = hashlib.sha256(struct.pack(f">{len(ids)}I", *ids)).digest()
    body = struct.pack(">QI", round & (2**64 - 1), len(ids)) + digest
    return _DOMAIN + b"|survivors|" + session + body


def share_key(secret: bytes, session: bytes, round: int, sender: int, receiver: int) -> bytes:
    """The AES-256-GCM key of the shares ``sender`` encrypts for ``receiver``: HKDF of the two
    parties' ``enc`` X25519 secret, bound to the direction (the ids in sender, receiver order,
    not canonical). The two directions of a pair use independent keys, so revealing one (a
    complaint, :mod:`secagg.secure_sum.client`) opens only that direction's ciphertext."""
    return derive(secret, PURPOSE_SHARE_KEY, session, round, sender, receiver)


def key_commitment(key: bytes) -> bytes:
    """SHA-256 commitment to a share key (binding; the key is a uniform 256-bit HKDF output,
    so the commitment says nothing useful about it)."""
    return hashlib.sha256(_DOMAIN + b"|share-key-commitment|" + key).digest()


def pair_digest(session: bytes, round: int, u: int, v: int, c_uv: bytes, c_vu: bytes) -> bytes:
    """What both ends of a pair compute and send the server at SHARES: a digest of the
    commitments to the pair's two directional share keys (``c_uv``: of the key of u -> v).
    Equal digests tell the server both ends derived the same keys; a complainer's revealed
    key is then checked against it."""
    lo, hi = pair(u, v)
    c_lohi, c_hilo = (c_uv, c_vu) if u == lo else (c_vu, c_uv)
    head = struct.pack(">QII", round & (2**64 - 1), lo, hi)
    return hashlib.sha256(_DOMAIN + b"|" + PURPOSE_PAIR_DIGEST + b"|" + session + head
                          + c_lohi + c_hilo).digest()


def share_statement(session: bytes, round: int, sender: int, receiver: int, ct: bytes) -> bytes:
    """What a client signs for each share ciphertext it sends: the ciphertext, bound to the
    session, round, sender and receiver. The receiver checks it before it complains (so a
    ciphertext altered after it left the sender is never blamed on the sender, and never
    opened for the server); the server checks it on receipt."""
    head = struct.pack(">QII", round & (2**64 - 1), sender, receiver)
    return _DOMAIN + b"|share|" + session + head + ct


@dataclass(frozen=True)
class KeyPairs:
    """A client's two X25519 key pairs for one session."""

    enc: X25519PrivateKey
    mask: X25519PrivateKey

    @classmethod
    def generate(cls, rand: Callable[[int], bytes] | None = None) -> KeyPairs:
        """Fresh key pairs from the OS CSPRNG (or from ``rand``, for reproducible tests)."""
        if rand is None or rand is os.urandom:
            return cls(X25519PrivateKey.generate(), X25519PrivateKey.generate())
        return cls(X25519PrivateKey.from_private_bytes(rand(32)),
                   X25519PrivateKey.from_private_bytes(rand(32)))

    @property
    def enc_public(self) -> bytes:
        """Raw public key of the share-encryption pair."""
        return public_bytes(self.enc.public_key())

    @property
    def mask_public(self) -> bytes:
        """Raw public key of the mask pair."""
        return public_bytes(self.mask.public_key())

    @property
    def mask_private(self) -> bytes:
        """Raw private key of the mask pair (the secret Shamir-shared for dropout recovery)."""
        return private_bytes(self.mask)
