"""The client side of the secure-sum protocol, as an explicit state machine.

A :class:`Client` consumes and produces wire messages (bytes) only. Its steps, in order:

1. :meth:`advertise` -- fresh X25519 key pairs; sends both public keys, signed with its
   Ed25519 key (a long-term, pinned identity key when one is given; else a fresh one).
2. :meth:`share_keys` -- reads its neighbours' keys (ROSTER; with pinned keys, each
   neighbour's keys must carry that neighbour's signature), refuses low-order keys and a
   share threshold t_k of at most half the holders, draws the self-mask seed b_u,
   Shamir-shares b_u and its mask private key t_k-out-of-(neighbours + itself), and encrypts
   each neighbour's shares with AES-256-GCM under an X25519+HKDF channel key; the associated
   data binds session, round, sender, receiver, stage and both parties' public keys. It also
   sends the server a hash commitment to b_u (checked when the server rebuilds b_u).
3. :meth:`receive_forward` -- checks each forwarded share's sender signature (over the
   ciphertext and the sender's share digests, :func:`share_digest`), decrypts it and checks
   the share against those signed digests; a share it cannot use is a *complaint* against its
   sender, sent back in the ACK with its evidence (below).
4. :meth:`masked_input` -- y_u = x_u + PRG(b_u) + sum_{v accepted, u<v} PRG(s_uv)
   - sum_{v accepted, u>v} PRG(s_uv) mod 2^k, with an integrity tag: its Ed25519 signature
   over the vector's digest, session and round (checked by the server on arrival). The input
   is checked, masked, reduced and hashed in one pass, block by block
   (:func:`~secagg.secure_sum.prg.add_masks`).
5. :meth:`sign_survivors` -- the consistency round of Bonawitz et al.'s active variant: signs
   the survivor set U3 the server showed it (which must contain it and have >= t members).
6. :meth:`unmask` -- answers one unmasking request; refuses one that asks for both the
   self-mask share and the mask-key shares of the same peer, for its own mask key, or for
   shares it does not hold; and releases nothing unless the request carries enough valid
   signatures over the SAME U3 it signed, asks self-mask shares only of members of U3 and
   mask-key shares only of non-members.

Why both checks. The split attack -- asking one group of a peer's share holders for its
self-mask shares and a disjoint group for its mask-key shares -- needs two disjoint groups of
t_k holders, impossible once 2 t_k > holders (enforced in :meth:`share_keys` from the roster
the client sees, whatever the server claims t_k is). With clients colluding with the server,
the consistency round closes the rest: an honest client only releases shares consistent with
the one U3 it signed, and two different survivor sets can each collect t signatures from a
cohort of n only if at least 2t - n signers signed both (are corrupt).

What the signatures prove depends on where the verification keys come from. With ``pinned``
(client id -> Ed25519 public key, known from outside the protocol, e.g. a PKI) the roster's
X25519 keys and every consistency signature are checked against them, so a malicious server
can neither substitute keys (man in the middle), nor invent clients, nor show two survivor
sets. Without pinned keys, the keys are whatever the server relayed: the round still catches
a server that equivocates without forging keys, but an active server that forges can defeat
it -- the protocol is then secure against an honest-but-curious server only.

Verifiable complaints. Shares and masks use separate key agreements: the ``enc`` X25519 pair
gives the share keys, the ``mask`` pair the pairwise mask keys (:mod:`.keys`). From the ``enc``
secret Z_uv each direction gets its own key, k_{u->v} = HKDF(Z_uv, share, u, v), and both
ends send the server, in SHARES, the digest D_uv of the commitments H(k_{u->v}), H(k_{v->u})
(:func:`~secagg.secure_sum.keys.pair_digest`); each ciphertext is signed by its sender. The
server compares the two ends' digests before forwarding: equal, both ends hold the same keys;
different, one end misderived or lied about them, the server cannot tell which, and it cuts
the edge (forwards neither direction; neither end masks with the other) -- no one is excluded,
and an edge is cut only where one end misbehaved. Complaints come in two kinds. A client
whose forwarded share does not carry its sender's valid signature says so and reveals
nothing; the server checks the signature on the ciphertext it relayed: invalid, the sender is
excluded; valid, the complainer is (its claim is false, or its own link altered the share). A
client whose signed share fails to decrypt, or decrypts to a share that contradicts the
share digests signed with it, complains with (the sender, k_{v->u}, H(k_{u->v})); the server
checks the key against D_uv and decrypts the ciphertext it relayed: it authenticates, decodes
and matches the signed digests -- a false complaint, the complainer is excluded; it does
not -- the sender is excluded; the key does not match D_uv -- the complainer revealed a key other
than the one it committed to, and is excluded (an honest client always reveals the committed
key). Each case is decided from evidence alone, so one client can exclude only itself, never
an honest peer.

What revealing k_{v->u} leaks. (1) Nothing about the pair's mask key: it is an HKDF output of
the ``enc`` secret, independent of the ``mask`` key pair (separate X25519 keys, separate HKDF
purposes), and the mask secret of a live pair is never revealed. (2) Nothing about the
reverse direction: k_{u->v} is an independent HKDF output; the server gets only its
commitment. (3) No share plaintext a later stage needs: an honest client complains only about
a ciphertext that carries its sender's valid signature and fails to decrypt under the key it
committed to, or opens to a share other than the one the sender signed a digest of -- so the
revealed key opens a ciphertext the sender itself made unusable (the sender is corrupt, and
excluded: its share of its own secrets is all the server learns); for a ciphertext the server
or the link altered (its signature fails) no key is revealed. A false complaint opens a share
the (corrupt) complainer already holds -- it could as well have sent the server that
plaintext directly, so complaining gives a corrupt client no power it lacked; it counts, as
any client that talks to the server, against the protocol's bound on corrupt clients. Either
way the server learns only what a corrupt client already knows.

Completeness and the residual case. With pinned identities the signature a receiver checks is
its sender's pinned key, so a ciphertext is provably the sender's: every complaint the server
upholds is the sender's fault, every one it rejects the complainer's. Without pinned keys the
signing keys are whatever the server relayed: against an honest-but-curious server (the model
then promised) the check is the same, but an active server can forge a sender's signature on
an altered ciphertext, so that an honest receiver complains and reveals the key of a share the
server can open -- the residual case, closed only by pinning.

Any step out of order raises :class:`StageOrderError`; a bad message raises a typed
:class:`~secagg.errors.ProtocolError` and leaves the client's state unchanged.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from secagg.errors import ConfigurationError, EncodingOverflow
from secagg.secure_sum import shamir, wire
from secagg.secure_sum.errors import (
    InconsistentView,
    MalformedMessage,
    MisaddressedMessage,
    ReplayedMessage,
    StageOrderError,
    UnmaskingRefused,
    UnsafeThreshold,
)
from secagg.secure_sum.keys import (
    PURPOSE_PAIR_MASK,
    PURPOSE_SELF_MASK,
    KeyPairs,
    advertise_statement,
    agree,
    derive,
    key_commitment,
    pair,
    pair_digest,
    share_key,
    share_statement,
    sign_public,
    signing_key,
    survivors_statement,
    verify_signature,
)
from secagg.secure_sum.prg import add_masks, word_dtype
from secagg.secure_sum.statements import (
    commit_seed,
    decode_share,
    encode_share,
    masked_statement,
    share_aad,
    share_digest,
    share_digests,
    share_digests_raw,
    share_nonce,
)
from secagg.secure_sum.wire import SERVER_ID, MsgType

_K = shamir.CHUNKS_PER_KEY

__all__ = [  # the statements are re-exported: tests and tools import them from here
    "Client", "commit_seed", "decode_share", "encode_share", "masked_statement", "share_aad",
    "share_digest", "share_digests", "share_nonce",
]


class Client:
    """One client's party in one secure-sum session.

    Args:
        cid: the client id (0 <= cid < 2^32 - 1); also its Shamir evaluation point minus one.
        session: the 16-byte session id the server announced for this run.
        round: the training round (bound into every derived key and associated data).
        entropy: byte source for keys, b_u and Shamir coefficients; default the OS CSPRNG
            (a seeded source is for reproducible experiments and tests only).
        threshold: t, the public minimum number of survivors: a survivor set smaller than t
            is refused, and with ``pinned`` keys at least t valid consistency signatures are
            required. None: not checked (then at least t_k signatures are required).
        length, ring_bits: the public vector length and ring; a ROSTER announcing others is
            refused (None: whatever the roster says).
        min_holders: the fewest share holders (listed neighbours and the client) a ROSTER may
            give -- t on the complete graph, where every live client is a neighbour; a server
            that lists fewer (to cut the cohort into small groups whose sums it could read) is
            refused. None: only 2 t_k > holders is checked.
        signing: this client's Ed25519 identity key (the private half of its pinned key);
            None draws a fresh one per session.
        pinned: client id -> raw Ed25519 public key of every client this one may talk to,
            known from outside the protocol; see the module docstring for what holds without.
    """

    def __init__(
        self,
        cid: int,
        session: bytes,
        round: int,
        entropy: Callable[[int], bytes] = os.urandom,
        *,
        threshold: int | None = None,
        length: int | None = None,
        ring_bits: int | None = None,
        min_holders: int | None = None,
        signing: Ed25519PrivateKey | None = None,
        pinned: Mapping[int, bytes] | None = None,
    ) -> None:
        if not 0 <= cid <= wire.MAX_ID:
            raise ConfigurationError(f"client ids must be in 0..{wire.MAX_ID}, got {cid}")
        self.cid = cid
        self.session = session
        self.round = round
        self._rand = entropy
        self.threshold = threshold
        self.length = length
        self.ring_bits = ring_bits
        self.min_holders = min_holders
        self._sign = signing
        self.pinned = dict(pinned) if pinned is not None else None
        if self.pinned is not None and signing is not None and \
                self.pinned.get(cid, sign_public(signing)) != sign_public(signing):
            raise ConfigurationError(f"client {cid}: its signing key is not the one pinned")
        self.survivors_count = 0  # |U3|, once signed
        self._u3: frozenset[int] = frozenset()
        self._u3_statement = b""
        self.stage = "new"
        self._keys: KeyPairs | None = None
        self._roster: wire.Roster | None = None
        self._b: bytes = b""
        self._held: dict[int, tuple[list[int], list[int]]] = {}
        self._channels: dict[int, tuple[bytes, bytes]] = {}
        self.accepted: set[int] = set()
        self.rejected: set[int] = set()

    def _expect(self, stage: str, nxt: str) -> None:
        if self.stage != stage:
            raise StageOrderError(
                f"client {self.cid}: cannot run {nxt!r} in state {self.stage!r}"
                + (" (message already processed)" if self.stage == nxt else "")
            )

    def _open(self, data: bytes, mtype: MsgType) -> memoryview:
        return wire.decode_header(data, mtype, self.session, self.cid, SERVER_ID)[1]

    def _channel(self, v: int) -> tuple[bytes, bytes]:
        """(the key of this client's shares for v, the key of v's shares for this client)."""
        assert self._keys is not None and self._roster is not None
        shared = agree(self._keys.enc, self._roster.keys[v][0])
        return (share_key(shared, self.session, self.round, self.cid, v),
                share_key(shared, self.session, self.round, v, self.cid))

    # ------------------------------------------------------------ stages

    def advertise(self) -> bytes:
        """Stage 1: generate key pairs and return the ADVERTISE message."""
        self._expect("new", "advertised")
        self._keys = KeyPairs.generate(self._rand)
        if self._sign is None:
            self._sign = signing_key(self._rand)
        enc, msk = self._keys.enc_public, self._keys.mask_public
        sig = self._sign.sign(advertise_statement(self.session, self.round, self.cid, enc, msk))
        self.stage = "advertised"
        body = wire.advertise_body(enc, msk, sign_public(self._sign), sig)
        return wire.encode(MsgType.ADVERTISE, self.session, self.cid, SERVER_ID, body)

    def share_keys(self, roster_msg: bytes) -> bytes:
        """Stage 2: read the ROSTER, share b_u and the mask key, return the SHARES message."""
        if self.stage == "shared":
            raise ReplayedMessage(f"client {self.cid}: ROSTER already processed")
        self._expect("advertised", "shared")
        assert self._keys is not None
        roster = wire.parse_roster(self._open(roster_msg, MsgType.ROSTER))
        if roster.round != self.round & (2**64 - 1):
            raise ReplayedMessage(f"client {self.cid}: ROSTER of round {roster.round}")
        for what, mine, got in (("vector length", self.length, roster.length),
                                ("ring size (bits)", self.ring_bits, roster.ring_bits)):
            if mine is not None and mine != got:
                raise MalformedMessage(
                    f"client {self.cid}: ROSTER announces {what} {got}, the session's is {mine}"
                )
        if self.cid in roster.keys:
            raise MisaddressedMessage(
                f"client {self.cid}: ROSTER lists the client as its own neighbour"
            )
        pks = [k for pair_ in roster.keys.values() for k in pair_]
        pks += [self._keys.enc_public, self._keys.mask_public]
        if len(set(pks)) != len(pks):
            raise MalformedMessage(f"client {self.cid}: ROSTER repeats a public key")
        # a low-order key in the roster is refused where it is used: agree() raises
        # MalformedMessage on the all-zero shared secret (no extra exchange per key here)
        if self.pinned is not None:
            self._check_pinned(roster)
        holders = len(roster.keys) + 1
        if not 2 <= roster.share_threshold <= holders:
            raise MalformedMessage(
                f"client {self.cid}: share threshold {roster.share_threshold} "
                f"with {holders} holders"
            )
        if 2 * roster.share_threshold <= holders:
            raise UnsafeThreshold(self.cid, roster.share_threshold, holders)
        if self.min_holders is not None and holders < self.min_holders:
            raise MalformedMessage(
                f"client {self.cid}: ROSTER lists {holders - 1} neighbours, fewer than the "
                f"{self.min_holders - 1} the session's threshold needs"
            )
        self._roster = roster
        assert self._sign is not None
        self._b = self._rand(32)
        secrets_ = shamir.key_to_elements(self._b) + shamir.key_to_elements(self._keys.mask_private)
        order = sorted(roster.keys) + [self.cid]
        mine = (self._keys.enc_public, self._keys.mask_public)
        shares = shamir.share(
            secrets_, roster.share_threshold, [v + 1 for v in order], self._rand
        )
        entries: dict[int, bytes] = {}
        for row, v in zip(shares, order, strict=True):
            els = [int(e) for e in row]
            if v == self.cid:
                self._held[v] = (els[:_K], els[_K:])
                continue
            self._channels[v] = k_send, k_recv = self._channel(v)
            pt = encode_share(els[:_K], els[_K:])
            ct = AESGCM(k_send).encrypt(
                share_nonce(self.cid, v), pt,
                share_aad(self.session, self.round, self.cid, v, mine, roster.keys[v]),
            )
            signed = ct + share_digests_raw(self.session, self.round, self.cid, v, pt)
            sig = self._sign.sign(share_statement(self.session, self.round, self.cid, v,
                                                  signed))
            digest = pair_digest(self.session, self.round, self.cid, v,
                                 key_commitment(k_send), key_commitment(k_recv))
            entries[v] = signed + sig + digest
        self.stage = "shared"
        body = wire.shares_body(commit_seed(self.session, self.round, self.cid, self._b), entries)
        return wire.encode(MsgType.SHARES, self.session, self.cid, SERVER_ID, body)

    def _check_pinned(self, roster: wire.Roster) -> None:
        """Every neighbour must be pinned, and its X25519 keys signed by its pinned key."""
        assert self.pinned is not None
        for v in sorted(roster.keys):
            spk, sig = roster.signing[v]
            if v not in self.pinned:
                raise MisaddressedMessage(
                    f"client {self.cid}: ROSTER lists client {v}, who has no pinned key"
                )
            stmt = advertise_statement(self.session, self.round, v, *roster.keys[v])
            if spk != self.pinned[v] or not verify_signature(spk, sig, stmt):
                raise InconsistentView(
                    self.cid, f"the ROSTER keys of client {v} are not signed by its pinned key "
                    "(substituted by the server?)"
                )

    def receive_forward(self, forward_msg: bytes) -> bytes:
        """Stage 3a: decrypt the shares addressed to this client; return the ACK message with
        a complaint for each sender whose share it cannot use: (revealed key, commitment) when
        a signed share fails authentication, a signature complaint (nothing revealed) when
        the share does not carry its sender's signature (see the module docstring)."""
        if self.stage == "forwarded":
            raise ReplayedMessage(f"client {self.cid}: FORWARD already processed")
        self._expect("shared", "forwarded")
        assert self._roster is not None
        entries = wire.parse_ciphertexts(self._open(forward_msg, MsgType.FORWARD), "FORWARD")
        strangers = sorted(set(entries) - set(self._roster.keys))
        if strangers:
            raise MisaddressedMessage(
                f"client {self.cid}: FORWARD carries shares from non-neighbours {strangers}"
            )
        assert self._keys is not None
        mine = (self._keys.enc_public, self._keys.mask_public)
        n_ct, n_signed = wire.SHARE_CIPHERTEXT_BYTES, wire.SIGNED_SHARE_BYTES
        accepted, held = set(), {}
        complaints: dict[int, tuple[bytes, bytes]] = {}
        for v, entry in entries.items():
            stmt = share_statement(self.session, self.round, v, self.cid, entry[:n_signed])
            if not verify_signature(self._roster.signing[v][0], entry[n_signed:], stmt):
                complaints[v] = (b"", b"")  # unsigned or altered: reveal nothing
                continue
            k_send, k_recv = self._channels[v]
            try:
                pt = AESGCM(k_recv).decrypt(
                    share_nonce(v, self.cid), entry[:n_ct],
                    share_aad(self.session, self.round, v, self.cid, self._roster.keys[v], mine),
                )
                b_els, sk_els = decode_share(pt)
                if share_digests_raw(self.session, self.round, v, self.cid, pt) \
                        != entry[n_ct:n_signed]:
                    raise ValueError("the share contradicts its dealer's signed digest")
            except (InvalidTag, ValueError):
                complaints[v] = (k_recv, key_commitment(k_send))
                continue
            held[v] = (b_els, sk_els)
            accepted.add(v)
        self._held.update(held)
        self.accepted, self.rejected = accepted, set(complaints)
        self.stage = "forwarded"
        return wire.encode(MsgType.ACK, self.session, self.cid, SERVER_ID,
                           wire.complaints_body(complaints))

    def masked_input(self, vector: np.ndarray) -> bytes:
        """Stage 3b: mask the encoded vector (uint64 ring elements) and return MASKED."""
        self._expect("forwarded", "masked")
        assert self._roster is not None and self._keys is not None
        r = self._roster
        x = np.asarray(vector)
        if x.ndim != 1 or x.size != r.length:
            raise ConfigurationError(
                f"client {self.cid}: vector must be 1-D of length {r.length}, got {x.shape}"
            )
        if x.dtype.kind not in "ui":
            raise ConfigurationError(
                f"client {self.cid}: vector must hold ring elements (integers), got {x.dtype}"
            )
        wd = word_dtype(r.ring_bits)
        acc = np.empty(x.size, dtype=wd)
        masks = [(derive(self._b, PURPOSE_SELF_MASK, self.session, self.round, self.cid,
                         self.cid), 1)]
        for v in sorted(self.accepted):
            s = agree(self._keys.mask, r.keys[v][1])
            masks.append((derive(s, PURPOSE_PAIR_MASK, self.session, self.round,
                                 *pair(self.cid, v)), 1 if self.cid < v else -1))
        # one pass over the vector, a cache-sized block at a time: check the input block,
        # copy it in, add every mask, reduce mod 2^k and hash the packed words
        packed_in_place = wire.packed_width(r.ring_bits) == wd.itemsize
        h = hashlib.sha256()
        top = r.ring_bits if r.ring_bits < 64 else None
        low = wd.type((1 << r.ring_bits) - 1) if r.ring_bits < wd.itemsize * 8 else None
        signed = x.dtype.kind == "i"

        def fill(lo: int, hi: int, block: np.ndarray) -> None:
            xs = x[lo:hi]
            if (signed and int(xs.min()) < 0) or (top is not None and int(xs.max()) >> top):
                raise EncodingOverflow(
                    f"client {self.cid}: vector entries outside Z_2^{r.ring_bits}")
            np.copyto(block, xs, casting="unsafe")  # exact: every entry is < 2^ring_bits

        def seal(lo: int, hi: int, block: np.ndarray) -> None:
            if low is not None:
                np.bitwise_and(block, low, out=block)
            if packed_in_place:
                h.update(memoryview(block).cast("B"))

        add_masks(acc, masks, before=fill, after=seal)
        data = wire.pack_ring(acc, r.ring_bits)
        if not packed_in_place:
            h.update(data)
        self.stage = "masked"
        assert self._sign is not None
        tag = self._sign.sign(masked_statement(self.session, self.round, self.cid,
                                               h.digest()))
        parts = wire.masked_parts(r.ring_bits, r.length, tag, data)
        return wire.encode(MsgType.MASKED, self.session, self.cid, SERVER_ID, parts)

    def sign_survivors(self, survivors_msg: bytes) -> bytes:
        """Consistency round: sign the survivor set U3 the server shows (SURVIVORS) and return
        the SIGNATURE message. An honest client signs exactly one set per session.

        Raises:
            InconsistentView: U3 leaves this client out (it did send its masked input) or has
                fewer than ``threshold`` members.
        """
        if self.stage == "signed":
            raise ReplayedMessage(f"client {self.cid}: already signed a survivor set")
        self._expect("masked", "signed")
        u3 = wire.parse_ids(self._open(survivors_msg, MsgType.SURVIVORS), "SURVIVORS")
        if self.cid not in u3:
            raise InconsistentView(self.cid, "the survivor set leaves out this client, whose "
                                   "masked input was sent")
        if self.threshold is not None and len(u3) < self.threshold:
            raise InconsistentView(
                self.cid, f"the survivor set has {len(u3)} members, fewer than the threshold "
                f"{self.threshold}"
            )
        assert self._sign is not None
        self._u3_statement = survivors_statement(self.session, self.round, u3)
        self.survivors_count = len(u3)
        # What the unmask check needs of U3: with pinned keys all of it (every signer must
        # be in it); else its members in this client's closed neighbourhood -- the only
        # clients whose shares it holds or whose signatures it can check -- so a client
        # keeps O(k) of U3, not O(n) (10,000 clients kept 7 GB of survivor sets).
        if self.pinned is not None:
            self._u3 = frozenset(u3)
        else:
            assert self._roster is not None
            mine = self._roster.keys.keys() | {self.cid}
            self._u3 = frozenset(v for v in u3 if v in mine)
        sig = self._sign.sign(self._u3_statement)
        self.stage = "signed"
        return wire.encode(MsgType.SIGNATURE, self.session, self.cid, SERVER_ID, sig)

    def _check_consistency(
        self, b_ids: list[int], sk_ids: list[int], sigs: dict[int, bytes]
    ) -> None:
        """Release nothing unless the request agrees with the survivor set this client signed
        and enough other clients signed that same set (see the module docstring)."""
        assert self._roster is not None and self._sign is not None
        # b_ids and sk_ids are peers whose shares this client holds (checked by the caller),
        # all in its neighbourhood, so the neighbourhood's part of U3 decides these two
        u3 = self._u3
        if self.pinned is None:  # only the neighbourhood's signatures can be checked
            sigs = {v: s for v, s in sigs.items()
                    if v == self.cid or v in self._roster.signing}
        if not set(b_ids) <= u3:
            raise InconsistentView(
                self.cid, f"self-mask shares asked of {sorted(set(b_ids) - u3)}, who are not in "
                "the survivor set it signed"
            )
        if set(sk_ids) & u3:
            raise InconsistentView(
                self.cid, f"mask-key shares asked of {sorted(set(sk_ids) & u3)}, who are in "
                "the survivor set it signed"
            )
        if not set(sigs) <= u3:
            raise InconsistentView(self.cid, "signatures from clients outside the survivor set")
        stmt = self._u3_statement  # what this client signed
        valid = 0
        for v in sorted(sigs):
            if self.pinned is not None:
                if v not in self.pinned:
                    raise InconsistentView(self.cid, f"signature of client {v}, who is not pinned")
                key = self.pinned[v]
            elif v == self.cid:
                key = sign_public(self._sign)
            else:
                key = self._roster.signing[v][0]
            if not verify_signature(key, sigs[v], stmt):
                raise InconsistentView(
                    self.cid, f"the signature of client {v} does not verify on the survivor set "
                    "this client was shown (the server showed different survivor sets, or "
                    "altered the signature)"
                )
            valid += 1
        need = self._roster.share_threshold
        if self.pinned is not None and self.threshold is not None:
            need = max(need, self.threshold)
        if valid < need:
            raise InconsistentView(
                self.cid, f"{valid} valid signatures on its survivor set, {need} needed"
            )

    def unmask(self, request_msg: bytes) -> bytes:
        """Stage 4: answer the server's UNMASK_REQUEST with the requested shares.

        Raises:
            UnmaskingRefused: the request asks for both kinds of share of one peer, for this
                client's own mask key, or for a share it does not hold.
        """
        if self.stage == "unmasked":
            raise ReplayedMessage(f"client {self.cid}: already answered an unmasking request")
        self._expect("signed", "unmasked")
        b_ids, sk_ids, sigs = wire.parse_unmask_request(
            self._open(request_msg, MsgType.UNMASK_REQUEST)
        )
        both = tuple(sorted(set(b_ids) & set(sk_ids)))
        if both:
            raise UnmaskingRefused(
                self.cid, both,
                "the request asks for both the self-mask share and the mask-key share "
                "(that would reveal these peers' inputs)",
            )
        if self.cid in sk_ids:
            raise UnmaskingRefused(
                self.cid, (self.cid,), "a live client never reveals its mask key"
            )
        missing = tuple(sorted(v for v in [*b_ids, *sk_ids] if v not in self._held))
        if missing:
            raise UnmaskingRefused(self.cid, missing, "no share of these peers is held")
        self._check_consistency(b_ids, sk_ids, sigs)
        self.stage = "unmasked"
        body = wire.unmask_response_body(
            {v: self._held[v][0] for v in b_ids}, {v: self._held[v][1] for v in sk_ids}
        )
        return wire.encode(MsgType.UNMASK_RESPONSE, self.session, self.cid, SERVER_ID, body)
