"""ValidatedSum's cryptographic core: two aggregators verify each client's L2-bound proof on
shares, drop the clients that fail and add up the rest.

Each integrity test has a negative control: the same scenario against aggregators built
with that check switched off (the test-only ``checks`` switch) must break the property, so
the test is shown to depend on the check.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from secagg.errors import ProtocolError
from secagg.validated_sum import field as F
from secagg.validated_sum import proof as proofs
from secagg.validated_sum import wire as W
from secagg.validated_sum.aggregator import ALL_CHECKS
from secagg.validated_sum.errors import (
    BoundExceeded,
    MalformedShare,
    ProofRejected,
    ReplayedShare,
)
from secagg.validated_sum.protocol import run_round

DIM = 48
BOUND = 1.0
PARAMS = proofs.Params(DIM, BOUND)


def _randbytes(seed: int):
    """A reproducible seed source for the clients (the PRG itself is AES-CTR)."""
    state = {"n": 0}

    def draw(n: int) -> bytes:
        state["n"] += 1
        out = b""
        while len(out) < n:
            out += hashlib.sha256(f"{seed}|{state['n']}|{len(out)}".encode()).digest()
        return out[:n]
    return draw


def _updates(n: int, seed: int = 0, dim: int = DIM) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for c in range(n):
        v = rng.normal(size=dim)
        out[c] = v * (rng.uniform(0.2, 1.0) * BOUND / np.linalg.norm(v))
    return out


def _exact_sum(updates: dict[int, np.ndarray], clients, params=PARAMS) -> np.ndarray:
    ints = sum(proofs.encode(updates[c], params) for c in clients)
    return ints.astype(np.float64) / params.scale


def _run(updates, **kw):
    kw.setdefault("randbytes", _randbytes(1))
    return run_round(updates, PARAMS, run_id=bytes(16), **kw)


def test_parameters_meet_the_soundness_target():
    for dim in (1, DIM, 10_000, 100_000, 1_000_000):
        p = proofs.Params(dim, 2.5)
        assert p.soundness_log2() <= -40
        assert dim * 4 ** p.wbits <= 1 << 60  # no coordinate window can wrap the squares
        assert p.half >= proofs.ALPHA * p.units


@pytest.mark.parametrize("k", [1, 4])
def test_cheaters_rejected_and_honest_sum_exact(k):
    ups = _updates(20, seed=k)
    cheaters = {c: 100.0 for c in range(0, 20, 20 // k)[:k]}
    res = _run(ups, cheaters=cheaters)
    honest = sorted(set(ups) - set(cheaters))
    assert set(res.rejected) == set(cheaters)
    assert all(isinstance(e, ProofRejected) and e.client == c for c, e in res.rejected.items())
    assert res.accepted == tuple(honest)
    np.testing.assert_array_equal(res.total, _exact_sum(ups, honest))


def test_cheaters_get_through_without_the_proof_check():
    """Negative control: the same round with the proof check off accepts the cheaters and
    moves the sum by about 100 honest clients' worth."""
    ups = _updates(20, seed=4)
    cheaters = {0: 100.0, 5: 100.0}
    res = _run(ups, cheaters=cheaters, checks=ALL_CHECKS - {"proof"})
    assert not res.rejected and len(res.accepted) == 20
    honest = _exact_sum(ups, sorted(set(ups) - set(cheaters)))
    assert np.linalg.norm(res.total - honest) > 50 * BOUND


def test_update_at_the_bound_passes_and_1001x_fails():
    rng = np.random.default_rng(7)
    v = rng.normal(size=DIM)
    at_bound = v * (BOUND / np.linalg.norm(v))
    assert abs(np.linalg.norm(at_bound) - BOUND) < 1e-12
    ups = {0: at_bound, 1: at_bound.copy(), 2: at_bound * 0.5}
    res = _run(ups, cheaters={1: 1.001})
    assert res.accepted == (0, 2)
    assert isinstance(res.rejected[1], ProofRejected)
    np.testing.assert_array_equal(res.total, _exact_sum(ups, (0, 2)))
    # an honest client refuses outright to prove the 1.001x update
    from secagg.validated_sum.client import Client
    with pytest.raises(BoundExceeded):
        Client(1, PARAMS, bytes(16), 0).upload(at_bound * 1.001)
    # negative control
    off = _run(ups, cheaters={1: 1.001}, checks=ALL_CHECKS - {"proof"})
    assert 1 in off.accepted


def _verify(x: np.ndarray, u: np.ndarray, wrap: np.ndarray, params: proofs.Params,
            skip: frozenset[str] = frozenset()) -> str | None:
    """Share x and u at random, run both aggregators' checks, decide."""
    rng = np.random.default_rng(3)
    xa = rng.integers(0, F.P, x.shape[0], dtype=np.uint64)
    ua = rng.integers(0, F.P, u.shape[0], dtype=np.uint64)
    ch = proofs.challenge(b"k" * 32, b"t", params)
    xf = F.from_signed(x)
    sa = proofs.check_share(0, xa, ua, wrap, ch, params)
    sb = proofs.check_share(1, F.sub(xf, xa), F.sub(u, ua), wrap, ch, params)
    return proofs.decide(sa, sb, params, skip=skip)


