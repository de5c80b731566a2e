"""Lying secure-sum clients (issue 33), shared by tests/test_secure_sum_lying_client.py,
tests/test_flower_lying_client.py and benchmarks/active_adversaries.py.

Each lie is a function ``lie(client, message) -> message`` applied to what a real
:class:`~secagg.secure_sum.client.Client` step returned; the client signs (and the node
attests) its lie as an honest party would its true message. :func:`liar` makes the lying
Client subclass. Only the public wire format and client helpers are used, so the same liars
run against an older tree (all but :func:`tag_for_round`, which needs the signed tag).
"""

import hashlib
import os

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from secagg.secure_sum import shamir, wire
from secagg.secure_sum.client import (
    Client,
    commit_seed,
    decode_share,
    encode_share,
    share_aad,
    share_nonce,
)
from secagg.secure_sum.keys import share_statement

# ------------------------------------------------------------------ the liars

def _body(client, msg, mtype):
    return wire.decode_header(msg, mtype, client.session, wire.SERVER_ID)[1]


def bad_tag(client, msg):
    """Its MASKED vector with one bit of the integrity tag flipped."""
    pos = wire.HEADER_BYTES + 5
    return msg[:pos] + bytes([msg[pos] ^ 1]) + msg[pos + 1:]


def tag_for_round(delta):
    """Its true vector under a correctly signed tag made for round + ``delta``."""

    def lie(client, msg):
        _, raw, _ = wire.parse_masked(_body(client, msg, wire.MsgType.MASKED),
                                      client._roster.ring_bits, client._roster.length)
        from secagg.secure_sum.client import masked_statement  # this tree's signed tag

        stmt = masked_statement(client.session, client.round + delta, client.cid,
                                hashlib.sha256(raw).digest())
        parts = wire.masked_parts(client._roster.ring_bits, client._roster.length,
                                  client._sign.sign(stmt), bytes(raw))
        return wire.encode(wire.MsgType.MASKED, client.session, client.cid, wire.SERVER_ID,
                           parts)

    return lie


other_round_tag = tag_for_round(1)


def bad_commitment(client, msg):
    """Its SHARES with a commitment to another seed than the one its shares encode."""
    _, entries = wire.parse_shares(_body(client, msg, wire.MsgType.SHARES))
    fake = commit_seed(client.session, client.round, client.cid, os.urandom(32))
    return wire.encode(wire.MsgType.SHARES, client.session, client.cid, wire.SERVER_ID,
                       wire.shares_body(fake, entries))


def wrong_share_to(victims, digest_of="dealt"):
    """Deals each of ``victims`` a wrong self-mask share inside a correctly encrypted and
    signed ciphertext. Where the tree signs share digests (issue 33's attribution), the
    liar signs, with ``digest_of="dealt"``, the digests of the wrong share it deals (its
    victims cannot tell: the share opens, is signed and matches its digest), and with
    ``"true"`` those of the true share (its victims can: the share contradicts its digest)."""

    def lie(client, msg):
        commitment, entries = wire.parse_shares(_body(client, msg, wire.MsgType.SHARES))
        n_ct = wire.SHARE_CIPHERTEXT_BYTES
        n_signed = getattr(wire, "SIGNED_SHARE_BYTES", n_ct)  # ciphertext | share digests
        mine = (client._keys.enc_public, client._keys.mask_public)
        for v in victims:
            k_send = client._channels[v][0]
            aad = share_aad(client.session, client.round, client.cid, v, mine,
                            client._roster.keys[v])
            b, sk = decode_share(AESGCM(k_send).decrypt(share_nonce(client.cid, v),
                                                        entries[v][:n_ct], aad))
            b[0] = (b[0] + 1) % shamir.P
            ct = AESGCM(k_send).encrypt(share_nonce(client.cid, v), encode_share(b, sk), aad)
            digests = entries[v][n_ct:n_signed]
            if digests and digest_of == "dealt":
                from secagg.secure_sum.client import share_digests  # this tree's digests

                digests = share_digests(client.session, client.round, client.cid, v, b, sk)
            sig = client._sign.sign(share_statement(client.session, client.round,
                                                    client.cid, v, ct + digests))
            entries[v] = ct + digests + sig + entries[v][wire.FORWARD_ENTRY_BYTES:]
        return wire.encode(wire.MsgType.SHARES, client.session, client.cid, wire.SERVER_ID,
                           wire.shares_body(commitment, entries))

    return lie


def wrong_unmask(owners=None):
    """Its UNMASK_RESPONSE with every requested self-mask share of ``owners`` (None: all)
    changed."""

    def lie(client, msg):
        b, s = wire.parse_unmask_response(_body(client, msg, wire.MsgType.UNMASK_RESPONSE))
        for u in b:
            if owners is None or u in owners:
                b[u] = [(e + 7) % shamir.P for e in b[u]]
        return wire.encode(wire.MsgType.UNMASK_RESPONSE, client.session, client.cid,
                           wire.SERVER_ID, wire.unmask_response_body(b, s))

    return lie


STEP_OF = {bad_tag: "masked_input", other_round_tag: "masked_input",
           bad_commitment: "share_keys"}


def liar(lie, step=None, rounds=None):
    """A Client that applies ``lie(client, message)`` to the message its ``step`` returns
    (in the rounds ``rounds``, None: every round)."""
    step = step or STEP_OF[lie]

    def wrapped(self, *args, **kwargs):
        msg = getattr(Client, step)(self, *args, **kwargs)
        if rounds is not None and self.round not in rounds:
            return msg
        return lie(self, msg)

    return type("Liar", (Client,), {step: wrapped})
