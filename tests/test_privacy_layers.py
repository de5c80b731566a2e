"""CentralDP, LocalDP and DistributedDP(SecureSum): noise levels, accounting, refusals."""

from __future__ import annotations

import math

import numpy as np
import pytest

from secagg.dropouts import ScheduledDropouts
from secagg.errors import BudgetExceeded, InadmissibleField, PrivacyError
from secagg.layers.base import RoundContext
from secagg.layers.plaintext import Plaintext
from secagg.messages import Bound, Field, Upload, UploadSpec
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.calibrate import epsilon_for
from secagg.privacy.layers import CentralDP, DistributedDP, LocalDP, noise_tail
from secagg.privacy.sensitivity import fedlog_record_l2, field_l2, joint_l2
from secagg.secure_sum import SecureSum

DELTA = 1e-5


def _spec(d: int = 40, bounded: bool = True, max_records: int = 5) -> UploadSpec:
    bound = Bound(l2=1.0, linf=1.0) if bounded else None
    return UploadSpec((Field("x", (d,), bound=bound, additive=True),
                       Field("n", (1,), dtype="int64", bound=Bound(linf=1.0), additive=True)),
                      max_records=max_records)


def _uploads(spec: UploadSpec, n: int, seed: int = 0) -> dict[int, Upload]:
    rng = np.random.default_rng(seed)
    out = {}
    d = spec["x"].shape[0]
    for c in range(n):
        recs = rng.normal(size=(3, d))
        recs /= np.linalg.norm(recs, axis=1, keepdims=True)
        out[c] = Upload.validate(spec, {"x": recs.sum(0), "n": np.array([3])}, c, 3)
    return out


def _truth(uploads: dict[int, Upload], clients) -> np.ndarray:
    return sum(np.asarray(uploads[c]["x"]) for c in clients)


def _ctx(r: int = 0, privacy=None, dropouts=None) -> RoundContext:
    kw = {"dropouts": dropouts} if dropouts is not None else {}
    return RoundContext(r, "stats", r, privacy=privacy, **kw)


@pytest.mark.parametrize("make", [
    lambda: CentralDP(Plaintext(), noise_multiplier=2.0),
    lambda: LocalDP(Plaintext(), noise_multiplier=2.0),
    lambda: DistributedDP(SecureSum(threshold=0.7), noise_multiplier=2.0),
])
def test_unbounded_field_is_refused(make) -> None:
    layer = make()
    spec = _spec(bounded=False)
    with pytest.raises(InadmissibleField, match="no Bound"):
        layer.check(spec)
    with pytest.raises(InadmissibleField):
        layer.aggregate({}, spec, _ctx())


def test_non_additive_refused_by_central_dp_unless_public() -> None:
    spec = UploadSpec((Field("emb", (3,), additive=False, bound=Bound(l2=1.0)),))
    with pytest.raises(InadmissibleField, match="not additive"):
        CentralDP(Plaintext(), noise_multiplier=1.0).check(spec)
    CentralDP(Plaintext(), noise_multiplier=1.0, public=["emb"]).check(spec)


def test_parameters_two_of_three() -> None:
    with pytest.raises(PrivacyError):
        CentralDP(Plaintext(), epsilon=1.0, delta=1e-5, noise_multiplier=3.0)
    with pytest.raises(PrivacyError):
        CentralDP(Plaintext(), delta=1e-5)
    with pytest.raises(PrivacyError):  # number of releases unknown
        _ = CentralDP(Plaintext(), epsilon=1.0).noise_multiplier
    lay = CentralDP(Plaintext(), epsilon=2.0, delta=DELTA, rounds=10)
    assert epsilon_for(lay.noise_multiplier, DELTA, rounds=10) <= 2.0
    back = CentralDP(Plaintext(), noise_multiplier=lay.noise_multiplier, rounds=10)
    assert abs(back.epsilon - 2.0) < 0.01


def test_sensitivities_from_bounds() -> None:
    spec = _spec()
    assert field_l2(spec, "x") == 1.0
    assert field_l2(spec, "x", "client") == 5.0  # max_records x record bound
    assert math.isclose(joint_l2(spec, ["x", "n"]), math.sqrt(2))
    # FedLog (m = 51 features incl. the constant 1, clamp b = 2): sqrt(1 + 50 * 4).
    assert math.isclose(fedlog_record_l2(51, 2.0), math.sqrt(201))
    only_linf = UploadSpec((Field("v", (4, 4), bound=Bound(linf=0.5), additive=True),))
    assert math.isclose(field_l2(only_linf, "v"), 0.5 * 4)


