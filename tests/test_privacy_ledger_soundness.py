"""A run is reported private only if every field it released was noised.

The privacy ledger composes the DP events of every DP layer in the stack (also inside
PerGroup) and of DP-SGD, and marks each field released without noise -- declared public,
or routed through a layer that adds none -- with its phase and the reason. The transcript's
privacy records carry that per-field truth for ``secagg audit``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from algorithms.fedavg import FedAvg
from algorithms.turbosvm import TurboSVM
from secagg import CentralDP, Federation, LocalDP, PerGroup, Plaintext, SecureSum
from secagg.data import iid_split
from secagg.errors import PrivacyError
from secagg.layers.base import RoundContext
from secagg.messages import Bound, Field, Upload, UploadSpec
from secagg.phase import AlgorithmBase
from secagg.privacy.accountant import PrivacyLedger
from secagg.privacy.dpsgd import DPSGD
from secagg.privacy.events import GaussianEvent
from secagg.transcript import Transcript

DELTA = 1e-5
FIELD_KEYS = {"type", "field", "phases", "epsilon", "delta", "accountant", "private"}


@pytest.fixture(scope="module")
def three_clients(digits):
    """Three clients of about 150 records each (small, so that each run takes a second)."""
    from secagg.data import Partition

    return Partition(digits, iid_split(digits, 12, seed=0)[:3])


def _gaussian_epsilon(*zs: float) -> float:
    """Epsilon of Gaussian releases with these multipliers, composed by a fresh ledger."""
    led = PrivacyLedger(delta=DELTA)
    led.spend(*(GaussianEvent(noise_multiplier=z) for z in zs))
    return led.epsilon()


# TurboSVM's uploads are the model the client just trained: record-level DP on them is
# refused (tests/test_adjacency.py); these tests use client-level adjacency, which needs
# a public bound on records per client.
MAX_RECORDS = 400


def _ledger_records(result) -> dict[str, dict]:
    """The ledger's final privacy records (those with an epsilon), by field (None: total)."""
    return {r["field"]: r for r in result.transcript.records
            if r.get("type") == "privacy" and "epsilon" in r}


def test_turbosvm_public_class_counts_under_central_dp_is_not_private(three_clients):
    layer = CentralDP(Plaintext(), noise_multiplier=2.0, delta=DELTA, adjacency="client",
                      public=("embeddings", "class_counts"))
    r = Federation(TurboSVM(), layer, three_clients, rounds=1, seed=0, max_records=MAX_RECORDS).run()
    led = r.privacy
    assert not led.private
    holds = dict(led.summary_rows())["DP guarantee holds"]
    assert holds.startswith("NO: ")
    for name in ("class_counts", "embeddings"):
        assert any(f"field {name!r}" in w and "phase 'train'" in w and "public" in w
                   for w in led.not_private_reasons), name
        g = led.field_guarantee(name)
        assert g["private"] is False and g["epsilon"] == math.inf and "public" in g["reason"]
    # the noised fields keep their (finite, correct) guarantee
    for name in ("n", "weighted_encoder"):
        g = led.field_guarantee(name)
        assert g["private"] is True and g["epsilon"] == pytest.approx(_gaussian_epsilon(2.0))
    recs = _ledger_records(r)
    assert recs["class_counts"]["private"] is False and "public" in recs["class_counts"]["reason"]
    assert recs["n"]["private"] is True and "reason" not in recs["n"]
    assert recs[None]["private"] is False
    assert {(u["phase"], u["field"]) for u in recs[None]["unnoised"]} == {
        ("train", "class_counts"), ("train", "embeddings")}


def test_dp_inside_per_group_books_into_the_run_ledger(three_clients):
    layer = PerGroup({"embeddings": Plaintext()},
                     default=CentralDP(SecureSum(), noise_multiplier=2.0, delta=DELTA, adjacency="client"))
    r = Federation(TurboSVM(), layer, three_clients, rounds=1, seed=0, max_records=MAX_RECORDS).run()
    led = r.privacy
    assert led is not None, "a DP route inside PerGroup must book into the run's ledger"
    assert len(led.events) == 1 and set(led.events[0].fields) == {"n", "weighted_encoder"}
    assert led.epsilon() == pytest.approx(_gaussian_epsilon(2.0))
    assert not led.private
    for name in ("class_counts", "embeddings"):
        assert any(f"field {name!r}" in w and "'plaintext'" in w and "group 'embeddings'" in w
                   for w in led.not_private_reasons), name
    assert led.field_guarantee("n")["private"] is True
    assert _ledger_records(r)["embeddings"]["private"] is False


