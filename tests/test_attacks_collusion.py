"""Server + colluding clients unmask a SecureSum input at the share threshold, not below."""

from __future__ import annotations

import numpy as np
import pytest

from secagg.layers.base import RoundContext
from secagg.secure_sum import wire
from secagg.secure_sum.client import Client
from secagg.secure_sum.prg import SeededEntropy
from secagg.secure_sum.protocol import run_secure_sum
from secagg.transcript import Transcript
from threat_models.attacks.collusion import unmask

SEED, N, T, BITS, TARGET = 7, 6, 4, 32, 5


@pytest.fixture(scope="module")
def session():
    rng = np.random.default_rng(0)
    vectors = {u: rng.integers(0, 2**BITS, size=16, dtype=np.uint64) for u in range(N)}
    inbox: dict[int, list[bytes]] = {}

    def capture(stage, sender, receiver, msg):
        if sender == "server":
            inbox.setdefault(receiver, []).append(msg)
        return msg

    ctx = RoundContext(0, "p", 0, transcript=Transcript(include_values=True))
    report = run_secure_sum(vectors, BITS, ctx, threshold=T, entropy_seed=SEED, tamper=capture)
    masked = next(np.asarray(r["values"], dtype=np.uint64) for r in ctx.transcript.observations()
                  if r["form"] == "masked" and r["sender"] == TARGET)
    return vectors, inbox, masked, report


def colluders_view(inbox, ids):
    """Each colluder replays its own session (its seeded randomness, the messages it got)."""
    sess = SeededEntropy(SEED, "session")(wire.SESSION_BYTES)
    shares, publics = {}, {}
    for u in ids:
        c = Client(u, sess, 0, SeededEntropy(SEED, u))
        c.advertise()
        c.share_keys(inbox[u][0])
        c.receive_forward(inbox[u][1])
        shares[u] = c._held[TARGET]
        publics.update({v: keys[1] for v, keys in c._roster.keys.items()})
        publics[u] = c._keys.mask_public
    return sess, shares, publics


def test_protocol_sum_is_right(session):
    vectors, _, masked, report = session
    assert report.graph.share_threshold == T
    want = sum(int(v[0]) for v in vectors.values()) % 2**BITS
    assert int(report.total[0]) == want
    assert not np.array_equal(masked, vectors[TARGET])   # the server alone sees noise


def test_at_threshold_the_coalition_unmasks_the_target(session):
    vectors, inbox, masked, _ = session
    sess, shares, publics = colluders_view(inbox, range(T))
    got = unmask(TARGET, masked, shares, publics, sess, 0, BITS)
    assert got is not None and np.array_equal(got, vectors[TARGET])


def test_below_threshold_it_fails(session):
    vectors, inbox, masked, _ = session
    sess, shares, publics = colluders_view(inbox, range(T - 1))
    assert unmask(TARGET, masked, shares, publics, sess, 0, BITS) is None
