"""Admissibility rules (one test per rule) and the Federation threat= refusal."""

from __future__ import annotations

import pytest

from secagg import Federation
from secagg.errors import ConfigurationError, InadmissibleField
from secagg.homomorphic import Homomorphic
from secagg.layers.per_group import PerGroup
from secagg.layers.plaintext import Plaintext
from secagg.messages import Bound, Field, UploadSpec
from secagg.privacy import CentralDP, DistributedDP, LocalDP
from secagg.secure_sum import SecureSum
from threat_models import ThreatModel, admissible

SPEC = {"stats": UploadSpec((Field("stats", (3, 4), additive=True,
                                   bound=Bound(l2=2.0, linf=1.0)),), max_records=50)}


def verdict(layer, threat, n=10, specs=SPEC):
    (v,) = admissible(None, layer, threat, specs=specs, n_clients=n)
    return v


def test_parse_and_name_round_trip():
    t = ThreatModel.parse("server+3")
    assert (t.server, t.colluding_clients, t.decryptor_colludes) == ("honest-but-curious", 3, False)
    assert ThreatModel.parse(t.name) == t
    assert ThreatModel.parse("active-server+decryptor").server == "active"
    with pytest.raises(ConfigurationError, match="not one of"):
        ThreatModel.parse("server+mallory")


def test_plaintext_breaks_against_curious_server_only():
    assert not verdict(Plaintext(), "server").ok
    assert verdict(Plaintext(), "clients:3").ok


def test_secure_sum_breaks_at_share_threshold_not_below():
    layer = SecureSum(threshold=4)
    assert verdict(layer, "server").ok
    assert verdict(layer, "server+3").ok
    v = verdict(layer, "server+4")
    assert not v.ok and "share threshold" in v.reason
    # fraction thresholds resolve on the cohort: 0.6 of 10 is 6 shares
    assert verdict(SecureSum(threshold=0.6), "server+5", n=10).ok
    assert not verdict(SecureSum(threshold=0.6), "server+6", n=10).ok


def test_secure_sum_last_honest_client_and_active_server():
    assert not verdict(SecureSum(threshold=0.9), "server+2", n=3).ok  # n - t = 1
    v = verdict(SecureSum(), "active-server")
    assert not v.ok and "active" in v.reason


def test_central_dp_vs_curious_server_sees_unnoised_sum():
    layer = CentralDP(SecureSum(), epsilon=1.0, delta=1e-5, rounds=1)
    v = verdict(layer, "server")
    assert not v.ok and "un-noised sum" in v.reads
    assert verdict(layer, "clients:2").ok


def test_local_dp_protects_against_server():
    assert verdict(LocalDP(Plaintext(), epsilon=4.0, delta=1e-5, rounds=1), "server").ok


def test_distributed_dp_colluders_subtract_their_noise():
    layer = DistributedDP(SecureSum(threshold=6), epsilon=2.0, delta=1e-5, rounds=1)
    assert verdict(layer, "server", n=10).ok
    assert verdict(layer, "server+4", n=10).ok          # 6 honest >= 6
    v = verdict(layer, "server+5", n=10)                 # 5 honest < 6 survivors sized for
    assert not v.ok and "noise" in v.reason


def test_he_clients_key_holder_breaks_with_one_colluding_client():
    layer = Homomorphic("bfv", key_holder="clients")
    assert verdict(layer, "server").ok
    v = verdict(layer, "server+1")
    assert not v.ok and "key_holder='clients'" in v.reason


def test_he_decryptor_collusion_breaks():
    layer = Homomorphic("bfv")
    assert verdict(layer, "server+5").ok
    assert not verdict(layer, "server+decryptor").ok


def test_per_group_routes_each_field():
    specs = {"p": UploadSpec((
        Field("w", (2,), additive=True, bound=Bound(linf=1.0), group="enc"),
        Field("emb", (2,), additive=False, bound=Bound(linf=1.0), group="emb"),
    ), max_records=5)}
    vs = {v.field: v for v in admissible(None, PerGroup({"emb": Plaintext()},
                                                        default=SecureSum()),
                                         "server", specs=specs, n_clients=10)}
    assert vs["w"].ok and vs["w"].layer == "secure-sum"
    assert not vs["emb"].ok and vs["emb"].layer == "plaintext"


@pytest.fixture(scope="module")
def digits_clients():
    from secagg.data import dirichlet_split, load_dataset

    return dirichlet_split(load_dataset("digits"), n_clients=5, alpha=0.5, seed=0)


def test_federation_refuses_inadmissible_then_allow_leaks_records_it(digits_clients):
    from algorithms.fedlog import FedLog

    threat = ThreatModel.parse("server")
    with pytest.raises(InadmissibleField) as exc:
        Federation(FedLog(feature_dim=8), Plaintext(), digits_clients, rounds=1,
                   threat=threat).run()
    assert exc.value.field == "stats" and "allow_leaks" in exc.value.reason
    res = Federation(FedLog(feature_dim=8), Plaintext(), digits_clients, rounds=1,
                     threat=threat, allow_leaks=True).run()
    head = res.transcript.records[0]
    assert head["allow_leaks"] is True and head["threat"]["name"] == "server"
    assert len(head["leaks"]) == 1 and "stats" in head["leaks"][0]
    # a protecting layer passes and records no leak
    res = Federation(FedLog(feature_dim=8), SecureSum(), digits_clients, rounds=1,
                     threat=threat).run()
    assert res.transcript.records[0]["leaks"] == []
