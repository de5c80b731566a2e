"""CentralDP(ValidatedSum): the two aggregators add the noise in shares, so neither sees an
un-noised sum; each field is proved against its own bound, and adaptive clipping's count is
proved to be a bit."""

from __future__ import annotations

import numpy as np
import pytest

from secagg.costs import SERVER
from secagg.errors import PrivacyError
from secagg.layers.base import RoundContext
from secagg.messages import Bound, Field, Upload, UploadSpec
from secagg.privacy import CentralDP
from secagg.validated_sum import AGGREGATOR_B, ValidatedSum
from secagg.validated_sum import proof as proofs
from secagg.validated_sum.aggregator import Aggregator

DIM = 30
CLIP = 1.0
SPEC = UploadSpec((
    Field("update", (DIM,), "float64", additive=True,
          bound=Bound(l2=CLIP, adjacency="client")),
    Field("unclipped", (1,), "float64", additive=True,
          bound=Bound(l2=0.5, linf=0.5, adjacency="client")),
))


def _uploads(n: int, seed: int = 0, count: float = 0.5) -> dict[int, Upload]:
    rng = np.random.default_rng(seed)
    out = {}
    for c in range(n):
        v = rng.normal(size=DIM)
        out[c] = Upload({"update": v * (0.9 * CLIP / np.linalg.norm(v)),
                         "unclipped": np.array([count if c % 2 else -count])}, SPEC, c, 1)
    return out


def _exact(ups: dict[int, Upload], clients, name: str, params: proofs.Params) -> np.ndarray:
    """The exact sum the aggregators decode: the clients' fixed-point vectors added as
    integers, then scaled back once."""
    total = np.sum([proofs.encode(ups[c][name], params) for c in clients], axis=0)
    return total.astype(np.float64) / params.scale


