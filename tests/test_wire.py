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
