"""The byte strings both secure-sum parties must compute alike: share ciphertexts' nonces,
associated data and plaintexts, the share digests a dealer signs, the seed commitment and the
masked vector's signed statement.

The client builds them when it deals and masks, the server when it judges a complaint or
checks a returned share or a masked vector's tag; they live here so that the two sides (and
tests playing either) read one definition. Re-exported by :mod:`secagg.secure_sum.client`.
"""

from __future__ import annotations

import hashlib
import struct

from secagg.secure_sum import shamir, wire
from secagg.secure_sum.wire import MsgType

_K = shamir.CHUNKS_PER_KEY


def share_nonce(sender: int, receiver: int) -> bytes:
    """AES-GCM nonce of a share ciphertext: unique per direction under a per-pair key."""
    return struct.pack(">II4s", sender, receiver, b"shr1")


def share_aad(
    session: bytes,
    round: int,
    sender: int,
    receiver: int,
    sender_keys: tuple[bytes, bytes],
    receiver_keys: tuple[bytes, bytes],
) -> bytes:
    """Associated data of a share ciphertext: session, round, sender, receiver and stage, and
    both parties' public keys as the encrypting party saw them -- so a key swapped on its way
    through the server makes the share fail authentication (the sender then counts as
    dropped) instead of silently breaking the masks."""
    head = struct.pack(">QIIB", round & (2**64 - 1), sender, receiver, MsgType.SHARES)
    return session + head + b"".join(sender_keys) + b"".join(receiver_keys)


def encode_share(b_elems: list[int], sk_elems: list[int]) -> bytes:
    """The plaintext of one holder's shares: 3 elements of b_u, then 3 of the mask key."""
    return b"".join(shamir.element_bytes(e) for e in [*b_elems, *sk_elems])


def decode_share(raw: bytes) -> tuple[list[int], list[int]]:
    """Inverse of :func:`encode_share` (raises ValueError on out-of-field elements)."""
    if len(raw) != wire.SHARE_PLAINTEXT_BYTES:
        raise ValueError("bad share length")
    els = [shamir.element_from_bytes(raw[i : i + 16]) for i in range(0, len(raw), 16)]
    return els[:_K], els[_K:]


def commit_seed(session: bytes, round: int, cid: int, b: bytes) -> bytes:
    """SHA-256 commitment to the self-mask seed b_u (hiding: b_u has 256 random bits). The
    server checks the seed it rebuilds against it, so corrupted shares cannot go unnoticed."""
    h = hashlib.sha256(b"secagg/secure-sum/v1|seed-commitment|" + session)
    h.update(struct.pack(">QI", round & (2**64 - 1), cid) + b)
    return h.digest()


_SHARE_KINDS = {"b": 0, "sk": 1}
_SHARE_DIGEST_TAG = b"secagg/secure-sum/v1|share-digest|"
_SECRET_BYTES = shamir.ELEMENT_BYTES * _K
"""One secret's share as encoded: its 3 elements, 16 bytes little-endian each."""


def share_digest(
    session: bytes, round: int, owner: int, holder: int, kind: str, elements: list[int]
) -> bytes:
    """SHA-256 digest of one share the owner dealt the holder: ``kind`` "b" (of the self-mask
    seed b_u) or "sk" (of the mask private key), its 3 field elements bound to the session,
    round, owner and holder. The owner signs one per holder and kind inside its SHARES entry;
    the holder checks the share it decrypts against it, the server each share a holder
    returns at unmask (see :mod:`secagg.secure_sum.server`). Hiding: a share of a secret is
    uniform given fewer than t_k others (>= 127 bits per element), so the digest leaks
    nothing a guess could confirm."""
    if kind not in _SHARE_KINDS or len(elements) != _K:
        raise ValueError("a share digest is of one secret's 3 elements, kind 'b' or 'sk'")
    raw = b"".join(shamir.element_bytes(int(e)) for e in elements)
    return share_digest_raw(session, round, owner, holder, kind, raw)


def share_digest_raw(
    session: bytes, round: int, owner: int, holder: int, kind: str, raw: bytes | memoryview
) -> bytes:
    """:func:`share_digest` of a share given as its 48 encoded bytes (the 3 elements, 16 bytes
    little-endian each, as :func:`encode_share` and the UNMASK_RESPONSE carry them): the same
    digest without decoding and re-encoding the elements."""
    if kind not in _SHARE_KINDS or len(raw) != _SECRET_BYTES:
        raise ValueError("a share digest is of one secret's 48 bytes, kind 'b' or 'sk'")
    return hashlib.sha256(b"".join((
        _SHARE_DIGEST_TAG, session,
        struct.pack(">QIIB", round & (2**64 - 1), owner, holder, _SHARE_KINDS[kind]), raw,
    ))).digest()


def share_digests(
    session: bytes, round: int, owner: int, holder: int, b: list[int], sk: list[int]
) -> bytes:
    """The two share digests of one SHARES entry (of the b_u share, then the mask-key share),
    64 bytes: what the entry's signature covers after the ciphertext."""
    return share_digests_raw(session, round, owner, holder, encode_share(b, sk))


def share_digests_raw(
    session: bytes, round: int, owner: int, holder: int, plaintext: bytes | memoryview
) -> bytes:
    """:func:`share_digests` of an encoded share plaintext (:func:`encode_share`: the b_u
    share's 48 bytes, then the mask-key share's)."""
    if len(plaintext) != 2 * _SECRET_BYTES:
        raise ValueError("a share plaintext is 96 bytes")
    mv = memoryview(plaintext)
    return (share_digest_raw(session, round, owner, holder, "b", mv[:_SECRET_BYTES])
            + share_digest_raw(session, round, owner, holder, "sk", mv[_SECRET_BYTES:]))


def masked_statement(session: bytes, round: int, cid: int, digest: bytes) -> bytes:
    """What a client's integrity tag on its masked vector signs (Ed25519, under the key it
    advertised with): session, round, the client and the SHA-256 of the packed vector. The
    server checks it on arrival, so a vector altered on its way, or tagged for another round,
    is refused before the survivor set is fixed and its sender counts as dropped."""
    h = hashlib.sha256(b"secagg/secure-sum/v1|masked-tag|" + session)
    h.update(struct.pack(">QI", round & (2**64 - 1), cid) + digest)
    return h.digest()
