"""Packing an upload into ciphertext slots, and the ciphertext wire format.

Packing: all additive fields of an upload are flattened, in spec order, into one vector
that is cut into ``ceil(total / slots)`` chunks, one ciphertext each; only the last
ciphertext has empty slots. So an upload of L values costs ceil(L / slots) ciphertexts
whatever its number of fields (no one-ciphertext-per-tensor waste).

Wire format of a ciphertext message (big-endian)::

    b"SHE"  version:u8  kind:u8  scheme:u8  fingerprint:16  crc32:u32
    n_values:u32  n_ct:u32  n_ct x length:u32  ciphertext bytes (TenSEAL serialization)

``fingerprint`` identifies the public context the ciphertexts were made under (BLAKE2b of
its serialization); ``crc32`` is the CRC-32 of the ciphertext bytes and catches
corruption in transit (it is not authentication: an active sender can recompute it, and
transport security is the deployment's job).
:func:`decode_message` checks every field and raises
:class:`~secagg.homomorphic.errors.CiphertextError` or
:class:`~secagg.homomorphic.errors.ForeignContextError`.
"""

from __future__ import annotations

import hashlib
import math
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from secagg.homomorphic.errors import CiphertextError, ForeignContextError
from secagg.messages import UploadSpec

MAGIC = b"SHE"
VERSION = 1
KIND_UPLOAD = 0
KIND_AGGREGATE = 1
SCHEMES = {"ckks": 1, "bfv": 2}
FINGERPRINT_BYTES = 16
_HEAD = struct.Struct(">3sBBB16sIII")


def fingerprint(public_context: bytes) -> bytes:
    """The 16-byte fingerprint of a serialized public context (BLAKE2b-128)."""
    return hashlib.blake2b(public_context, digest_size=FINGERPRINT_BYTES).digest()


def _checksum(parts: Sequence[bytes]) -> int:
    crc = 0
    for p in parts:
        crc = zlib.crc32(p, crc)
    return crc


@dataclass(frozen=True)
class Packing:
    """Where each additive field lives in the flat vector, and how it is cut.

    Attributes:
        names, shapes, offsets: per additive field, in spec order.
        total: number of values of one upload.
        slots: values per ciphertext.
    """

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    total: int
    slots: int

    @classmethod
    def from_spec(cls, spec: UploadSpec, slots: int) -> Packing:
        """The packing of ``spec``'s additive fields into ``slots``-value ciphertexts."""
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        names, shapes, offsets, pos = [], [], [], 0
        for f in spec.additive:
            names.append(f.name)
            shapes.append(f.shape)
            offsets.append(pos)
            pos += f.size
        return cls(tuple(names), tuple(shapes), tuple(offsets), pos, slots)

    @property
    def n_ciphertexts(self) -> int:
        """Ciphertexts per upload: ceil(total / slots)."""
        return math.ceil(self.total / self.slots)

    @property
    def utilisation(self) -> float:
        """Fraction of the slots that carry values (1.0 for an empty upload)."""
        n = self.n_ciphertexts
        return self.total / (n * self.slots) if n else 1.0

    def chunks(self) -> list[tuple[int, int]]:
        """(start, stop) of each ciphertext's values in the flat vector."""
        return [(a, min(a + self.slots, self.total)) for a in range(0, self.total, self.slots)]

    def flatten(self, values: Mapping[str, np.ndarray], dtype: type) -> np.ndarray:
        """Concatenate the fields (ravelled, spec order) into one ``dtype`` vector."""
        out = np.empty(self.total, dtype=dtype)
        for name, shape, off in zip(self.names, self.shapes, self.offsets, strict=True):
            size = int(np.prod(shape, dtype=np.int64))
            out[off:off + size] = np.asarray(values[name]).ravel()
        return out

    def unflatten(self, vec: np.ndarray) -> dict[str, np.ndarray]:
        """Inverse of :meth:`flatten`: field name -> array of its declared shape (views
        into ``vec``)."""
        if vec.shape != (self.total,):
            raise CiphertextError(f"decrypted {vec.shape[0]} values, expected {self.total}")
        out = {}
        for name, shape, off in zip(self.names, self.shapes, self.offsets, strict=True):
            size = int(np.prod(shape, dtype=np.int64))
            out[name] = vec[off:off + size].reshape(shape)
        return out


def encode_message(
    kind: int, scheme: str, fp: bytes, n_values: int, ciphertexts: Sequence[bytes]
) -> bytes:
    """Frame serialized ciphertexts into one message (see the module docstring)."""
    head = _HEAD.pack(MAGIC, VERSION, kind, SCHEMES[scheme], fp, _checksum(ciphertexts),
                      n_values, len(ciphertexts))
    lengths = struct.pack(f">{len(ciphertexts)}I", *(len(c) for c in ciphertexts))
    return b"".join([head, lengths, *ciphertexts])


def decode_message(
    data: bytes, kind: int, scheme: str, fp: bytes, packing: Packing
) -> list[bytes]:
    """Check a framed message against what the receiver expects and return the
    serialized ciphertexts (still to be loaded by TenSEAL).

    Raises:
        ForeignContextError: the message names another context (fingerprint) or scheme.
        CiphertextError: anything else malformed (magic, version, kind, counts, lengths,
            truncation, trailing bytes, checksum).
    """
    if not isinstance(data, bytes | bytearray):
        raise CiphertextError(f"a ciphertext message must be bytes, got {type(data).__name__}")
    if len(data) < _HEAD.size:
        raise CiphertextError(f"message of {len(data)} bytes is shorter than its header")
    magic, version, got_kind, got_scheme, got_fp, checksum, n_values, n_ct = _HEAD.unpack_from(
        data, 0)
    if magic != MAGIC:
        raise CiphertextError("not a homomorphic ciphertext message (bad magic)")
    if version != VERSION:
        raise CiphertextError(f"unsupported message version {version}")
    if got_kind != kind:
        raise CiphertextError(f"message kind {got_kind}, expected {kind}")
    if got_scheme != SCHEMES[scheme]:
        raise ForeignContextError(f"message made under scheme code {got_scheme}, not {scheme}")
    if got_fp != fp:
        raise ForeignContextError(
            "ciphertexts were made under another context (fingerprint "
            f"{got_fp.hex()[:12]}..., expected {fp.hex()[:12]}...)"
        )
    if n_values != packing.total:
        raise CiphertextError(f"message carries {n_values} values, expected {packing.total}")
    if n_ct != packing.n_ciphertexts:
        raise CiphertextError(f"message carries {n_ct} ciphertexts, expected "
                              f"{packing.n_ciphertexts}")
    pos = _HEAD.size + 4 * n_ct
    if len(data) < pos:
        raise CiphertextError("message truncated inside its length table")
    lengths = struct.unpack_from(f">{n_ct}I", data, _HEAD.size)
    if pos + sum(lengths) != len(data):
        raise CiphertextError(
            f"ciphertext lengths add up to {sum(lengths)} bytes but {len(data) - pos} follow"
        )
    if zlib.crc32(memoryview(data)[pos:]) != checksum:
        raise CiphertextError("ciphertext bytes corrupted (CRC-32 mismatch)")
    out = []
    for n in lengths:
        out.append(bytes(data[pos:pos + n]))
        pos += n
    return out
