"""Empirical privacy audit (threat_models.dp_audit, ``secagg dp-audit``): the math, soundness
and tightness on the real DP layers, and bugs injected by monkeypatch that it must catch.

Every audit uses fixed seeds (the auditor's and the layers' noise streams), so each result
is deterministic; each bound holds with probability >= 0.95 by construction, and the
tightness margins below were chosen with room for that randomness (measured: see the
report in docs/dp_audit.md).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import secagg.messages
import secagg.privacy.central
import secagg.privacy.distributed
import secagg.privacy.dp_base
import secagg.privacy.layers as layers_mod
import secagg.privacy.local
from secagg.cli import main
from threat_models.dp_audit import (
    AuditError,
    SumRelease,
    allowed_fnr,
    audit,
    audit_dpsgd,
    audit_dpsgd_one_run,
    audit_release,
    audit_sum,
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_from_counts,
    epsilon_from_rates,
    one_run_epsilon,
    one_run_p_value,
    plot_tradeoff,
    threshold_test,
)

DELTA = 1e-5
ROOT = Path(__file__).resolve().parents[1]


# --- the math ------------------------------------------------------------------------


def test_clopper_pearson_closed_forms() -> None:
    n, a = 200, 0.05
    # no success: P[Bin(n, p) <= 0] = (1 - p)^n = a
    assert math.isclose(float(clopper_pearson_upper(0, n, a)), 1 - a ** (1 / n), rel_tol=1e-9)
    # all successes: P[Bin(n, p) >= n] = p^n = a
    assert math.isclose(float(clopper_pearson_lower(n, n, a)), a ** (1 / n), rel_tol=1e-9)
    assert float(clopper_pearson_upper(n, n, a)) == 1.0
    assert float(clopper_pearson_lower(0, n, a)) == 0.0
    # the bound's defining tail probability
    up = float(clopper_pearson_upper(37, n, a))
    assert math.isclose(stats.binom.cdf(37, n, up), a, rel_tol=1e-6)
    with pytest.raises(AuditError):
        clopper_pearson_upper(5, 4, a)


def test_epsilon_from_rates_is_the_dp_region_boundary() -> None:
    eps, delta = 1.3, 1e-3
    fpr = np.array([0.01, 0.05, 0.1])
    fnr_edge = 1 - delta - math.exp(eps) * fpr  # the (eps, delta) trade-off line
    assert np.allclose(epsilon_from_rates(fpr, fnr_edge, delta), eps)
    # a test doing worse than the boundary proves less
    assert np.all(epsilon_from_rates(fpr, fnr_edge + 0.02, delta) < eps)
    # symmetric in which error is which
    assert np.allclose(epsilon_from_rates(fnr_edge, fpr, delta), eps)
    # a useless test (FPR + FNR >= 1 - delta) proves nothing
    assert float(epsilon_from_rates(0.5, 0.5, delta)) == 0.0


def test_epsilon_from_counts_takes_the_confidence_into_account() -> None:
    exact = float(epsilon_from_rates(100 / 10_000, 0.5, DELTA))
    measured = float(epsilon_from_counts(100, 10_000, 5_000, 10_000, DELTA, 0.05))
    assert 0 < measured < exact


def test_one_run_p_value_and_epsilon() -> None:
    m, r, v = 1000, 100, 80
    p = 1 / (1 + math.exp(-1.0))
    # delta = 0: the theorem is the binomial tail of eps-randomized response
    assert math.isclose(one_run_p_value(m, r, v, 1.0, 0.0), stats.binom.sf(v - 1, r, p))
    # delta > 0 only adds to it; larger epsilon makes v correct guesses likelier
    assert one_run_p_value(m, r, v, 1.0, DELTA) > one_run_p_value(m, r, v, 1.0, 0.0)
    assert one_run_p_value(m, r, v, 2.0, DELTA) > one_run_p_value(m, r, v, 1.0, DELTA)
    # all r guesses right, delta = 0: P[Bin(r, p) >= r] = p^r = alpha, closed form
    alpha = 0.05
    q = alpha ** (1 / r)
    assert math.isclose(one_run_epsilon(m, r, r, 0.0, alpha), math.log(q / (1 - q)),
                        rel_tol=1e-6)
    # chance-level guessing proves nothing
    assert one_run_epsilon(m, r, r // 2, DELTA, alpha) == 0.0


def test_one_run_guesses_are_counted_and_bad_counts_refused_by_both_audits() -> None:
    """The one-run auditor's guesses (threat_models.dp_audit_bounds), shared by the DP-SGD
    and the DP-FedAvg one-run audits: k per side, counted against the coin; a canary or
    guess count that cannot be audited is refused by both, before any training."""
    from threat_models.dp_audit_bounds import one_run_guess, one_run_half
    from threat_models.dp_audit_fedavg import audit_fedavg_one_run

    assert one_run_half(1000, None) == 100 and one_run_half(10, 6) == 3
    score = np.array([5.0, -1.0, 3.0, 0.0, -4.0, 9.0])
    included = np.array([True, False, False, True, True, True])
    # "in" for the 2 largest (9.0: in, 5.0: in), "out" for the 2 smallest (-4.0: in,
    # -1.0: out): 3 of the 4 guesses are right
    assert one_run_guess(score, included, 2) == (4, 3)
    assert one_run_guess(score, ~included, 2) == (4, 1)
    for run in (lambda **kw: audit_dpsgd_one_run(noise_multiplier=1.0, **kw),
                lambda **kw: audit_fedavg_one_run("central-dp", epsilon=1.0, **kw)):
        for bad in ({"canaries": 1}, {"canaries": 10, "guesses": 1},
                    {"canaries": 10, "guesses": 12}):
            with pytest.raises(AuditError, match="canaries|guesses"):
                run(**bad)


def test_threshold_test_is_sound_on_randomized_response() -> None:
    """eps-randomized response is exactly eps-DP: the audit must land just below eps."""
    eps = 1.0
    p = math.exp(eps) / (1 + math.exp(eps))

    def rr(with_canary: bool, n: int, rng: np.random.Generator) -> np.ndarray:
        truth = 1.0 if with_canary else 0.0
        keep = rng.random(n) < p
        return np.where(keep, truth, 1.0 - truth)

    res = audit(rr, epsilon=eps, delta=DELTA, trials=200_000, seed=3, mechanism="rr")
    assert res.epsilon_lower <= eps
    assert res.epsilon_lower >= 0.9 * eps
    # and a release that is not private at all is flagged as such
    leak = audit(lambda w, n, rng: np.full(n, float(w)), epsilon=eps, trials=2000, seed=3)
    assert leak.violated and leak.epsilon_lower > 5


def test_threshold_choice_is_made_on_the_selection_split_only() -> None:
    rng = np.random.default_rng(0)
    without, with_ = rng.normal(0, 1, 4000), rng.normal(1, 1, 4000)
    out = threshold_test(without, with_, delta=DELTA, alpha=0.05)
    assert out.n_without == 3000 and out.n_with == 3000  # 25% went to selection
    t = out.threshold
    assert out.false_pos == int(np.sum(without[1000:] >= t))
    assert out.false_neg == int(np.sum(with_[1000:] < t))


def test_audit_release_runs_one_release_at_a_time() -> None:
    """The generic interface (e.g. for client-level DP-FedAvg): a Laplace mechanism."""
    eps = 1.0

    def laplace(with_canary: bool, rng: np.random.Generator) -> float:
        return float(with_canary) + rng.laplace(0.0, 1.0 / eps)

    a = audit_release(laplace, epsilon=eps, trials=3000, seed=5, mechanism="laplace")
    b = audit_release(laplace, epsilon=eps, trials=3000, seed=5, mechanism="laplace")
    assert a.epsilon_lower == b.epsilon_lower  # reproducible
    assert 0.2 < a.epsilon_lower <= eps


# --- sound and tight on the DP layers -----------------------------------------------


@pytest.mark.parametrize("eps", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("layer,kw,trials", [
    ("central-dp", {}, 500_000),
    ("local-dp", {}, 500_000),
    ("distributed-dp", {}, 1_000_000),
])
def test_audit_is_sound_and_tight(layer: str, kw: dict, trials: int, eps: float) -> None:
    res = audit_sum(layer, epsilon=eps, delta=DELTA, trials=trials, seed=11, **kw)
    # DistributedDP's claim is what its ledger charges for the survivors (the fewest
    # by default): its budget, to the calibration's tolerance
    assert res.epsilon_claimed == pytest.approx(eps, rel=2e-3)
    assert res.epsilon_lower <= eps, res.row()
    assert res.epsilon_lower >= 0.5 * eps, res.row()


def test_distributed_skellam_is_sound_and_tight() -> None:
    res = audit_sum("distributed-dp", mechanism="skellam", epsilon=2.0, trials=1_000_000,
                    seed=12)
    assert 1.0 <= res.epsilon_lower <= 2.0
    # the integer tests ran and found nothing on the honest sampler
    got = {t.statistic: t.epsilon_lower for t in res.tests}
    assert set(got) == {"shift", "parity", "exact"}
    assert got["parity"] < 0.1 and got["exact"] < 0.1


@pytest.mark.parametrize("scale", [1.0, 10.0])
def test_integer_canary_sits_on_the_grid_with_an_odd_shift(scale: float) -> None:
    rel = SumRelease("distributed-dp", epsilon=1.0, canary_scale=scale, seed=0)
    q = rel.canary_value / rel.step
    assert q == round(q) and round(q) % 2 == 1
    assert 1.0 - 2 * rel.step <= rel.canary_value <= 1.0  # at its bound, after the clip
    # the default cohort of 10: the fewest survivors threshold 0.7 accepts
    assert rel.clients == 10 and rel.details()["survivors"] == 7


@pytest.mark.parametrize("layer", ["central-dp", "local-dp", "distributed-dp"])
def test_batched_release_has_the_law_of_the_layers_aggregate(layer: str) -> None:
    """The batched draws are distributed as single releases through ``layer.aggregate``
    (the whole layer: validation, secure sum with masking, noise, decoding)."""
    from secagg.layers.base import RoundContext
    from secagg.messages import Upload
    from secagg.privacy.accountant import PrivacyLedger

    # every client survives the real secure sum, and LocalDP's observation is the canary
    # client's upload, so the cohort is that one client (the sum of one upload)
    rel = SumRelease(layer, epsilon=1.0, delta=DELTA, seed=21, survivors="all",
                     clients=1 if layer == "local-dp" else 4)
    n = 150 if layer == "distributed-dp" else 2000
    batched = rel(True, n, np.random.default_rng(0))
    ups = {c: Upload.validate(rel.spec, {"x": np.array([rel.canary_value if c == 0 else 0.0])},
                              c, 1) for c in range(rel.clients)}
    single = []
    for t in range(n):
        ctx = RoundContext(10_000 + t, "dp-audit", t, privacy=PrivacyLedger())
        agg = rel.layer.aggregate(ups, rel.spec, ctx)
        single.append(float(agg.sums["x"][0]))
    assert stats.ks_2samp(batched, single).pvalue > 1e-3
    sigma = rel.details()["sigma"]
    assert abs(np.mean(single) - rel.canary_value) < 5 * sigma / math.sqrt(n)


# --- bugs it must catch ----------------------------------------------------------------

#: the modules of the DP layers (a bug is injected into every one that uses the name)
DP_MODULES = (secagg.privacy.dp_base, secagg.privacy.central, secagg.privacy.local,
              secagg.privacy.distributed)


def _real(name: str):  # noqa: ANN202
    return getattr(next(m for m in DP_MODULES if hasattr(m, name)), name)


def _patch(monkeypatch: pytest.MonkeyPatch, name: str, fn) -> None:  # noqa: ANN001
    for mod in DP_MODULES:
        if hasattr(mod, name):
            monkeypatch.setattr(mod, name, fn)

BUG_TRIALS = 200_000


@pytest.mark.parametrize("layer", ["central-dp", "local-dp"])
def test_catches_halved_noise(monkeypatch: pytest.MonkeyPatch, layer: str) -> None:
    real = _real("gaussian")
    _patch(monkeypatch, "gaussian", lambda s, size, rng: real(s / 2, size, rng))
    res = audit_sum(layer, epsilon=1.0, trials=BUG_TRIALS, seed=31)
    assert res.violated and res.epsilon_lower > 1.0


@pytest.mark.parametrize("layer", ["central-dp", "distributed-dp"])
def test_catches_halved_sensitivity(monkeypatch: pytest.MonkeyPatch, layer: str) -> None:
    real = _real("field_l2")
    _patch(monkeypatch, "field_l2", lambda *a, **k: real(*a, **k) / 2)
    res = audit_sum(layer, epsilon=1.0, trials=BUG_TRIALS, seed=32)
    assert res.violated and res.epsilon_lower > 1.0


def test_catches_skellam_with_biased_low_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _real("skellam")

    def biased(lam: float, size: int, rng: np.random.Generator) -> np.ndarray:
        x = real(lam, size, rng)  # the real sampler, then the low bit cleared 90% of the time
        return np.where(rng.random(x.shape) < 0.9, x & ~np.int64(1), x)

    _patch(monkeypatch, "skellam", biased)
    res = audit_sum("distributed-dp", mechanism="skellam", epsilon=1.0, trials=BUG_TRIALS,
                    seed=33)
    assert res.violated and res.best.statistic == "parity"
    shift = next(t for t in res.tests if t.statistic == "shift")
    assert shift.epsilon_lower <= 1.0  # the output's magnitude alone looks fine


def test_catches_discrete_gaussian_that_ignores_the_ring_wrap(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A client adds its discrete Gaussian share only where the sum does not wrap around
    the ring (treating the wrap as an overflow): every negative share larger than the
    client's value is dropped, leaving the un-noised value in the clear."""
    def no_wrap(self, release, upload, rng):  # noqa: ANN001, ANN202 - the layer's signature
        parts = []
        for f in release.additive:
            enc = release.plans[f.name].encode(np.asarray(upload[f.name])).astype(np.int64)
            if f.name in release.share_std:
                s = enc + self._draw(release.share_std[f.name], f.size, rng)
                enc = np.where((s >= 0) & (s < (1 << release.ring_bits)), s, enc)
            parts.append(enc.astype(np.uint64))
        return np.concatenate(parts)

    monkeypatch.setattr(layers_mod.DistributedDP, "encode_noised", no_wrap)
    res = audit_sum("distributed-dp", epsilon=1.0, trials=BUG_TRIALS, seed=34)
    assert res.violated and res.best.statistic == "exact"
    assert res.epsilon_lower > 4.0


