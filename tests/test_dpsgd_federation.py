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
