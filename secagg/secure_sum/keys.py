"""Key agreement and key derivation for the secure-sum protocol.

Each client holds two X25519 key pairs (Bonawitz et al. 2017): ``enc`` for the channel keys
that encrypt its Shamir shares, and ``mask`` for the pairwise mask keys. They must differ: the
mask private key is revealed to the server when the client drops out, which must not open its
share ciphertexts. Every derived key goes through HKDF-SHA256 with the session id as salt and
an ``info`` string that binds the purpose, the round and the two party ids (domain separation).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from secagg.secure_sum.errors import MalformedMessage

KEY_BYTES = 32
_DOMAIN = b"secagg/secure-sum/v1"

PURPOSE_SHARE_KEY = b"share-aead-key"
PURPOSE_PAIR_MASK = b"pairwise-mask-key"
PURPOSE_SELF_MASK = b"self-mask-key"
PURPOSE_MASKED_TAG = b"masked-input-tag-key"


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
        return private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as exc:  # all-zero shared secret: low-order public key
        raise MalformedMessage(f"unusable X25519 public key ({exc})") from None


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
