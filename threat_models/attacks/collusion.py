"""Server + colluding clients against SecureSum: rebuild a client's secrets, unmask its input.

In Bonawitz et al.'s protocol every client Shamir-shares its self-mask seed ``b_u`` and its
mask private key among its neighbours with threshold T. The server holds every masked input
``y_u = x_u + PRG(b_u) + sum_v +-PRG(s_uv)`` and the advertised public keys; a colluding
client holds (after decrypting them) its shares of every neighbour's two secrets. With T
colluders the coalition rebuilds both of a target's secrets and removes all its masks;
with T - 1 the Lagrange interpolation yields unrelated values, which the coalition detects
(the rebuilt key does not match the advertised public key) and the attack fails.

What it uses: the colluders' decrypted shares (a client's own memory after the share stage),
the target's masked vector and the public keys (the server's view), the session id and
round (public). The transcript does not hold shares, so :func:`unmask` works on these
protocol values; the test drives a real session and replays the colluders' own messages.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from secagg.secure_sum import shamir
from secagg.secure_sum.keys import PURPOSE_PAIR_MASK, PURPOSE_SELF_MASK, agree, derive, pair
from secagg.secure_sum.keys import public_bytes as _public_bytes
from secagg.secure_sum.prg import MaskAccumulator, word_dtype

_K = shamir.CHUNKS_PER_KEY


def rebuild_secrets(shares: Mapping[int, tuple[list[int], list[int]]], mask_public: bytes
                    ) -> tuple[bytes, bytes] | None:
    """``(b_u, mask private key)`` from holder id -> (b-share, key-share) elements, or None
    when the shares do not rebuild the key matching ``mask_public`` (too few holders)."""
    holders = sorted(shares)
    mat = np.empty((len(holders), 2 * _K), dtype=object)
    for i, h in enumerate(holders):
        b_els, sk_els = shares[h]
        mat[i, :_K], mat[i, _K:] = b_els, sk_els
    flat = shamir.reconstruct([h + 1 for h in holders], mat)
    try:
        b = shamir.elements_to_key(flat[:_K])
        sk = shamir.elements_to_key(flat[_K:])
        pub = _public_bytes(X25519PrivateKey.from_private_bytes(sk).public_key())
    except ValueError:
        return None
    return (b, sk) if pub == mask_public else None


def unmask(target: int, masked: np.ndarray, shares: Mapping[int, tuple[list[int], list[int]]],
           mask_publics: Mapping[int, bytes], session: bytes, round: int,
           ring_bits: int) -> np.ndarray | None:
    """The target's input vector (ring elements), or None when the coalition's shares are
    fewer than the threshold.

    Args:
        masked: the target's masked vector as the server received it.
        shares: colluding client -> its shares of the target's (b_u, mask key).
        mask_publics: client -> advertised mask public key (the target and its neighbours).
    """
    got = rebuild_secrets(shares, mask_publics[target])
    if got is None:
        return None
    b, sk = got
    acc = np.asarray(masked).astype(word_dtype(ring_bits))
    masks = MaskAccumulator(acc)
    masks.add(derive(b, PURPOSE_SELF_MASK, session, round, target, target), -1)
    for v, pub in sorted(mask_publics.items()):
        if v == target:
            continue
        key = derive(agree(sk, pub), PURPOSE_PAIR_MASK, session, round, *pair(target, v))
        masks.add(key, -1 if target < v else 1)
    if ring_bits < acc.dtype.itemsize * 8:
        np.bitwise_and(acc, acc.dtype.type((1 << ring_bits) - 1), out=acc)
    return acc.astype(np.uint64)
