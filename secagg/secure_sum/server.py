"""The server side of the secure-sum protocol, as an explicit state machine.

The :class:`Server` sees only wire messages. Per stage it collects the clients' messages
(``receive_*``) and then closes the stage (``close_*``), which checks the live set against the
thresholds (raising :class:`~secagg.errors.SecureSumAborted` naming the stage and the counts)
and returns the messages it sends next. :meth:`finish` rebuilds the secrets it needs from the
unmasking responses, removes the masks and returns the ring sum of the contributors' inputs.

What the server needs to remove, with L = contributors (masked input arrived, not excluded):

* every u in L: its self mask PRG(b_u), with b_u rebuilt from t_k shares;
* every v that shared keys but is not in L (dropped, or excluded by a complaint's verdict):
  the pairwise masks between v and each w in L that accepted v's share, with v's mask private
  key rebuilt from t_k shares.

Complaints are checked, never taken at face value (the scheme and why revealing a share key
is safe: :mod:`secagg.secure_sum.client`). At SHARES the server keeps the signed ciphertexts
and the pair digests. Closing the share stage it compares the two digests of every
pair and cuts the edges where they differ (:attr:`Server.cut`: neither direction forwarded,
no one excluded); a client left with fewer than t_k share holders by cuts is dropped there,
before any share of it is forwarded (:attr:`Server.cut_off`). At ACK each complaint is judged
from evidence (:meth:`Server._judge`): a signature complaint against the signature on the
relayed ciphertext; a key complaint's key must match the pair digest and fail to open the
relayed ciphertext. Upheld, the sender is excluded; otherwise the complainer is
(:attr:`Server.verdicts`).

It never asks one client for both kinds of share of the same peer (honest clients refuse).

At ADVERTISE the server refuses (drops, recording why in :attr:`Server.refused`) a client whose
keys cannot be used safely -- a low-order X25519 point, a key another client already
advertised, the same key for both purposes, a bad signature -- so one bad client cannot abort
the session for everyone. Between masked input and unmasking it runs the consistency round:
it shows the survivor set U3 to every member, collects their Ed25519 signatures of it, and
forwards them all with each unmasking request (clients check them, see
:mod:`secagg.secure_sum.client`).
With ``pinned`` identities (client -> Ed25519 public key, known from outside the protocol)
an ADVERTISE signed by any other key is refused there, so a client with an unpinned key is
left out before any roster lists it (else every honest client would refuse the roster).

A lying client excludes only itself, at every stage:

* its MASKED vector carries its Ed25519 signature over (session, round, sender, SHA-256 of
  the vector) -- the integrity tag -- checked on arrival: a wrong tag, or one made for
  another round or session, refuses the vector (:class:`~.errors.BadIntegrityTag`), and the
  sender is then treated as dropped (its mask key is rebuilt, its pairwise masks removed);
* every wrong share names exactly one liar. In its SHARES entry for holder v the dealer u
  signs, with the ciphertext (one Ed25519 signature over both), one digest per secret of the
  share it deals v: SHA-256(tag, session, round, u, v, kind, share)
  (:func:`~secagg.secure_sum.client.share_digest`; a share is uniform given fewer than t_k
  others, >= 127 bits per element, so the digest reveals nothing). At FORWARD an honest v
  checks the share it decrypts against u's signed digest; a mismatch is a key complaint, and
  the server, opening the relayed ciphertext with the revealed key, finds the mismatch itself
  and excludes u (the "upheld" verdict). So a share an honest holder accepted equals what its
  dealer signed. At unmask the server checks every returned share against the dealer's
  signed digest: a mismatch is the holder's lie (only the holder chose that value: the dealer
  signed another, the holder accepted it against that digest), recorded in :attr:`faults`,
  and none of the holder's shares is used (:class:`~.errors.WrongShare`). The shares left
  are each exactly what their dealer signed, so when the decoder still corrects one (below),
  the dealer dealt shares that are not on one polynomial: the dealer is named
  (:meth:`Server._blame_corrected`; a holder that accepted an entry without its dealer's
  valid signature is named instead -- an honest one complains). One party per lie, from
  evidence; no honest client is ever named;
* each secret is rebuilt from the shares left by Reed-Solomon decoding
  (:func:`secagg.secure_sum.shamir.decode`): with h shares and threshold t_k up to
  floor((h - t_k) / 2) wrong shares are corrected and located. A dealer named for a wrong
  share whose masked input is already in the sum stays a contributor: dropping it now would
  mean rebuilding both its self-mask seed and its mask key, which together reveal its input.
  It is named and its wrong shares corrected; the sum stays exact;
* a rebuilt self-mask seed that does not match its owner's commitment while all of its
  h > t_k shares agree is the owner's own lie (its commitment contradicts the polynomial every
  holder agrees on; only h - t_k + 1 liars agreeing on another polynomial could explain it
  otherwise): recorded in :attr:`Server.faults`, and the seed the shares encode is used. With
  a mismatch and a corrected share as well, the round aborts (more liars than the bound
  could explain it);
* past the bound -- more wrong shares than the code corrects, or a mask key that decodes to
  a key other than the advertised one -- the round aborts with
  :class:`~.errors.UnrecoverableSecret` naming the owner, the counts and the bound, never a
  wrong sum. The decoding relies on at most that many wrong shares per secret among the
  shares whose holders passed the digest check (lying holders' shares are dropped before
  decoding, so they count against t_k, not against the bound).
"""

