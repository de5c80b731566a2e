"""The additivity check: catches a mean declared additive; passes sums; spots training."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from algorithms.base import Aggregate, Algorithm, ClientState, Phase
from algorithms.fedavg import FedAvg
from algorithms.fedlog import FedLog
from algorithms.gmm import GMM
from algorithms.moments import one_hot, weighted_moments
from secagg import Federation
from secagg.cli import main
from secagg.data import dirichlet_split, load_dataset
from secagg.errors import ConfigurationError
from secagg.messages import Bound, Field, UploadSpec
from secagg.secure_sum import SecureSum
from threat_models.additivity import assert_additive, check_additivity


class ClassMeans(Algorithm):
    """The bug of the issue: per-client class means declared additive. With ``as_sums``
    it uploads the rewrite instead: per-class counts and sums."""

    name = "class-means"

    def __init__(self, as_sums: bool = False) -> None:
        self.as_sums = as_sums
        self.means: np.ndarray | None = None

    def setup(self, dataset, clients, seed):
        self.c, self.d = dataset.n_classes, int(np.prod(dataset.input_shape))

    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        return [_MeansPhase(self)]

    def evaluate(self, dataset, clients) -> float:
        return 0.0


class _MeansPhase(Phase):
    name = "means"

    def __init__(self, algo: ClassMeans) -> None:
        self.algo = algo

    def spec(self) -> UploadSpec:
        a, b = self.algo, Bound(linf=1.0)
        if a.as_sums:
            return UploadSpec((Field("counts", (a.c,), additive=True, bound=b),
                               Field("sums", (a.c, a.d), additive=True, bound=b)))
        return UploadSpec((Field("means", (a.c, a.d), additive=True,
                                 bound=Bound(linf=1.0, adjacency="client")),))

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]):
        n, s, _ = weighted_moments(client.data.x, one_hot(client.data.y, self.algo.c))
        if self.algo.as_sums:
            return {"counts": n, "sums": s}
        return {"means": s / np.maximum(n, 1)[:, None]}

    def server_step(self, aggregate: Aggregate) -> None:
        if self.algo.as_sums:
            self.algo.means = aggregate["sums"] / np.maximum(aggregate["counts"], 1)[:, None]
        else:
            self.algo.means = aggregate["means"]  # what a user would (wrongly) take


@pytest.fixture(scope="module")
def part():
    return dirichlet_split(load_dataset("digits"), n_clients=4, alpha=0.5, seed=0)


def test_mean_field_is_caught_and_silently_wrong_under_secure_sum(part):
    (check,) = check_additivity(ClassMeans(), part)
    assert check.field == "means" and check.status == "NOT additive" and check.error > 0.1
    with pytest.raises(ConfigurationError, match="means: NOT additive"):
        assert_additive(ClassMeans(), part)
    # what the check prevents: the summed "mean" is far from the pooled class mean
    algo = ClassMeans()
    Federation(algo, SecureSum(), part, rounds=1).run()
    x = np.concatenate([c.x for c in part])
    y = np.concatenate([c.y for c in part])
    pooled = np.stack([x[y == c].mean(0) for c in range(10)])
    assert np.max(np.abs(algo.means - pooled)) > 0.5


def test_rewrite_as_sums_passes_and_recovers_the_pooled_mean(part):
    assert all(c.status == "additive" for c in assert_additive(ClassMeans(as_sums=True), part))
    algo = ClassMeans(as_sums=True)
    Federation(algo, SecureSum(), part, rounds=1).run()
    x = np.concatenate([c.x for c in part])
    y = np.concatenate([c.y for c in part])
    pooled = np.stack([x[y == c].mean(0) for c in range(10)])
    assert np.max(np.abs(algo.means - pooled)) < 1e-6


def test_shipped_statistics_are_additive(part):
    got = {(c.phase, c.field): c.status for c in assert_additive(FedLog(feature_dim=8), part,
                                                                     rounds=1)}
    assert got == {("stats", "stats"): "additive"}
    got = {(c.phase, c.field): c.status for c in assert_additive(GMM(n_components=3), part)}
    assert set(got.values()) == {"additive"} and len(got) == 6


def test_model_averaging_is_reported_as_training(part):
    got = {c.field: c.status for c in check_additivity(FedAvg(local_epochs=1), part,
                                                       clients=[0])}
    assert got == {"n": "additive", "weighted_params": "training"}


def test_cli_check(capsys):
    assert main(["check", "tests.test_additivity:ClassMeans", "--clients", "4"]) == 1
    out = capsys.readouterr().out
    assert "means/means: NOT additive" in out
    assert main(["check", "algorithms.gmm:GMM", "--clients", "4"]) == 0
    assert "em/Q: additive" in capsys.readouterr().out
