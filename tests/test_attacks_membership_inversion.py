"""Membership inference on a summed statistic (clear vs DP, against the DP bound) and
gradient inversion of a batch-1 FedAvg update (clear vs SecureSum)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy.stats import norm

from algorithms.base import ClientState
from algorithms.fedavg import FedAvg
from secagg import Federation
from secagg.data import ClientData, Partition, load_dataset
from secagg.layers.plaintext import Plaintext
from secagg.privacy import CentralDP
from secagg.secure_sum import SecureSum
from threat_models.attacks.inversion import invert_fedavg, psnr
from threat_models.attacks.membership import dp_advantage_bound, measure_advantage

TARGET = np.array([0.6, -0.8, 0.0])        # one record's contribution, L2 norm 1
REST = np.array([4.0, 2.5, -1.0])          # everyone else's sum, known to the attacker
TRIALS = 300


def test_membership_in_the_clear_is_certain():
    assert measure_advantage(Plaintext, TARGET, REST, trials=40) == 1.0


@pytest.mark.parametrize("epsilon", [1.0, 2.0])
def test_membership_under_central_dp_stays_within_the_bound(epsilon):
    make = lambda: CentralDP(Plaintext(), epsilon=epsilon, delta=1e-5, rounds=1)  # noqa: E731
    adv = measure_advantage(make, TARGET, REST, trials=TRIALS, seed=1)
    slack = 3.0 * math.sqrt(2.0 / TRIALS)   # 3 sigma of a difference of two proportions
    assert adv <= dp_advantage_bound(epsilon, 1e-5) + slack
    # and it matches the likelihood-ratio test's exact advantage at the layer's noise
    layer = make()
    layer.plan_releases(1)
    expected = 2.0 * norm.cdf(1.0 / (2.0 * layer.noise_multiplier)) - 1.0
    assert abs(adv - expected) <= slack
    assert adv < 0.9


@pytest.fixture(scope="module")
def one_record_clients():
    ds = load_dataset("digits")
    i, j = np.flatnonzero(ds.y_train == 0)[0], np.flatnonzero(ds.y_train == 7)[0]
    clients = [ClientData(0, ds.x_train[i:i + 1], ds.y_train[i:i + 1]),
               ClientData(1, ds.x_train[j:j + 1], ds.y_train[j:j + 1])]
    return Partition(ds, clients)


def fedavg():
    return FedAvg(local_epochs=1, batch_size=1, lr=0.1, momentum=0.0, upload_dtype="float64")


def setup(part):
    algo = fedavg()
    algo.setup(part.dataset, [ClientState(c) for c in part], 0)
    return algo.params.astype(np.float64), replace(algo.spec(), max_records=1)


def test_gradient_inversion_clear_vs_secure_sum(one_record_clients):
    part = one_record_clients
    before, spec = setup(part)
    truth = {c.id: c.x[0].astype(np.float64) for c in part}
    clear = Federation(fedavg(), Plaintext(), part, rounds=1, include_values=True).run()
    res = invert_fedavg(clear.transcript, before)
    assert res.basis == "clear uploads"
    clear_psnr = [psnr(res.estimates[c], truth[c]) for c in truth]
    assert min(clear_psnr) > 40.0
    sec = Federation(fedavg(), SecureSum(), part, rounds=1, include_values=True).run()
    res = invert_fedavg(sec.transcript, before, spec=spec)
    assert res.basis == "sum"
    sec_psnr = [psnr(res.estimates[c], truth[c]) for c in truth]
    assert max(sec_psnr) < 20.0
