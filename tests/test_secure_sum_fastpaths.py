"""The secure-sum fast paths give the same bits as the plain ones (issue 35).

* :func:`secagg.secure_sum.prg.add_masks` (every mask over cache-sized blocks) against one
  :class:`~secagg.secure_sum.prg.MaskAccumulator` pass per mask.
* The float32 route of :class:`~secagg.encoding.FixedPoint` against the float64 arithmetic
  it replaces, at rounding ties, at the bound, past it and on non-finite values.
* A client's one-pass masked input still refuses an entry outside the ring in any block.
"""

import numpy as np
import pytest

from secagg.encoding import FixedPoint
from secagg.errors import EncodingOverflow
from secagg.secure_sum import prg
from secagg.secure_sum.prg import MaskAccumulator, SeededEntropy, add_masks


@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
@pytest.mark.parametrize("n", [0, 1, 7, 1000, 5000])
@pytest.mark.parametrize("count", [0, 1, 5])
def test_add_masks_equals_one_pass_per_mask(monkeypatch, dtype, n, count):
    monkeypatch.setattr(prg, "_OPEN", 2)  # several groups of open ciphers
    rand = SeededEntropy(n, f"{count}")
    masks = [(rand(32), sign) for sign in (1, -1, -1, 1, 1)[:count]]
    base = np.frombuffer(rand(n * np.dtype(dtype).itemsize), dtype=dtype).copy()
    want = base.copy()
    acc = MaskAccumulator(want)
    for key, sign in masks:
        acc.add(key, sign)
    got = base.copy()
    seen: list[tuple[str, int, int]] = []
    add_masks(got, masks, chunk=333,
              before=lambda lo, hi, b: seen.append(("before", lo, hi)),
              after=lambda lo, hi, b: seen.append(("after", lo, hi)))
    assert np.array_equal(got, want)
    blocks = [(lo, min(n, lo + 333)) for lo in range(0, n, 333)]
    assert [s[1:] for s in seen if s[0] == "before"] == blocks
    assert [s[1:] for s in seen if s[0] == "after"] == blocks


def test_add_masks_refuses_bad_arguments():
    with pytest.raises(ValueError):
        add_masks(np.zeros(4, np.int32), [])
    with pytest.raises(ValueError):
        add_masks(np.zeros(4, np.uint32), [(b"short", 1)])


def _float64_reference(fp: FixedPoint, x: np.ndarray) -> np.ndarray:
    q = np.rint(np.ldexp(x.astype(np.float64), fp.scale_bits)).astype(np.int64)
    return q.view(np.uint64) & np.uint64((1 << fp.ring_bits) - 1)


@pytest.mark.parametrize("ring_bits", [24, 32, 40])
def test_float32_encoding_is_bit_identical(ring_bits):
    fp = FixedPoint("w", 20, ring_bits, 1.0, 8)
    x = np.random.default_rng(ring_bits).uniform(-1, 1, 20_000).astype(np.float32)
    ties = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5], np.float64) * 2.0 ** -20
    x[: ties.size] = ties.astype(np.float32)  # exact halves: round half to even
    x[6:10] = [1.0, -1.0, np.float32(1e-45), -np.float32(1e-45)]
    assert np.array_equal(fp.encode(x), _float64_reference(fp, x))
    assert np.array_equal(fp.to_int(x), np.rint(np.ldexp(x.astype(np.float64), 20)))
    assert np.array_equal(fp.encode(x.reshape(100, 200)), _float64_reference(fp, x))


@pytest.mark.parametrize("bad, words", [(1.01, "exceeds the bound"), (3e38, "exceeds the bound"),
                                        (np.inf, "non-finite"), (np.nan, "non-finite")])
def test_float32_encoding_refuses_as_before(bad, words):
    fp = FixedPoint("w", 20, 32, 1.0, 8)
    x = np.zeros(100, np.float32)
    x[57] = bad
    for method in (fp.encode, fp.to_int):
        with pytest.raises(EncodingOverflow, match=words):
            method(x)


