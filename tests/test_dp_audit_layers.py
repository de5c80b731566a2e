"""The audits of issue 40 beyond the bare sum: DP-FTRL's tree noise
(threat_models.dp_audit_tree), DP-FedAvg with adaptive clipping
(threat_models.dp_audit_adaptive), and the command line's run-wide confidence.

Fixed seeds; every bound holds at its stated confidence by construction, and the margins
asserted below were measured with room.
"""

from __future__ import annotations

import pytest

from secagg.layers.plaintext import Plaintext
from threat_models.dp_audit_adaptive import AdaptiveRelease, audit_adaptive
from threat_models.dp_audit_bugs import DroppedFieldShareCentralDP
from threat_models.dp_audit_run import run_audits
from threat_models.dp_audit_tree import TreeRelease, audit_tree, canary_nodes

DELTA = 1e-5


def test_canary_nodes_are_the_prefix_decomposition_nodes() -> None:
    assert canary_nodes(8, 0) == [(0, 1), (0, 2), (0, 4), (0, 8)]
    assert canary_nodes(8, 5) == [(4, 6), (0, 8)]  # [5, 6) and [4, 8) are never released
    assert canary_nodes(8, 3) == [(0, 4), (0, 8)]
    assert canary_nodes(7, 0) == [(0, 1), (0, 2), (0, 4)]


def test_tree_audit_is_tight_on_the_worst_leaf_and_sound_elsewhere() -> None:
    rel = TreeRelease(epsilon=2.0, delta=DELTA, rounds=8, seed=1)
    # the ledger's charge over the tree is the planned budget (the worst client is in 4
    # nodes, what the layer calibrated for)
    assert rel.epsilon == pytest.approx(2.0, rel=2e-3)
    assert rel.details()["canary_nodes"] == 4
    res = audit_tree(epsilon=2.0, trials=200_000, seed=1, progress=False)
    assert res.best.mode == "gdp" and res.best.statistic == "tree-nodes"
    assert 0.9 * res.epsilon_claimed <= res.epsilon_lower <= res.epsilon_claimed, res.row()
    # a client of round 5 enters 2 nodes: it is audited well below the worst-case claim
    late = audit_tree(epsilon=2.0, trials=200_000, seed=1, canary_round=5, progress=False)
    assert late.epsilon_lower < 0.75 * late.epsilon_claimed


def test_adaptive_clipping_release_is_tight_and_weighs_the_count() -> None:
    rel = AdaptiveRelease("central-dp", epsilon=2.0, delta=DELTA, seed=2)
    assert rel.canary_bit == -0.5 and rel.canary_update == pytest.approx(1.0, rel=1e-5)
    # the count gets its count_weight share: its noise is sqrt(1 / 0.01) = 10x wider per
    # unit of bound, and the update's is sqrt(1.01) z C
    s = rel.details()["sigma"]
    assert s["unclipped"] / s["update"] == pytest.approx(10.0 * 0.5, rel=1e-9)
    res = audit_adaptive("central-dp", epsilon=2.0, trials=200_000, seed=2, progress=False)
    assert 0.9 * 2.0 <= res.epsilon_lower <= 2.0, res.row()


def test_adaptive_clipping_catches_a_dropped_count_share() -> None:
    """The layer's split of z forgets the count field: the count is noised as if it were
    the update's only field (10x too little noise per unit of bound)."""
    lay = DroppedFieldShareCentralDP(Plaintext(), epsilon=2.0, delta=DELTA, rounds=1,
                                     adjacency="client", seed=3)
    res = audit_adaptive(lay, trials=100_000, seed=3, progress=False)
    assert res.violated and res.epsilon_lower > 1.2 * res.epsilon_claimed, res.row()


def test_run_audits_splits_the_confidence_over_the_run() -> None:
    out = run_audits(layers=["local-dp", "distributed-dp"], epsilons=[2.0], trials=20_000,
                     familywise=True, progress=False)
    # local-dp once, distributed-dp with the fewest survivors and with all of them
    assert [r.details.get("survivors") for r in out] == [None, 7, 10]
    assert all(r.confidence == pytest.approx(1 - 0.05 / 3) for r in out)
    assert not any(r.violated for r in out)
