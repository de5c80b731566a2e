"""Messages of the validated sum, as bytes.

Every message starts with a fixed header: magic ``VSUM``, version, kind, the run id (16
bytes), round (u32), client (u32, 0xFFFFFFFF for aggregator-to-aggregator messages) and the
receiving aggregator's role (u8: 0 = A, 1 = B). Field elements are little-endian u64 and
must be < p. A decoding problem raises :class:`MalformedShare` naming the client; a header
that names another run, round, client or aggregator raises :class:`ReplayedShare`.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

import numpy as np

from secagg.validated_sum import field as F
from secagg.validated_sum.errors import MalformedShare, ReplayedShare

MAGIC = b"VSUM"
VERSION = 1
NO_CLIENT = 0xFFFFFFFF
_HEADER = struct.Struct(">4sBB16sIIB")
HEADER_LEN = _HEADER.size

#: message kinds
SHARE_X = 1
CHALLENGE = 2
SHARE_PROOF = 3
COIN_COMMIT = 4
COIN_OPEN = 5
CHECK = 6
SUM = 7

SEED_LEN = 32
DIGEST_LEN = 32


@dataclass(frozen=True)
class Header:
    """The fixed header every message carries."""

    kind: int
    run_id: bytes
    round: int
    client: int
    role: int

    def pack(self) -> bytes:
        """The header's bytes."""
        return _HEADER.pack(MAGIC, VERSION, self.kind, self.run_id, self.round, self.client,
                            self.role)


def context(run_id: bytes, round: int, client: int, what: str) -> bytes:
    """The byte string every PRG expansion and challenge of one client is bound to."""
    return b"|".join([b"vsum", run_id.hex().encode(), str(round).encode(),
                      str(client).encode(), what.encode()])


def digest(body: bytes) -> bytes:
    """SHA-256 of a message body (the pieces the two aggregators compare)."""
    return hashlib.sha256(body).digest()


def parse(msg: bytes, *, kind: int, run_id: bytes, round: int, client: int, role: int,
          blame: int) -> bytes:
    """Check ``msg``'s header against what the receiver expects and return the body.

    ``blame`` is the client named by the errors."""
    if not isinstance(msg, (bytes, bytearray, memoryview)):
        raise MalformedShare(blame, "message is not bytes")
    msg = bytes(msg)
    if len(msg) < HEADER_LEN:
        raise MalformedShare(blame, f"message of {len(msg)} bytes is shorter than its header")
    magic, version, k, rid, rnd, cl, rl = _HEADER.unpack_from(msg)
    if magic != MAGIC or version != VERSION:
        raise MalformedShare(blame, "bad magic or version")
    if k != kind:
        raise MalformedShare(blame, f"message kind {k}, expected {kind}")
    if rid != run_id or rnd != round or cl != client or rl != role:
        raise ReplayedShare(
            blame, f"message names run {rid.hex()[:8]}, round {rnd}, client {cl}, "
            f"aggregator {rl}; expected run {run_id.hex()[:8]}, round {round}, "
            f"client {client}, aggregator {role}")
    return msg[HEADER_LEN:]


def pack_elements(v: np.ndarray) -> bytes:
    """Field elements as little-endian u64."""
    return np.asarray(v, dtype="<u8").tobytes()


def unpack_elements(body: bytes, n: int, blame: int, what: str) -> np.ndarray:
    """Exactly ``n`` canonical field elements from ``body``, else :class:`MalformedShare`."""
    if len(body) != 8 * n:
        raise MalformedShare(blame, f"{what} has {len(body)} bytes, expected {8 * n} "
                             f"({n} field elements)")
    v = np.frombuffer(body, dtype="<u8").astype(np.uint64)
    if np.any(v >= np.uint64(F.P)):
        raise MalformedShare(blame, f"{what} holds a value >= p")
    return v
