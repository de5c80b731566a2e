"""The ValidatedSum layer in the embedded engine: what it returns, what it books, what each
aggregator is recorded as having seen."""

from __future__ import annotations

import numpy as np
import pytest

from secagg.costs import SERVER
from secagg.dropouts import ScheduledDropouts
from secagg.errors import InadmissibleField
from secagg.layers.base import RoundContext
from secagg.messages import Bound, Field, Upload, UploadSpec
from secagg.validated_sum import proof as proofs
from secagg.validated_sum.layer import AGGREGATOR_B, ValidatedSum

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
    seen = [r for r in ctx.transcript.records if r.get("type") == "observation"]
    assert seen and all(r["form"] == "masked" for r in seen)
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