def test_integer_boundary_exactly():
    """sum x^2 = B^2 passes; B^2 + 1 (the smallest violation) fails."""
    p = PARAMS
    wrap = proofs.wrap_vectors(b"w" * 32, b"t", p)
    x = np.zeros(DIM, dtype=np.int64)
    x[0] = p.units
    assert _verify(x, proofs.prove(x, wrap, p), wrap, p) is None
    x[1] = 1
    with pytest.raises(BoundExceeded):
        proofs.prove(x, wrap, p)
    assert _verify(x, proofs.prove(x, wrap, p, honest=False), wrap, p) is not None


def test_wraparound_cheater_rejected_only_by_the_wraparound_check():
    """A coordinate near sqrt(p) has a square that wraps to a small field value: the sum of
    squares and the norm range check both pass; only the wraparound projections catch it."""
    p = PARAMS
    wrap = proofs.wrap_vectors(b"w" * 32, b"t", p)
    x = np.zeros(DIM, dtype=np.int64)
    x[0] = math.isqrt(F.P) + 1
    wrapped = x[0] * x[0] % F.P
    assert wrapped <= p.units ** 2 < x[0] * x[0]
    u = proofs.prove(x, wrap, p, honest=False, claimed_norm=wrapped)
    assert _verify(x, u, wrap, p) == "a wraparound projection is outside its window"
    assert _verify(x, u, wrap, p, skip=frozenset({"wrap"})) is None  # negative control


def test_a_non_bit_in_the_norm_range_is_caught():
    """A client over the bound writes B^2 - N = -1 as the 'bit' p - 1 (every linear identity
    then holds, and FLP2 is computed honestly on that value): only the bits-are-bits check
    rejects it."""
    p = PARAMS
    wrap = proofs.wrap_vectors(b"w" * 32, b"t", p)
    x = np.zeros(DIM, dtype=np.int64)
    x[0], x[1] = p.units, 1  # N = B^2 + 1
    u = proofs.prove(x, wrap, p, honest=False, claimed_norm=p.units ** 2 + 1)
    s = p.slices()
    bits = u[s["bits"]].copy()
    nbits = p.norm_bits
    n = p.units ** 2 + 1
    bits[:nbits] = [(n >> j) & 1 for j in range(nbits)]
    bits[nbits:2 * nbits] = 0
    bits[nbits] = F.P - 1  # "bit" 0 of B^2 - N holds -1
    u = np.concatenate([u[:s["bits"].start], proofs.bits_proof(bits)])
    assert _verify(x, u, wrap, p) == "a shared bit is not 0 or 1"
    assert _verify(x, u, wrap, p, skip=frozenset({"bits"})) is None  # negative control


def _body(msg: bytes) -> bytes:
    return msg[W.HEADER_LEN + 2 * W.DIGEST_LEN:]


class _MaliciousClient:
    """Client ``who`` replaces the body it sends B (x or proof share) and keeps both
    messages' digests consistent, as a client -- not a network attacker -- can."""

    def __init__(self, who: int, kind: int, new_body) -> None:
        self.who, self.kind, self.new_body = who, kind, new_body

    def __call__(self, client: int, kind: int, msgs: tuple[bytes, bytes]):
        if client != self.who or kind != self.kind:
            return msgs
        body_a, body_b = _body(msgs[0]), self.new_body(_body(msgs[1]))
        dig = W.digest(body_a) + W.digest(body_b)
        h = W.HEADER_LEN
        return msgs[0][:h] + dig + body_a, msgs[1][:h] + dig + body_b


@pytest.mark.parametrize("what", ["value>=p", "truncated", "random-proof"])
def test_malformed_proof_rejected_naming_the_client(what):
    ups = _updates(6, seed=11)

    def new_body(body: bytes) -> bytes:
        v = np.frombuffer(body, dtype="<u8").copy()
        if what == "value>=p":
            v[3] = np.uint64(F.P)
        elif what == "truncated":
            return body[:-5]
        else:
            v = np.random.default_rng(5).integers(0, F.P, v.shape[0], dtype=np.uint64)
        return v.astype("<u8").tobytes()

    res = _run(ups, tamper=_MaliciousClient(2, W.SHARE_PROOF, new_body))
    assert set(res.rejected) == {2}
    err = res.rejected[2]
    assert err.client == 2 and "client 2" in str(err)
    expected = ProofRejected if what == "random-proof" else MalformedShare
    assert isinstance(err, expected), err
    assert res.accepted == (0, 1, 3, 4, 5)
    np.testing.assert_array_equal(res.total, _exact_sum(ups, res.accepted))
    if what == "random-proof":  # negative control: only the proof check stops it
        off = _run(ups, tamper=_MaliciousClient(2, W.SHARE_PROOF, new_body),
                   checks=ALL_CHECKS - {"proof"})
        assert 2 in off.accepted