def test_central_dp_noise_level_and_ledger() -> None:
    spec = _spec(d=500)
    ups = _uploads(spec, 8)
    ledger = PrivacyLedger(delta=DELTA)
    layer = CentralDP(Plaintext(), noise_multiplier=3.0, rounds=4, seed=7)
    resid = []
    for r in range(4):
        agg = layer.aggregate(ups, spec, _ctx(r, ledger))
        resid.append(agg["x"] - _truth(ups, range(8)))
        assert agg["n"].dtype == np.int64
        sig = agg.notes["dp"]["fields"]["x"]["sigma"]
    # Two noised fields with Delta 1 each: sigma = z sqrt(2) Delta.
    assert math.isclose(sig, 3.0 * math.sqrt(2))
    emp = float(np.std(np.concatenate(resid)))
    assert abs(emp - sig) / sig < 0.05
    assert len(ledger.events) == 4
    assert math.isclose(ledger.epsilon(), epsilon_for(3.0, DELTA, rounds=4), rel_tol=1e-9)
    assert not ledger.private  # a user seed was fixed


def test_budget_guard_stops_the_release() -> None:
    spec = _spec()
    ups = _uploads(spec, 4)
    layer = CentralDP(Plaintext(), epsilon=1.0, delta=DELTA, rounds=2)
    ledger = layer.make_privacy_ledger()
    layer.aggregate(ups, spec, _ctx(0, ledger))
    layer.aggregate(ups, spec, _ctx(1, ledger))
    assert ledger.epsilon() <= 1.0
    with pytest.raises(BudgetExceeded):
        layer.aggregate(ups, spec, _ctx(2, ledger))
    assert len(ledger.events) == 2


def test_local_dp_noises_each_upload() -> None:
    spec = _spec(d=400)
    n = 10
    ups = _uploads(spec, n)
    ledger = PrivacyLedger(delta=DELTA)
    layer = LocalDP(Plaintext(), noise_multiplier=2.0, rounds=1, seed=3)
    ctx = _ctx(0, ledger)
    agg = layer.aggregate(ups, spec, ctx)
    sig = 2.0 * math.sqrt(2)
    emp = float(np.std(agg["x"] - _truth(ups, range(n))))
    assert abs(emp - sig * math.sqrt(n)) / (sig * math.sqrt(n)) < 0.1
    forms = {r["form"] for r in ctx.transcript.observations() if r["what"] == "upload"}
    assert forms == {"noised"}
    assert math.isclose(ledger.epsilon(), epsilon_for(2.0, DELTA), rel_tol=1e-9)


def test_local_dp_around_homomorphic_encrypts_the_noised_uploads() -> None:
    """LocalDP(Homomorphic): the server holds only ciphertexts of noised uploads and the
    decrypted noised sum (the relabelling context crashed on the HE layer's digests)."""
    from secagg.homomorphic import Homomorphic

    spec = _spec(d=40)
    ups = _uploads(spec, 4)
    ledger = PrivacyLedger(delta=DELTA)
    layer = LocalDP(Homomorphic(scheme="bfv"), noise_multiplier=2.0, rounds=1, seed=3)
    ctx = _ctx(0, ledger)
    agg = layer.aggregate(ups, spec, ctx)
    forms = {(r["party"], r["form"]) for r in ctx.transcript.observations()}
    assert ("server", "encrypted") in forms and ("server", "clear") not in forms
    sig = 2.0 * math.sqrt(2)
    gap = np.asarray(agg["x"]) - _truth(ups, range(4))
    assert 0 < np.abs(gap).max() < 8 * sig * 2  # the noise of 4 uploads, sigma each
    assert math.isclose(ledger.epsilon(), epsilon_for(2.0, DELTA), rel_tol=1e-9)


