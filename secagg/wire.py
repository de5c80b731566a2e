"""A small, versioned, length-checked wire format for named arrays.

Used for plaintext uploads and broadcasts, so that the ledger counts real bytes. Layout
(big-endian): magic ``b"SGW"``, version byte, u16 array count, then per array: u16 name
length, UTF-8 name, u8 dtype code, u8 ndim, ndim x u32 dims, the raw C-order data.
Decoding checks every length and raises :class:`WireError` on any mismatch.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from typing import TypeAlias

import numpy as np

from secagg.errors import ProtocolError

MAGIC = b"SGW"
VERSION = 1
_DTYPES = {1: np.dtype("<f4"), 2: np.dtype("<f8"), 3: np.dtype("<i8"), 4: np.dtype("<u8"),
           5: np.dtype("<u4"), 6: np.dtype("u1")}
_CODES = {v: k for k, v in _DTYPES.items()}


Message: TypeAlias = bytes | bytearray | Sequence[bytes]
"""A message as it crosses the wire: one buffer, or a sequence of frames sent back to back
(sized and digested as their concatenation)."""


def is_message(value: object) -> bool:
    """Whether ``value`` is a :data:`Message` (bytes, or a tuple/list of bytes frames)."""
    return isinstance(value, bytes | bytearray) or (
        isinstance(value, tuple | list) and all(isinstance(f, bytes | bytearray) for f in value))


def message_size(message: Message) -> int:
    """Bytes on the wire of a message: its length, or its frames' total length."""
    if isinstance(message, bytes | bytearray):
        return len(message)
    return sum(len(f) for f in message)


class WireError(ProtocolError):
    """A message could not be decoded (bad magic/version, truncated, trailing bytes...)."""


def pack_arrays(arrays: Mapping[str, np.ndarray]) -> bytes:
    """Serialize named arrays (float32/64, int64, uint64/32, uint8)."""
    parts = [MAGIC, bytes([VERSION]), struct.pack(">H", len(arrays))]
    for name, value in arrays.items():
        arr = np.ascontiguousarray(value).reshape(np.shape(value))
        dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        code = _CODES.get(np.dtype(dt.str.replace("=", "<")))
        if code is None:
            raise TypeError(f"array {name!r}: dtype {arr.dtype} not supported on the wire")
        raw = name.encode()
        parts.append(struct.pack(">H", len(raw)) + raw)
        parts.append(struct.pack(">BB", code, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape))
        parts.append(arr.astype(_DTYPES[code], copy=False).tobytes())
    return b"".join(parts)


def unpack_arrays(data: bytes) -> dict[str, np.ndarray]:
    """Inverse of :func:`pack_arrays`; raises :class:`WireError` on malformed input."""
    mv = memoryview(data)
    if len(mv) < 6 or bytes(mv[:3]) != MAGIC:
        raise WireError("not a secagg array message (bad magic)")
    if mv[3] != VERSION:
        raise WireError(f"unsupported wire version {mv[3]}")
    (count,) = struct.unpack(">H", mv[4:6])
    pos, out = 6, {}
    try:
        for _ in range(count):
            (n,) = struct.unpack(">H", mv[pos:pos + 2])
            pos += 2
            name = bytes(mv[pos:pos + n]).decode()
            if len(name.encode()) != n:
                raise WireError("truncated name")
            pos += n
            code, ndim = struct.unpack(">BB", mv[pos:pos + 2])
            pos += 2
            if code not in _DTYPES:
                raise WireError(f"array {name!r}: unknown dtype code {code}")
            shape = struct.unpack(f">{ndim}I", mv[pos:pos + 4 * ndim])
            pos += 4 * ndim
            dt = _DTYPES[code]
            if name in out:
                raise WireError(f"array {name!r} appears twice")
            size = math.prod(shape) * dt.itemsize  # Python ints: a crafted shape cannot wrap
            if pos + size > len(mv):
                raise WireError(f"array {name!r}: truncated ({len(mv) - pos} of {size} bytes)")
            try:
                out[name] = np.frombuffer(mv[pos:pos + size], dtype=dt).reshape(shape).copy()
            except ValueError as exc:  # e.g. more dimensions than numpy supports
                raise WireError(f"array {name!r}: shape {shape} is not valid ({exc})") from None
            pos += size
    except (struct.error, UnicodeDecodeError) as exc:
        raise WireError(f"truncated or malformed message ({exc})") from None
    if pos != len(mv):
        raise WireError(f"{len(mv) - pos} trailing bytes")
    return out
