"""Typed errors of the homomorphic layer (all are :class:`~secagg.errors.ProtocolError`)."""

from __future__ import annotations

from secagg.errors import ProtocolError


class HomomorphicError(ProtocolError):
    """Base of every error the homomorphic layer raises about messages or key roles."""


class CiphertextError(HomomorphicError):
    """A ciphertext message is malformed: bad framing, truncated, corrupted (checksum),
    the wrong number or length of ciphertexts, or bytes TenSEAL/SEAL cannot load."""


class ForeignContextError(HomomorphicError):
    """A ciphertext was made under another context (other keys or other parameters) than
    the one this party holds: its context fingerprint differs, or SEAL rejects its
    parameters."""


class KeyRoleError(HomomorphicError):
    """A party holds a key it must not hold (e.g. the aggregator's context has a secret
    key), or lacks one it needs."""
