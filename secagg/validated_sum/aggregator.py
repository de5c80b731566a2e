"""The two aggregators of the validated sum, as byte-in/byte-out state machines.

Aggregator A (role 0) and aggregator B (role 1) are assumed not to collude; each alone
learns, about one client, only whether its proof passed. One round:

1. :meth:`Aggregator.receive_upload` per client (SHARE_X).
2. The first joint coin (:meth:`coin_commit`, :meth:`coin_open`, :meth:`coin_finish`): each
   aggregator commits to 32 fresh random bytes (SHA-256), then both open; the coin is the
   hash of both. Drawn after every upload is fixed, so neither a client nor one deviating
   aggregator can steer it. :meth:`challenge` is the CHALLENGE each live client gets.
3. :meth:`receive_proof` per client (SHARE_PROOF).
4. The second joint coin: each client's FLP points and bit weights (:mod:`.proof`).
5. :meth:`check_message` / :meth:`receive_check`: each opens its shares of the check values
   and the digests of what it received; a client passes when both saw the same upload and
   every check holds.
6. :meth:`sum_message` / :meth:`finish`: B sends its share of the sum over the passing
   clients; A adds its own and obtains the sum. Clients that failed or did not finish are
   absent from it; no individual share is ever sent to the other aggregator.

Every problem with a client's message raises a :class:`~.errors.ClientRejected` subclass
naming it, after recording it in :attr:`rejected` (the caller goes on with the others).

``checks`` is a test-only switch: leaving out ``"proof"``, ``"wrap"``, ``"length"`` or
``"binding"``
builds an aggregator that skips that check, to show that the tests fail without it.
"""

from __future__ import annotations

import hashlib
import secrets
import struct

import numpy as np

from secagg.secure_sum.errors import StageOrderError
from secagg.stages import Stage
from secagg.validated_sum import field as F
from secagg.validated_sum import proof as proofs
from secagg.validated_sum import wire as W
from secagg.validated_sum.errors import (
    ClientRejected,
    CoinError,
    MalformedShare,
    ProofRejected,
    ReplayedShare,
)

ALL_CHECKS = frozenset({"proof", "wrap", "length", "binding"})
_ID = struct.Struct(">I")