@pytest.mark.parametrize("ring_bits", [20, 32, 40])
def test_masked_input_refuses_an_entry_outside_the_ring_in_a_later_block(monkeypatch, ring_bits):
    """The one-pass masking checks every block before masking it: an entry >= 2^k past the
    first block is refused, the client stays where it was, and the honest vector then masks
    to the exact sum."""
    from secagg.secure_sum.client import Client
    from secagg.secure_sum.graph import build
    from secagg.secure_sum.server import Server

    monkeypatch.setattr(prg, "CHUNK_WORDS", 64)
    n, m = 4, 1000
    session = SeededEntropy(1, "s")(16)
    server = Server(session, 1, build(list(range(n)), 3, "complete"), ring_bits, m)
    clients = {u: Client(u, session, 1, SeededEntropy(1, u)) for u in range(n)}
    for c in clients.values():
        server.receive_advertise(c.advertise())
    rosters = server.close_advertise()
    for u, c in clients.items():
        server.receive_shares(c.share_keys(rosters[u]))
    forwards = server.close_shares()
    for u, c in clients.items():
        server.receive_ack(c.receive_forward(forwards[u]))
    rng = np.random.default_rng(ring_bits)
    vecs = {u: rng.integers(0, 1 << ring_bits, m, dtype=np.uint64) for u in clients}
    bad = vecs[0].copy()
    bad[900] = 1 << ring_bits  # in the 15th block of 64
    with pytest.raises(EncodingOverflow):
        clients[0].masked_input(bad)
    with pytest.raises(EncodingOverflow):
        clients[0].masked_input(-vecs[0].astype(np.int64) - 1)
    assert clients[0].stage == "forwarded"
    for u, c in clients.items():
        server.receive_masked(c.masked_input(vecs[u]))
    for u, msg in server.close_masked().items():
        server.receive_signature(clients[u].sign_survivors(msg))
    for u, msg in server.close_consistency().items():
        server.receive_unmask(clients[u].unmask(msg))
    total, contributors = server.finish()
    want = sum(v.astype(object) for v in vecs.values())
    assert contributors == tuple(range(n))
    assert [int(t) for t in total] == [int(w) % (1 << ring_bits) for w in want]


def _naive_lagrange(xs):
    from secagg.secure_sum.shamir import P

    out = []
    for i, xi in enumerate(xs):
        num = den = 1
        for j, xj in enumerate(xs):
            if j != i:
                num, den = num * xj % P, den * (xj - xi) % P
        out.append(num * pow(den, P - 2, P) % P)
    return tuple(out)


@pytest.mark.parametrize("big", [False, True])
def test_fast_lagrange_weights_equal_the_textbook_ones(big):
    """Small points (client ids) take the int64 route, others the modular loop."""
    import random

    from secagg.secure_sum import shamir

    rnd = random.Random(7)
    for h in (1, 2, 3, 4, 5, 30, 127):
        top = shamir.P - 1 if big else 10_001
        xs = tuple(sorted({rnd.randrange(1, top) for _ in range(h)}))
        assert shamir.lagrange_at_zero.__wrapped__(xs) == _naive_lagrange(xs)


def test_decode_at_secagg_plus_size_rebuilds_and_names_the_wrong_rows():
    """h = 113 holders (ids up to 10,000), t = 89: the shared weights give every secret, and a
    corrupted share is corrected and located, as before."""
    import random

    from secagg.secure_sum import shamir

    rnd = random.Random(3)
    xs = sorted(rnd.sample(range(1, 10_001), 113))
    secrets_ = [rnd.randrange(shamir.P) for _ in range(6)]
    shares = shamir.share(secrets_, 89, xs, SeededEntropy(3, "c"))
    values, errors = shamir.decode(xs, shares, 89, SeededEntropy(3, "d"))
    assert values == secrets_ and all(not e for e in errors)
    bad = shares.copy()
    bad[5, 2] = (bad[5, 2] + 1) % shamir.P
    bad[40, 2] = (bad[40, 2] + 9) % shamir.P
    values, errors = shamir.decode(xs, bad, 89, SeededEntropy(3, "e"))
    assert values == secrets_ and errors[2] == {5, 40} and not errors[0]