def test_per_group_composes_every_dp_route_and_is_private_when_all_fields_are_noised(
        three_clients):
    layer = PerGroup({"embeddings": LocalDP(Plaintext(), noise_multiplier=3.0, delta=DELTA, adjacency="client")},
                     default=CentralDP(Plaintext(), noise_multiplier=2.0, delta=DELTA, adjacency="client"))
    r = Federation(TurboSVM(), layer, three_clients, rounds=1, seed=0, max_records=MAX_RECORDS).run()
    led = r.privacy
    assert led.private and led.not_private_reasons == ()
    assert len(led.events) == 2
    assert led.epsilon() == pytest.approx(_gaussian_epsilon(2.0, 3.0))
    assert led.epsilon() > _gaussian_epsilon(2.0) + 0.1  # both routes count
    assert led.field_guarantee("embeddings")["epsilon"] == pytest.approx(_gaussian_epsilon(3.0))
    assert dict(led.summary_rows())["DP guarantee holds"] == "yes"
    recs = _ledger_records(r)
    assert all(recs[f]["private"] for f in ("n", "weighted_encoder", "embeddings",
                                            "class_counts"))


def test_field_covered_by_dpsgd_is_not_reported_unnoised(digits):
    """weighted_params is DP-SGD output: declaring it public in CentralDP keeps the run
    private (n is noised by the layer); without DP-SGD the same layer is not private."""
    from secagg.data import Partition

    clients = Partition(digits, iid_split(digits, 12, seed=0)[:2])

    def run(dpsgd):
        layer = CentralDP(Plaintext(), noise_multiplier=2.0, delta=DELTA,
                          public=["weighted_params"])
        ledger = PrivacyLedger(delta=DELTA, accountant="rdp")  # RDP: fast enough for a test
        return Federation(FedAvg(local_epochs=1, dpsgd=dpsgd), layer, clients, rounds=1,
                          seed=0, privacy=ledger).run().privacy

    assert run(DPSGD(1.0, 1.0)).private
    plain = run(None)
    assert not plain.private
    assert [f for _, f in plain.unnoised] == ["weighted_params"]


def test_per_group_ledger_needs_one_delta_and_sums_budgets() -> None:
    both = PerGroup({"a": CentralDP(Plaintext(), epsilon=1.0, delta=1e-5, rounds=1)},
                    default=CentralDP(Plaintext(), epsilon=2.0, delta=1e-5, rounds=1))
    led = both.make_privacy_ledger()
    assert led.delta == 1e-5 and led.epsilon_budget == 3.0
    assert PerGroup({"a": Plaintext()}).make_privacy_ledger() is None
    shared = CentralDP(Plaintext(), epsilon=2.0, delta=1e-5, rounds=1)
    twice = PerGroup({"a": shared}, default=shared)
    assert twice.make_privacy_ledger().epsilon_budget == 2.0
    twice.plan_releases(3)  # 3 phases, each releasing through it once per group
    assert shared.releases == 6
    mixed = PerGroup({"a": CentralDP(Plaintext(), epsilon=1.0, delta=1e-5, rounds=1)},
                     default=CentralDP(Plaintext(), epsilon=1.0, delta=1e-6, rounds=1))
    with pytest.raises(PrivacyError, match="same delta"):
        mixed.make_privacy_ledger()


def test_layers_name_the_fields_they_leave_unnoised() -> None:
    spec = UploadSpec((Field("x", (3,), bound=Bound(l2=1.0), additive=True),
                       Field("e", (2,), additive=False, bound=Bound(l2=1.0), group="emb")),
                      max_records=2)
    assert set(Plaintext().unnoised_fields(spec)) == {"x", "e"}
    central = CentralDP(Plaintext(), noise_multiplier=1.0, public=["e"])
    assert list(central.unnoised_fields(spec)) == ["e"]
    assert "public" in central.unnoised_fields(spec)["e"]
    # a public field noised by an inner DP layer is noised
    assert CentralDP(LocalDP(Plaintext(), noise_multiplier=1.0), noise_multiplier=1.0,
                     public=["e"]).unnoised_fields(spec) == {}
    routed = PerGroup({"emb": Plaintext()}, default=CentralDP(Plaintext(), noise_multiplier=1.0))
    assert list(routed.unnoised_fields(spec)) == ["e"]
    assert "group 'emb'" in routed.unnoised_fields(spec)["e"]


