"""The client of the validated sum, as a byte-in/byte-out state machine.

Steps, in order:

1. :meth:`Client.upload` -- encodes its update in fixed point and splits it additively over
   F_p: aggregator A gets a fresh 256-bit seed, its share being the seed's AES-CTR expansion
   bound to (run, round, client, "x"); aggregator B gets x minus that share explicitly. Each
   message carries the digests of both bodies, which the aggregators later compare, so a
   piece replayed into another upload is caught.
2. :meth:`Client.respond` -- reads the aggregators' CHALLENGE (the wraparound coin, drawn
   after every upload of the round is fixed; both must send the same one), computes the
   proof vector of :mod:`.proof` and splits it the same way.

``honest=False`` (with ``scale_by``) is the attack hook of tests and demonstrations: the
client skips its clip, multiplies its update by ``scale_by`` and still sends the best proof
it can make (:func:`secagg.validated_sum.proof.prove`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable

import numpy as np

from secagg.secure_sum.errors import StageOrderError
from secagg.validated_sum import field as F
from secagg.validated_sum import proof as proofs
from secagg.validated_sum import wire as W
from secagg.validated_sum.errors import BoundExceeded, CoinError


class Client:
    """One client for one round of the validated sum."""

    def __init__(self, client_id: int, params: proofs.Params, run_id: bytes, round: int,
                 *, honest: bool = True, scale_by: float = 1.0,
                 randbytes: Callable[[int], bytes] = secrets.token_bytes) -> None:
        """``randbytes`` is where seeds come from (``secrets.token_bytes``; a test passes a
        seeded source for reproducibility)."""
        if len(run_id) != 16:
            raise ValueError("run_id is 16 bytes")
        self.id = int(client_id)
        self.params = params
        self.run_id = run_id
        self.round = int(round)
        self.honest = honest
        self.scale_by = float(scale_by)
        self._rand = randbytes
        self._x: np.ndarray | None = None
        self._stage = "new"

    def _ctx(self, what: str) -> bytes:
        return W.context(self.run_id, self.round, self.id, what)

    def _split(self, kind: int, values: np.ndarray, what: str) -> tuple[bytes, bytes]:
        seed = self._rand(W.SEED_LEN)
        share_a = F.expand(seed, self._ctx(what), values.shape[0])
        body_a = seed
        body_b = W.pack_elements(F.sub(values, share_a))
        dig = W.digest(body_a) + W.digest(body_b)
        head = [W.Header(kind, self.run_id, self.round, self.id, role).pack() for role in (0, 1)]
        return head[0] + dig + body_a, head[1] + dig + body_b

    def upload(self, update: np.ndarray) -> tuple[bytes, bytes]:
        """Step 1: the SHARE_X messages for aggregators A and B."""
        if self._stage != "new":
            raise StageOrderError(f"client {self.id}: upload after {self._stage}")
        v = np.asarray(update, dtype=np.float64) * self.scale_by
        if self.honest:
            x = proofs.encode(v, self.params)
            if proofs.squared_norm(x) > self.params.units ** 2:
                raise BoundExceeded(float(np.linalg.norm(v)), self.params.bound)
        else:  # a cheater encodes whatever it likes, modulo p
            x = np.trunc(np.asarray(v).reshape(-1) * self.params.scale).astype(np.int64)
        self._x = x
        self._stage = "uploaded"
        return self._split(W.SHARE_X, F.from_signed(x), "x")

    def respond(self, challenge_a: bytes, challenge_b: bytes) -> tuple[bytes, bytes]:
        """Step 2: read both aggregators' CHALLENGE, return the SHARE_PROOF messages."""
        if self._stage != "uploaded" or self._x is None:
            raise StageOrderError(f"client {self.id}: respond before upload")
        coins = []
        for role, msg in ((0, challenge_a), (1, challenge_b)):
            body = W.parse(msg, kind=W.CHALLENGE, run_id=self.run_id, round=self.round,
                           client=self.id, role=role, blame=self.id)
            if len(body) != W.SEED_LEN:
                raise CoinError(f"client {self.id}: challenge of {len(body)} bytes")
            coins.append(body)
        if coins[0] != coins[1]:
            raise CoinError(f"client {self.id}: the aggregators sent different challenges")
        wrap = proofs.wrap_vectors(
            coins[0], W.context(self.run_id, self.round, W.NO_CLIENT, "wrap"), self.params)
        u = proofs.prove(self._x, wrap, self.params, honest=self.honest,
                         randbytes=self._rand)
        self._stage = "done"
        return self._split(W.SHARE_PROOF, u, "proof")
