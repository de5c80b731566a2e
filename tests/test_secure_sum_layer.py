"""The SecureSum layer: admissibility, exact decoding, ring sizing, wire cost, Federation."""

import math

import numpy as np
import pytest

from secagg.dropouts import ScheduledDropouts
from secagg.errors import EncodingOverflow, InadmissibleField, SecureSumAborted
from secagg.layers.base import RoundContext
from secagg.messages import Bound, Field, Upload, UploadSpec
from secagg.secure_sum import SecureSum
from secagg.secure_sum.wire import HEADER_BYTES


def _spec(m=6, max_records=50):
    return UploadSpec((
        Field("w", (2, m), "float64", bound=Bound(linf=2.0, adjacency="client"), additive=True),
        Field("h", (m,), "float32", bound=Bound(linf=1.0), additive=True),  # per record, 50 records max
        Field("count", (3,), "int64", bound=Bound(linf=1.0), additive=True),
    ), max_records=max_records)


def _uploads(spec, n, seed=0):
    rng = np.random.default_rng(seed)
    out = {}
    for c in range(n):
        recs = int(rng.integers(1, spec.max_records + 1))
        vals = {
            "w": rng.uniform(-2, 2, spec["w"].shape),
            "h": rng.uniform(-1, 1, spec["h"].shape).astype(np.float32) * recs,
            "count": rng.integers(0, recs + 1, 3),
        }
        out[c] = Upload.validate(spec, vals, c, recs)
    return out


def _ctx(schedule=None):
    return RoundContext(round=0, phase="stats", seed=0, dropouts=ScheduledDropouts(schedule or {}))


def test_non_additive_and_unbounded_fields_are_refused_with_the_reason():
    layer = SecureSum()
    emb = Field("embeddings", (4, 3), additive=False, bound=Bound(linf=1.0))
    with pytest.raises(InadmissibleField) as e:
        layer.check(UploadSpec((Field("w", (3,), bound=Bound(linf=1.0), additive=True), emb)))
    assert e.value.field == "embeddings" and e.value.layer == "secure-sum"
    assert "not additive" in e.value.reason
    with pytest.raises(InadmissibleField) as e:
        layer.check(UploadSpec((Field("w", (3,), additive=True),)))
    assert "bound" in e.value.reason
    layer.check(_spec())  # an admissible spec passes


@pytest.mark.parametrize("graph", ["complete", "harary"])
def test_decoded_sums_equal_the_plaintext_sums_of_the_quantised_inputs(graph):
    spec = _spec()
    ups = _uploads(spec, 9, seed=1)
    precision = 1e-7
    layer = SecureSum(threshold=0.6, graph=graph, k=4, precision=precision)
    agg = layer.aggregate(ups, spec, _ctx({"masked-input": {4}, "unmask": {0}}))
    assert agg.contributors == (0, 1, 2, 3, 5, 6, 7, 8)
    f = math.ceil(-math.log2(precision))  # fractional bits for the precision target
    for name in ("w", "h"):
        q = sum(np.rint(np.ldexp(ups[c][name].astype(np.float64), f)).astype(np.int64)
                for c in agg.contributors)
        want = np.ldexp(q.astype(np.float64), -f)
        assert agg[name].dtype == np.float64 and agg[name].shape == spec[name].shape
        assert np.array_equal(agg[name], want)  # bit-exact
        plain = sum(ups[c][name].astype(np.float64) for c in agg.contributors)
        assert np.max(np.abs(agg[name] - plain)) <= len(agg.contributors) * 2.0 ** -f
    want_counts = sum(ups[c]["count"] for c in agg.contributors)
    assert agg["count"].dtype == np.int64 and np.array_equal(agg["count"], want_counts)
    assert agg.values == {}


