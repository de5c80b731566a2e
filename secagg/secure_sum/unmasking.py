"""The server's last stage of a secure-sum session: unmasking.

:class:`Unmasking` is the part of :class:`~secagg.secure_sum.server.Server` that takes the
UNMASK_RESPONSE messages -- every returned share checked against the digest its dealer
signed -- rebuilds the secrets it needs with error correction (:func:`.shamir.decode`, one
set of weights per holder set), names the one liar behind each corrected share, and removes
the masks from the running sum. The state it reads is the server's (see
:mod:`secagg.secure_sum.server` for the protocol as a whole).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from secagg.secure_sum import shamir, wire
from secagg.secure_sum.errors import (
    MisaddressedMessage,
    ReplayedMessage,
    TooFewShares,
    UnrecoverableSecret,
    WrongShare,
)
from secagg.secure_sum.graph import Graph
from secagg.secure_sum.keys import (
    PURPOSE_PAIR_MASK,
    PURPOSE_SELF_MASK,
    agree,
    derive,
    pair,
    public_bytes,
    share_statement,
    verify_signature,
)
from secagg.secure_sum.prg import add_masks
from secagg.secure_sum.statements import commit_seed, share_digest_raw
from secagg.secure_sum.wire import MsgType
from secagg.stages import Stage

_K = shamir.CHUNKS_PER_KEY


class Unmasking:
    """The unmasking stage of :class:`~secagg.secure_sum.server.Server` (a mixin: the
    attributes below are the server's)."""

    session: bytes
    round: int
    graph: Graph
    ring_bits: int
    stage: str
    keys: dict[int, tuple[bytes, bytes]]
    signing: dict[int, tuple[bytes, bytes]]
    forwarded: dict[int, set[int]]
    rejected: dict[int, set[int]]
    excluded: set[int]
    dropped: set[int]
    total: np.ndarray | None
    requests: dict[int, tuple[set[int], set[int]]]
    b_shares: dict[int, dict[int, list[int]]]
    sk_shares: dict[int, dict[int, list[int]]]
    responders: set[int]
    _lied: set[int]
    commitments: dict[int, bytes]
    _relayed: dict[int, dict[int, bytes]]
    faults: dict[int, str]
    check_cpu_s: dict[str, float]

    # ------------------------------------------------------------ unmask

    def receive_unmask(self, data: bytes) -> int:
        """Take one UNMASK_RESPONSE; returns its sender.

        Every share it returns of a peer's secret is checked against the digest the peer (the
        dealer) signed for this holder in its SHARES entry.

        Raises:
            WrongShare: a returned share contradicts its dealer's signed digest: the holder's
                lie (recorded in :attr:`faults`); none of its shares is used.
        """
        self._expect(Stage.UNMASK)
        w, body = self._open(data, MsgType.UNMASK_RESPONSE)
        if w in self.responders or w in self._lied:
            raise ReplayedMessage(f"second UNMASK_RESPONSE from client {w}")
        if w not in self.requests:
            raise MisaddressedMessage(f"UNMASK_RESPONSE from {w}, who was not asked")
        b_raw, s_raw = wire.parse_unmask_response_raw(body)
        b, s = wire.shares_elements(b_raw), wire.shares_elements(s_raw)  # field-checked
        if set(b_raw) != self.requests[w][0] or set(s_raw) != self.requests[w][1]:
            raise MisaddressedMessage(f"UNMASK_RESPONSE from {w} does not answer its request")
        t0 = time.thread_time()
        n_ct, n_d = wire.SHARE_CIPHERTEXT_BYTES, wire.SHARE_DIGEST_BYTES
        for kind, got, off in (("b", b_raw, 0), ("sk", s_raw, n_d)):
            for u in sorted(got):
                if u == w:  # its own share of its own secret: dealer and holder are one
                    continue
                signed = self._relayed[u][w][n_ct + off : n_ct + off + n_d]
                # the digest of the share's bytes as they arrived: the same as of its elements
                if share_digest_raw(self.session, self.round, u, w, kind, got[u]) != signed:
                    self.check_cpu_s["share digests"] += time.thread_time() - t0
                    self._lied.add(w)
                    what = "mask key" if kind == "sk" else "self-mask seed"
                    self._fault(w, f"unmask: returned a share of client {u}'s {what} that "
                                f"contradicts the digest client {u} signed for it")
                    raise WrongShare(w, u, what)
        self.check_cpu_s["share digests"] += time.thread_time() - t0
        self.responders.add(w)
        for u, els in b.items():
            self.b_shares.setdefault(u, {})[w] = els
        for v, els in s.items():
            self.sk_shares.setdefault(v, {})[w] = els
        return w

    def _verify(self, kind: str, owner: int, secret: bytes) -> bool:
        """Check a rebuilt secret: a mask key against the advertised public key, a self-mask
        seed against the commitment its owner sent with its shares."""
        if kind == "sk":
            pub = X25519PrivateKey.from_private_bytes(secret).public_key()
            return public_bytes(pub) == self.keys[owner][1]
        return commit_seed(self.session, self.round, owner, secret) == self.commitments[owner]

    def _rebuild(self, wanted: Sequence[tuple[str, int]]) -> dict[tuple[str, int], bytes]:
        """Rebuild 32-byte secrets from every share that arrived, with error correction
        (:func:`shamir.decode`; owners with equal holders are decoded in one batch).

        Every rebuilt secret is verified: a mask key against its advertised public key, a
        self-mask seed against its owner's commitment (a mismatch there, once the shares
        decoded, is the owner's fault: recorded in :attr:`faults`, the decoded seed kept).
        Each corrected share names one liar in :attr:`faults` (:meth:`_blame_corrected`).

        Raises:
            TooFewShares: fewer than t_k shares of a needed secret arrived.
            UnrecoverableSecret: more wrong shares than the code corrects, or a mask key
                that decodes to another key than the advertised one.
        """
        tk = self.graph.share_threshold
        groups: dict[tuple[int, ...], list[tuple[str, int]]] = {}
        for kind, owner in wanted:
            pool = (self.b_shares if kind == "b" else self.sk_shares).get(owner, {})
            if len(pool) < tk:
                raise TooFewShares(owner, "mask key" if kind == "sk" else "self-mask seed",
                                   len(pool), tk)
            groups.setdefault(tuple(sorted(pool)), []).append((kind, owner))
        out: dict[tuple[str, int], bytes] = {}
        # one random parity polynomial for every holder set: drawn now, after every share
        # arrived, and evaluated once per holder point (see shamir.ParityPolynomial)
        parity = shamir.ParityPolynomial()
        for holders, items in groups.items():
            mat = np.empty((len(holders), _K * len(items)), dtype=object)
            for j, (kind, owner) in enumerate(items):
                pool = (self.b_shares if kind == "b" else self.sk_shares)[owner]
                for i, h in enumerate(holders):
                    mat[i, _K * j : _K * j + _K] = pool[h]
            try:
                flat, errors = shamir.decode([h + 1 for h in holders], mat, tk,
                                             parity=parity)
            except shamir.DecodingError as exc:
                kind, owner = items[exc.column // _K]
                raise UnrecoverableSecret(
                    owner, "mask key" if kind == "sk" else "self-mask seed", len(holders), tk,
                    "its shares are inconsistent: more wrong shares than the code corrects",
                ) from None
            for j, (kind, owner) in enumerate(items):
                what = "mask key" if kind == "sk" else "self-mask seed"
                wrong = sorted({holders[i] for c in range(_K * j, _K * j + _K)
                                for i in errors[c]})
                try:
                    secret = shamir.elements_to_key(flat[_K * j : _K * j + _K])
                except ValueError:
                    raise UnrecoverableSecret(owner, what, len(holders), tk,
                                              "the decoded value is not a key") from None
                if not self._verify(kind, owner, secret):
                    if kind == "sk":
                        raise UnrecoverableSecret(
                            owner, what, len(holders), tk,
                            "it decodes to a key other than the advertised one")
                    if len(holders) == tk or wrong:
                        # only when every one of more than t_k shares agrees is the seed
                        # surely the one the owner dealt (its commitment the only lie);
                        # with a correction too, more liars than the bound could explain it
                        raise UnrecoverableSecret(
                            owner, what, len(holders), tk,
                            "its shares are inconsistent with its commitment" + (
                                ", and no spare share is left to correct them"
                                if len(holders) == tk else
                                f" even after correcting {len(wrong)} share(s)"))
                    self._fault(owner, (
                        "unmask: its seed commitment contradicts the seed its shares encode "
                        f"({len(holders) - len(wrong)} of {len(holders)} holders agree)"))
                self._blame_corrected(kind, owner, wrong)
                out[(kind, owner)] = secret
        return out

    def _blame_corrected(self, kind: str, owner: int, wrong: list[int]) -> None:
        """Name the one liar behind each share the decoder corrected. Each such share matched,
        at :meth:`receive_unmask`, the digest in its dealer's entry (else it never reached the
        decoder): when that entry carries the dealer's signature the holder returned exactly
        what the dealer signed it was dealing, so the dealer dealt it wrong; when it does not,
        the holder accepted a share its dealer never signed (an honest holder complains
        instead) and is named. The owner's own share of its own secret names the owner."""
        what = "mask key" if kind == "sk" else "self-mask seed"
        n_signed = wire.SIGNED_SHARE_BYTES
        dealt = []
        for w in wrong:
            if w == owner:
                self._fault(owner, f"unmask: returned a wrong share of its own {what}")
                continue
            entry = self._relayed[owner][w]
            t0 = time.thread_time()
            ok = verify_signature(self.signing[owner][0], entry[n_signed:],
                                  share_statement(self.session, self.round, owner, w,
                                                  entry[:n_signed]))
            self.check_cpu_s["signatures"] += time.thread_time() - t0
            if ok:
                dealt.append(w)
            else:
                self._fault(w, f"share: accepted a share of client {owner}'s {what} that "
                            f"client {owner} never signed (an honest holder complains)")
        if dealt:
            self._fault(owner, (
                f"share: dealt client(s) {dealt} a wrong share of its {what} under its "
                "signed digest (corrected" + ("; its input stays in the sum: dropping it now "
                                              "would reveal it)" if kind == "b" else ")")))

    def finish(self) -> tuple[np.ndarray, tuple[int, ...]]:
        """Close stage 4: unmask the running sum.

        Returns:
            (the ring sum of the contributors' vectors as uint64, the contributors).
        """
        self._expect(Stage.UNMASK)
        live = self.contributors
        self._check(Stage.UNMASK, set(self.responders))
        wanted = [("b", u) for u in sorted(live)] + [("sk", v) for v in sorted(self.dropped)]
        secrets_ = self._rebuild(wanted)
        assert self.total is not None
        masks: list[tuple[bytes, int]] = []
        for u in sorted(live):
            b = secrets_[("b", u)]
            masks.append((derive(b, PURPOSE_SELF_MASK, self.session, self.round, u, u), -1))
        for v in sorted(self.dropped):
            sk = X25519PrivateKey.from_private_bytes(secrets_[("sk", v)])  # once per v
            # the live clients that masked with v are among v's neighbours: O(k), not O(n)
            for w in sorted(set(self.graph.neighbours[v]) & live):
                if v in self.forwarded.get(w, ()) and v not in self.rejected.get(w, ()):
                    s = agree(sk, self.keys[w][1])
                    key = derive(s, PURPOSE_PAIR_MASK, self.session, self.round, *pair(w, v))
                    masks.append((key, -1 if w < v else 1))
        add_masks(self.total, masks)  # every mask in one cache-blocked pass over the sum
        self.stage = "done"
        out = self.total.astype(np.uint64)
        if self.ring_bits < 64:
            out &= np.uint64((1 << self.ring_bits) - 1)
        return out, tuple(sorted(live))
