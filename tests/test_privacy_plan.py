"""The privacy plan before round 0 (secagg.privacy.plan, secagg run --dry-run): its noise
is the noise the run then adds, and it warns, with the fix, when the noise swamps any sum
the cohort could upload."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from algorithms.fedavg import FedAvg
from algorithms.fedlog import FedLog
from secagg import CentralDP, DistributedDP, Federation, LocalDP, Plaintext, SecureSum
from secagg.data import dirichlet_split, load_dataset
from secagg.privacy.plan import NoiseSwampsSignal, swamped

LAYERS = {
    "central-dp": lambda: CentralDP(Plaintext(), epsilon=4.0, adjacency="client"),
    "local-dp": lambda: LocalDP(Plaintext(), epsilon=4.0, adjacency="client"),
    "distributed-dp": lambda: DistributedDP(SecureSum(threshold=0.7), epsilon=4.0,
                                            adjacency="client"),
}


@pytest.fixture(scope="module")
def part():
    return dirichlet_split(load_dataset("digits"), 6, 0.5, seed=0)


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_the_planned_noise_is_the_noise_the_run_adds(name, part):
    plan = Federation(FedAvg(local_epochs=1, feature_dim=8, clip=1.0), LAYERS[name](), part,
                      rounds=2, seed=0).plan()
    assert [p.round for p in plan] == [0, 1] and {p.field for p in plan} == {"update"}
    layer = LAYERS[name]()
    seen = []
    res = Federation(FedAvg(local_epochs=1, feature_dim=8, clip=1.0), layer, part,
                     rounds=2, seed=0).run(
        on_aggregate=lambda r, p, agg: seen.append(agg.notes["dp"]))
    assert res.failure() is None and len(seen) == 2
    for p, notes in zip(plan, seen, strict=True):
        real = notes.get("sum_sigma", {}).get("update", notes["fields"]["update"]["sigma"])
        assert p.sigma == pytest.approx(real, rel=1e-9)
    # the plan composes the layer's planning event: exact for the Gaussian layers, an upper
    # bound for DistributedDP's integer noise (planned at the fewest survivors)
    spent = res.privacy.epsilon(1e-5)
    assert spent <= plan[-1].epsilon_after_round + 1e-9
    if name != "distributed-dp":
        assert plan[-1].epsilon_after_round == pytest.approx(spent, rel=2e-3)
    assert json.loads(json.dumps(plan[0].to_dict()))["field"] == "update"


def test_it_warns_for_client_level_statistics_over_ten_clients_and_not_for_a_healthy_run():
    part = dirichlet_split(load_dataset("digits"), 10, 0.5, seed=0, local_test_fraction=0.2)
    bad = Federation(FedLog(feature_dim=8, local_epochs=1),
                     CentralDP(Plaintext(), epsilon=2.0, adjacency="client"), part,
                     rounds=2, seed=0, max_records=1000)
    lines = swamped(bad.plan())
    assert len(lines) == 1 and "swamps the signal" in lines[0] and "10 clients" in lines[0]
    assert "record-level adjacency" in lines[0] and "clients per round" in lines[0]
    with pytest.warns(NoiseSwampsSignal, match="swamps the signal"):
        bad.run()
    good = Federation(FedLog(feature_dim=8, local_epochs=1, release_rounds=1),
                      CentralDP(Plaintext(), epsilon=1.0), part, rounds=2, seed=0)
    assert swamped(good.plan()) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", NoiseSwampsSignal)
        good.run()


def test_cli_dry_run_prints_the_plan_and_writes_nothing(tmp_path, capsys):
    from secagg.cli import main

    out = tmp_path / "never"
    code = main(["run", "--layer", "central-dp", "--adjacency", "client", "--max-records",
                 "1000", "--epsilon", "2", "--rounds", "3", "--dry-run", "--out", str(out)])
    assert code == 0 and not out.exists()
    text = capsys.readouterr()
    assert "eps after round" in text.out and len(text.out.strip().splitlines()) == 4
    assert "warning:" in text.err and "swamps the signal" in text.err
    eps = [float(line.split()[-1]) for line in text.out.strip().splitlines()[1:]]
    assert eps == sorted(eps) and np.isclose(eps[-1], 2.0, rtol=1e-2)
