"""The engine with FedAvg and FedLog under the Plaintext layer."""

import numpy as np
import pytest

from algorithms.fedavg import FedAvg
from algorithms.fedlog import FedLog, class_statistics
from secagg.audit import audit
from secagg.cli import main
from secagg.dropouts import DropoutModel
from secagg.errors import ConfigurationError, UploadError
from secagg.federation import ClientState, Federation
from secagg.layers import Plaintext, RoundContext
from secagg.messages import Upload


def test_fedavg_aggregate_is_the_weighted_mean(digits_clients):
    algo = FedAvg(local_epochs=1)
    states = [ClientState(c) for c in digits_clients]
    algo.setup(digits_clients.dataset, states, seed=0)
    phase = algo.phases(0, 1)[0]
    spec = phase.spec()
    bcast = phase.broadcast()
    uploads = {s.id: Upload.validate(spec, phase.client_step(s, bcast), s.id, s.n_records)
               for s in states}
    agg = Plaintext().aggregate(uploads, spec, RoundContext(0, phase.name, 0))
    phase.server_step(agg)
    # central computation from the clients' trained models (trained again: the same
    # seeded local training), in float64
    ws = [algo.local_update(s, bcast["params"], 0).astype(np.float64) for s in states]
    ns = [s.n_records for s in states]
    central = sum(n * w for n, w in zip(ns, ws)) / sum(ns)
    assert not np.allclose(central, bcast["params"], atol=1e-3)  # training moved the model
    np.testing.assert_allclose(algo.params, central, atol=1e-6, rtol=0)


def test_class_statistics_match_a_loop():
    rng = np.random.default_rng(1)
    phi, y = rng.normal(size=(30, 4)), rng.integers(0, 3, 30)
    s = class_statistics(phi, y, 3)
    for c in range(3):
        want = np.zeros(5)
        for i in range(30):
            if y[i] == c:
                want += np.concatenate([[1.0], phi[i]])
        np.testing.assert_allclose(s[c], want)


def test_runs_are_deterministic_and_seed_sensitive(digits_clients):
    def run(seed):
        r = Federation(FedAvg(local_epochs=1), Plaintext(), digits_clients, rounds=2,
                       fraction=0.5, dropout=0.2, seed=seed).run()
        return r.history, [(x.sender, x.wire_bytes) for x in r.costs.rows if x.direction == "up"]
    a, b, c = run(0), run(0), run(1)
    assert a == b
    assert a != c


def test_dropouts_remove_contributors_and_are_seeded():
    d = DropoutModel(0.5, seed=3).at(2, "train")
    s1 = d.survivors("upload", list(range(100)))
    assert 30 < len(s1) < 70
    assert s1 == DropoutModel(0.5, seed=3).at(2, "train").survivors("upload", list(range(100)))
    assert s1 != DropoutModel(0.5, seed=4).at(2, "train").survivors("upload", list(range(100)))
    with pytest.raises(ValueError):
        DropoutModel(1.0)


def test_fedlog_learns_on_digits_and_is_personalized(digits_clients):
    r = Federation(FedLog(), Plaintext(), digits_clients, rounds=4, seed=0).run()
    assert r.accuracy_kind == "mean local test"
    assert r.accuracy >= 0.85, r.history
    up = r.costs.total("up")
    # each upload: C x (d+1) float64 stats (counts in column 0, so no separate n), and
    # with each its client's signed statement (stage "attest", no plaintext bytes)
    assert up["messages"] == 40 + 40
    assert sum(1 for x in r.costs.rows if x.stage == "upload") == 40
    assert up["plaintext_bytes"] == 40 * (10 * 65 * 8)


def test_fedlog_solves_with_the_record_count_from_the_count_column(digits_clients):
    """FedLog uploads no separate n: the server's N is nu + the sum of the counts column,
    which equals the number of training records, and the head is the exact solve."""
    from algorithms.fedlog_solver import solve_map

    seen = []

    class Recording(FedLog):
        def phases(self, round, rounds):
            (p,) = super().phases(round, rounds)
            step = p.server_step
            p.server_step = lambda agg: (seen.append(np.array(agg["stats"])), step(agg))[1]
            return [p]

    algo = Recording(local_epochs=1, nu=0.5)
    assert [f.name for f in algo.spec().fields] == ["stats"]
    Federation(algo, Plaintext(), digits_clients, rounds=1, seed=0).run()
    (stats,) = seen
    total = sum(len(c.y) for c in digits_clients)
    assert float(stats[:, 0].sum()) == total
    np.testing.assert_allclose(algo.eta, solve_map(stats, 0.5 + total).eta, rtol=0, atol=0)