def test_wrong_length_share_rejected_naming_the_client():
    ups = _updates(6, seed=12)
    hook = _MaliciousClient(3, W.SHARE_X, lambda body: body[:-8])  # d - 1 elements
    res = _run(ups, tamper=hook)
    assert isinstance(res.rejected.get(3), MalformedShare)
    assert "expected" in res.rejected[3].reason and res.rejected[3].client == 3
    assert res.accepted == (0, 1, 2, 4, 5)
    np.testing.assert_array_equal(res.total, _exact_sum(ups, res.accepted))
    # negative control: without the length check the short share is padded and summed
    off = _run(ups, tamper=_MaliciousClient(3, W.SHARE_X, lambda body: body[:-8]),
               checks=ALL_CHECKS - {"length", "proof"})
    assert 3 in off.accepted


def test_replayed_share_rejected_naming_the_client():
    ups = _updates(6, seed=13)
    old: dict[int, bytes] = {}

    def record(client, kind, msgs):
        if client == 4 and kind == W.SHARE_X:
            old[0] = msgs[1]
        return msgs
    _run(ups, round=0, tamper=record)

    def replay(client, kind, msgs):
        return (msgs[0], old[0]) if (client == 4 and kind == W.SHARE_X) else msgs
    res = _run(ups, round=1, tamper=replay)
    assert isinstance(res.rejected.get(4), ReplayedShare)
    assert res.rejected[4].client == 4 and "round 0" in str(res.rejected[4])
    assert res.accepted == (0, 1, 2, 3, 5)
    np.testing.assert_array_equal(res.total, _exact_sum(ups, res.accepted))
    # negative control: without the binding the replay is not recognised as one
    off = _run(ups, round=1, tamper=replay, checks=ALL_CHECKS - {"binding"})
    assert not isinstance(off.rejected.get(4), ReplayedShare)


def test_dropout_is_simply_absent():
    ups = _updates(8, seed=14)
    res = _run(ups, dropped={1: "upload", 6: "proof"})
    assert res.absent == (1, 6) and not res.rejected
    np.testing.assert_array_equal(res.total, _exact_sum(ups, res.accepted))


def _chi2_top_bits(values: np.ndarray, bits: int = 4) -> float:
    """Chi-square statistic of the top ``bits`` bits of 61-bit field elements."""
    bins = np.bincount((values >> np.uint64(61 - bits)).astype(np.int64), minlength=1 << bits)
    expected = values.shape[0] / (1 << bits)
    return float(np.sum((bins - expected) ** 2 / expected))


def test_one_aggregators_view_of_an_honest_client_is_uniform():
    """B's share of a highly structured update (all coordinates equal), and the FLP values
    it opens, look uniform; a share without the seed-expanded mask does not."""
    from secagg.validated_sum.client import Client
    params = proofs.Params(4000, BOUND)
    update = np.full(4000, BOUND / math.sqrt(4000) * 0.99)
    cl = Client(9, params, bytes(16), 0, randbytes=_randbytes(99))
    _, to_b = cl.upload(update)
    share_b = W.unpack_elements(_body(to_b), 4000, 9, "x")
    # 15 degrees of freedom: P(chi2 > 37.7) = 0.001
    assert _chi2_top_bits(share_b) < 37.7
    unmasked = F.from_signed(proofs.encode(update, params))
    assert _chi2_top_bits(unmasked) > 1000  # the statistic detects a share without a mask


def test_protocol_errors_are_rooted():
    assert issubclass(MalformedShare, ProtocolError)
    assert issubclass(ReplayedShare, ProtocolError)


def test_a_coin_opened_differently_from_its_commitment_stops_the_round():
    from secagg.secure_sum.errors import StageOrderError
    from secagg.validated_sum.aggregator import Aggregator
    from secagg.validated_sum.errors import CoinError

    a = Aggregator(0, PARAMS, bytes(16), 0)
    b = Aggregator(1, PARAMS, bytes(16), 0)
    com_a, com_b = a.coin_commit(), b.coin_commit()
    open_a, open_b = a.coin_open(), b.coin_open()
    forged = open_b[:-1] + bytes([open_b[-1] ^ 1])  # B changes its half after seeing A's
    with pytest.raises(CoinError):
        a.coin_finish(com_b, forged)
    b.coin_finish(com_a, open_a)
    with pytest.raises(StageOrderError):
        b.receive_upload(0, b"")  # the upload stage is over


def test_a_retransmitted_message_is_ignored_and_a_different_second_one_rejected():
    from secagg.validated_sum.aggregator import Aggregator
    from secagg.validated_sum.client import Client

    b = Aggregator(1, PARAMS, bytes(16), 0)
    first = Client(3, PARAMS, bytes(16), 0, randbytes=_randbytes(5)).upload(np.zeros(DIM))[1]
    b.receive_upload(3, first)
    b.receive_upload(3, first)  # the same bytes again: a retransmission
    assert b.live == (3,) and not b.rejected
    other = Client(3, PARAMS, bytes(16), 0, randbytes=_randbytes(6)).upload(np.zeros(DIM))[1]
    with pytest.raises(ReplayedShare):
        b.receive_upload(3, other)
    assert b.live == () and isinstance(b.rejected[3], ReplayedShare)