def test_ring_is_the_smallest_whole_number_of_bytes_and_the_wire_packs_it():
    m = 1000
    spec = UploadSpec((Field("x", (m,), "float32", bound=Bound(linf=1.0, adjacency="client"), additive=True),))
    rng = np.random.default_rng(2)
    ups = {c: Upload.validate(spec, {"x": rng.uniform(-1, 1, m)}, c, 1) for c in range(5)}
    # 16 fractional bits, |sum| <= 5: 2 + 16 + 3 bits -> a 24-bit ring, 3 bytes a value
    for precision, ring, width in ((2.0 ** -16, 24, 3), (1e-9, 40, 5), (2.0 ** -8, 16, 2)):
        ctx = _ctx()
        agg = SecureSum(threshold=3, precision=precision).aggregate(ups, spec, ctx)
        assert agg.notes["secure_sum"]["ring_bits"] == ring
        masked = [r.wire_bytes for r in ctx.ledger.rows
                  if r.stage == "masked-input" and r.receiver == "server" and r.wire_bytes > m]
        assert masked == [HEADER_BYTES + 5 + 64 + width * m] * 5  # 64: the signed tag
    # a cap below what the plan needs is refused, naming the field
    with pytest.raises(EncodingOverflow, match="'x'"):
        SecureSum(precision=1e-9, ring_bits=32).aggregate(ups, spec, _ctx())


def test_upload_bytes_per_client_within_ten_percent_of_float32_plaintext():
    m, n = 50_000, 8
    spec = UploadSpec((Field("x", (m,), "float32", bound=Bound(linf=1.0, adjacency="client"), additive=True),))
    base = np.random.default_rng(3).uniform(-1, 1, m).astype(np.float32)
    ups = {c: Upload.validate(spec, {"x": base}, c, 1) for c in range(n)}
    ctx = _ctx()
    agg = SecureSum(threshold=0.7, precision=2.0 ** -20).aggregate(ups, spec, ctx)
    assert agg.notes["secure_sum"]["ring_bits"] == 32
    up = sum(r.wire_bytes for r in ctx.ledger.rows if r.receiver == "server") / n
    assert 4 * m < up <= 1.1 * 4 * m
    assert np.allclose(agg["x"], n * base.astype(np.float64), atol=n * 2.0 ** -20)


def test_sum_encoded_returns_the_ring_sum_and_contributors():
    rng = np.random.default_rng(4)
    vecs = {c: rng.integers(0, 2**64, 7, dtype=np.uint64) for c in (3, 5, 8, 13)}
    total, contributors = SecureSum(threshold=3).sum_encoded(vecs, 64, _ctx({"share": {5}}))
    assert contributors == (3, 8, 13)
    assert total.dtype == np.uint64
    assert np.array_equal(total, vecs[3] + vecs[8] + vecs[13])  # numpy wraps mod 2^64
    with pytest.raises(SecureSumAborted) as e:
        SecureSum(threshold=4).sum_encoded(vecs, 64, _ctx({"share": {5}}))
    assert e.value.stage == "share"


def test_fedlog_on_digits_matches_plaintext_and_transcript_shows_masked_then_sum(digits_clients):
    from algorithms.fedlog import FedLog
    from secagg.federation import Federation
    from secagg.layers.plaintext import Plaintext

    plain = Federation(FedLog(), Plaintext(), digits_clients, rounds=1, seed=0).run()
    secure = Federation(FedLog(), SecureSum(threshold=0.7), digits_clients, rounds=1,
                        seed=0).run()
    assert abs(plain.accuracy - secure.accuracy) <= 1e-6
    obs = list(secure.transcript.observations())
    assert obs and all(o["form"] in ("masked", "clear") for o in obs)
    for fname in {o["field"] for o in obs}:
        forms = [(o["form"], o["what"]) for o in obs if o["field"] == fname]
        assert forms[-1] == ("clear", "sum") and forms.count(("clear", "sum")) == 1
        assert forms[:-1] == [("masked", "upload")] * len(digits_clients)
