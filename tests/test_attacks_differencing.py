"""Differencing across cohorts: the attack recovers a round-invariant upload from exact sums
over cohorts that differ, fails (error at the noise scale) under DistributedDP, and
admissible() / secagg audit --threat flag exactly the exact, repeated, varying-cohort case."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

import numpy as np
import pytest

from algorithms.base import Aggregate, Algorithm, ClientState, Phase
from algorithms.fedavg import FedAvg
from secagg import Federation
from secagg.data import Dataset, dirichlet_split, load_dataset
from secagg.errors import ConfigurationError, InadmissibleField
from secagg.messages import Bound, Field, UploadSpec
from secagg.privacy.layers import DistributedDP, LocalDP
from secagg.secure_sum import SecureSum
from threat_models import admissible
from threat_models.attacks.differencing import difference, differencing
from threat_models.audit import threat_audit
from threat_models.differencing import determined, transcript_risks
from threat_models.threat import ThreatModel

ROUNDS, N = 12, 8


class LabelShares(Algorithm):
    """Each round, every sampled client uploads its label distribution (a statistics phase
    repeated: the value does not change between rounds, and the phase says so)."""

    name: ClassVar[str] = "label-shares"

    def setup(self, dataset: Dataset, clients: Sequence[ClientState], seed: int) -> None:
        self.n_classes = dataset.n_classes
        self.sums: list[np.ndarray] = []

    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        return [_SharesPhase(self)]

    def evaluate(self, dataset: Dataset, clients: Sequence[ClientState]) -> float:
        return 0.0


class _SharesPhase(Phase):
    name: ClassVar[str] = "stats"

    def __init__(self, algo: LabelShares) -> None:
        self.algo = algo

    def spec(self) -> UploadSpec:
        return UploadSpec((Field("shares", (self.algo.n_classes,), "float64", additive=True,
                                 bound=Bound(l2=1.0, adjacency="client")),))

    def client_step(self, client: ClientState,
                    broadcast: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {"shares": truth_of(client, self.algo.n_classes)}

    def server_step(self, aggregate: Aggregate) -> None:
        self.algo.sums.append(np.asarray(aggregate["shares"]))

    def round_invariant_fields(self) -> tuple[str, ...]:
        return ("shares",)


def truth_of(client: ClientState, n_classes: int) -> np.ndarray:
    y = np.asarray(client.data.y)
    return np.bincount(y, minlength=n_classes).astype(np.float64) / max(len(y), 1)


@pytest.fixture(scope="module")
def part():
    return dirichlet_split(load_dataset("digits"), n_clients=N, alpha=0.5, seed=0)


@pytest.fixture(scope="module")
def truth(part):
    return {i: truth_of(ClientState(cd), part.dataset.n_classes)
            for i, cd in enumerate(part)}


def _run(part, layer, **kw):
    algo = LabelShares()
    res = Federation(algo, layer, part, rounds=ROUNDS, fraction=0.5, seed=3,
                     include_values=True, **kw).run()
    return res, _SharesPhase(algo).spec()


# --- the linear algebra ------------------------------------------------------------------


def test_two_cohorts_differing_by_one_client_reveal_it() -> None:
    x = {0: np.array([1.0, 2.0]), 1: np.array([5.0, -1.0]), 2: np.array([0.5, 0.25])}
    cohorts = [[0, 1, 2], [0, 2]]
    sums = [sum(x[c] for c in k) for k in cohorts]
    res = difference(cohorts, sums)
    assert set(res.estimates) == {1}  # 0 and 2 always appear together: not separable
    assert np.allclose(res.estimates[1], x[1], rtol=0, atol=1e-12)
    assert res.amplification[1] == pytest.approx(np.sqrt(2))


def test_swapped_cohorts_alone_reveal_nobody_but_more_samplings_do() -> None:
    assert determined([[0, 1], [1, 2]]) == {}  # a difference of two clients only
    got = determined([[0, 1], [1, 2], [0, 2]])
    assert set(got) == {0, 1, 2}
    with pytest.raises(ConfigurationError):
        difference([[0]], [])


# --- the attack on real runs ---------------------------------------------------------------


@pytest.fixture(scope="module")
def secure_run(part):
    return _run(part, SecureSum(threshold=0.6))


@pytest.fixture(scope="module")
def dp_run(part):
    layer = DistributedDP(SecureSum(threshold=0.6), noise_multiplier=1.0, delta=1e-5,
                          adjacency="client", seed=0)
    return _run(part, layer)


def test_attack_recovers_uploads_in_the_clear_under_secure_sum(secure_run, truth) -> None:
    res, spec = secure_run
    out = differencing(res.transcript, "server", "stats", "shares", spec=spec)
    assert out.basis == "differenced exact sums"
    assert len(out.estimates) >= N // 2, sorted(out.estimates)  # most clients, exactly
    score = out.score({c: truth[c] for c in out.estimates},
                      correct=lambda e, t: bool(np.max(np.abs(e - t)) < 1e-6))
    assert score["success_rate"] == 1.0 and score["max_error"] < 1e-6


def test_attack_fails_under_distributed_dp(dp_run, truth) -> None:
    res, spec = dp_run
    out = differencing(res.transcript, "server", "stats", "shares", spec=spec)
    assert out.basis == "differenced noised sums"
    assert out.estimates
    # error of each estimate in units of its predicted noise std: ||w|| x the sum's std
    # (noise multiplier 1, clip 1, shares sized for the fewest survivors: std >= 1)
    z = [np.sqrt(np.mean((out.estimates[c] - truth[c]) ** 2)) / out.amplification[c]
         for c in out.estimates]
    assert 0.5 < float(np.median(z)) < 3.0
    score = out.score({c: truth[c] for c in out.estimates},
                      correct=lambda e, t: bool(np.max(np.abs(e - t)) < 1e-3))
    assert score["success_rate"] == 0.0 and score["max_error"] > 0.5


# --- the rule: admissible() and secagg audit --threat --------------------------------------


def _setup(algo, part):
    algo.setup(part.dataset, [ClientState(cd) for cd in part], 0)
    return algo


def _verdict(verdicts, field):
    return next(v for v in verdicts if v.field == field)


def test_admissible_flags_a_repeated_exact_sum_of_a_round_invariant_field(part) -> None:
    algo = _setup(LabelShares(), part)
    flagged = _verdict(admissible(algo, SecureSum(), "server", rounds=5, fraction=0.5),
                       "shares")
    assert not flagged.ok and "differenc" in flagged.reads and "round-invariant" in \
        flagged.reason
    # same cohort every round, a single release, noise before the server, no server
    assert _verdict(admissible(algo, SecureSum(), "server", rounds=5), "shares").ok
    assert _verdict(admissible(algo, SecureSum(), "server", rounds=5, dropouts=True),
                    "shares").reason.count("dropouts") == 1
    assert _verdict(admissible(algo, SecureSum(), "server", rounds=1, fraction=0.5),
                    "shares").ok
    for layer in (DistributedDP(SecureSum(), epsilon=1.0, delta=1e-5, adjacency="client"),
                  LocalDP(SecureSum(), epsilon=1.0, delta=1e-5, adjacency="client")):
        assert _verdict(admissible(algo, layer, "server", rounds=5, fraction=0.5),
                        "shares").ok
    assert _verdict(admissible(algo, SecureSum(), "clients:1", rounds=5, fraction=0.5),
                    "shares").ok


def test_fedavg_record_count_is_round_invariant(part) -> None:
    algo = _setup(FedAvg(feature_dim=8), part)
    v = admissible(algo, SecureSum(), "server", rounds=3, fraction=0.5)
    assert not _verdict(v, "n").ok and _verdict(v, "weighted_params").ok
    clipped = _setup(FedAvg(feature_dim=8, clip=1.0), part)
    assert all(x.ok for x in admissible(clipped, SecureSum(), "server", rounds=3,
                                        fraction=0.5))


def test_federation_refuses_it_under_a_threat(part) -> None:
    with pytest.raises(InadmissibleField, match="differenc"):
        Federation(LabelShares(), SecureSum(threshold=0.6), part, rounds=3, fraction=0.5,
                   threat=ThreatModel()).run()


def test_threat_audit_flags_the_secure_sum_run_not_the_dp_run(secure_run, dp_run) -> None:
    res, _ = secure_run
    assert res.transcript.records[0]["round_invariant"] == {"stats": ["shares"]}
    risks = transcript_risks(res.transcript, "server")
    assert list(risks) == [("stats", "shares")] and len(risks["stats", "shares"].clients) >= 4
    text, leaks = threat_audit(res.transcript, "server")
    assert leaks and "READABLE by differencing" in text
    text, leaks = threat_audit(dp_run[0].transcript, "server")
    assert "by differencing" not in text and not transcript_risks(dp_run[0].transcript,
                                                                  "server")
