"""Fixed-point plans: exact sums of quantised inputs, refusal before overflow."""

import numpy as np
import pytest

from secagg.encoding import plan, plan_ring_bits
from secagg.errors import EncodingOverflow
from secagg.messages import Bound, Field, UploadSpec


def spec(bound=1.0, dtype="float64", max_records=1):
    return UploadSpec((Field("x", (50,), dtype, bound=Bound(linf=bound), additive=True),), max_records=max_records)


@pytest.mark.parametrize("ring_bits", [32, 48, 64])
def test_ring_sum_decodes_to_exact_sum_of_quantised(ring_bits):
    rng = np.random.default_rng(0)
    n = 20
    p = plan(spec(), n, precision=1e-6 if ring_bits == 32 else 1e-9, ring_bits=ring_bits)["x"]
    xs = rng.uniform(-1, 1, size=(n, 50))
    ring = np.zeros(50, np.uint64)
    for x in xs:
        ring = (ring + p.encode(x)) & np.uint64((1 << ring_bits) - 1 if ring_bits < 64 else 2**64 - 1)
    exact_int = sum(p.to_int(x).astype(object) for x in xs)  # Python ints: no overflow
    assert [int(v) for v in p.lift(ring)] == list(exact_int)
    np.testing.assert_allclose(p.decode_sum(ring), sum(p.quantise(x) for x in xs), rtol=0, atol=1e-12)
    assert np.max(np.abs(p.decode_sum(ring) - xs.sum(0))) <= n * p.step / 2 + 1e-12


@pytest.mark.parametrize("ring_bits", [2, 17, 33, 55, 63, 64])
def test_lift_is_the_centred_representative(ring_bits):
    """lift() against Python-int arithmetic, including every ring's edge values (63 bits
    once overflowed an int64 intermediate)."""
    from secagg.encoding import FixedPoint

    fp = FixedPoint("x", 10, ring_bits, 1.0, 1)
    rng = np.random.default_rng(ring_bits)
    k = ring_bits
    edges = [0, 1, 2 ** (k - 1) - 1, 2 ** (k - 1), 2**k - 1, 2**64 - 1]
    ring = np.concatenate([rng.integers(0, 2**64 - 1, 2000, dtype=np.uint64, endpoint=True),
                           np.array(edges, dtype=np.uint64)])
    want = []
    for v in ring.tolist():
        v &= 2**k - 1
        want.append(v - 2**k if v >= 2 ** (k - 1) else v)
    assert [int(v) for v in fp.lift(ring)] == want
    assert fp.decode_sum(ring).tolist() == [v / 2**10 for v in want]


def test_worst_case_cohort_does_not_wrap():
    n = 1000
    p = plan(spec(), n, precision=1e-6, ring_bits=32)["x"]
    x = np.ones(50)
    ring = np.zeros(50, np.uint64)
    for _ in range(n):
        ring = (ring + p.encode(x)) & np.uint64(2**32 - 1)
    np.testing.assert_array_equal(p.decode_sum(ring), n * p.quantise(x))
    ring = np.zeros(50, np.uint64)
    for _ in range(n):
        ring = (ring + p.encode(-x)) & np.uint64(2**32 - 1)
    np.testing.assert_array_equal(p.decode_sum(ring), -n * p.quantise(x))


def test_overflow_refused_with_field_and_bits():
    with pytest.raises(EncodingOverflow, match=r"'x'.*needs a \d+-bit ring"):
        plan(spec(bound=1e6), 10_000, precision=1e-9, ring_bits=64)
    # the same plan fits when the precision is loosened
    assert plan(spec(bound=1e6), 10_000, precision=1e-3)["x"].ring_bits == 64


def test_value_outside_planned_bound_refused():
    p = plan(spec(), 3)["x"]
    with pytest.raises(EncodingOverflow, match="exceeds the bound"):
        p.encode(np.full(50, 1.5))
    with pytest.raises(EncodingOverflow, match="non-finite"):
        p.encode(np.full(50, np.nan))


def test_integer_fields_exact_and_ring_bits_minimal():
    s = UploadSpec((Field("n", (1,), "int64", bound=Bound(linf=1.0), additive=True),), max_records=100)
    p = plan(s, 10)["n"]
    assert p.integer and p.scale_bits == 0
    assert int(p.decode_sum(p.encode(np.array([-37])))[0]) == -37
    # 10 clients x 100 records = 1000 -> 10 magnitude bits + sign
    assert plan_ring_bits({"n": p}) == 11


def test_plan_argument_errors():
    with pytest.raises(ValueError, match="no Bound"):
        plan(UploadSpec((Field("x", (2,), additive=True),)), 3)
    with pytest.raises(ValueError):
        plan(spec(), 0)
    with pytest.raises(ValueError):
        plan(spec(), 3, ring_bits=65)
    with pytest.raises(ValueError, match="unknown fields"):
        plan(spec(), 3, extra_bound={"y": 1.0})