@pytest.mark.parametrize("mechanism", ["discrete_gaussian", "skellam"])
def test_distributed_dp_dropouts_down_to_threshold(mechanism: str) -> None:
    spec = _spec(d=300)
    n = 10
    ups = _uploads(spec, n)
    ledger = PrivacyLedger(delta=DELTA)
    layer = DistributedDP(SecureSum(threshold=0.7), noise_multiplier=2.0, rounds=1,
                          mechanism=mechanism, seed=11)
    drops = ScheduledDropouts({"masked-input": {0, 1, 2}})  # 7 of 10 left = threshold
    agg = layer.aggregate(ups, spec, _ctx(0, ledger, drops))
    notes = agg.notes["dp"]
    assert agg.contributors == tuple(range(3, 10)) and notes["survivors"] == 7
    for f in ("x", "n"):
        achieved = notes["fields"][f]["sigma"]
        assert achieved >= notes["target_sigma"][f] * (1 - 1e-12)
        assert achieved >= 2.0 * math.sqrt(2) * 1.0  # z sqrt(k) Delta, real units
    # Decodes without wrap-around: the error is noise-sized, not ring-sized.
    resid = agg["x"] - _truth(ups, range(3, 10))
    sig = notes["fields"]["x"]["sigma"]
    assert np.max(np.abs(resid)) < noise_tail(sig, 300)
    assert abs(float(np.std(resid)) - sig) / sig < 0.12
    assert notes["ring_bits"] < 64
    n_resid = int(agg["n"][0]) - 21
    assert abs(n_resid) < noise_tail(notes["fields"]["n"]["sigma"], 1)
    # The ledger holds the achieved (integer) mechanism, close to the Gaussian plan: the
    # noise is large in integer units, so it is charged as its Gaussian reference (PLD path,
    # secagg.privacy.pld) rather than through the RDP bound (about 8% above it).
    assert ledger.method() == "pld" and len(ledger.events) == 2
    gauss = epsilon_for(2.0, DELTA)
    # Both integer mechanisms (counts included: they travel scaled by 2^s) are within 2% of
    # the continuous Gaussian at the same multiplier.
    assert gauss * 0.98 <= ledger.epsilon() <= gauss * 1.02


def test_distributed_dp_small_noise_many_clients_stays_tight() -> None:
    # 30 clients, z = 0.7: unscaled counts would need shares below 1/2 and the distributed
    # discrete Gaussian bound's tau term would blow up; scaled, the bound stays tight.
    spec = _spec(d=20)
    ups = _uploads(spec, 30)
    ledger = PrivacyLedger(delta=DELTA)
    layer = DistributedDP(SecureSum(threshold=0.7), noise_multiplier=0.7, rounds=1, seed=2)
    agg = layer.aggregate(ups, spec, _ctx(0, ledger))
    assert agg["n"].dtype == np.int64
    gauss = epsilon_for(0.7 * math.sqrt(30 / 21), DELTA)
    assert ledger.method() == "pld"
    assert gauss * 0.98 <= ledger.epsilon() <= gauss * 1.02


def test_distributed_dp_more_survivors_more_noise_less_epsilon() -> None:
    spec = _spec(d=50)
    ups = _uploads(spec, 10)
    full, dropped = PrivacyLedger(delta=DELTA), PrivacyLedger(delta=DELTA)
    layer = DistributedDP(SecureSum(threshold=0.7), noise_multiplier=2.0, rounds=1, seed=1)
    a = layer.aggregate(ups, spec, _ctx(0, full))
    b = layer.aggregate(ups, spec, _ctx(0, dropped, ScheduledDropouts({"masked-input": {0, 1}})))
    sa, sb = a.notes["dp"]["fields"]["x"]["sigma"], b.notes["dp"]["fields"]["x"]["sigma"]
    assert math.isclose(sa / sb, math.sqrt(10 / 8), rel_tol=1e-9)
    assert full.epsilon() < dropped.epsilon()


def test_distributed_dp_calibrated_to_epsilon_meets_it_at_threshold() -> None:
    spec = _spec(d=20)
    ups = _uploads(spec, 10)
    layer = DistributedDP(SecureSum(threshold=0.7), epsilon=2.0, delta=DELTA, rounds=3)
    ledger = layer.make_privacy_ledger()
    drops = ScheduledDropouts({"masked-input": {0, 1, 2}})
    for r in range(3):
        layer.aggregate(ups, spec, _ctx(r, ledger, drops))
    assert 1.9 < ledger.epsilon() <= 2.0
    with pytest.raises(BudgetExceeded):
        layer.aggregate(ups, spec, _ctx(3, ledger, drops))


def test_distributed_dp_needs_secure_sum() -> None:
    with pytest.raises(PrivacyError, match="SecureSum"):
        DistributedDP(Plaintext(), noise_multiplier=1.0)


def test_public_fields_are_not_noised_and_the_transcript_says_so() -> None:
    spec = _spec(d=10)
    ups = _uploads(spec, 5)
    ledger = PrivacyLedger(delta=DELTA)
    layer = CentralDP(Plaintext(), noise_multiplier=2.0, public=["n"])
    ctx = _ctx(0, ledger)
    agg = layer.aggregate(ups, spec, ctx)
    assert int(agg["n"][0]) == 15  # exact
    assert not np.allclose(agg["x"], _truth(ups, range(5)))
    # Only x is noised now: sigma = z * Delta_x (k = 1).
    assert math.isclose(agg.notes["dp"]["fields"]["x"]["sigma"], 2.0)
    assert agg.notes["dp"]["public"] == ["n"]
    recs = [r for r in ctx.transcript.records if r.get("type") == "privacy"]
    assert any(r["field"] == "n" and r["public"] for r in recs)
    assert ledger.events[0].fields == ("x",)
