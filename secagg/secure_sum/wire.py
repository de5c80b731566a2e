"""The secure-sum wire format: versioned, length-checked messages, one per protocol step.

Every message is a 32-byte header followed by a body (all integers big-endian)::

    magic "SS" | version u8 | type u8 | session 16 bytes | sender u32 | receiver u32 | body u32

The server's id is 0xFFFFFFFF. :func:`decode_header` checks magic, version, type, lengths,
the session (a message of another session is a replay) and the addressee; the body codecs
check every count against the remaining length and refuse trailing bytes. Each failure is a
typed :class:`~secagg.errors.ProtocolError` subclass from :mod:`secagg.secure_sum.errors`.

Bodies:

* ADVERTISE (client -> server): enc public key (32) | mask public key (32) | Ed25519 public
  key (32) | Ed25519 signature (64) of :func:`~secagg.secure_sum.keys.advertise_statement`
* ROSTER (server -> client): round u64 | ring_bits u8 | length u32 | t_k u32 | count u32 |
  count x (id u32 | enc pk 32 | mask pk 32 | signing pk 32 | ADVERTISE signature 64)
  -- the client's live neighbours
* SHARES (client -> server): commitment to b_u (32) | count u32 |
  count x (receiver u32 | AEAD ciphertext 112 | share digests 2 x 32 | Ed25519 signature 64
  of :func:`~secagg.secure_sum.keys.share_statement` over the ciphertext and the share
  digests | pair digest 32 of :func:`~secagg.secure_sum.keys.pair_digest`) -- the share
  digests are :func:`~secagg.secure_sum.client.share_digest` of the receiver's share of b_u,
  then of the mask key: the dealer's signed word on what it dealt (the receiver checks its
  share against them at FORWARD, the server each returned share at unmask)
* FORWARD (server -> client): count u32 | count x (sender u32 | AEAD ciphertext 112 |
  share digests 2 x 32 | the sender's signature 64)
* ACK (client -> server): count u32 | count x (sender u32 | kind u8 | share key 32 |
  commitment 32) -- complaints: kind 0, the sender's signed share failed AEAD or contradicts
  its signed share digests, with the revealed key of that direction and the commitment to
  the reverse direction's key (the evidence the server checks, see
  :mod:`secagg.secure_sum.server`); kind 1, the share does
  not carry the sender's signature (key and commitment all zero: nothing is revealed). An
  ACK without complaints is 4 zero bytes
* MASKED (client -> server): ring_bits u8 | length u32 | tag 64 | length x ceil(ring_bits/8)
  bytes (little-endian ring elements, packed); tag = the sender's Ed25519 signature (the key
  it advertised with) over session, round, sender and SHA-256(packed bytes): the server checks
  it on receipt, so a vector altered in transit, or tagged for another round, is refused and
  its sender counts as dropped
* SURVIVORS (server -> client): count u32 | count x (id u32)  -- U3, the clients whose
  masked input the server holds (the consistency round)
* SIGNATURE (client -> server): Ed25519 signature (64) of
  :func:`~secagg.secure_sum.keys.survivors_statement` over the SURVIVORS it received
* UNMASK_REQUEST (server -> client): nb u32 | nb x id | ns u32 | ns x id | nsig u32 |
  nsig x (id u32 | signature 64)  -- peers whose self-mask share, resp. mask-key shares, are
  requested, and the consistency signatures the server collected
* UNMASK_RESPONSE (client -> server): nb u32 | nb x (id | 3 elements) | ns u32 |
  ns x (id | 3 elements); an element is 16 bytes
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from secagg.secure_sum.errors import (
    MalformedMessage,
    MisaddressedMessage,
    ReplayedMessage,
    TruncatedMessage,
)
from secagg.secure_sum.prg import word_dtype
from secagg.secure_sum.shamir import CHUNKS_PER_KEY, ELEMENT_BYTES

MAGIC = b"SS"
VERSION = 4
SERVER_ID = 0xFFFFFFFF
SESSION_BYTES = 16
HEADER = struct.Struct(">2sBB16sIII")
HEADER_BYTES = HEADER.size
KEY_BYTES = 32
SIGNATURE_BYTES = 64
SHARE_PLAINTEXT_BYTES = ELEMENT_BYTES * CHUNKS_PER_KEY * 2
"""b_u as 3 elements and the mask private key as 3 elements (6 x 16 bytes)."""
TAG_BYTES = 16
SHARE_CIPHERTEXT_BYTES = SHARE_PLAINTEXT_BYTES + TAG_BYTES
MAX_ID = SERVER_ID - 1
COMMITMENT_BYTES = 32
MASKED_TAG_BYTES = SIGNATURE_BYTES  # the MASKED integrity tag: its sender's Ed25519 signature
TAG_HMAC_BYTES = MASKED_TAG_BYTES  # the former name (the tag was an HMAC)
SHARE_DIGEST_BYTES = 32
"""One share digest (SHA-256): the dealer's signed word on one secret's share it dealt."""
SIGNED_SHARE_BYTES = SHARE_CIPHERTEXT_BYTES + 2 * SHARE_DIGEST_BYTES
"""What a share's signature covers: the ciphertext, then the digests of the b_u share and of
the mask-key share."""
FORWARD_ENTRY_BYTES = SIGNED_SHARE_BYTES + SIGNATURE_BYTES
"""A forwarded share: the ciphertext, the share digests and its sender's signature."""
SHARES_ENTRY_BYTES = FORWARD_ENTRY_BYTES + COMMITMENT_BYTES
"""A sent share: the ciphertext, the share digests, its signature and the pair digest."""
COMPLAINT_BYTES = 4 + 1 + 2 * KEY_BYTES
COMPLAINT_KEY = 0
"""A complaint that the share does not decrypt: it carries the revealed key and commitment."""
COMPLAINT_SIGNATURE = 1
"""A complaint that the share does not carry its sender's signature: no key is revealed."""


