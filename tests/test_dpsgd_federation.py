"""DP-SGD inside a federation: its accounting joins the run's privacy ledger."""

import math

import pytest

from algorithms.fedavg import FedAvg
from algorithms.fedlog import FedLog
from secagg.federation import Federation
from secagg.layers import Plaintext
from secagg.privacy import CentralDP, PrivacyLedger
from secagg.privacy.dpsgd import DPSGD


def test_dpsgd_under_plaintext_is_accounted_but_not_private(digits_clients):
    r = Federation(FedAvg(local_epochs=1, dpsgd=DPSGD(1.0, 1.0)), Plaintext(), digits_clients,
                   rounds=2, seed=0).run()
    led = r.privacy
    assert led is not None
    s = led.summary()
    assert s["n_events"] == 2 and all(e["label"] == "dp-sgd" for e in s["events"])
    assert 0 < led.epsilon(1e-5) < math.inf
    assert led.epsilon(1e-5, field="weighted_params") == pytest.approx(led.epsilon(1e-5))
    # n was released in the clear, so the run as a whole is not private, and says why
    assert not s["private"]
    assert any("'n'" in why for why in s["not_private_reasons"])
    assert not any("'weighted_params'" in why for why in s["not_private_reasons"])


def test_dpsgd_and_statistics_releases_compose_in_one_ledger(digits_clients):
    def run(dpsgd):
        layer = CentralDP(Plaintext(), epsilon=4.0, delta=1e-5, rounds=2)
        ledger = PrivacyLedger(epsilon_budget=100.0, delta=1e-5)
        return Federation(FedLog(local_epochs=1, dpsgd=dpsgd), layer, digits_clients, rounds=2,
                          seed=0, privacy=ledger).run().privacy
    stats_only = run(None)
    both = run(DPSGD(2.0, 1.0))
    assert stats_only.epsilon() == pytest.approx(4.0, rel=0.02)
    assert both.epsilon() > stats_only.epsilon() + 0.1
    assert len(both.summary()["events"]) > len(stats_only.summary()["events"])


def test_budget_guard_stops_the_run_before_a_release(digits_clients):
    ledger = PrivacyLedger(epsilon_budget=0.5, delta=1e-5)
    r = Federation(FedAvg(local_epochs=1, dpsgd=DPSGD(0.8, 1.0)), Plaintext(), digits_clients,
                   rounds=5, seed=0, privacy=ledger).run()
    assert r.rounds < 5 and r.aborted
    assert "budget" in r.aborted[-1][2].lower()
    assert r.privacy.epsilon() <= 0.5


def _spy_streams(monkeypatch) -> list[tuple[int, tuple[float, ...]]]:
    """Record, for every private training, the Poisson-sampling generator's seed and the
    first draws of its noise generator (from a copy, so training is unaffected)."""
    import copy

    from secagg.privacy import dpsgd as mod

    seen: list[tuple[int, tuple[float, ...]]] = []
    real_noise, real_make = mod.noise_generator, mod.make_private
    noise_draws: list[tuple[float, ...]] = []

    def noise_spy(*args, **kwargs):
        src = real_noise(*args, **kwargs)
        noise_draws.append(tuple(copy.deepcopy(src.rng).standard_normal(4)))
        return src

    def make_spy(*args, **kwargs):
        pt = real_make(*args, **kwargs)
        seen.append((int(pt.engine.secure_rng.initial_seed()), noise_draws[-1]))
        return pt

    monkeypatch.setattr(mod, "noise_generator", noise_spy)
    monkeypatch.setattr(mod, "make_private", make_spy)
    return seen


def _two_clients(digits):
    from secagg.data import iid_split

    return iid_split(digits, 2, seed=0)


@pytest.mark.parametrize("seed", [None, 3])
def test_each_client_and_round_trains_on_its_own_streams(seed, digits, monkeypatch):
    """Two clients x two rounds = four trainings: four different sampling seeds and four
    different noise streams, with or without a user seed (the old code gave every training
    of a seeded run the same streams)."""
    seen = _spy_streams(monkeypatch)
    r = Federation(FedAvg(local_epochs=1, dpsgd=DPSGD(1.0, 1.0, seed=seed)), Plaintext(),
                   _two_clients(digits), rounds=2, seed=0).run()
    assert len(seen) == 4
    assert len({s for s, _ in seen}) == 4, "Poisson sampling shared between trainings"
    assert len({n for _, n in seen}) == 4, "DP-SGD noise shared between trainings"
    seed_reasons = [w for w in r.privacy.not_private_reasons if "seed" in w]
    if seed is None:
        assert not seed_reasons
    else:
        # a user-fixed seed makes the noise predictable: the run says so, with the seed
        assert seed_reasons and f"seed={seed}" in seed_reasons[0]
        assert not r.privacy.field_guarantee("weighted_params")["private"]


def test_seeded_dpsgd_is_reproducible_and_reported_not_private(digits):
    """Same user seed, same run: the same streams (that is what a seed is for); and the
    guarantee is reported as not holding, in the table and in the transcript."""
    def run():
        return Federation(FedAvg(local_epochs=1, dpsgd=DPSGD(1.0, 1.0, seed=5)), Plaintext(),
                          _two_clients(digits), rounds=1, seed=0).run()
    a, b = run(), run()
    assert a.history == b.history
    assert not a.privacy.private
    assert any("seed=5" in w for w in a.privacy.not_private_reasons)
    assert "seed=5" in dict(a.privacy.summary_rows())["DP guarantee holds"]
    recs = {p["field"]: p for p in a.transcript.records if p.get("type") == "privacy"}
    assert recs["weighted_params"]["private"] is False
    assert "seed=5" in recs["weighted_params"]["reason"]
