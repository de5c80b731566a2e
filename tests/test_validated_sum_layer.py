"""The ValidatedSum layer in the embedded engine: what it returns, what it books, what each
aggregator is recorded as having seen."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from secagg.costs import SERVER
from secagg.dropouts import ScheduledDropouts
from secagg.errors import InadmissibleField
from secagg.layers.base import RoundContext
from secagg.messages import Bound, Field, Upload, UploadSpec
from secagg.validated_sum import proof as proofs
from secagg.validated_sum.layer import AGGREGATOR_B, ValidatedSum
from secagg.validated_sum.protocol import run_round

DIM = 40
SPEC = UploadSpec((Field("update", (DIM,), "float64", additive=True,
                         bound=Bound(l2=2.0, adjacency="client")),))


def _uploads(n: int) -> dict[int, Upload]:
    rng = np.random.default_rng(0)
    out = {}
    for c in range(n):
        v = rng.normal(size=DIM)
        out[c] = Upload({"update": v * (1.5 / np.linalg.norm(v))}, SPEC, c, 1)
    return out


def test_layer_rejects_cheaters_and_sums_the_rest():
    ups = _uploads(10)
    layer = ValidatedSum(cheaters=2)
    ctx = RoundContext(0, "train", 0,
                       dropouts=ScheduledDropouts({"proof": {5}, "share": {7}}))
    agg = layer.aggregate(ups, SPEC, ctx)
    assert set(agg.notes["rejected"]) == {0, 1}  # the first two live clients cheated
    assert agg.notes["absent"] == [5, 7]
    assert agg.contributors == (2, 3, 4, 6, 8, 9)
    params = proofs.Params(DIM, 2.0)  # the bound derived from the spec's client-level l2
    want = sum(proofs.encode(ups[c]["update"], params) for c in agg.contributors)
    np.testing.assert_array_equal(agg["update"], want / params.scale)
    # an honest sum, to the fixed-point resolution
    plain = sum(ups[c]["update"] for c in agg.contributors)
    assert np.max(np.abs(agg["update"] - plain)) <= len(agg.contributors) / params.scale


def test_layer_books_aggregator_b_as_internal_and_transcripts_masked_views():
    ups = _uploads(4)
    ctx = RoundContext(0, "train", 0)
    ValidatedSum(bound=2.0).aggregate(ups, SPEC, ctx)
    rows = ctx.ledger.rows
    internal = [r for r in rows if r.direction == "internal"]
    assert internal and all({r.sender, r.receiver} == {SERVER, AGGREGATOR_B}
                            for r in internal)
    ups_rows = [r for r in rows if r.direction == "up"]
    # every client sends two messages to each aggregator (shares, then proof shares)
    assert sorted((r.sender, r.receiver) for r in ups_rows) == sorted(
        (c, a) for c in range(4) for a in (SERVER, AGGREGATOR_B) for _ in range(2))
    obs = [r for r in ctx.transcript.records if r.get("type") == "observation"]
    seen = [r for r in obs if r["sender"] != SERVER]
    assert seen and all(r["form"] == "masked" for r in seen)
    # what A reconstructs is the sum over the accepted clients, and nothing else
    assert [(r["party"], r["form"], r["what"]) for r in obs if r["sender"] == SERVER] == [
        (SERVER, "clear", "sum")] * len(SPEC.fields)
    assert {r["party"] for r in seen} == {SERVER, AGGREGATOR_B}
    assert {(r["party"], r["sender"]) for r in seen} == {
        (a, c) for c in range(4) for a in (SERVER, AGGREGATOR_B)}


def test_layer_refuses_what_it_cannot_carry():
    with pytest.raises(InadmissibleField):
        ValidatedSum().check(UploadSpec((Field("update", (3,), "float64", additive=True,
                                               bound=Bound(linf=1.0)),)))
    with pytest.raises(InadmissibleField):
        ValidatedSum(bound=1.0).check(UploadSpec((Field("v", (3,), "float64", additive=False,
                                                        reason="per client"),)))
    with pytest.raises(ValueError):
        ValidatedSum(bound=-1.0)


def test_layer_runs_in_the_engine(digits_clients):
    from algorithms import FedAvg
    from secagg import Federation

    layer = ValidatedSum(cheaters=2)
    res = Federation(FedAvg(clip=5.0, local_epochs=1, feature_dim=8), layer,
                     digits_clients, rounds=1, seed=0).run()
    assert np.isfinite(res.accuracy)
    assert len(layer.last_result.rejected) == 2
    assert any(r.receiver == AGGREGATOR_B for r in res.costs.rows)


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


def test_fedavg_with_two_cheaters_stays_close():
    """Federated averaging of a linear softmax model on the digits data, 20 clients, two
    of which skip their clip and scale their update by 100 each round: under the validated
    sum the accuracy stays within 2 points of the cheater-free run; a sum that checks
    nothing falls to chance. The unchecked run is a plain sum: what SecureSum returns, as
    it adds whatever fits its ring (exact modular sum), so it is modelled without running
    its masking."""
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = x / 16.0
    rng = np.random.default_rng(0)
    order = rng.permutation(len(y))
    train, test = order[:1400], order[1400:]
    parts = np.array_split(train, 20)
    dim = 64 * 10
    params = proofs.Params(dim, 1.0)

    def local_update(w, idx):
        logits = x[idx] @ w.reshape(64, 10)
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(idx)), y[idx]] -= 1
        g = (x[idx].T @ p / len(idx)).reshape(-1)
        step = -2.0 * g
        n = np.linalg.norm(step)
        return step * min(1.0, 1.0 / n)  # the clip

    def accuracy(w):
        return float(np.mean(np.argmax(x[test] @ w.reshape(64, 10), 1) == y[test]))

    def train_run(cheat: bool, validated: bool) -> float:
        w = np.zeros(dim)
        for rnd in range(3):
            ups = {c: local_update(w, parts[c]) for c in range(20)}
            cheaters = {0: -100.0, 1: -100.0} if cheat else {}
            if validated:
                res = run_round(ups, params, round=rnd, run_id=bytes(16), cheaters=cheaters,
                                randbytes=_randbytes(rnd))
                w = w + res.total / len(res.accepted)
            else:
                total = sum(ups[c] * cheaters.get(c, 1.0) for c in ups)
                w = w + total / 20
        return accuracy(w)

    with threadpool_limits(limits=1, user_api="blas"):
        clean = train_run(cheat=False, validated=True)
        attacked = train_run(cheat=True, validated=True)
        unchecked = train_run(cheat=True, validated=False)
    print(f"digits FedAvg: clean {clean:.3f}, 2 cheaters validated {attacked:.3f}, "
          f"unchecked {unchecked:.3f}")
    assert clean > 0.85
    assert abs(clean - attacked) <= 0.02, (clean, attacked)
    # the unchecked sum falls by about 79 points (0.90 -> 0.11, chance level)
    assert clean - unchecked > 0.5, (clean, unchecked)