class Aggregator:
    """One of the two aggregators, for one round."""

    def __init__(self, role: int, params: proofs.Params, run_id: bytes, round: int, *,
                 checks: frozenset[str] = ALL_CHECKS) -> None:
        if role not in (0, 1):
            raise ValueError("role is 0 (A) or 1 (B)")
        self.role = role
        self.params = params
        self.run_id = run_id
        self.round = int(round)
        self.checks = frozenset(checks)
        self.rejected: dict[int, ClientRejected] = {}
        self.accepted: tuple[int, ...] = ()
        self._x: dict[int, np.ndarray] = {}
        self._u: dict[int, np.ndarray] = {}
        self._opened: dict[int, np.ndarray] = {}
        self._wrap_vectors: np.ndarray | None = None
        self._received: dict[tuple[int, str], bytes] = {}
        self._dig: dict[int, bytes] = {}
        self._coins: list[bytes] = []
        self._nonce: bytes | None = None
        self._stage = Stage.UPLOAD
        self._noise: np.ndarray | None = None

    # -- helpers -------------------------------------------------------------------------
    def _reject(self, err: ClientRejected) -> ClientRejected:
        self.rejected.setdefault(err.client, err)
        self._x.pop(err.client, None)
        self._u.pop(err.client, None)
        return err

    def _client_body(self, client: int, msg: bytes, kind: int, n: int, what: str
                     ) -> tuple[bytes, np.ndarray]:
        """Digests and this aggregator's share from a client's message."""
        role = self.role if "binding" in self.checks else None
        try:
            if role is None:  # test-only: read the header without checking it
                msg = bytes(msg)
                if len(msg) < W.HEADER_LEN:
                    raise MalformedShare(client, "short")
                body = msg[W.HEADER_LEN:]
            else:
                body = W.parse(msg, kind=kind, run_id=self.run_id, round=self.round,
                               client=client, role=role, blame=client)
            if len(body) < 2 * W.DIGEST_LEN:
                raise MalformedShare(client, f"{what} message has no digests")
            dig, own = body[:2 * W.DIGEST_LEN], body[2 * W.DIGEST_LEN:]
            mine = dig[self.role * W.DIGEST_LEN:(self.role + 1) * W.DIGEST_LEN]
            if W.digest(own) != mine:
                raise MalformedShare(client, f"{what} body does not match its digest")
            if self.role == 0:
                if len(own) != W.SEED_LEN:
                    raise MalformedShare(client, f"{what} seed has {len(own)} bytes, "
                                         f"expected {W.SEED_LEN}")
                ctx = W.context(self.run_id, self.round, client, what)
                return dig, F.expand(own, ctx, n)
            if "length" not in self.checks and len(own) % 8 == 0:
                v = np.frombuffer(own, dtype="<u8").astype(np.uint64) % np.uint64(F.P)
                return dig, np.resize(v, n)  # test-only: a build without the length check
            return dig, W.unpack_elements(own, n, client, f"{what} share")
        except ClientRejected as err:
            raise self._reject(err) from None

    def _seen(self, client: int, what: str, msg: bytes) -> bool:
        """True when ``msg`` repeats, byte for byte, the message this client already sent
        for ``what`` (a retransmission is ignored; a different second message is not)."""
        h = hashlib.sha256(bytes(msg) if isinstance(msg, (bytes, bytearray, memoryview))
                           else b"").digest()
        key = (client, what)
        if key in self._received:
            return self._received[key] == h
        self._received[key] = h
        return False

    def _need(self, stage: str) -> None:
        if self._stage != stage:
            raise StageOrderError(f"aggregator {self.role}: {stage} step during {self._stage}")

    # -- step 1 ----------------------------------------------------------------------------
    def receive_upload(self, client: int, msg: bytes) -> None:
        """Store a client's share of its update (SHARE_X)."""
        self._need(Stage.UPLOAD)
        if self._seen(client, "x", msg):
            return  # the same message again (a retransmission): nothing new
        if client in self._x or client in self.rejected:
            raise self._reject(ReplayedShare(client, "second upload in one round"))
        dig, share = self._client_body(client, msg, W.SHARE_X, self.params.dim, "x")
        self._x[client] = share
        self._dig[client] = dig

    # -- joint coins -------------------------------------------------------------------------
    def coin_commit(self) -> bytes:
        """Commit to this aggregator's half of the next joint coin."""
        if self._nonce is not None:
            raise StageOrderError("coin already committed")
        self._nonce = secrets.token_bytes(32)
        label = str(len(self._coins)).encode()
        body = hashlib.sha256(b"vsum-coin|" + label + b"|" + self._nonce).digest()
        return W.Header(W.COIN_COMMIT, self.run_id, self.round, W.NO_CLIENT,
                        1 - self.role).pack() + body

    def coin_open(self) -> bytes:
        """Open the committed half (after receiving the other's commitment)."""
        if self._nonce is None:
            raise StageOrderError("coin not committed")
        return W.Header(W.COIN_OPEN, self.run_id, self.round, W.NO_CLIENT,
                        1 - self.role).pack() + self._nonce

    def coin_finish(self, other_commit: bytes, other_open: bytes) -> None:
        """Check the other's opening against its commitment and fix the coin."""
        if self._nonce is None:
            raise StageOrderError("coin not committed")
        kw = dict(run_id=self.run_id, round=self.round, client=W.NO_CLIENT, role=self.role,
                  blame=-1)
        try:
            com = W.parse(other_commit, kind=W.COIN_COMMIT, **kw)
            nonce = W.parse(other_open, kind=W.COIN_OPEN, **kw)
        except ClientRejected as err:
            raise CoinError(f"aggregator {1 - self.role}: {err.reason}") from None
        label = str(len(self._coins)).encode()
        if len(nonce) != 32 or hashlib.sha256(b"vsum-coin|" + label + b"|" + nonce
                                              ).digest() != com:
            raise CoinError(f"aggregator {1 - self.role} opened a coin it did not commit to")
        halves = (self._nonce, nonce) if self.role == 0 else (nonce, self._nonce)
        self._coins.append(hashlib.sha256(b"vsum-joint|" + label + b"|" + b"".join(halves)
                                          ).digest())
        self._nonce = None
        self._stage = {Stage.UPLOAD: Stage.PROOF, Stage.PROOF: Stage.CHECK}.get(self._stage,
                                                                               self._stage)

    # -- step 2/3 ----------------------------------------------------------------------------
    @property
    def live(self) -> tuple[int, ...]:
        """Clients whose shares this aggregator holds and has not rejected."""
        return tuple(sorted(self._x))

    def challenge(self, client: int) -> bytes:
        """The CHALLENGE for a live client: the wraparound coin."""
        self._need(Stage.PROOF)
        return W.Header(W.CHALLENGE, self.run_id, self.round, client, self.role
                        ).pack() + self._coins[0]

    def receive_proof(self, client: int, msg: bytes) -> None:
        """Store a client's share of its proof (SHARE_PROOF)."""
        self._need(Stage.PROOF)
        if self._seen(client, Stage.PROOF, msg):
            return  # the same message again (a retransmission): nothing new
        if client not in self._x:
            raise self._reject(ReplayedShare(client, "proof without an upload"))
        if client in self._u:
            raise self._reject(ReplayedShare(client, "second proof in one round"))
        dig, share = self._client_body(client, msg, W.SHARE_PROOF, self.params.proof_len,
                                       Stage.PROOF)
        self._u[client] = share
        self._dig[client] += dig

    # -- step 5 ----------------------------------------------------------------------------
    def _wrap(self) -> np.ndarray:
        if self._wrap_vectors is None:
            ctx = W.context(self.run_id, self.round, W.NO_CLIENT, "wrap")
            self._wrap_vectors = proofs.wrap_vectors(self._coins[0], ctx, self.params)
        return self._wrap_vectors

    def check_message(self) -> bytes:
        """Open this aggregator's shares of every proved client's check values."""
        self._need(Stage.CHECK)
        for c in [c for c in self._x if c not in self._u]:
            self._x.pop(c)  # no proof: the client did not finish and is simply absent
        parts = [W.Header(W.CHECK, self.run_id, self.round, W.NO_CLIENT, 1 - self.role).pack(),
                 _ID.pack(len(self._u))]
        ctx = W.context(self.run_id, self.round, W.NO_CLIENT, Stage.CHECK)
        ch = proofs.challenge(self._coins[1], ctx, self.params)
        for c in sorted(self._u):
            share = proofs.check_share(self.role, self._x[c], self._u[c], self._wrap(), ch,
                                       self.params)
            self._opened[c] = share
            parts += [_ID.pack(c), self._dig[c], W.pack_elements(share)]
        self._stage = "decide"
        return b"".join(parts)

    def receive_check(self, msg: bytes) -> tuple[int, ...]:
        """Decide every client from both openings; returns the accepted clients (the
        rejected ones are in :attr:`rejected`)."""
        self._need("decide")
        try:
            body = W.parse(msg, kind=W.CHECK, run_id=self.run_id, round=self.round,
                           client=W.NO_CLIENT, role=self.role, blame=-1)
        except ClientRejected as err:
            raise CoinError(f"aggregator {1 - self.role}: {err.reason}") from None
        n_check = self.params.check_len
        entry = _ID.size + 4 * W.DIGEST_LEN + 8 * n_check
        if len(body) < 4 or len(body) != 4 + entry * _ID.unpack_from(body)[0]:
            raise CoinError(f"aggregator {1 - self.role}: malformed CHECK")
        other: dict[int, tuple[bytes, np.ndarray]] = {}
        for i in range(_ID.unpack_from(body)[0]):
            off = 4 + i * entry
            c = _ID.unpack_from(body, off)[0]
            dig = body[off + 4:off + 4 + 4 * W.DIGEST_LEN]
            vec = np.frombuffer(body, dtype="<u8", count=n_check,
                                offset=off + 4 + 4 * W.DIGEST_LEN).astype(np.uint64)
            if np.any(vec >= np.uint64(F.P)):
                raise CoinError(f"aggregator {1 - self.role}: CHECK value >= p")
            other[c] = (dig, vec)
        mine = self._opened
        accepted = []
        for c in sorted(self._u):
            if c not in other:
                self._reject(ClientRejected(c, "the other aggregator excluded it"))
                continue
            dig, vec = other[c]
            if "binding" in self.checks and dig != self._dig[c]:
                self._reject(ReplayedShare(c, "the aggregators received pieces of "
                                           "different uploads"))
                continue
            a, b = (mine[c], vec) if self.role == 0 else (vec, mine[c])
            failure = (proofs.decide(a, b, self.params, skip=ALL_CHECKS - self.checks)
                       if "proof" in self.checks else None)
            if failure is not None:
                self._reject(ProofRejected(c, failure))
                continue
            accepted.append(c)
        self.accepted = tuple(accepted)
        self._stage = "sum"
        return self.accepted

    # -- step 6 ----------------------------------------------------------------------------
    def keep_only(self, clients: set[int], why: str) -> None:
        """Exclude the accepted clients not in ``clients`` (they failed a check of another
        proof of the same upload, e.g. another field's bound) before the sum."""
        self._need("sum")
        for c in self.accepted:
            if c not in clients:
                self.rejected.setdefault(c, ClientRejected(c, why))
        self.accepted = tuple(c for c in self.accepted if c in clients)

    def add_noise(self, noise: np.ndarray) -> None:
        """Add this aggregator's own noise (field elements, drawn by it) to its share of the
        sum, before that share leaves it or meets the other's (CentralDP in shares)."""
        self._need("sum")
        noise = np.asarray(noise, dtype=np.uint64)
        if noise.shape != (self.params.dim,):
            raise ValueError(f"noise of shape {noise.shape}, expected ({self.params.dim},)")
        self._noise = noise if self._noise is None else F.add(self._noise, noise)

    def _share_sum(self) -> np.ndarray:
        total = np.zeros(self.params.dim, dtype=np.uint64)
        for c in self.accepted:
            total = F.add(total, self._x[c])
        return total if self._noise is None else F.add(total, self._noise)

    def sum_message(self) -> bytes:
        """B's share of the sum over the accepted clients, for A."""
        self._need("sum")
        ids = b"".join(_ID.pack(c) for c in self.accepted)
        return (W.Header(W.SUM, self.run_id, self.round, W.NO_CLIENT, 1 - self.role).pack()
                + _ID.pack(len(self.accepted)) + ids + W.pack_elements(self._share_sum()))

    def finish(self, other_sum: bytes) -> np.ndarray:
        """A: the sum (field elements) over the accepted clients."""
        self._need("sum")
        try:
            body = W.parse(other_sum, kind=W.SUM, run_id=self.run_id, round=self.round,
                           client=W.NO_CLIENT, role=self.role, blame=-1)
        except ClientRejected as err:
            raise CoinError(f"aggregator {1 - self.role}: {err.reason}") from None
        n = _ID.unpack_from(body)[0] if len(body) >= 4 else -1
        ids = tuple(_ID.unpack_from(body, 4 + 4 * i)[0] for i in range(max(n, 0)))
        if ids != self.accepted:
            raise CoinError("the aggregators disagree on the accepted clients")
        share = W.unpack_elements(body[4 + 4 * n:], self.params.dim, -1, "sum share")
        self._stage = "done"
        return F.add(self._share_sum(), share)