def test_secagg_plus_sizing_meets_its_bounds_and_is_minimal():
    from scipy.stats import hypergeom

    from secagg.errors import ConfigurationError
    from secagg.secure_sum.graph import secagg_plus_sizing

    n, drop = 1000, 0.1
    prev = 0
    for corrupt in (0.0, 0.05, 0.1):
        z = secagg_plus_sizing(n, drop, corrupt)
        k, t = z.k, z.share_threshold
        assert 2 * t > k + 1 and k % 2 == 0
        gone, bad = round(n * (drop + corrupt)), round(n * corrupt)
        assert n * hypergeom(n - 1, gone, k).sf(k + 1 - t) <= 2.0 ** -20
        if bad:
            assert n * hypergeom(n - 1, bad, k).sf(2 * t - k - 2) <= 2.0 ** -40
        # minimal: no t works at the next smaller even degree
        k2 = k - 2
        assert all(n * hypergeom(n - 1, gone, k2).sf(k2 + 1 - t2) > 2.0 ** -20
                   or (bad and n * hypergeom(n - 1, bad, k2).sf(2 * t2 - k2 - 2) > 2.0 ** -40)
                   for t2 in range(k2 // 2 + 1, k2 + 2))
        assert k >= prev  # more corrupt clients never need a smaller degree
        prev = k
    with pytest.raises(ConfigurationError):
        secagg_plus_sizing(30, 0.3, 0.3)
    with pytest.raises(ConfigurationError):
        secagg_plus_sizing(100, 0.6, 0.5)


def _textbook_share_digest(session, round, owner, holder, kind, elements):
    """The share digest as the statements module defined it before its raw-bytes path."""
    import hashlib
    import struct

    h = hashlib.sha256(b"secagg/secure-sum/v1|share-digest|" + session)
    h.update(struct.pack(">QIIB", round & (2**64 - 1), owner, holder, {"b": 0, "sk": 1}[kind]))
    h.update(b"".join(int(e).to_bytes(16, "little") for e in elements))
    return h.digest()


def test_share_digests_of_raw_bytes_equal_the_textbook_digest():
    from secagg.secure_sum import shamir
    from secagg.secure_sum.statements import (
        encode_share,
        share_digest,
        share_digest_raw,
        share_digests,
        share_digests_raw,
    )

    rand = SeededEntropy(3, "digests")
    for trial in range(20):
        b = shamir.random_elements(3, rand)
        sk = shamir.random_elements(3, rand)
        if trial == 0:
            b, sk = [0, 1, shamir.P - 1], [shamir.P - 1, 0, 0]  # the field's ends
        sess, rnd, owner, holder = rand(16), 2**64 - 1 - trial, trial, 0xFFFFFFFE - trial
        pt = encode_share(b, sk)
        for kind, els, raw in (("b", b, pt[:48]), ("sk", sk, pt[48:])):
            want = _textbook_share_digest(sess, rnd, owner, holder, kind, els)
            assert share_digest(sess, rnd, owner, holder, kind, els) == want
            assert share_digest_raw(sess, rnd, owner, holder, kind, raw) == want
        assert share_digests_raw(sess, rnd, owner, holder, pt) == \
            share_digests(sess, rnd, owner, holder, b, sk) == \
            _textbook_share_digest(sess, rnd, owner, holder, "b", b) + \
            _textbook_share_digest(sess, rnd, owner, holder, "sk", sk)
    with pytest.raises(ValueError):
        share_digest_raw(bytes(16), 0, 1, 2, "b", bytes(47))
    with pytest.raises(ValueError):
        share_digest_raw(bytes(16), 0, 1, 2, "x", bytes(48))
    with pytest.raises(ValueError):
        share_digests_raw(bytes(16), 0, 1, 2, bytes(95))


def _textbook_unmask_response(body):
    """The UNMASK_RESPONSE decoder as it read field by field before the one-slice path."""
    from secagg.secure_sum import wire
    from secagg.secure_sum.errors import MalformedMessage

    r = wire.Reader(body, "UNMASK_RESPONSE")
    out = []
    for _ in range(2):
        n = r.count(4 + 48)
        d = {}
        for _ in range(n):
            v = r.u32()
            if v in d or v > wire.MAX_ID:
                raise MalformedMessage("repeated or invalid id")
            els = []
            for _ in range(3):
                e = int.from_bytes(r.take(16), "little")
                if e >= (1 << 127) - 1:
                    raise MalformedMessage("outside the field")
                els.append(e)
            d[v] = els
        out.append(d)
    r.done()
    return out[0], out[1]


def test_unmask_response_parser_agrees_with_the_field_by_field_one():
    import struct

    from secagg.errors import ProtocolError
    from secagg.secure_sum import shamir, wire

    rand = SeededEntropy(4, "unmask")
    b = {v: shamir.random_elements(3, rand) for v in (0, 7, 9, wire.MAX_ID)}
    s = {v: shamir.random_elements(3, rand) for v in (1, 3)}
    good = wire.unmask_response_body(b, s)
    assert wire.parse_unmask_response(memoryview(good)) == (b, s) == \
        _textbook_unmask_response(memoryview(good))
    empty = wire.unmask_response_body({}, {})
    assert wire.parse_unmask_response(memoryview(empty)) == ({}, {})
    entry = 4 + 48
    bad = [
        good[:-1],  # truncated
        good + b"\x00",  # trailing byte
        good[:4] + good[4 + entry : 4 + 2 * entry] + good[4 + entry:],  # id 7 twice
        good[:4 + 3 * entry] + struct.pack(">I", wire.MAX_ID + 1) + good[8 + 3 * entry:],
        good[:8] + ((1 << 127) - 1).to_bytes(16, "little") + good[24:],  # p itself
        good[:8] + (2**128 - 1).to_bytes(16, "little") + good[24:],
        struct.pack(">I", 10**6) + good[4:],  # a count that does not fit
    ]
    for raw in bad:
        with pytest.raises(ProtocolError):
            _textbook_unmask_response(memoryview(raw))
        with pytest.raises(ProtocolError):
            wire.parse_unmask_response(memoryview(raw))


def test_one_parity_polynomial_for_many_holder_sets_checks_each_like_its_own():
    """Holder sets of different sizes sharing one ParityPolynomial (the server's finish):
    every codeword passes, every single wrong share is caught, corrected and located, and a
    column past the bound is refused -- as with a polynomial drawn per call. The shared
    values are the truncations of one polynomial, evaluated once per point."""
    import random

    from secagg.secure_sum import shamir

    rnd = random.Random(5)
    parity = shamir.ParityPolynomial(SeededEntropy(5, "g"))
    for trial in range(12):
        h, t = rnd.randrange(8, 40), 0
        t = rnd.randrange(2, h - 3)
        xs = sorted(rnd.sample(range(1, 200), h))  # points reused across the sets
        secrets_ = [rnd.randrange(shamir.P) for _ in range(3)]
        shares = shamir.share(secrets_, t, xs, SeededEntropy(trial, "s"))
        assert shamir.decode(xs, shares, t, parity=parity) == \
            (secrets_, [set(), set(), set()])
        bad = shares.copy()
        row = rnd.randrange(h)
        bad[row, 1] = (bad[row, 1] + 1 + rnd.randrange(shamir.P - 1)) % shamir.P
        values, errors = shamir.decode(xs, bad, t, parity=parity)
        assert values == secrets_ and errors == [set(), {row}, set()]
        worse = shares.copy()
        for r in rnd.sample(range(h), shamir.max_errors(h, t) + 1):
            worse[r, 0] = (worse[r, 0] + 1) % shamir.P
        with pytest.raises(shamir.DecodingError):
            shamir.decode(xs, worse, t, parity=parity)
    # the values kept per point are g's truncations: g_e(x) = sum_{j<e} g_j x^j mod p
    g = parity._coeffs
    for x in (1, 7, 199):
        for e in (0, 1, len(g)):
            assert parity.values([x], e) == [sum(c * pow(x, j, shamir.P)
                                                 for j, c in enumerate(g[:e])) % shamir.P]