def test_catches_a_clip_that_is_not_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    # honest: a canary 10x over its bound is clipped back to it, and the claim holds
    honest = audit_sum("central-dp", epsilon=1.0, trials=BUG_TRIALS, seed=35,
                       canary_scale=10.0)
    assert not honest.violated
    monkeypatch.setattr(secagg.messages, "_check_bound", lambda arr, f, c, n, on: (arr, 0))
    res = audit_sum("central-dp", epsilon=1.0, trials=BUG_TRIALS, seed=35, canary_scale=10.0)
    assert res.violated and res.epsilon_lower > 4.0


def test_tradeoff_curve_and_plot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The empirical trade-off curve stays out of the region the claim forbids for the
    honest layer and enters it for a broken one; both are drawn to PNG and SVG."""
    honest = audit_sum("central-dp", epsilon=1.0, trials=100_000, seed=36)
    real = _real("gaussian")
    _patch(monkeypatch, "gaussian", lambda s, size, rng: real(s / 4, size, rng))
    broken = audit_sum("central-dp", epsilon=1.0, trials=100_000, seed=36)

    def worst_gap(r) -> float:  # noqa: ANN001
        fpr, fnr = np.array(r.curve["fpr"]), np.array(r.curve["fnr"])
        return float(np.min(fnr - allowed_fnr(fpr, r.epsilon_claimed, r.delta)))

    assert worst_gap(honest) > -0.01  # sampling noise only
    assert worst_gap(broken) < -0.1
    paths = plot_tradeoff([honest, broken], tmp_path / "tradeoff")
    assert [p.name for p in paths] == ["tradeoff.png", "tradeoff.svg"]
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "VIOLATED" in paths[1].read_text()


# --- DP-SGD (Opacus) ------------------------------------------------------------------

Z_DPSGD = 3.0  # one full-batch step: the ledger's epsilon is 1.27


def _no_clip(monkeypatch: pytest.MonkeyPatch) -> None:
    from opacus.optimizers.optimizer import DPOptimizer

    real = DPOptimizer.clip_and_accumulate

    def unclipped(self) -> None:  # noqa: ANN001 - Opacus' method
        norm, self.max_grad_norm = self.max_grad_norm, float("inf")
        try:
            real(self)  # clip factor min(1, inf / norm) = 1; the noise keeps the real norm
        finally:
            self.max_grad_norm = norm

    monkeypatch.setattr(DPOptimizer, "clip_and_accumulate", unclipped)


def test_dpsgd_audits_are_sound() -> None:
    multi = audit_dpsgd(noise_multiplier=Z_DPSGD, trials=300, seed=41)
    assert 1.0 < multi.epsilon_claimed < 2.0
    assert multi.epsilon_lower <= multi.epsilon_claimed
    one = audit_dpsgd_one_run(noise_multiplier=Z_DPSGD, canaries=1000, seed=41)
    assert one.epsilon_claimed == multi.epsilon_claimed
    assert one.epsilon_lower <= one.epsilon_claimed


def test_dpsgd_audits_catch_a_clip_that_is_not_applied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _no_clip(monkeypatch)
    multi = audit_dpsgd(noise_multiplier=Z_DPSGD, trials=300, seed=42)
    assert multi.violated
    one = audit_dpsgd_one_run(noise_multiplier=Z_DPSGD, canaries=1000, seed=42)
    assert one.violated


# --- the command line ------------------------------------------------------------------


def test_cli_json_rows(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["dp-audit", "--layer", "central-dp", "--layer", "distributed-dp",
               "--epsilon", "2", "--trials", "100000", "--json", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = json.loads(out)
    # distributed-dp with the fewest survivors (7 of the default 10) and with all of them
    assert [r["mechanism"] for r in rows] == [
        "central-dp", "distributed-dp/discrete_gaussian (7 of 10)",
        "distributed-dp/discrete_gaussian (10 of 10)"]
    for r in rows:
        assert {"mechanism", "epsilon_claimed", "epsilon_lower", "confidence", "trials",
                "canary", "mode"} <= set(r)
        assert r["epsilon_claimed"] <= 2.0 + 1e-9
        assert 0 < r["epsilon_lower"] <= r["epsilon_claimed"]
        # the run's 0.95 is split between its 3 audits (Bonferroni)
        assert r["trials"] == 100_000 and r["confidence"] == pytest.approx(1 - 0.05 / 3)


def test_cli_exit_status_flags_a_broken_mechanism(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    real = _real("gaussian")
    _patch(monkeypatch, "gaussian", lambda s, size, rng: real(s / 2, size, rng))
    rc = main(["dp-audit", "--layer", "central-dp", "--epsilon", "1", "--trials", "200000",
               "--quiet"])
    cap = capsys.readouterr()
    assert rc == 6
    assert "VIOLATED" in cap.out and "central-dp is not (1, 1e-05)-DP" in cap.err


def test_cli_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["dp-audit", "--trials", "3"], ["dp-audit", "--epsilon", "0"],
                 ["dp-audit", "--layer", "secure-sum"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
    assert "dp-audit" in capsys.readouterr().err


def test_cli_smallest_call_as_a_program() -> None:
    """``secagg dp-audit --layer central-dp --epsilon 2 --json`` (default 10^6 trials) in a
    fresh interpreter; importing secagg.cli alone does not import threat_models."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    code = ("import sys, secagg.cli; assert 'threat_models' not in sys.modules; "
            "sys.exit(secagg.cli.main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "dp-audit", "--layer", "central-dp",
                           "--epsilon", "2", "--json"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["trials"] == 1_000_000 and 1.0 <= row["epsilon_lower"] <= 2.0
    assert proc.stderr == ""  # no progress bar when stderr is not a terminal
