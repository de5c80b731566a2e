"""Issue 10, points 1 and 8: honest adjacency for trained uploads, a public max_records.

A field computed from a model trained on the client's own records has no record-level
sensitivity from its per-record bound (removing a record moves the model); the engine
refuses such a release before anything runs unless the training is DP-SGD. Per-client bounds
come from a public max_records, never from the largest client.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from algorithms.ccvr import CCVR
from algorithms.fedavg import FedAvg
from algorithms.fedlog import FedLog
from algorithms.spherefed import SphereFed
from algorithms.turbosvm import TurboSVM
from secagg.data import dirichlet_split
from secagg.encoding import plan
from secagg.errors import ConfigurationError, PrivacyError, UploadError
from secagg.federation import Federation
from secagg.layers import Plaintext
from secagg.layers.base import Layer
from secagg.messages import DEFAULT_MAX_RECORDS, UploadSpec
from secagg.privacy import CentralDP, DistributedDP, PrivacyLedger
from secagg.privacy.dpsgd import DPSGD
from secagg.privacy.sensitivity import check_training_adjacency, dp_adjacency, field_l2
from secagg.secure_sum import SecureSum


def _phase(algo: Any, digits: Any, clients: Any, round: int, rounds: int, name: str) -> Any:
    from secagg.federation import ClientState

    algo.setup(digits, [ClientState(c) for c in clients], 0)
    return next(p for p in algo.phases(round, rounds) if p.name == name)


def test_phases_declare_which_fields_depend_on_training(digits, digits_clients):
    fl = FedLog(local_epochs=1)
    assert _phase(fl, digits, digits_clients, 0, 2, "stats").trained_fields() == ()
    p1 = _phase(fl, digits, digits_clients, 1, 2, "stats")
    assert p1.trained_fields() == ("stats",) and p1.upload_depends_on_training
    assert not p1.trained_with_dpsgd()
    assert _phase(FedLog(dpsgd=DPSGD(1.0, 1.0)), digits, digits_clients, 1, 2,
                  "stats").trained_with_dpsgd()
    train = _phase(FedAvg(), digits, digits_clients, 0, 1, "train")
    assert train.trained_fields() == ("weighted_params",)  # n is a count
    assert _phase(CCVR(feature_dim=8), digits, digits_clients, 0, 1,
                  "moments").trained_fields() == ("sums", "outer")
    assert _phase(SphereFed(feature_dim=16), digits, digits_clients, 0, 1,
                  "ffc").trained_fields() == ("V", "U")
    assert set(_phase(TurboSVM(feature_dim=8), digits, digits_clients, 0, 1,
                      "train").trained_fields()) == {"weighted_encoder", "embeddings"}


def test_record_level_dp_on_a_trained_per_record_bound_is_refused_before_any_release(
        digits_clients):
    algo = FedLog(local_epochs=1, client_l2=None)  # the old per-record bound 16.03
    layer = CentralDP(Plaintext(), epsilon=2.0, delta=1e-5)
    with pytest.raises(PrivacyError) as info:
        Federation(algo, layer, digits_clients, rounds=2, seed=0, progress=False).run()
    msg = str(info.value)
    assert "phase 'stats'" in msg and "field 'stats'" in msg and "trained" in msg
    assert "DP-SGD" in msg and "client" in msg  # says how to go on
    assert algo.eta is None  # refused before round 0's release, not after training


def test_fedavg_record_level_refused_client_level_needs_public_max_records(digits_clients):
    record = CentralDP(Plaintext(), noise_multiplier=1.0, delta=1e-5)
    with pytest.raises(PrivacyError, match="'weighted_params'"):
        Federation(FedAvg(local_epochs=1), record, digits_clients, rounds=1,
                   progress=False).run()
    client = CentralDP(Plaintext(), noise_multiplier=1.0, delta=1e-5, adjacency="client")
    with pytest.raises(PrivacyError, match="max_records"):
        Federation(FedAvg(local_epochs=1), client, digits_clients, rounds=1,
                   progress=False).run()
    r = Federation(FedAvg(local_epochs=1), client, digits_clients, rounds=1, seed=0,
                   progress=False, max_records=200).run()
    assert r.privacy is not None and np.isfinite(r.privacy.epsilon(1e-5))


def test_dpsgd_training_allows_record_level_and_both_are_on_the_ledger(digits_clients):
    algo = FedLog(local_epochs=1, client_l2=None, dpsgd=DPSGD(1.0, 1.0))
    layer = CentralDP(Plaintext(), epsilon=4.0, delta=1e-5)
    ledger = PrivacyLedger(epsilon_budget=100.0, delta=1e-5)  # room for both
    r = Federation(algo, layer, digits_clients, rounds=2, seed=0, progress=False,
                   privacy=ledger).run()
    assert r.aborted == []
    labels = [e["label"] for e in r.privacy.summary()["events"]]
    assert "dp-sgd" in labels and "central-dp" in labels
    # composed: more than the statistics' releases alone (calibrated to 4.0)
    assert r.privacy.epsilon(1e-5) > 4.0 + 0.1


def test_fedlog_default_is_a_client_level_bound_enforced_by_clipping(digits_clients):
    algo = FedLog(local_epochs=1, client_l2=60.0)
    layer = CentralDP(Plaintext(), noise_multiplier=1.0, delta=1e-5)  # record-level
    r = Federation(algo, layer, digits_clients, rounds=2, seed=0, progress=False,
                   include_values=True).run()
    spec = algo.spec()
    assert spec["stats"].bound.adjacency == "client" and spec["stats"].bound.l2 == 60.0
    # a client bound C bounds one record's effect by 2C, and one client's by C
    assert field_l2(spec, "stats", "record") == 120.0
    assert field_l2(spec, "stats", "client") == 60.0
    assert algo.clipped > 0  # digits clients' statistics exceed 60 and were scaled into it
    assert r.aborted == [] and len(r.history) == 2
    plain = FedLog(local_epochs=1, client_l2=60.0)
    res = Federation(plain, Plaintext(), digits_clients, rounds=2, seed=0,
                     progress=False).run()
    assert res.accuracy > 0.5  # the solve still gets n from the (scaled) count column


class _SpecSpy(Layer):
    """Plaintext that remembers the spec the engine handed it (to compare plans)."""

    name = "spy"

    def __init__(self) -> None:
        self.inner = Plaintext()
        self.specs: list[UploadSpec] = []

    def check(self, spec: UploadSpec) -> None:
        self.specs.append(spec)
        self.inner.check(spec)

    def aggregate(self, uploads, spec, ctx):
        return self.inner.aggregate(uploads, spec, ctx)


def test_same_public_max_records_gives_the_same_plan_whatever_the_largest_client(digits):
    a = dirichlet_split(digits, 10, 0.5, seed=0)
    b = dirichlet_split(digits, 10, 0.5, seed=1)
    assert max(len(c.y) for c in a) != max(len(c.y) for c in b)
    specs = []
    for part in (a, b):
        spy = _SpecSpy()
        Federation(FedAvg(local_epochs=1), spy, part, rounds=1, seed=0, progress=False,
                   max_records=400).run()
        specs.append(spy.specs[0])
    assert specs[0].max_records == specs[1].max_records == 400
    assert plan(specs[0], 10, 1e-6) == plan(specs[1], 10, 1e-6)
    assert field_l2(specs[0], "weighted_params", "client") == \
        field_l2(specs[1], "weighted_params", "client")
    # and without one, the engine plans from the public default, not from the data
    spy = _SpecSpy()
    Federation(FedAvg(local_epochs=1), spy, a, rounds=1, seed=0, progress=False).run()
    assert spy.specs[0].max_records == DEFAULT_MAX_RECORDS


def test_a_client_above_the_public_max_records_is_refused(digits_clients):
    with pytest.raises(UploadError, match="max_records=50"):
        Federation(FedAvg(local_epochs=1), SecureSum(), digits_clients, rounds=1,
                   progress=False, max_records=50).run()
    with pytest.raises(ConfigurationError, match="max_records"):
        Federation(FedAvg(), Plaintext(), digits_clients, max_records=0)


def test_dp_adjacency_sees_through_per_group_and_public_fields(digits, digits_clients):
    from secagg.layers.per_group import PerGroup

    algo = TurboSVM(feature_dim=8)
    spec = _phase(algo, digits, digits_clients, 0, 1, "train").spec()
    layer = PerGroup({"encoder": DistributedDP(SecureSum(), epsilon=1.0, delta=1e-5,
                                               public=("n",)),
                      "embeddings": Plaintext()})
    assert dp_adjacency(layer, spec) == {"weighted_encoder": "record"}
    with pytest.raises(PrivacyError, match="'weighted_encoder'"):
        check_training_adjacency("train", spec, ("weighted_encoder", "embeddings"),
                                 dp_adjacency(layer, spec))
    with pytest.raises(ConfigurationError, match="DP-SGD"):
        TurboSVM(dpsgd=DPSGD(1.0, 1.0))