def test_engine_rejects_bad_configuration(digits_clients):
    with pytest.raises(ConfigurationError):
        Federation(FedAvg(), Plaintext(), digits_clients, rounds=0)
    with pytest.raises(ConfigurationError):
        Federation(FedAvg(), Plaintext(), digits_clients, fraction=0)
    with pytest.raises(ConfigurationError):
        Federation(FedAvg(), "plaintext", digits_clients)  # type: ignore[arg-type]


class _Leaky(FedAvg):
    """FedAvg whose clients over-report n (10 per record), breaking the field's bound."""

    def phases(self, round, rounds):
        (p,) = super().phases(round, rounds)
        orig = p.client_step
        p.client_step = lambda c, b: {**orig(c, b), "n": np.array([10 * c.n_records])}
        return [p]


def test_out_of_bound_upload_raises_or_is_clipped(digits_clients):
    with pytest.raises(UploadError, match="field 'n'"):
        Federation(_Leaky(local_epochs=1), Plaintext(), digits_clients, rounds=1).run()
    r = Federation(_Leaky(local_epochs=1), Plaintext(), digits_clients, rounds=1,
                   on_violation="clip").run()
    assert r.clips == {"n": 10}


def test_plaintext_audit_shows_every_field_in_the_clear(digits_clients, tmp_path, capsys):
    r = Federation(FedLog(local_epochs=1), Plaintext(), digits_clients, rounds=1, seed=0).run()
    paths = r.save(tmp_path)
    rep = audit(r.transcript)
    assert {e["field"] for e in rep["fields"]} == {"stats"}
    for e in rep["fields"]:
        assert e["server_saw"] == {"clear upload": 10}
        assert e["clear_individual_uploads"] == 10 and len(e["senders"]) == 10
    assert main(["audit", str(paths["transcript"])]) == 0
    out = capsys.readouterr().out
    assert out.count("server saw   : clear upload x10") == 1
    assert "YES - the server read individual uploads in the clear" in out


def test_per_round_dropout_rate_is_spread_over_the_layers_stages(digits_clients):
    """A per-round rate drops that fraction of clients whatever the number of stages; the
    per-stage rate compounds over SecureSum's four stages."""
    from secagg.layers import PerGroup
    from secagg.privacy import CentralDP
    from secagg.secure_sum import SecureSum

    stages = SecureSum().dropout_stages()
    assert stages == ("advertise", "share", "masked-input", "consistency", "unmask")
    clients = list(range(20_000))

    def dropped(model):
        live = clients
        for s in stages:
            live = model.survivors(s, live)
        return 1 - len(live) / len(clients)

    per_round = DropoutModel(0.1, seed=1, per="round").for_stages(stages).at(0, "p")
    per_stage = DropoutModel(0.1, seed=1).for_stages(stages).at(0, "p")
    assert abs(dropped(per_round) - 0.1) < 0.01
    assert abs(dropped(per_stage) - (1 - 0.9**len(stages))) < 0.01
    # The engine takes a float as a per-round rate over its layer's stages.
    fed = Federation(FedAvg(), CentralDP(SecureSum(), noise_multiplier=1.0, delta=1e-5),
                     digits_clients, dropout=0.1)
    assert fed.dropouts.per == "round" and fed.dropouts.stages == stages
    assert abs(fed.dropouts.probability("share") - (1 - 0.9 ** (1 / len(stages)))) < 1e-12
    assert Federation(FedAvg(), Plaintext(), digits_clients, dropout=0.1).dropouts \
        .probability("upload") == pytest.approx(0.1)
    assert PerGroup({"a": Plaintext(), "b": SecureSum()}).dropout_stages() == ("upload", *stages)
    with pytest.raises(ValueError):
        DropoutModel({"upload": 0.1}, per="round")


def test_participation_records_who_made_it_into_each_aggregate(digits_clients):
    r = Federation(FedLog(local_epochs=1), Plaintext(), digits_clients, rounds=3,
                   dropout=0.3, seed=2).run()
    assert [(p[0], p[1], p[3]) for p in r.participation] == [(i, "stats", 10) for i in range(3)]
    uploads = [x for x in r.costs.rows if x.stage == "upload"]
    for rnd, _, got, _ in r.participation:
        assert got == sum(1 for x in uploads if x.round == rnd)
    got = sum(p[2] for p in r.participation)
    assert 0 < got < 30  # some dropped (30% per round), and the table says how many
    assert f"{got} / 30" in r.table()
    full = Federation(FedLog(local_epochs=1), Plaintext(), digits_clients, rounds=1).run()
    assert full.participation == [(0, "stats", 10, 10)]
    assert "uploads aggregated" not in full.table()
