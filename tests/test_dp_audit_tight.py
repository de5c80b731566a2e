"""The tight audit mode (threat_models.dp_audit_gdp, ``gdp_fit``): its math, its soundness
over many seeds, its tightness on the correct layers, the survivor patterns of the default
cohorts, and the injected 20-30% miscalibrations it must catch while the threshold mode
(the auditor before the tight mode) lets them through.

Fixed seeds throughout, so every figure is deterministic; the bounds hold with the stated
confidence by construction, and the margins asserted below were measured with room.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
from scipy import stats

from secagg.cli import main
from threat_models.dp_audit import (
    AuditError,
    SumRelease,
    audit,
    audit_sum,
    dropout_pattern,
    gdp_fit,
    make_layer,
)
from threat_models.dp_audit_bugs import BUGS, injected_audits
from threat_models.dp_audit_fields import audit_fields
from threat_models.dp_audit_gdp import delta_for_mu, epsilon_for_mu, mu_for_epsilon

DELTA = 1e-5


# --- the math ------------------------------------------------------------------------


def test_gdp_delta_closed_form_and_inverses() -> None:
    # at eps = 0 the Gaussian trade-off's delta is the total variation Phi(mu/2) - Phi(-mu/2)
    assert math.isclose(delta_for_mu(1.0, 0.0), stats.norm.cdf(0.5) - stats.norm.cdf(-0.5),
                        rel_tol=1e-12)
    for eps in (0.5, 1.0, 2.0, 4.0, 8.0):
        mu = mu_for_epsilon(eps, DELTA)
        assert math.isclose(delta_for_mu(mu, eps), DELTA, rel_tol=1e-6)
        assert math.isclose(epsilon_for_mu(mu, DELTA), eps, rel_tol=1e-8)
    # the classical Gaussian mechanism's sigma is enough, so its mu gives at most eps
    eps = 1.0
    sigma = math.sqrt(2 * math.log(1.25 / DELTA)) / eps
    assert epsilon_for_mu(1 / sigma, DELTA) < eps
    assert epsilon_for_mu(0.0, DELTA) == 0.0
    with pytest.raises(AuditError):
        epsilon_for_mu(-1.0, DELTA)


def test_gdp_fit_bounds_mu_from_below_on_gaussian_scores() -> None:
    rng = np.random.default_rng(1)
    mu, n = 0.5, 200_000
    out = gdp_fit(rng.normal(0, 3, n), rng.normal(3 * mu, 3, n), delta=DELTA, alpha=0.05)
    assert out.mode == "gdp" and out.mu_lower is not None
    assert mu - 0.03 < out.mu_lower <= mu
    assert out.epsilon_lower == pytest.approx(epsilon_for_mu(out.mu_lower, DELTA))
    # identical worlds prove nothing; a noise-free release is told apart exactly
    same = gdp_fit(rng.normal(0, 1, 1000), rng.normal(0, 1, 1000), delta=DELTA, alpha=0.05)
    assert same.mu_lower < 0.2
    exact = gdp_fit(np.zeros(100), np.ones(100), delta=DELTA, alpha=0.05)
    assert math.isinf(exact.epsilon_lower)


# --- soundness: 50 seeds of a correct Gaussian at eps 2 ----------------------------------


def test_soundness_fifty_seeds_of_a_correct_gaussian() -> None:
    """No violation over 50 seeds at 95% with Bonferroni: each audit at 1 - 0.05/50."""
    seeds, eps = 50, 2.0
    base = make_layer("central-dp", epsilon=eps, delta=DELTA, seed=0)
    assert base.noise_multiplier > 0  # calibrated once; each seed gets its own noise streams
    lowers = []
    for s in range(seeds):
        lay = copy.copy(base)
        lay.seed = 1000 + s
        res = audit_sum(lay, trials=50_000, seed=s, confidence=1 - 0.05 / seeds,
                        progress=False)
        assert res.epsilon_claimed == eps
        lowers.append(res.epsilon_lower)
    assert sum(v > eps for v in lowers) == 0, max(lowers)
    assert min(lowers) > 0.8 * eps  # and every one of them measured the noise


def test_tight_mode_flags_a_non_gaussian_mechanism_the_threshold_mode_does_not() -> None:
    """The Gaussian-shape assumption is real: randomized response at eps 1 is exactly
    (1, 0)-DP, yet its mean shift is large; the default (threshold) mode stays sound."""
    p = math.exp(1.0) / (1 + math.exp(1.0))

    def rr(with_canary: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        keep = rng.random(n) < p
        return np.where(keep, float(with_canary), 1.0 - float(with_canary))

    assert not audit(rr, epsilon=1.0, trials=100_000, seed=2).violated
    assert audit(rr, epsilon=1.0, trials=100_000, seed=2, mode="tight").violated


# --- tightness on the correct layers ---------------------------------------------------


@pytest.mark.parametrize("layer,eps", [("central-dp", 1.0), ("local-dp", 2.0),
                                       ("distributed-dp", 4.0)])
def test_tight_mode_reaches_nine_tenths_of_the_claim(layer: str, eps: float) -> None:
    res = audit_sum(layer, epsilon=eps, delta=DELTA, trials=1_000_000, seed=7, progress=False)
    assert res.best.mode == "gdp"
    assert 0.9 * res.epsilon_claimed <= res.epsilon_lower <= res.epsilon_claimed, res.row()
    # the same trials' threshold tests (the assumption-free mode) prove much less
    thr = max(t.epsilon_lower for t in res.tests if t.mode == "threshold")
    assert thr < 0.85 * res.epsilon_lower


@pytest.mark.parametrize("mechanism,survivors", [("skellam", "all"),
                                                  ("discrete_gaussian", "fewest")])
def test_distributed_dp_claim_is_reached_at_eps_1(mechanism: str, survivors: str) -> None:
    """DistributedDP's ledger charges the integer noise's exact Gaussian curve (plus a gap
    below 1e-7, secagg.privacy.pld), so the tight audit comes within a few percent of the
    claim and stays below it. Under the RDP accounting (8% above that curve) no sound
    audit could pass 0.915 of the claim: this fails there."""
    res = audit_sum("distributed-dp", epsilon=1.0, delta=DELTA, trials=250_000, seed=3,
                    mechanism=mechanism, survivors=survivors, progress=False)
    assert res.best.mode == "gdp"
    assert 0.95 * res.epsilon_claimed <= res.epsilon_lower <= res.epsilon_claimed, res.row()


def test_several_fields_are_audited_jointly() -> None:
    res = audit_fields("central-dp", epsilon=2.0, fields=3, trials=400_000, seed=3,
                       progress=False)
    assert 0.9 * 2.0 <= res.epsilon_lower <= 2.0, res.row()


# --- survivors ---------------------------------------------------------------------------


def test_default_cohort_exercises_the_survivor_dependent_noise() -> None:
    fewest = SumRelease("distributed-dp", epsilon=2.0, delta=DELTA, seed=0)
    assert fewest.clients == 10 and len(fewest.survivors) == 7  # threshold 0.7
    assert fewest.survivors[0] == 0 and fewest.survivors != tuple(range(7))  # dropouts inside
    everyone = SumRelease("distributed-dp", epsilon=2.0, delta=DELTA, seed=0,
                          survivors="all")
    assert everyone.survivors == tuple(range(10))
    # the claim is what the ledger charges: the layer's budget at the fewest survivors,
    # less with all of them (each share is sized for 7, so 10 add more noise)
    assert fewest.epsilon == pytest.approx(2.0, rel=2e-3)
    assert everyone.epsilon < 0.9 * fewest.epsilon
    res = audit_sum("distributed-dp", epsilon=2.0, trials=300_000, seed=4, survivors="all",
                    progress=False)
    assert res.details["survivors"] == 10 and res.mechanism.endswith("(10 of 10)")
    assert 0.85 * res.epsilon_claimed <= res.epsilon_lower <= res.epsilon_claimed


def test_dropout_pattern_checks_its_count() -> None:
    assert dropout_pattern(10, 7, 8, 0)[0] == 0 and len(dropout_pattern(10, 7, 8, 0)) == 8
    for bad in (6, 11, "most", True):
        with pytest.raises(AuditError):
            dropout_pattern(10, 7, bad, 0)


# --- injected miscalibrations ----------------------------------------------------------


@pytest.mark.parametrize("bug", BUGS)
def test_injected_miscalibration_is_caught_by_the_tight_mode_only(bug: str) -> None:
    """Each bug is 20-30% above its claim. The tight mode proves it; the threshold mode
    (today's auditor before this mode) does not, so this test fails on that auditor."""
    (tight,) = injected_audits(1.0, trials=300_000, seed=5, which=[bug])
    assert 1.2 <= tight.size <= 1.3, tight.size
    assert tight.result.violated and tight.result.best.mode == "gdp", tight.result.row()
    (thr,) = injected_audits(1.0, trials=300_000, seed=5, which=[bug], mode="threshold")
    assert not thr.result.violated, thr.result.row()


def test_cli_inject_exits_6_and_json_names_the_mode(capsys: pytest.CaptureFixture[str]
                                                    ) -> None:
    rc = main(["dp-audit", "--inject", "stale-bound", "--inject", "delta-mixup",
               "--epsilon", "2", "--trials", "200000", "--json", "--quiet"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 6
    assert [r["violated"] for r in rows] == [True, True]
    assert all(r["mode"] == "gdp" and r["mu_lower"] > 0 for r in rows)
    assert all({t["mode"] for t in r["tests"]} == {"gdp", "threshold"} for r in rows)


def test_cli_correct_layer_threshold_mode(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["dp-audit", "--layer", "distributed-dp", "--epsilon", "2", "--trials", "50000",
               "--mode", "threshold", "--survivors", "fewest", "--json", "--quiet"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(rows) == 1
    assert rows[0]["mode"] == "threshold" and rows[0]["details"]["survivors"] == 7
    assert {t["mode"] for t in rows[0]["tests"]} == {"threshold"}