def test_dp_layer_on_its_own_ledger_reports_public_fields() -> None:
    """Used outside a federation, a DP layer's own ledger is not private when a field is
    declared public."""
    spec = UploadSpec((Field("x", (4,), bound=Bound(l2=1.0), additive=True),
                       Field("n", (1,), dtype="int64", bound=Bound(linf=1.0), additive=True)), max_records=3)
    ups = {c: Upload.validate(spec, {"x": np.full(4, 0.1), "n": np.array([1])}, c, 1)
           for c in range(3)}
    layer = CentralDP(Plaintext(), noise_multiplier=2.0, delta=DELTA, rounds=1, public=["n"])
    layer.aggregate(ups, spec, RoundContext(0, "stats", 0))
    own = layer.ledger(RoundContext(0, "stats", 0))
    assert not own.private and own.unnoised == {("stats", "n"): own.unnoised[("stats", "n")]}


def test_record_format_per_field_and_total() -> None:
    led = PrivacyLedger(delta=DELTA)
    led.spend(GaussianEvent(noise_multiplier=2.0, phase="p", fields=("a",)))
    led.spend(GaussianEvent(noise_multiplier=2.0, phase="p", fields=("s",)))
    led.mark_unnoised("b", "p", "declared public")
    led.mark_unnoised("b", "p", "declared public")  # once per (phase, field)
    led.mark_not_private("noise seed fixed by the user (seed=1)", fields=("s",))
    t = Transcript()
    led.record_in(t)
    recs = {r["field"]: r for r in t.records}
    assert set(recs["a"]) == FIELD_KEYS and recs["a"]["private"] is True
    assert recs["a"]["epsilon"] == pytest.approx(_gaussian_epsilon(2.0))
    assert set(recs["b"]) == FIELD_KEYS | {"reason"} and recs["b"]["private"] is False
    assert recs["b"]["epsilon"] == math.inf and recs["b"]["phases"] == ["p"]
    assert "declared public" in recs["b"]["reason"] and "phase 'p'" in recs["b"]["reason"]
    # a seed scoped to one field makes that field (and the run) not private, not the others
    assert recs["s"]["private"] is False and "seed=1" in recs["s"]["reason"]
    assert math.isfinite(recs["s"]["epsilon"])
    total = recs[None]
    assert total["private"] is False and len(total["not_private_reasons"]) == 2
    assert total["unnoised"] == [{"phase": "p", "field": "b", "reason": "declared public"}]
    assert total["epsilon"] == pytest.approx(led.epsilon()) and total["n_events"] == 2


class _CensusThenTrain(AlgorithmBase):
    """Round 0 releases each client's record count (a phase of its own); later rounds
    upload a model trained with DP-SGD (its real planned event, covering ``w``)."""

    name = "census-then-train"
    personalized = False

    def setup(self, dataset, clients, seed) -> None:
        self.dpsgd = DPSGD(1.0, 1.0)

    def phases(self, round: int, rounds: int):
        from algorithms.base import Phase

        algo = self

        class Census(Phase):
            name = "census"

            def spec(self):
                return UploadSpec((Field("n", (1,), "int64", bound=Bound(linf=10**6), additive=True),))

            def client_step(self, client, broadcast):
                return {"n": np.array([client.n_records])}

            def server_step(self, aggregate) -> None:
                pass

        class Train(Phase):
            name = "train"

            def spec(self):
                return UploadSpec((Field("w", (2,), bound=Bound(linf=1.0), additive=True),))

            def client_step(self, client, broadcast):
                return {"w": np.zeros(2)}

            def server_step(self, aggregate) -> None:
                pass

            def privacy_events(self):
                return [algo.dpsgd.event(100, 10, 1)]

            def dp_covered_fields(self):
                return ("w",)

        return [Census()] if round == 0 else [Train()]

    def evaluate(self, dataset, clients) -> float:
        return 0.0

    def describe(self):
        return {"name": self.name}


def test_clear_release_before_dpsgd_starts_is_still_reported(three_clients):
    """The ledger appears only when DP-SGD first spends (round 1); the census phase of
    round 0 released n in the clear and must still make the run not private."""
    r = Federation(_CensusThenTrain(), Plaintext(), three_clients, rounds=2, seed=0).run()
    led = r.privacy
    assert led is not None and len(led.events) == 1
    assert not led.private
    assert set(led.unnoised) == {("census", "n")}
    assert led.field_guarantee("w")["private"] is True


def test_each_run_gets_a_fresh_ledger(digits_clients):
    """Running the same Federation twice does not book the first run's releases again."""
    from algorithms.fedlog import FedLog

    fed = Federation(FedLog(feature_dim=8), CentralDP(Plaintext(), noise_multiplier=2.0,
                                                      delta=DELTA), digits_clients, rounds=1)
    first = fed.run().privacy
    second = fed.run().privacy
    assert len(first.events) == len(second.events) == 1
    assert second.epsilon() == pytest.approx(_gaussian_epsilon(2.0))
