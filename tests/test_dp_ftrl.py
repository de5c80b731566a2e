"""DP-FTRL's tree aggregation (Kairouz et al., ICML 2021): the tree's noise has its stated
variance, its accounting equals dp-accounting's tree event in the single-epoch setting,
trees restart rather than let a client enter one twice, and the budget guard holds."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest

from algorithms.fedavg import FedAvg
from secagg import Federation, Plaintext
from secagg.data import iid_split, load_dataset
from secagg.errors import BudgetExceeded, PrivacyError
from secagg.layers.base import RoundContext
from secagg.messages import Bound, Field, Upload, UploadSpec
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.layers import CentralDP
from secagg.privacy.tree import TreeAccount, decomposition, tree_depth

SPEC = UploadSpec((Field("update", (20_000,), "float64", additive=True,
                         bound=Bound(l2=1.0, adjacency="client")),))


def _release(layer, t, clients, ledger, values=None):
    uploads = {c: Upload.validate(SPEC, {"update": np.zeros(20_000) if values is None
                                         else values}, c, 1) for c in clients}
    ctx = RoundContext(t, "train", t, privacy=ledger)
    return layer.aggregate(uploads, SPEC, ctx)


def test_decomposition_and_depth():
    assert decomposition(6) == [(0, 4), (4, 2)]
    assert decomposition(7) == [(0, 4), (4, 2), (6, 1)]
    assert decomposition(0) == []
    assert [tree_depth(t) for t in (1, 2, 3, 7, 8)] == [1, 2, 2, 3, 4]


def test_tree_noise_has_its_stated_variance():
    """The noise in prefix k (the sum of the first k releases) is the sum of
    |decomposition(k)| node noises of variance sigma^2 = (z C)^2; a release alone is the
    difference of two prefixes."""
    z, d = 1.5, 20_000
    # a user seed: the same noise on every run (the private default draws from the OS, and
    # 7 two-sided checks of its mean at ~2.7 standard errors failed about once in 40 runs)
    layer = CentralDP(Plaintext(), noise_multiplier=z, delta=1e-5, adjacency="client",
                      tree=True, rounds=7, seed=3)
    ledger = PrivacyLedger(delta=1e-5)
    prefix = np.zeros(d)
    for t in range(7):
        agg = _release(layer, t, [t], ledger)
        prefix = prefix + agg.sums["update"]
        nodes = len(decomposition(t + 1))
        assert np.var(prefix) == pytest.approx(nodes * z ** 2, rel=0.05)  # 5 standard errors
        assert abs(np.mean(prefix)) < 4 * z * np.sqrt(nodes / d)  # 4 standard errors
    # for contrast, plain central DP's prefix noise after 7 releases has variance 7 z^2
    assert len(decomposition(7)) == 3


def test_single_epoch_accounting_equals_dp_accounting_tree_event():
    """Seven rounds, each client in exactly one (the paper's single epoch): the ledger's
    events compose to dp-accounting's SingleEpochTreeAggregationDpEvent (RDP, exact) and
    the PLD composition is no larger."""
    z, rounds = 2.0, 7
    for accountant in ("rdp", "auto"):
        layer = CentralDP(Plaintext(), noise_multiplier=z, delta=1e-5, adjacency="client",
                          tree=True, rounds=rounds)
        ledger = PrivacyLedger(delta=1e-5, accountant=accountant)
        for t in range(rounds):
            _release(layer, t, [10 * t, 10 * t + 1], ledger)
        # dp-accounting states the tree event under its REPLACE_SPECIAL relation (a record
        # replaced by a zero one, i.e. one client's contribution added or removed: ours)
        ref = dp_accounting.rdp.RdpAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_SPECIAL)
        ref.compose(dp_accounting.SingleEpochTreeAggregationDpEvent(z, rounds))
        if accountant == "rdp":
            assert ledger.epsilon(1e-5) == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)
        else:
            assert ledger.epsilon(1e-5) <= ref.get_epsilon(1e-5) + 1e-9
    # the worst client (leaf 0) entered depth(7) = 3 nodes: three charges of multiplier z
    assert sum(1.0 / e.noise_multiplier ** 2 for e in ledger.events) == pytest.approx(
        3 / z ** 2)


def test_a_returning_client_starts_a_new_tree_and_is_charged_for_it():
    acc = TreeAccount()
    assert acc.add_leaf([1, 2]) == 1
    assert acc.add_leaf([3]) == 1  # node [0, 2) holds client 1 again: S_1 = 2
    assert acc.trees == 1
    assert acc.add_leaf([1]) == 1  # client 1 again: a new tree, S_1 = 3
    assert acc.trees == 2 and acc.s[1] == 3
    # without the restart client 1 would be in node [0, 4) with 2 leaves (S_1 = 1+1+4)


def test_the_budget_guard_stops_a_release_the_plan_did_not_cover():
    """Planned for one participation per client; a client returning every round costs
    more, and the guard refuses the release before anything is added."""
    layer = CentralDP(Plaintext(), epsilon=2.0, delta=1e-5, adjacency="client", tree=True,
                      rounds=8)
    ledger = layer.make_privacy_ledger()
    with pytest.raises(BudgetExceeded):
        for t in range(8):
            _release(layer, t, [0], ledger)
    assert ledger.epsilon(1e-5) <= 2.0 + 1e-9


def test_dp_ftrl_refuses_several_phases_and_a_changing_bound():
    layer = CentralDP(Plaintext(), noise_multiplier=1.0, adjacency="client", tree=True,
                      rounds=2)
    with pytest.raises(PrivacyError, match="one phase"):
        layer.plan_phases(["train", "ffc"])
    ledger = PrivacyLedger(delta=1e-5)
    _release(layer, 0, [0], ledger)
    wide = UploadSpec((Field("update", (20_000,), "float64", additive=True,
                             bound=Bound(l2=2.0, adjacency="client")),))
    ups = {1: Upload.validate(wide, {"update": np.zeros(20_000)}, 1, 1)}
    with pytest.raises(PrivacyError, match="same bound"):
        layer.aggregate(ups, wide, RoundContext(1, "train", 1, privacy=ledger))


def test_dp_ftrl_fedavg_run_is_private_and_planned_from_participation():
    """FedAvg with a fixed clip under tree-aggregated central DP: 8 rounds of 5 of 40
    clients; planned for 2 participations each, the run completes within its budget."""
    part = iid_split(load_dataset("digits"), 40, seed=0)
    layer = CentralDP(Plaintext(), epsilon=4.0, delta=1e-5, adjacency="client", tree=True,
                      tree_participations=3)
    res = Federation(FedAvg(local_epochs=1, feature_dim=16, clip=1.0), layer, part,
                     rounds=8, fraction=0.125, seed=0).run()
    assert res.failure() is None, res.failure()
    assert res.privacy.private and res.privacy.epsilon(1e-5) <= 4.0 + 1e-6
    assert math.isfinite(res.accuracy)


def test_dp_ftrl_with_adaptive_clipping_is_refused_before_any_client_trains(monkeypatch):
    """The tree needs one bound for every round; an adaptive clip moves it. The refusal
    used to come only in round 1's release, after round 0's training (the plan, and so
    ``secagg run --dry-run``, passed); now the plan refuses and no client ever trains."""
    import algorithms.fedavg as fedavg_module

    calls = []
    real = fedavg_module.train_local
    monkeypatch.setattr(fedavg_module, "train_local",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    part = iid_split(load_dataset("digits"), 6, seed=0)
    layer = CentralDP(Plaintext(), epsilon=8.0, delta=1e-5, adjacency="client", tree=True,
                      tree_participations=2)
    fed = Federation(FedAvg(local_epochs=1, feature_dim=16, clip="adaptive"), layer, part,
                     rounds=2, seed=0)
    with pytest.raises(PrivacyError, match="clip is adaptive"):
        fed.plan()
    with pytest.raises(PrivacyError, match="clip is adaptive"):
        fed.run()
    assert calls == []
    # a fixed clip plans
    Federation(FedAvg(local_epochs=1, feature_dim=16, clip=1.0), layer, part, rounds=2,
               seed=0).plan()
