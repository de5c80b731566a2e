"""Label histograms, class prototypes and single records: read in the clear, not under
SecureSum (the coalition is the honest-but-curious server)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from algorithms.base import ClientState
from algorithms.ccvr import CCVR
from algorithms.fedlog import FedLog, class_statistics
from algorithms.spherefed import SphereFed
from algorithms.training import features
from secagg import Federation
from secagg.data import ClientData, Partition, dirichlet_split, load_dataset
from secagg.errors import ConfigurationError
from secagg.layers.plaintext import Plaintext
from secagg.secure_sum import SecureSum
from threat_models.attacks.statistics import class_prototypes, label_histograms, single_records

N_CLIENTS = 6


@pytest.fixture(scope="module")
def split():
    return dirichlet_split(load_dataset("digits"), n_clients=N_CLIENTS, alpha=0.3, seed=1)


def hist_truth(part):
    return {c.id: np.bincount(c.y, minlength=10) for c in part}


def fedlog_truth(part, d=8):
    """Each client's true stats in round 0: every body is the shared initialisation."""
    algo = FedLog(feature_dim=d)
    states = [ClientState(c) for c in part]
    algo.setup(part.dataset, states, 0)
    return {s.id: class_statistics(features(s.state["model"], s.data.x), s.data.y, 10)
            for s in states}


def public_spec(algo, part, get):
    """The phase's UploadSpec as the server knows it (max_records as the engine sets it)."""
    algo.setup(part.dataset, [ClientState(c) for c in part], 0)
    return replace(get(algo), max_records=max(len(c.y) for c in part))


def run(algo, layer, part, rounds=1):
    return Federation(algo, layer, part, rounds=rounds, seed=0, include_values=True).run()


@pytest.fixture(scope="module")
def fedlog_runs(split):
    return {name: run(FedLog(feature_dim=8), layer, split).transcript
            for name, layer in (("clear", Plaintext()), ("secure", SecureSum()))}


def test_fedlog_label_histograms(split, fedlog_runs):
    truth = hist_truth(split)
    clear = label_histograms(fedlog_runs["clear"]).score(truth)
    assert clear["success_rate"] == 1.0 and clear["max_error"] == 0
    spec = public_spec(FedLog(feature_dim=8), split, FedLog.spec)
    res = label_histograms(fedlog_runs["secure"], spec=spec)
    assert res.basis == "sum"
    secure = res.score(truth)
    assert secure["success_rate"] == 0.0 and secure["max_error"] >= 5


def proto_error(est, truth_stats):
    t = {c: truth_stats[c, 1:] / truth_stats[c, 0] for c in range(10) if truth_stats[c, 0] > 0}
    if set(est) != set(t):
        return float("inf")
    return max(float(np.max(np.abs(est[c] - t[c]))) for c in t)


def test_fedlog_class_prototypes(split, fedlog_runs):
    truth = fedlog_truth(split)
    ok = lambda e, t: proto_error(e, t) < 1e-9  # noqa: E731
    clear = class_prototypes(fedlog_runs["clear"]).score(truth, ok, proto_error)
    assert clear["success_rate"] == 1.0 and clear["max_error"] < 1e-9
    spec = public_spec(FedLog(feature_dim=8), split, FedLog.spec)
    secure = class_prototypes(fedlog_runs["secure"], spec=spec).score(truth, ok, proto_error)
    assert secure["success_rate"] == 0.0 and secure["max_error"] > 1e-3


def test_single_record_feature_vector(split):
    # client 0 keeps a single record of class 3 (and its records of other classes)
    c0 = split[0]
    keep = np.flatnonzero(c0.y != 3)
    one = np.flatnonzero(split.dataset.y_train == 3)[0]
    x = np.concatenate([c0.x[keep], split.dataset.x_train[one:one + 1]])
    y = np.concatenate([c0.y[keep], [3]])
    part = Partition(split.dataset, [ClientData(0, x, y)] + list(split[1:]))
    truth = fedlog_truth(part)
    record = truth[0][3, 1:]
    clear = single_records(run(FedLog(feature_dim=8), Plaintext(), part).transcript)
    assert np.array_equal(clear.estimates[0][3], record)
    spec = public_spec(FedLog(feature_dim=8), part, FedLog.spec)
    secure = single_records(run(FedLog(feature_dim=8), SecureSum(), part).transcript, spec=spec)
    assert secure.basis == "sum"
    assert all(3 not in est for est in secure.estimates.values())


def test_ccvr_label_histograms(split):
    truth = hist_truth(split)
    algo = lambda: CCVR(local_epochs=1, feature_dim=16, calib_epochs=0)  # noqa: E731
    clear = label_histograms(run(algo(), Plaintext(), split).transcript).score(truth)
    assert clear["success_rate"] == 1.0
    spec = public_spec(algo(), split, CCVR.moments_spec)
    res = label_histograms(run(algo(), SecureSum(), split).transcript, spec=spec)
    assert res.basis == "sum"
    secure = res.score(truth)
    assert secure["success_rate"] == 0.0


def test_spherefed_label_presence(split):
    truth = {c: h > 0 for c, h in hist_truth(split).items()}
    presence = lambda e, t: bool(np.array_equal(e > 0, t))  # noqa: E731
    algo = lambda: SphereFed(local_epochs=1, feature_dim=16)  # noqa: E731
    clear = label_histograms(run(algo(), Plaintext(), split).transcript)
    assert clear.score(truth, presence)["success_rate"] == 1.0
    spec = public_spec(algo(), split, SphereFed.ffc_spec)
    secure = label_histograms(run(algo(), SecureSum(), split).transcript, spec=spec)
    assert secure.basis == "sum"
    assert secure.score(truth, presence)["success_rate"] < 0.5


def test_attack_needs_values(split):
    t = Federation(FedLog(feature_dim=8), Plaintext(), split, rounds=1).run().transcript
    with pytest.raises(ConfigurationError, match="include_values"):
        label_histograms(t)
