import numpy as np
import pytest

from secagg.wire import WireError, pack_arrays, unpack_arrays


def test_round_trip_all_dtypes():
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([1.5]),
              "c": np.array([-3], dtype=np.int64), "d": np.array([2**63], dtype=np.uint64)}
    out = unpack_arrays(pack_arrays(arrays))
    assert list(out) == list(arrays)
    for k in arrays:
        assert out[k].dtype == arrays[k].dtype
        np.testing.assert_array_equal(out[k], arrays[k])


@pytest.mark.parametrize("mutate,match", [
    (lambda b: b[:-1], "truncated"),
    (lambda b: b + b"\0", "trailing"),
    (lambda b: b"XXX" + b[3:], "magic"),
    (lambda b: b[:3] + b"\x09" + b[4:], "version"),
    (lambda b: b[:5], "magic|truncated"),
])
def test_malformed_messages_raise_typed_errors(mutate, match):
    data = pack_arrays({"w": np.ones(10)})
    with pytest.raises(WireError, match=match):
        unpack_arrays(mutate(data))


def _header(ndim: int, dims: tuple[int, ...], code: int = 2, name: bytes = b"w") -> bytes:
    """A crafted one-array message header (no data), in the layout of secagg.wire."""
    import struct

    from secagg.wire import MAGIC, VERSION

    return (MAGIC + bytes([VERSION]) + struct.pack(">H", 1) + struct.pack(">H", len(name))
            + name + struct.pack(">BB", code, ndim) + struct.pack(f">{ndim}I", *dims))


@pytest.mark.parametrize("dims", [
    (2**16, 2**16, 2**16, 2**15),        # product 2^63: wraps to 0 bytes in int64
    (2**32 - 1,) * 3,                    # product far beyond int64
    (0,) + (2**32 - 1,) * 3,             # zero-size but numpy refuses the shape
    (0,) + (2,) * 100,                   # more dimensions than numpy supports
])
def test_crafted_shape_raises_wire_error(dims):
    with pytest.raises(WireError, match="'w'"):
        unpack_arrays(_header(len(dims), dims))


def test_duplicate_array_name_raises_wire_error():
    one = pack_arrays({"w": np.ones(2)})
    body = one[6:]  # the array record after magic, version and count
    data = one[:4] + (2).to_bytes(2, "big") + body + body
    with pytest.raises(WireError, match="twice"):
        unpack_arrays(data)
