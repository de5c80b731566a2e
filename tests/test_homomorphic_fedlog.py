"""Acceptance: FedLog on digits under Homomorphic("bfv") matches Plaintext to 1e-6, and
under Homomorphic("ckks") (flooded, rounded releases) stays within a point of it."""

from __future__ import annotations

import pytest

from algorithms.fedlog import FedLog
from secagg.data import dirichlet_split, load_dataset
from secagg.federation import Federation
from secagg.homomorphic import Homomorphic
from secagg.layers.plaintext import Plaintext


@pytest.fixture(scope="module")
def partition():
    return dirichlet_split(load_dataset("digits"), n_clients=4, alpha=1.0, seed=0,
                           local_test_fraction=0.2)


def _run(layer, partition):
    algo = FedLog(feature_dim=16, local_epochs=1)
    return Federation(algo, layer, partition, rounds=2, seed=0, progress=False).run()


@pytest.fixture(scope="module")
def plain(partition):
    return _run(Plaintext(), partition)


def test_fedlog_digits_bfv_matches_plaintext(partition, plain):
    he = _run(Homomorphic("bfv"), partition)
    assert plain.accuracy > 0.2  # the run learned something, so equality is informative
    assert abs(he.accuracy - plain.accuracy) <= 1e-6
    assert len(he.history) == len(plain.history) == 2
    for a, b in zip(he.history, plain.history, strict=True):
        assert abs(a - b) <= 1e-6
    rows = he.costs.rows
    uploads = [r for r in rows if r.stage == "upload"]
    keys = [r for r in rows if r.stage == "keys"]
    assert len(uploads) == 2 * 4
    # keys are sent once per client (and once to the server) over the whole run
    assert sorted(str(r.receiver) for r in keys) == ["0", "1", "2", "3", "server"]
    assert all(r.wire_bytes > r.plaintext_bytes for r in uploads)


def test_fedlog_digits_ckks_release_keeps_accuracy(partition, plain):
    """CKKS sums reach the server flooded and rounded (error <= 1e-6 per entry); FedLog's
    exact solve from them loses essentially nothing."""
    he = _run(Homomorphic("ckks"), partition)
    assert abs(he.accuracy - plain.accuracy) <= 0.01