class _Spy:
    """Records every share sum each aggregator holds when it leaves for, or meets, the
    other's (the aggregators' view of the sum)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.views: list[tuple[int, np.ndarray]] = []
        orig = Aggregator._share_sum

        def spy(agg: Aggregator) -> np.ndarray:
            out = orig(agg)
            self.views.append((agg.role, out.copy()))
            return out
        monkeypatch.setattr(Aggregator, "_share_sum", spy)


def test_noise_is_added_in_shares_and_neither_aggregator_sees_the_unnoised_sum(monkeypatch):
    ups = _uploads(6)
    layer = CentralDP(ValidatedSum(bits=("unclipped",)), epsilon=1.0, delta=1e-5, rounds=1,
                      adjacency="client")
    ctx = RoundContext(0, "train", 0)
    spy = _Spy(monkeypatch)
    agg = layer.aggregate(ups, SPEC, ctx)
    assert agg.contributors == tuple(range(6))
    params = layer.inner.parts(SPEC)[0][1]
    clean = _exact(ups, range(6), "update", params)
    sigma = agg.notes["dp"]["fields"]["update"]["sigma"]
    assert sigma > 0 and agg.notes["dp"]["server_saw_unnoised_sum"] is False
    # the released sum carries both aggregators' noise: std sqrt(2) sigma per entry
    noise = agg.sums["update"] - clean
    assert 0.8 * np.sqrt(2) * sigma < np.std(noise) < 1.25 * np.sqrt(2) * sigma
    # what each aggregator holds of the update's sum, minus its own noise-free share sum,
    # is never the clean sum: each share sum carries that aggregator's own noise
    p_upd = layer.inner.parts(SPEC)[0][1]
    upd_views = [(r, v) for r, v in spy.views if v.shape == (p_upd.dim,)]
    a = [v for r, v in upd_views if r == 0]
    b = [v for r, v in upd_views if r == 1]
    assert a and b
    from secagg.validated_sum import field as F
    # A's reconstruction (its share + B's) minus A's own noise still carries B's noise
    total = proofs.decode(F.add(a[-1], b[-1]), p_upd)
    assert np.allclose(total, agg.sums["update"])
    assert not np.allclose(total, clean, atol=0.1 * sigma)
    # the transcript: the server saw a noised sum, never a clear one
    sums = [r for r in ctx.transcript.records if r.get("type") == "observation"
            and r["what"] == "sum" and r["field"] == "update"]
    assert [r["form"] for r in sums] == ["noised"]
    led = layer.ledger(ctx)
    assert any(AGGREGATOR_B in h for h in led.holds_against)


def test_without_shares_the_server_sees_the_clear_sum_first():
    """The check above could fail: CentralDP around a plain ValidatedSum subclass that does
    not noise in shares falls back to the server noising the clear sum."""

    class _NoShares(ValidatedSum):
        noises_in_shares = False

    ctx = RoundContext(0, "train", 0)
    layer = CentralDP(_NoShares(bits=("unclipped",)), epsilon=1.0, delta=1e-5, rounds=1,
                      adjacency="client")
    agg = layer.aggregate(_uploads(4), SPEC, ctx)
    assert agg.notes["dp"]["server_saw_unnoised_sum"] is True
    forms = [r["form"] for r in ctx.transcript.records if r.get("type") == "observation"
             and r["what"] == "sum" and r["field"] == "update"]
    assert forms[0] == "clear"


def _with_cheater(monkeypatch: pytest.MonkeyPatch, client: int) -> None:
    """Make ``client`` skip its clip in the next aggregate (the protocol's attack hook:
    it encodes what it has and sends the best proof it can; an honest client refuses to
    prove a false statement)."""
    from secagg.validated_sum import layer as L

    orig = L.run_rounds

    def cheat(*a, **kw):
        kw["cheaters"] = {client: 1.0}
        return orig(*a, **kw)
    monkeypatch.setattr(L, "run_rounds", cheat)


@pytest.mark.parametrize("count", [0.25, 0.0, -0.4999, 3.0])
def test_a_count_that_is_not_a_bit_is_rejected(count, monkeypatch):
    """Client 1 reports a count that is not +-1/2 (all but 3.0 within the field's own L2
    bound, so only the exact bit proof catches them); it is rejected from every field's
    sum, and the sums are exact over the others."""
    ups = _uploads(4)
    ups[1] = Upload({"update": ups[1]["update"], "unclipped": np.array([count])}, SPEC, 1, 1)
    _with_cheater(monkeypatch, 1)
    layer = ValidatedSum(bits=("unclipped",))
    agg = layer.aggregate(ups, SPEC, RoundContext(0, "train", 0))
    assert 1 in agg.notes["rejected"] and agg.contributors == (0, 2, 3)
    exp = sum(float(ups[c]["unclipped"][0]) for c in (0, 2, 3))
    assert agg.sums["unclipped"][0] == pytest.approx(exp, abs=1e-9)
    params = layer.parts(SPEC)[0][1]
    assert np.array_equal(agg.sums["update"], _exact(ups, (0, 2, 3), "update", params))


def test_without_the_bit_proof_a_fractional_count_gets_through():
    """Without ``bits`` (the count under its L2 bound only), the same fractional count is
    accepted: the test above depends on the exact proof."""
    ups = _uploads(4)
    ups[1] = Upload({"update": ups[1]["update"], "unclipped": np.array([0.25])}, SPEC, 1, 1)
    agg = ValidatedSum().aggregate(ups, SPEC, RoundContext(0, "train", 0))
    assert agg.contributors == (0, 1, 2, 3)


def test_each_field_is_proved_against_its_own_bound(monkeypatch):
    """A cheater moving its norm budget into the count (update 0, count just under the
    joint bound sqrt(CLIP^2 + 1/4)) passes one joint bound but not per-field bounds."""
    ups = _uploads(4)
    joint = float(np.sqrt(CLIP ** 2 + 0.25))
    ups[2] = Upload({"update": np.zeros(DIM), "unclipped": np.array([joint * 0.999])}, SPEC,
                    2, 1)
    _with_cheater(monkeypatch, 2)
    per_field = ValidatedSum().aggregate(ups, SPEC, RoundContext(0, "train", 0))
    assert per_field.contributors == (0, 1, 3) and 2 in per_field.notes["rejected"]
    together = ValidatedSum(bound=joint).aggregate(ups, SPEC, RoundContext(0, "train", 0))
    assert together.contributors == (0, 1, 2, 3)


def test_tree_noise_is_refused_around_shares():
    with pytest.raises(PrivacyError, match="tree"):
        CentralDP(ValidatedSum(), epsilon=1.0, delta=1e-5, rounds=4, tree=True)


@pytest.mark.filterwarnings("ignore:.*swamps the signal")
def test_dp_fedavg_runs_under_central_dp_around_validated_sum(digits_clients):
    """DP-FedAvg (adaptive clip) under CentralDP(ValidatedSum): the clip is
    enforced by the aggregators' proofs, adaptive clipping's count is proved a bit, the
    release is noised in shares and spent on the run's ledger."""
    from algorithms import FedAvg
    from secagg import Federation

    layer = CentralDP(ValidatedSum(bits=("unclipped",)), epsilon=4.0, delta=1e-5,
                      adjacency="client")
    res = Federation(FedAvg(clip="adaptive", local_epochs=1, feature_dim=8), layer, digits_clients,
                     rounds=1, seed=0).run()
    assert np.isfinite(res.accuracy) and res.rejected == []
    assert res.privacy is not None and res.privacy.epsilon() <= 4.0 + 1e-9
    sums = [r for r in res.transcript.records if r.get("type") == "observation"
            and r["what"] == "sum" and r["party"] == SERVER]
    assert sums and {r["form"] for r in sums} == {"noised"}
    verdicts = [r for r in res.transcript.records if r.get("type") == "verdict"]
    assert len(verdicts) == 1 and len(verdicts[0]["accepted"]) == 10


def test_a_share_replayed_from_another_part_is_rejected_naming_the_client():
    """Each part of an upload (one proof per field) is bound to its own run id: client 3's
    update share replayed as its count share is a ReplayedShare naming client 3, and
    client 3 is out of every part's sum."""
    from secagg.validated_sum import ReplayedShare
    from secagg.validated_sum import wire as W
    from secagg.validated_sum.protocol import run_rounds

    ups = _uploads(4)
    layer = ValidatedSum(bits=("unclipped",))
    parts = layer.parts(SPEC)
    vecs = [{c: np.concatenate([np.asarray(ups[c][f.name]).ravel() for f in fs])
             for c in ups} for fs, _ in parts]
    first: dict[int, tuple[bytes, bytes]] = {}

    def replay(c: int, kind: int, msgs: tuple[bytes, bytes]) -> tuple[bytes, bytes]:
        if c != 3 or kind != W.SHARE_X:
            return msgs
        if c not in first:
            first[c] = msgs  # part 0's shares
            return msgs
        return first[c]  # replayed into part 1

    res = run_rounds(vecs, [p for _, p in parts], round=0, run_id=bytes(16), tamper=replay)
    assert isinstance(res[1].rejected[3], ReplayedShare) and res[1].rejected[3].client == 3
    assert all(r.accepted == (0, 1, 2) for r in res)
