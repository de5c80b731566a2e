"""The DP-FedAvg audit (threat_models.dp_audit_fedavg): sound on the real layers at client
adjacency, its batched release has the law of the real round, and a clip that is not
applied is caught (multi-run and one-run). Small trial counts; every bound is at 95%
confidence, so each soundness assertion could fail by chance with probability <= 5%
(fixed seeds make the outcome deterministic)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

import algorithms.fedavg as fedavg_mod
import secagg.messages
from secagg.cli import main as cli_main
from secagg.errors import EncodingOverflow, UploadError
from threat_models.dp_audit import AuditError
from threat_models.dp_audit_fedavg import FedAvgRelease, audit_fedavg, audit_fedavg_one_run

LAYERS = ["central-dp", "local-dp", "distributed-dp"]


@pytest.mark.parametrize("layer", LAYERS)
def test_multi_run_is_sound_and_measures_something(layer: str) -> None:
    # the tight mode's bound on an exactly calibrated Gaussian is above the claim with
    # probability about 1 - confidence, so soundness is asserted at 0.999
    res = audit_fedavg(layer, epsilon=2.0, trials=100_000, seed=3, progress=False,
                       confidence=0.999)
    assert res.epsilon_claimed == pytest.approx(2.0, rel=2e-3)
    assert res.details["adjacency"] == "client" and res.details["clip"] == 1.0
    assert res.epsilon_lower <= res.epsilon_claimed, res.row()
    # the canary update is seen: far from 0 at this trial count
    assert res.epsilon_lower >= 0.3 * 2.0, res.row()


@pytest.mark.parametrize("layer", LAYERS)
def test_one_run_is_sound(layer: str) -> None:
    res = audit_fedavg_one_run(layer, epsilon=4.0, canaries=1000, seed=4)
    assert res.epsilon_lower <= 4.0, res.row()
    assert res.epsilon_lower > 0.5, res.row()  # most guesses are right
    assert res.details["correct"] > 0.6 * res.details["guesses"]


def test_canary_is_clipped_to_the_bound_by_the_real_clip() -> None:
    rel = FedAvgRelease("central-dp", epsilon=1.0, clip=0.5, canary_norm=10.0)
    assert math.isclose(float(np.linalg.norm(rel.canary_value)), 0.5, rel_tol=1e-6)
    assert np.linalg.norm(rel.canary_value) <= 0.5
    cos = rel.canary_value @ rel.direction / np.linalg.norm(rel.canary_value)
    assert cos > 1 - 1e-6
    for v in rel.uploads[True][1:]:  # background: above the clip before, at it after
        assert np.linalg.norm(v) <= 0.5 and np.linalg.norm(v) > 0.49
    assert rel.details()["sigma"] == pytest.approx(rel.details()["noise_multiplier"] * 0.5)


@pytest.mark.parametrize("layer", ["central-dp", "distributed-dp"])
def test_batched_release_has_the_law_of_the_real_round(layer: str) -> None:
    """Batched draws vs rounds through ``layer.aggregate`` (validation, secure sum with
    masks, noise, decoding) and ``FedAvg.apply_update``, projected on the canary."""
    from algorithms.server_opt import OptimizerState
    from secagg.layers.base import RoundContext
    from secagg.messages import Upload
    from secagg.privacy.accountant import PrivacyLedger

    # DistributedDP: every client of the cohort survives (a real round adds the noise of
    # the batched release's survivors)
    rel = FedAvgRelease(layer, epsilon=1.0, seed=5, clients=4, survivors="all")
    assert rel.survivors == (0, 1, 2, 3)
    n = 120 if layer == "distributed-dp" else 1500
    batched = rel(True, n, np.random.default_rng(0)) @ rel.direction
    ups = {c: Upload.validate(rel.spec, {"update": v}, c, 1)
           for c, v in enumerate(rel.uploads[True])}
    single = []
    for t in range(n):
        ctx = RoundContext(10_000 + t, "dp-audit-fedavg", t, privacy=PrivacyLedger())
        agg = rel.layer.aggregate(ups, rel.spec, ctx)
        agg.cohort = rel.clients
        rel.algo.opt_state = OptimizerState()
        new = rel.algo.apply_update(rel.broadcast.astype(np.float32), agg)
        single.append(float(np.asarray(new, np.float64) @ rel.direction))
    assert stats.ks_2samp(batched, single).pvalue > 1e-3
    want = (rel.broadcast + sum(rel.uploads[True]) / rel.clients) @ rel.direction
    sigma = rel.details()["sigma"] / rel.clients
    assert abs(np.mean(single) - want) < 5 * sigma / math.sqrt(n)
    assert abs(np.mean(batched) - want) < 5 * sigma / math.sqrt(n)


def test_record_adjacency_is_refused() -> None:
    from threat_models.dp_audit import make_layer

    with pytest.raises(AuditError, match="client-level"):
        FedAvgRelease(make_layer("central-dp", epsilon=1.0))


# --- a clip that is not applied --------------------------------------------------------


def _no_clip(monkeypatch: pytest.MonkeyPatch, check: bool = False) -> None:
    """The client forgets to clip; unless ``check``, the upload check is broken too (a bug
    in both lines of defence is what an audit must catch)."""
    def unclipped(vector, bound, dtype="float64"):  # noqa: ANN001, ANN202 - clip_l2's
        v = np.asarray(vector, dtype=np.float64)
        return v.astype(dtype), float(np.linalg.norm(v)), False

    monkeypatch.setattr(fedavg_mod, "clip_l2", unclipped)
    if not check:
        monkeypatch.setattr(secagg.messages, "_check_bound", lambda arr, f, c, n, on: (arr, 0))


def test_the_upload_check_refuses_an_unclipped_update(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_clip(monkeypatch, check=True)
    with pytest.raises(UploadError):
        FedAvgRelease("central-dp", epsilon=1.0)


@pytest.mark.parametrize("layer", ["central-dp", "local-dp"])
def test_multi_run_catches_a_clip_that_is_not_applied(
        monkeypatch: pytest.MonkeyPatch, layer: str) -> None:
    _no_clip(monkeypatch)
    res = audit_fedavg(layer, epsilon=1.0, trials=2000, seed=6, progress=False)
    assert res.violated and res.epsilon_lower > 1.0, res.row()


@pytest.mark.parametrize("layer", ["central-dp", "local-dp"])
def test_one_run_catches_a_clip_that_is_not_applied(
        monkeypatch: pytest.MonkeyPatch, layer: str) -> None:
    _no_clip(monkeypatch)
    res = audit_fedavg_one_run(layer, epsilon=1.0, canaries=1000, seed=7)
    assert res.violated and res.epsilon_lower > 1.0, res.row()


def test_distributed_dp_encoding_refuses_an_unclipped_update(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Under DistributedDP an unclipped update cannot even be encoded: the fixed-point
    plan is sized for the bound (a third line of defence, after the clip and the check)."""
    _no_clip(monkeypatch)
    with pytest.raises(EncodingOverflow):
        audit_fedavg("distributed-dp", epsilon=1.0, trials=100, seed=6, progress=False)


# --- command line ------------------------------------------------------------------------


def test_cli_dp_fedavg_rows(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["dp-audit", "--layer", "central-dp", "--release", "dp-fedavg",
                   "--epsilon", "2", "--trials", "4000", "--one-run", "--canaries", "200",
                   "--json", "--quiet"])
    assert rc == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["mechanism"] for r in rows] == ["dp-fedavg/central-dp",
                                              "dp-fedavg/central-dp (one run)"]
    assert all(r["epsilon_lower"] <= r["epsilon_claimed"] == 2.0 for r in rows)


def test_cli_dp_fedavg_refuses_dp_sgd(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["dp-audit", "--layer", "dp-sgd", "--release", "dp-fedavg", "--quiet"])
    assert rc == 1
    assert "record-level" in capsys.readouterr().err