class MsgType(IntEnum):
    """Message types, in protocol order."""

    ADVERTISE = 1
    ROSTER = 2
    SHARES = 3
    FORWARD = 4
    ACK = 5
    MASKED = 6
    UNMASK_REQUEST = 7
    UNMASK_RESPONSE = 8
    SURVIVORS = 9
    SIGNATURE = 10


@dataclass(frozen=True)
class Header:
    """A decoded message header."""

    type: MsgType
    session: bytes
    sender: int
    receiver: int
    body_len: int


def encode(
    mtype: MsgType,
    session: bytes,
    sender: int,
    receiver: int,
    body: bytes | memoryview | list[bytes | memoryview],
) -> bytes:
    """Frame ``body`` (bytes, or a list of bytes-like parts joined with one copy) with a
    header."""
    if len(session) != SESSION_BYTES:
        raise ValueError("session ids are 16 bytes")
    parts = body if isinstance(body, list) else [body]
    size = sum(memoryview(p).nbytes for p in parts)
    head = HEADER.pack(MAGIC, VERSION, int(mtype), session, sender, receiver, size)
    return b"".join([head, *parts])


def decode_header(
    data: bytes,
    expect: MsgType,
    session: bytes,
    receiver: int,
    sender: int | None = None,
) -> tuple[Header, memoryview]:
    """Check and split a message.

    Args:
        data: the raw message.
        expect: the message type the caller is waiting for.
        session: the caller's session id (another session's message is a replay).
        receiver: the caller's id (a message for someone else is misaddressed).
        sender: the expected sender, if the caller knows it.

    Returns:
        The header and a view of the body.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise MalformedMessage(f"a message is bytes, got {type(data).__name__}")
    mv = memoryview(data)
    if len(mv) < HEADER_BYTES:
        raise TruncatedMessage(f"message of {len(mv)} bytes is shorter than its header")
    magic, version, mtype, sess, snd, rcv, blen = HEADER.unpack(mv[:HEADER_BYTES])
    if magic != MAGIC:
        raise MalformedMessage("not a secure-sum message (bad magic)")
    if version != VERSION:
        raise MalformedMessage(f"unsupported secure-sum wire version {version}")
    try:
        mt = MsgType(mtype)
    except ValueError:
        raise MalformedMessage(f"unknown message type {mtype}") from None
    if len(mv) < HEADER_BYTES + blen:
        raise TruncatedMessage(
            f"{mt.name}: body has {len(mv) - HEADER_BYTES} of its {blen} declared bytes"
        )
    if len(mv) > HEADER_BYTES + blen:
        raise MalformedMessage(f"{mt.name}: {len(mv) - HEADER_BYTES - blen} trailing bytes")
    if sess != session:
        raise ReplayedMessage(f"{mt.name} from {snd} belongs to another session")
    if mt != expect:
        raise MalformedMessage(f"expected a {expect.name} message, got {mt.name}")
    if rcv != receiver:
        raise MisaddressedMessage(f"{mt.name} from {snd} is addressed to {rcv}, not {receiver}")
    if sender is not None and snd != sender:
        raise MisaddressedMessage(f"{mt.name} claims sender {snd}, expected {sender}")
    return Header(mt, sess, snd, rcv, blen), mv[HEADER_BYTES:]


class Reader:
    """Sequential, bounds-checked reads from a message body."""

    def __init__(self, body: memoryview, what: str) -> None:
        self.body = body
        self.pos = 0
        self.what = what

    def take(self, n: int) -> memoryview:
        """The next n bytes."""
        if n < 0 or self.pos + n > len(self.body):
            raise TruncatedMessage(f"{self.what}: body ends before its declared content")
        out = self.body[self.pos : self.pos + n]
        self.pos += n
        return out

    def u8(self) -> int:
        """One unsigned byte."""
        return self.take(1)[0]

    def u32(self) -> int:
        """One big-endian u32."""
        return struct.unpack(">I", self.take(4))[0]

    def u64(self) -> int:
        """One big-endian u64."""
        return struct.unpack(">Q", self.take(8))[0]

    def count(self, item_bytes: int) -> int:
        """A u32 count whose items (item_bytes each) must fit the rest of the body."""
        n = self.u32()
        if n * item_bytes > len(self.body) - self.pos:
            raise TruncatedMessage(f"{self.what}: {n} entries do not fit the body")
        return n

    def done(self) -> None:
        """Refuse trailing bytes."""
        if self.pos != len(self.body):
            raise MalformedMessage(f"{self.what}: {len(self.body) - self.pos} unexpected bytes")


def _ids(raw: memoryview, n: int, what: str) -> list[int]:
    ids = list(struct.unpack(f">{n}I", raw))
    if len(set(ids)) != n:
        raise MalformedMessage(f"{what}: repeated id")
    if any(i > MAX_ID for i in ids):
        raise MalformedMessage(f"{what}: invalid client id")
    return ids


# ---------------------------------------------------------------- bodies


def advertise_body(enc_pk: bytes, mask_pk: bytes, sign_pk: bytes, signature: bytes) -> bytes:
    """ADVERTISE body."""
    if len(sign_pk) != KEY_BYTES or len(signature) != SIGNATURE_BYTES:
        raise ValueError("Ed25519 keys are 32 bytes and signatures 64")
    return enc_pk + mask_pk + sign_pk + signature


def parse_advertise(body: memoryview) -> tuple[bytes, bytes, bytes, bytes]:
    """(enc public key, mask public key, signing public key, signature)."""
    r = Reader(body, "ADVERTISE")
    enc, msk = bytes(r.take(KEY_BYTES)), bytes(r.take(KEY_BYTES))
    spk, sig = bytes(r.take(KEY_BYTES)), bytes(r.take(SIGNATURE_BYTES))
    r.done()
    return enc, msk, spk, sig


@dataclass(frozen=True)
class Roster:
    """What a client learns at the share-keys stage."""

    round: int
    ring_bits: int
    length: int
    share_threshold: int
    keys: dict[int, tuple[bytes, bytes]]
    signing: dict[int, tuple[bytes, bytes]]
    """neighbour -> (its Ed25519 public key, its signature over its ADVERTISE keys)"""


def roster_body(
    round: int,
    ring_bits: int,
    length: int,
    tk: int,
    keys: dict[int, tuple[bytes, bytes]],
    signing: dict[int, tuple[bytes, bytes]],
) -> bytes:
    """ROSTER body: ``keys`` (enc, mask) and ``signing`` (public key, ADVERTISE signature)
    per neighbour."""
    parts = [struct.pack(">QBIII", round & (2**64 - 1), ring_bits, length, tk, len(keys))]
    for v in sorted(keys):
        parts.append(struct.pack(">I", v) + keys[v][0] + keys[v][1] + signing[v][0]
                     + signing[v][1])
    return b"".join(parts)


def parse_roster(body: memoryview) -> Roster:
    """Decode a ROSTER body."""
    r = Reader(body, "ROSTER")
    rnd, rb, length, tk = r.u64(), r.u8(), r.u32(), r.u32()
    if not 1 <= rb <= 64:
        raise MalformedMessage(f"ROSTER: ring_bits {rb} outside 1..64")
    n = r.count(4 + 3 * KEY_BYTES + SIGNATURE_BYTES)
    keys: dict[int, tuple[bytes, bytes]] = {}
    signing: dict[int, tuple[bytes, bytes]] = {}
    for _ in range(n):
        v = r.u32()
        if v in keys or v > MAX_ID:
            raise MalformedMessage("ROSTER: repeated or invalid client id")
        keys[v] = (bytes(r.take(KEY_BYTES)), bytes(r.take(KEY_BYTES)))
        signing[v] = (bytes(r.take(KEY_BYTES)), bytes(r.take(SIGNATURE_BYTES)))
    r.done()
    return Roster(rnd, rb, length, tk, keys, signing)


def ciphertexts_body(entries: dict[int, bytes], entry_bytes: int = FORWARD_ENTRY_BYTES) -> bytes:
    """SHARES / FORWARD entries: peer id -> fixed-length entry (see the module docstring)."""
    parts = [struct.pack(">I", len(entries))]
    for v in sorted(entries):
        ct = entries[v]
        if len(ct) != entry_bytes:
            raise ValueError(f"share entries are {entry_bytes} bytes, got {len(ct)}")
        parts += (struct.pack(">I", v), ct)
    return b"".join(parts)


def shares_body(commitment: bytes, entries: dict[int, bytes]) -> bytes:
    """SHARES body: the commitment to b_u, then the entries (ciphertext | share digests |
    signature | pair digest)."""
    if len(commitment) != COMMITMENT_BYTES:
        raise ValueError("commitments are 32 bytes")
    return commitment + ciphertexts_body(entries, SHARES_ENTRY_BYTES)


def parse_shares(body: memoryview) -> tuple[bytes, dict[int, bytes]]:
    """Decode a SHARES body into (commitment, receiver -> entry)."""
    if len(body) < COMMITMENT_BYTES:
        raise TruncatedMessage("SHARES: body shorter than its commitment")
    return bytes(body[:COMMITMENT_BYTES]), parse_ciphertexts(body[COMMITMENT_BYTES:], "SHARES",
                                                             SHARES_ENTRY_BYTES)


def parse_ciphertexts(body: memoryview, what: str,
                      entry_bytes: int = FORWARD_ENTRY_BYTES) -> dict[int, bytes]:
    """Decode a FORWARD body (or the entries of a SHARES body)."""
    r = Reader(body, what)
    n = r.count(4 + entry_bytes)
    item = 4 + entry_bytes
    raw = bytes(r.take(n * item))
    ids = struct.unpack(f">{n}I", b"".join(raw[j : j + 4] for j in range(0, len(raw), item)))
    out = {v: raw[j * item + 4 : (j + 1) * item] for j, v in enumerate(ids)}
    if len(out) != n or (n and max(ids) > MAX_ID):
        seen: set[int] = set()
        for v in ids:  # the first bad entry names the error
            if v in seen:
                raise ReplayedMessage(f"{what}: two entries for peer {v}")
            if v > MAX_ID:
                raise MalformedMessage(f"{what}: invalid client id")
            seen.add(v)
    r.done()
    return out


def complaints_body(complaints: dict[int, tuple[bytes, bytes]]) -> bytes:
    """ACK body: sender -> (the revealed key of sender -> this client, the commitment to the
    key of this client -> sender), or (b"", b"") for a share without its sender's signature.
    No complaints: the 4-byte zero count."""
    parts = [struct.pack(">I", len(complaints))]
    for v in sorted(complaints):
        key, commit = complaints[v]
        if key == commit == b"":
            parts.append(struct.pack(">IB", v, COMPLAINT_SIGNATURE) + bytes(2 * KEY_BYTES))
            continue
        if len(key) != KEY_BYTES or len(commit) != KEY_BYTES:
            raise ValueError("complaint keys and commitments are 32 bytes")
        parts.append(struct.pack(">IB", v, COMPLAINT_KEY) + key + commit)
    return b"".join(parts)


def parse_complaints(body: memoryview) -> dict[int, tuple[bytes, bytes]]:
    """Decode an ACK body into sender -> (revealed key, commitment), (b"", b"") for a
    signature complaint."""
    r = Reader(body, "ACK")
    n = r.count(COMPLAINT_BYTES)
    out: dict[int, tuple[bytes, bytes]] = {}
    for _ in range(n):
        v = r.u32()
        if v in out:
            raise ReplayedMessage(f"ACK: two complaints about client {v}")
        if v > MAX_ID:
            raise MalformedMessage("ACK: invalid client id")
        kind = r.u8()
        key, commit = bytes(r.take(KEY_BYTES)), bytes(r.take(KEY_BYTES))
        if kind == COMPLAINT_SIGNATURE:
            if any(key) or any(commit):
                raise MalformedMessage("ACK: a signature complaint reveals no key")
            key = commit = b""
        elif kind != COMPLAINT_KEY:
            raise MalformedMessage(f"ACK: unknown complaint kind {kind}")
        out[v] = (key, commit)
    r.done()
    return out


def ids_body(ids: list[int] | tuple[int, ...] | set[int]) -> bytes:
    """A u32 count and ids (SURVIVORS body)."""
    s = sorted(ids)
    return struct.pack(f">I{len(s)}I", len(s), *s)


def parse_ids(body: memoryview, what: str) -> list[int]:
    """Decode a list of ids (a SURVIVORS body)."""
    r = Reader(body, what)
    n = r.count(4)
    ids = _ids(r.take(4 * n), n, what)
    r.done()
    return ids


def packed_width(ring_bits: int) -> int:
    """Bytes per ring element on the wire: ceil(ring_bits / 8)."""
    return (ring_bits + 7) // 8


def pack_ring(vec: np.ndarray, ring_bits: int) -> bytes | memoryview:
    """Ring elements (words already reduced mod 2^ring_bits) packed little-endian at
    ceil(ring_bits / 8) bytes each (a zero-copy view when that is the word size)."""
    w = packed_width(ring_bits)
    wd = word_dtype(ring_bits)
    arr = np.ascontiguousarray(vec, dtype=wd)
    if w == wd.itemsize:
        return memoryview(arr).cast("B")
    return arr.view(np.uint8).reshape(-1, wd.itemsize)[:, :w].tobytes()


def masked_parts(
    ring_bits: int, length: int, tag: bytes, data: bytes | memoryview
) -> list[bytes | memoryview]:
    """MASKED body, as parts for :func:`encode`: ring_bits, length, the tag, the packed
    vector."""
    if len(tag) != MASKED_TAG_BYTES:
        raise ValueError(f"masked-input tags are {MASKED_TAG_BYTES} bytes")
    return [struct.pack(">BI", ring_bits, length), tag, data]


def parse_masked(
    body: memoryview, ring_bits: int, length: int
) -> tuple[bytes, memoryview, np.ndarray]:
    """Decode a MASKED body into (tag, the packed bytes, the vector as words -- a read-only
    view when no unpacking is needed)."""
    r = Reader(body, "MASKED")
    rb, n = r.u8(), r.u32()
    if rb != ring_bits or n != length:
        raise MalformedMessage(
            f"MASKED: vector of {n} elements mod 2^{rb}, expected {length} mod 2^{ring_bits}"
        )
    tag = bytes(r.take(MASKED_TAG_BYTES))
    w = packed_width(ring_bits)
    raw = r.take(w * n)
    r.done()
    wd = word_dtype(ring_bits)
    if w == wd.itemsize:
        out = np.frombuffer(raw, dtype=wd)
    else:
        full = np.zeros((n, wd.itemsize), dtype=np.uint8)
        full[:, :w] = np.frombuffer(raw, dtype=np.uint8).reshape(n, w)
        out = full.view(wd).reshape(n)
    if ring_bits % 8 and n and int(out.max()) >> ring_bits:
        raise MalformedMessage("MASKED: element outside the ring")
    return tag, raw, out


def unmask_request_body(
    b_ids: set[int] | list[int],
    sk_ids: set[int] | list[int],
    signatures: dict[int, bytes] | None = None,
) -> bytes:
    """UNMASK_REQUEST body: the requested peers and the consistency signatures (signer ->
    64-byte signature)."""
    b, s = sorted(b_ids), sorted(sk_ids)
    sigs = signatures or {}
    parts = [struct.pack(f">I{len(b)}I", len(b), *b), struct.pack(f">I{len(s)}I", len(s), *s),
             struct.pack(">I", len(sigs))]
    for v in sorted(sigs):
        if len(sigs[v]) != SIGNATURE_BYTES:
            raise ValueError("signatures are 64 bytes")
        parts.append(struct.pack(">I", v) + sigs[v])
    return b"".join(parts)


def parse_unmask_request(body: memoryview) -> tuple[list[int], list[int], dict[int, bytes]]:
    """(peers whose self-mask share is asked, peers whose mask-key shares are asked,
    signer -> consistency signature)."""
    r = Reader(body, "UNMASK_REQUEST")
    nb = r.count(4)
    b = _ids(r.take(4 * nb), nb, "UNMASK_REQUEST")
    ns = r.count(4)
    s = _ids(r.take(4 * ns), ns, "UNMASK_REQUEST")
    n = r.count(4 + SIGNATURE_BYTES)
    sigs: dict[int, bytes] = {}
    for _ in range(n):
        v = r.u32()
        if v in sigs or v > MAX_ID:
            raise MalformedMessage("UNMASK_REQUEST: repeated or invalid signer id")
        sigs[v] = bytes(r.take(SIGNATURE_BYTES))
    r.done()
    return b, s, sigs


def parse_signature(body: memoryview) -> bytes:
    """Decode a SIGNATURE body (64 bytes)."""
    r = Reader(body, "SIGNATURE")
    sig = bytes(r.take(SIGNATURE_BYTES))
    r.done()
    return sig


_B_ITEM = 4 + ELEMENT_BYTES * CHUNKS_PER_KEY
_S_ITEM = 4 + ELEMENT_BYTES * CHUNKS_PER_KEY


def unmask_response_body(b: dict[int, list[int]], s: dict[int, list[int]]) -> bytes:
    """UNMASK_RESPONSE body: peer -> its share elements (3 each)."""
    parts = []
    for d in (b, s):
        parts.append(struct.pack(">I", len(d)))
        for v in sorted(d):
            raw = b"".join(int(e).to_bytes(ELEMENT_BYTES, "little") for e in d[v])
            parts.append(struct.pack(">I", v) + raw)
    return b"".join(parts)


def parse_unmask_response_raw(
    body: memoryview,
) -> tuple[dict[int, bytes], dict[int, bytes]]:
    """Decode an UNMASK_RESPONSE body into (self-mask shares, mask-key shares), each share as
    its 48 encoded bytes (3 elements, 16 bytes little-endian each; not range-checked here:
    :func:`share_elements` checks them). One slice per list instead of one read per field."""
    r = Reader(body, "UNMASK_RESPONSE")
    out: list[dict[int, bytes]] = []
    for item in (_B_ITEM, _S_ITEM):
        n = r.count(item)
        raw = bytes(r.take(n * item))
        ids = struct.unpack(f">{n}I", b"".join(raw[j : j + 4] for j in range(0, len(raw), item)))
        d = {v: raw[j * item + 4 : (j + 1) * item] for j, v in enumerate(ids)}
        if len(d) != n or (n and max(ids) > MAX_ID):
            raise MalformedMessage("UNMASK_RESPONSE: repeated or invalid id")
        out.append(d)
    r.done()
    return out[0], out[1]


def share_elements(raw: bytes) -> list[int]:
    """The 3 field elements of one share's 48 encoded bytes.

    Raises:
        MalformedMessage: an element is not below p = 2^127 - 1.
    """
    els = [int.from_bytes(raw[j : j + ELEMENT_BYTES], "little")
           for j in range(0, ELEMENT_BYTES * CHUNKS_PER_KEY, ELEMENT_BYTES)]
    if max(els) >= (1 << 127) - 1:
        raise MalformedMessage("UNMASK_RESPONSE: share outside the field")
    return els


def shares_elements(shares: dict[int, bytes]) -> dict[int, list[int]]:
    """:func:`share_elements` of every share of one response, in one pass over their bytes.

    Raises:
        MalformedMessage: an element is not below p = 2^127 - 1.
    """
    blob = b"".join(shares.values())
    els = [int.from_bytes(blob[j : j + ELEMENT_BYTES], "little")
           for j in range(0, len(blob), ELEMENT_BYTES)]
    if els and max(els) >= (1 << 127) - 1:
        raise MalformedMessage("UNMASK_RESPONSE: share outside the field")
    k = CHUNKS_PER_KEY
    return {v: els[k * i : k * i + k] for i, v in enumerate(shares)}


def parse_unmask_response(body: memoryview) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Decode an UNMASK_RESPONSE body into (self-mask shares, mask-key shares)."""
    b, s = parse_unmask_response_raw(body)
    return shares_elements(b), shares_elements(s)