from __future__ import annotations

import hashlib
import time

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from secagg.errors import SecureSumAborted
from secagg.secure_sum import shamir, wire
from secagg.secure_sum.errors import (
    BadIntegrityTag,
    MalformedMessage,
    MisaddressedMessage,
    RejectedKey,
    ReplayedMessage,
    StageOrderError,
)
from secagg.secure_sum.graph import Graph
from secagg.secure_sum.keys import (
    advertise_statement,
    is_low_order,
    key_commitment,
    pair,
    pair_digest,
    share_statement,
    survivors_statement,
    verify_signature,
)
from secagg.secure_sum.prg import word_dtype
from secagg.secure_sum.statements import (
    decode_share,
    masked_statement,
    share_aad,
    share_digests,
    share_nonce,
)
from secagg.secure_sum.unmasking import Unmasking
from secagg.secure_sum.wire import SERVER_ID, MsgType
from secagg.stages import SECURE_SUM_STAGES, Stage

_K = shamir.CHUNKS_PER_KEY

STAGES = SECURE_SUM_STAGES


class Server(Unmasking):
    """The aggregator's party in one secure-sum session.

    Args:
        session: 16-byte session id (fresh per run).
        round: the training round.
        graph: the neighbour graph and thresholds (:func:`secagg.secure_sum.graph.build`).
        ring_bits: k, the sum is computed in Z_{2^k}.
        length: the vector length every client uploads.
        forward_all_signatures: send every client all the consistency signatures (its
            clients pin every peer's key and need at least t valid ones: Theta(n) bytes
            per client, Theta(n^2) in all). False (default): each client gets only its
            closed neighbourhood's signatures, the ones a client without pinned keys can
            check at all (it knows only its neighbours' signing keys, from the roster), so
            the request is O(k) bytes and what the client verifies is unchanged.
        pinned: client -> its pinned Ed25519 public key (32 bytes); an ADVERTISE signed by
            another key, or from a client with none, is refused. None: any key is taken.
    """

    def __init__(
        self, session: bytes, round: int, graph: Graph, ring_bits: int, length: int,
        *, forward_all_signatures: bool = False, pinned: dict[int, bytes] | None = None,
    ) -> None:
        self.pinned = dict(pinned) if pinned is not None else None
        self.session = session
        self.forward_all_signatures = forward_all_signatures
        self.round = round
        self.graph = graph
        self.ring_bits = ring_bits
        self.length = length
        self.cohort = frozenset(graph.neighbours)
        self.stage = Stage.ADVERTISE
        self.keys: dict[int, tuple[bytes, bytes]] = {}
        self.signing: dict[int, tuple[bytes, bytes]] = {}
        self.refused: dict[int, str] = {}
        self._key_owner: dict[bytes, int] = {}
        self.survivors: tuple[int, ...] = ()
        self._survivor_set: frozenset[int] = frozenset()
        self._survivors_stmt = b""
        self.signatures: dict[int, bytes] = {}
        self.u2: set[int] = set()
        self._shares: dict[int, dict[int, bytes]] = {}
        self.forwarded: dict[int, set[int]] = {}
        self.rejected: dict[int, set[int]] = {}
        self.excluded: set[int] = set()
        self.masked_from: set[int] = set()
        self.total: np.ndarray | None = None
        self.requests: dict[int, tuple[set[int], set[int]]] = {}
        self.b_shares: dict[int, dict[int, list[int]]] = {}
        self.sk_shares: dict[int, dict[int, list[int]]] = {}
        self.responders: set[int] = set()
        self._lied: set[int] = set()
        self.live: dict[str, int] = {}
        self.dropped: set[int] = set()
        self.commitments: dict[int, bytes] = {}
        self.tags: dict[int, tuple[bytes, bytes]] = {}
        self._rostered: dict[int, set[int]] = {}
        self._relayed: dict[int, dict[int, bytes]] = {}
        self._digests: dict[int, dict[int, bytes]] = {}
        self.cut: set[tuple[int, int]] = set()
        self.cut_off: dict[int, str] = {}
        self.verdicts: list[tuple[int, int, str]] = []
        self.faults: dict[int, str] = {}
        self.check_cpu_s: dict[str, float] = {"signatures": 0.0, "digests": 0.0,
                                              "complaints": 0.0, "share digests": 0.0}

    # ------------------------------------------------------------ helpers

    def _expect(self, stage: str) -> None:
        if self.stage != stage:
            raise StageOrderError(f"server: message for stage {stage!r} while in {self.stage!r}")

    def _open(self, data: bytes, mtype: MsgType) -> tuple[int, memoryview]:
        head, body = wire.decode_header(data, mtype, self.session, SERVER_ID)
        if head.sender not in self.cohort:
            raise MisaddressedMessage(f"{mtype.name} from {head.sender}, who is not in the cohort")
        return head.sender, body

    def _fault(self, u: int, why: str) -> None:
        """Record a lie attributed to u (several lies of one party are joined)."""
        self.faults[u] = f"{self.faults[u]}; {why}" if u in self.faults else why

    def _check(self, stage: str, live: set[int]) -> None:
        self.live[stage] = len(live)
        ok, survivors, needed = self.graph.live_ok(live)
        if not ok:
            raise SecureSumAborted(stage=stage, survivors=survivors, threshold=needed)

    # ------------------------------------------------------------ advertise

    def receive_advertise(self, data: bytes) -> int:
        """Take one ADVERTISE message; returns its sender.

        Raises:
            RejectedKey: the keys cannot be used safely (low-order point, a key already
                advertised by another client or twice by this one, bad signature); the client
                is left out of the session (recorded in :attr:`refused`), the others go on.
        """
        self._expect(Stage.ADVERTISE)
        u, body = self._open(data, MsgType.ADVERTISE)
        if u in self.keys or u in self.refused:
            raise ReplayedMessage(f"second ADVERTISE from client {u}")
        enc, msk, spk, sig = wire.parse_advertise(body)
        reason = ""
        if self.pinned is not None and self.pinned.get(u) != spk:
            reason = ("a signing key that is not its pinned identity" if u in self.pinned
                      else "no pinned identity")
        elif is_low_order(enc) or is_low_order(msk):
            reason = "a low-order X25519 public key (its shared secrets would be public)"
        elif enc == msk:
            reason = "the same X25519 key for share encryption and masking"
        elif any(k in self._key_owner for k in (enc, msk, spk)):
            owner = next(self._key_owner[k] for k in (enc, msk, spk) if k in self._key_owner)
            reason = f"a copy of client {owner}'s public key"
        elif not verify_signature(spk, sig, advertise_statement(self.session, self.round, u,
                                                                 enc, msk)):
            reason = "the signature over its keys does not verify"
        if reason:
            self.refused[u] = reason
            raise RejectedKey(u, reason)
        self.keys[u] = (enc, msk)
        self.signing[u] = (spk, sig)
        for k in (enc, msk, spk):
            self._key_owner[k] = u
        return u

    def close_advertise(self) -> dict[int, bytes]:
        """Close stage 1; returns the ROSTER message for each client that advertised."""
        self._expect(Stage.ADVERTISE)
        live = set(self.keys)
        self._check(Stage.ADVERTISE, live)
        self.stage = Stage.SHARE
        out = {}
        for u in sorted(live):
            nb = {v: self.keys[v] for v in self.graph.neighbours[u] if v in live}
            body = wire.roster_body(self.round, self.ring_bits, self.length,
                                    self.graph.share_threshold, nb,
                                    {v: self.signing[v] for v in nb})
            out[u] = wire.encode(MsgType.ROSTER, self.session, SERVER_ID, u, body)
        self._rostered = {u: set(self.graph.neighbours[u]) & live for u in live}
        return out

    # ------------------------------------------------------------ share keys

    def receive_shares(self, data: bytes) -> int:
        """Take one SHARES message; returns its sender. (The entries' signatures are checked
        by their receivers; the server checks one only when a receiver complains about it.)"""
        self._expect(Stage.SHARE)
        u, body = self._open(data, MsgType.SHARES)
        if u in self._shares:
            raise ReplayedMessage(f"second SHARES from client {u}")
        if u not in self._rostered:
            raise MisaddressedMessage(f"SHARES from {u}, who did not advertise")
        commitment, entries = wire.parse_shares(body)
        if set(entries) != self._rostered[u]:
            raise MisaddressedMessage(
                f"SHARES from {u} addressed to {sorted(entries)}, not to its neighbours"
            )
        n_fw = wire.FORWARD_ENTRY_BYTES
        self._shares[u] = {v: e[:n_fw] for v, e in entries.items()}
        self._digests[u] = {v: e[n_fw:] for v, e in entries.items()}
        self.commitments[u] = commitment
        return u

    def _cut_edges(self) -> None:
        """Cut every pair whose two ends sent different pair digests, then drop (into
        :attr:`cut_off`) the clients the cuts leave with fewer than t_k share holders."""
        t0 = time.thread_time()
        live = set(self._shares)
        for u in sorted(live):
            for v in sorted(self._shares[u]):
                if u < v and v in live and self._digests[u][v] != self._digests[v].get(u):
                    self.cut.add((u, v))
        tk = self.graph.share_threshold
        touched = {w for edge in self.cut for w in edge}
        while touched:
            w = touched.pop()
            if w not in live:
                continue
            held = [v for v in self._shares[w] if v in live and pair(w, v) not in self.cut]
            if len(held) + 1 < tk:
                live.discard(w)
                self.cut_off[w] = (f"{len(held) + 1} share holders after cutting its "
                                   f"mismatched pairs, fewer than t_k = {tk}")
                touched |= set(self._shares[w]) & live
        for w in self.cut_off:
            del self._shares[w]
        self.check_cpu_s["digests"] += time.thread_time() - t0

    def close_shares(self) -> dict[int, bytes]:
        """Close stage 2; returns the FORWARD message for each client that shared."""
        self._expect(Stage.SHARE)
        self._cut_edges()
        self.u2 = set(self._shares)
        self._check(Stage.SHARE, self.u2)
        self.stage = Stage.MASKED_INPUT
        out = {}
        for v in sorted(self.u2):
            # the senders of v's shares are among its neighbours: O(k) per client, not O(n)
            entries = {u: self._shares[u][v] for u in sorted(self.graph.neighbours[v])
                       if u in self.u2 and v in self._shares[u] and pair(u, v) not in self.cut}
            self.forwarded[v] = set(entries)
            out[v] = wire.encode(MsgType.FORWARD, self.session, SERVER_ID, v,
                                 wire.ciphertexts_body(entries))
        self._relayed, self._shares = self._shares, {}
        return out

    # ------------------------------------------------------------ masked input

    def receive_ack(self, data: bytes) -> int:
        """Take one ACK: its sender's complaints, each judged from its evidence (see the
        module docstring); every verdict excludes exactly one party and is recorded in
        :attr:`verdicts` as (complainer, accused, verdict)."""
        self._expect(Stage.MASKED_INPUT)
        if self.masked_from:
            raise StageOrderError("server: ACKs must all arrive before masked vectors")
        u, body = self._open(data, MsgType.ACK)
        if u in self.rejected:
            raise ReplayedMessage(f"second ACK from client {u}")
        if u not in self.u2:
            raise MisaddressedMessage(f"ACK from {u}, who did not share keys")
        complaints = wire.parse_complaints(body)
        if not set(complaints) <= self.forwarded[u]:
            raise MisaddressedMessage(f"ACK from {u} rejects shares it was never sent")
        t0 = time.thread_time()
        for v, (key, commit) in sorted(complaints.items()):
            verdict = self._judge(u, v, key, commit)
            self.verdicts.append((u, v, verdict))
            self.excluded.add(v if verdict == "upheld" else u)
        self.check_cpu_s["complaints"] += time.thread_time() - t0
        self.rejected[u] = set(complaints)
        return u

    def _judge(self, u: int, v: int, key: bytes, commit: bytes) -> str:
        """The verdict on u's complaint against v: "upheld" (v's ciphertext, as relayed, does
        not carry v's signature, or does not open under the key both ends committed to),
        "false" (it opens to a well-formed share), "uncommitted key" (the revealed key is not
        the one the pair digest commits to) or "signed as relayed" (u says the signature
        fails, but the relayed ciphertext carries it: u lies, or its own link altered it). A
        share that opens but contradicts v's signed share digest is v's fault too ("upheld")."""
        n_ct, n_signed = wire.SHARE_CIPHERTEXT_BYTES, wire.SIGNED_SHARE_BYTES
        entry = self._relayed[v][u]
        if key == b"":
            t0 = time.thread_time()
            ok = verify_signature(self.signing[v][0], entry[n_signed:],
                                  share_statement(self.session, self.round, v, u,
                                                  entry[:n_signed]))
            self.check_cpu_s["signatures"] += time.thread_time() - t0
            return "signed as relayed" if ok else "upheld"
        if pair_digest(self.session, self.round, v, u, key_commitment(key), commit) \
                != self._digests[v][u]:
            return "uncommitted key"
        ct = entry[:n_ct]
        try:
            b_els, sk_els = decode_share(AESGCM(key).decrypt(
                share_nonce(v, u), ct,
                share_aad(self.session, self.round, v, u, self.keys[v], self.keys[u])))
        except (InvalidTag, ValueError):
            return "upheld"
        if share_digests(self.session, self.round, v, u, b_els, sk_els) != entry[n_ct:n_signed]:
            return "upheld"  # v signed digests of other shares than the one it encrypted
        return "false"

    def receive_masked(self, data: bytes) -> tuple[int, np.ndarray]:
        """Take one MASKED message; returns (sender, the masked vector as received).

        The vector is added to the running sum unless its sender was excluded."""
        self._expect(Stage.MASKED_INPUT)
        u, body = self._open(data, MsgType.MASKED)
        if u in self.masked_from:
            raise ReplayedMessage(f"second MASKED from client {u}")
        if u not in self.rejected:
            raise StageOrderError(f"MASKED from {u} before its ACK")
        tag, raw, y = wire.parse_masked(body, self.ring_bits, self.length)
        digest = hashlib.sha256(raw).digest()
        if not verify_signature(self.signing[u][0], tag,
                                masked_statement(self.session, self.round, u, digest)):
            self.faults[u] = "masked-input: integrity tag does not verify for this round"
            raise BadIntegrityTag(u)
        self.masked_from.add(u)
        self.tags[u] = (tag, digest)
        if u not in self.excluded:
            if self.total is None:
                self.total = np.array(y, dtype=word_dtype(self.ring_bits))
            else:
                np.add(self.total, y, out=self.total)
        return u, y

    @property
    def contributors(self) -> set[int]:
        """Clients whose masked input is in the running sum."""
        return self.masked_from - self.excluded

    def accepted_by(self, w: int) -> set[int]:
        """The senders whose shares w holds (forwarded to w and authenticated)."""
        return self.forwarded.get(w, set()) - self.rejected.get(w, set())

    def close_masked(self) -> dict[int, bytes]:
        """Close stage 3; returns the SURVIVORS message (U3, the contributors) for each
        contributor."""
        self._expect(Stage.MASKED_INPUT)
        live = self.contributors
        self._check(Stage.MASKED_INPUT, live)
        self.stage = Stage.CONSISTENCY
        self.survivors = tuple(sorted(live))
        self._survivor_set = frozenset(self.survivors)
        self._survivors_stmt = survivors_statement(self.session, self.round, self.survivors)
        body = wire.ids_body(self.survivors)
        return {w: wire.encode(MsgType.SURVIVORS, self.session, SERVER_ID, w, body)
                for w in self.survivors}

    # ------------------------------------------------------------ consistency

    def receive_signature(self, data: bytes) -> int:
        """Take one SIGNATURE (a survivor's Ed25519 signature of U3); returns its sender.

        Raises:
            MalformedMessage: the signature does not verify under the sender's advertised key
                (the sender is then left out of the unmasking, as if it had dropped).
        """
        self._expect(Stage.CONSISTENCY)
        u, body = self._open(data, MsgType.SIGNATURE)
        if u in self.signatures:
            raise ReplayedMessage(f"second SIGNATURE from client {u}")
        if u not in self._survivor_set:
            raise MisaddressedMessage(f"SIGNATURE from {u}, who is not a survivor")
        sig = wire.parse_signature(body)
        if not verify_signature(self.signing[u][0], sig, self._survivors_stmt):
            raise MalformedMessage(f"SIGNATURE from {u} does not verify on the survivor set")
        self.signatures[u] = sig
        return u

    def close_consistency(self) -> dict[int, bytes]:
        """Close the consistency round; returns the UNMASK_REQUEST for each survivor that
        signed, with the consistency signatures it can check (every collected one under
        ``forward_all_signatures``, else its closed neighbourhood's)."""
        self._expect(Stage.CONSISTENCY)
        signers = set(self.signatures)
        self._check(Stage.CONSISTENCY, signers)
        self.stage = Stage.UNMASK
        live = set(self.survivors)
        # a dropped client whose shares some survivor holds (only its neighbours can)
        self.dropped = {
            v for v in self.u2 - live
            if any(v in self.accepted_by(w) for w in self.graph.neighbours[v] & live)
        }
        out = {}
        for w in sorted(signers):
            acc = self.accepted_by(w)
            b_ids = (acc | {w}) & live
            sk_ids = acc & self.dropped
            self.requests[w] = (b_ids, sk_ids)
            if self.forward_all_signatures:
                sigs = self.signatures
            else:  # the signatures w can check: its own and its neighbours'
                sigs = {v: self.signatures[v] for v in self.graph.closed(w)
                        if v in self.signatures}
            out[w] = wire.encode(MsgType.UNMASK_REQUEST, self.session, SERVER_ID, w,
                                 wire.unmask_request_body(b_ids, sk_ids, sigs))
        return out
