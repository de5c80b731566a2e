"""Client-level DP for the algorithms that train a model: DP-FedAvg's clipped updates,
adaptive clipping, server optimizers, the fixed denominator and the measurements."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.ccvr import CCVR
from algorithms.fedavg import FedAvg
from algorithms.fedprox import FedProx
from algorithms.feduv import FedUV
from algorithms.server_opt import OptimizerState, ServerOptimizer
from algorithms.spherefed import SphereFed
from algorithms.turbosvm import TurboSVM
from secagg import CentralDP, Federation, Plaintext
from secagg.data import dirichlet_split, iid_split, load_dataset
from secagg.errors import ConfigurationError, UploadError
from secagg.federation import ClientState
from secagg.layers.base import Aggregate
from secagg.messages import Upload
from secagg.privacy.clipping import AdaptiveClip, FixedClip, clip_l2, parse_clip

TRAINING = {
    "fedavg": lambda **k: FedAvg(local_epochs=1, feature_dim=16, **k),
    "fedprox": lambda **k: FedProx(local_epochs=1, feature_dim=16, **k),
    "feduv": lambda **k: FedUV(local_epochs=1, feature_dim=16, **k),
    "spherefed": lambda **k: SphereFed(local_epochs=1, feature_dim=16, calibrate=False, **k),
    "ccvr": lambda **k: CCVR(local_epochs=1, feature_dim=16, calibrate=False, **k),
    "turbosvm": lambda **k: TurboSVM(local_epochs=1, feature_dim=16, **k),
}


@pytest.fixture(scope="module")
def part():
    return dirichlet_split(load_dataset("digits"), 6, 0.5, seed=0)


# -- the clip itself -----------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e30, 1e30, allow_nan=False, allow_infinity=False), min_size=1,
                max_size=64),
       st.floats(1e-6, 1e6), st.sampled_from(["float32", "float64"]))
def test_clip_l2_never_exceeds_its_bound(values, bound, dtype):
    out, norm, was = clip_l2(np.array(values), bound, dtype)
    assert out.dtype == np.dtype(dtype)
    assert float(np.linalg.norm(out.astype(np.float64))) <= bound
    assert was == (norm > bound)
    if not was and np.isfinite(np.array(values, dtype=dtype)).all():
        # within the bound: unchanged, up to the one rounding step a float32 cast may need
        np.testing.assert_allclose(out, np.array(values, dtype=dtype), rtol=3e-6)


def test_clip_l2_refuses_nan_and_a_bad_bound():
    with pytest.raises(ConfigurationError):
        clip_l2(np.array([1.0, np.nan]), 1.0)
    with pytest.raises(ConfigurationError):
        clip_l2(np.ones(3), 0.0)


def test_parse_clip_forms():
    assert parse_clip(None) is None
    assert parse_clip("1.5") == FixedClip(1.5)
    assert parse_clip(2) == FixedClip(2.0)
    assert parse_clip("adaptive") == AdaptiveClip()
    assert parse_clip("adaptive:0.7").quantile == 0.7
    for bad in ("adaptive:1.5", "adaptive:x", "zero", "-1", True):
        with pytest.raises(ConfigurationError):
            parse_clip(bad)


# -- every training algorithm's upload holds the clip ---------------------------------------

@pytest.mark.parametrize("name", sorted(TRAINING))
@pytest.mark.parametrize("clip", [0.5, "adaptive"])
def test_every_training_algorithms_upload_holds_the_clip(name, clip, part, monkeypatch):
    """Local training replaced by a jump of norm 1e6 in a random direction: the upload's
    update still has L2 norm <= the broadcast clip, and the phase's spec declares it as a
    client-level bound (so its sensitivity is the clip, with no max_records)."""
    algo = TRAINING[name](clip=clip)
    states = [ClientState(cd) for cd in part]
    algo.setup(part.dataset, states, 0)
    rng = np.random.default_rng(1)
    import algorithms.fedavg as fedavg_mod
    import algorithms.turbosvm as turbo_mod

    def jump(model, *a, **k):
        from algorithms.models import get_flat, set_flat
        params = list(model.body.parameters()) if name == "turbosvm" else None
        plist = params or list(model.parameters())
        flat = get_flat(plist)
        set_flat(plist, flat + rng.normal(size=flat.size) * 1e6 / math.sqrt(flat.size))
        return 0.0

    monkeypatch.setattr(fedavg_mod, "train_local", jump)
    monkeypatch.setattr(turbo_mod, "train_local", jump)
    phase = algo.phases(0, 1)[0]
    spec = phase.spec()
    bound = spec["update"].bound
    assert bound.adjacency == "client" and bound.l2 == algo.clip_value
    bcast = phase.broadcast()
    for st_ in states:
        values = phase.client_step(st_, bcast)
        assert np.linalg.norm(values["update"].astype(np.float64)) <= algo.clip_value
        Upload.validate(phase.spec(), values, st_.id, st_.n_records)  # within the spec
    assert algo.round_clipped == len(states)


def test_an_unclipped_update_is_refused_by_the_spec(part):
    """The check above can fail: an update that skipped the clip breaks the declared
    client-level bound and is refused (this is what the property test guards)."""
    algo = FedAvg(local_epochs=1, feature_dim=16, clip=0.5)
    algo.setup(part.dataset, [ClientState(cd) for cd in part], 0)
    spec = algo.phases(0, 1)[0].spec()
    raw = np.full(algo.params.size, 1.0, dtype=np.float32)  # norm >> 0.5
    with pytest.raises(UploadError, match="L2 norm"):
        Upload.validate(spec, {"update": raw}, 0, 10)


def test_no_clip_keeps_the_classic_upload_bit_for_bit(part):
    """Non-DP runs are unchanged: FedAvg without clip uploads n and n * theta, and the new
    server-optimizer code path (sgd at lr 1) gives the plain weighted mean."""
    a = Federation(FedAvg(local_epochs=1, feature_dim=16), Plaintext(), part, rounds=2,
                   seed=3).run()
    b = Federation(FedAvg(local_epochs=1, feature_dim=16, server_opt="sgd", server_lr=1.0),
                   Plaintext(), part, rounds=2, seed=3).run()
    assert a.history == b.history
    algo = FedAvg(local_epochs=1, feature_dim=16)
    algo.setup(part.dataset, [ClientState(cd) for cd in part], 0)
    assert algo.phases(0, 1)[0].spec().names == ("n", "weighted_params")
    assert a.measurements == []


# -- server optimizers ------------------------------------------------------------------------

def test_fedadam_on_a_known_update_equals_the_formula():
    opt = ServerOptimizer("adam", lr=0.1, beta1=0.9, beta2=0.99, tau=1e-3)
    x0 = np.array([1.0, -2.0, 0.5])
    d1, d2 = np.array([0.2, -0.4, 0.0]), np.array([-0.1, 0.3, 0.05])
    s, x1 = opt.step(OptimizerState(), x0, d1)
    m1 = 0.1 * d1
    v1 = 0.01 * d1 ** 2
    np.testing.assert_allclose(x1, x0 + 0.1 * m1 / (np.sqrt(v1) + 1e-3), rtol=1e-12)
    s, x2 = opt.step(s, x1, d2)
    m2 = 0.9 * m1 + 0.1 * d2
    v2 = 0.99 * v1 + 0.01 * d2 ** 2
    np.testing.assert_allclose(x2, x1 + 0.1 * m2 / (np.sqrt(v2) + 1e-3), rtol=1e-12)


def test_fedavgm_and_server_sgd_formulas():
    x0 = np.zeros(2)
    s, x1 = ServerOptimizer("momentum", lr=0.5, beta1=0.9).step(OptimizerState(), x0,
                                                                np.array([1.0, 2.0]))
    s, x2 = ServerOptimizer("momentum", lr=0.5, beta1=0.9).step(s, x1, np.array([1.0, 0.0]))
    np.testing.assert_allclose(x2, x1 + 0.5 * (0.9 * np.array([1.0, 2.0]) + [1.0, 0.0]))
    _, y = ServerOptimizer("sgd", lr=2.0).step(OptimizerState(), x0, np.array([1.0, -1.0]))
    np.testing.assert_allclose(y, [2.0, -2.0])
    with pytest.raises(ConfigurationError):
        ServerOptimizer("rmsprop")
    with pytest.raises(ConfigurationError):
        ServerOptimizer("sgd", lr=0)


# -- the fixed denominator --------------------------------------------------------------------

def test_the_mean_update_divides_by_the_cohort_not_the_survivors(part):
    """30% of a cohort of 10 dropped: the noised sum is still divided by 10, so the noise
    on the mean keeps its scale (dividing by the 7 survivors would raise it by 10/7)."""
    algo = FedAvg(local_epochs=1, feature_dim=16, clip=1.0)
    algo.setup(part.dataset, [ClientState(cd) for cd in part], 0)
    x0 = algo.params.copy()
    total = np.full(x0.size, 7.0)
    agg = Aggregate("train", 0, {"update": total}, {}, tuple(range(7)), cohort=10)
    new = algo.apply_update(x0, agg)
    np.testing.assert_allclose(new.astype(np.float64) - x0, 0.7, rtol=1e-6)


# -- adaptive clipping ------------------------------------------------------------------------

class _SyntheticNorms(FedAvg):
    """No training: client k's update is a fixed direction times a norm drawn once from a
    log-normal distribution (the synthetic norm distribution)."""

    def __init__(self, norms, **kw):
        super().__init__(local_epochs=1, feature_dim=8, **kw)
        self.norms = norms

    def local_update(self, client, params, round):
        d = np.zeros(params.size)
        d[client.id % params.size] = self.norms[client.id]
        return params + d


def test_adaptive_clipping_converges_to_the_target_quantile_and_its_count_is_on_the_ledger():
    """C follows the 0.7 quantile of a log-normal norm distribution to within 0.05; the
    noised count is released with the update through the same layer, and the ledger's
    epsilon is dp-accounting's composition of both fields' Gaussian noise (RDP, exact)."""
    from secagg.privacy.accountant import PrivacyLedger

    data = load_dataset("digits")
    n, rounds, q, z = 100, 40, 0.7, 0.5
    part = iid_split(data, n, seed=0)
    norms = np.random.default_rng(0).lognormal(mean=0.0, sigma=1.0, size=n)
    policy = AdaptiveClip(quantile=q, initial_clip=0.05, lr=0.5)
    layer = CentralDP(Plaintext(), noise_multiplier=z, delta=1e-5, adjacency="client")
    ledger = PrivacyLedger(delta=1e-5, accountant="rdp")
    res = Federation(_SyntheticNorms(norms, clip=policy), layer, part, rounds=rounds,
                     seed=0, privacy=ledger).run()
    final = res.measurements[-1]["next_clip"]
    assert abs(float(np.mean(norms <= final)) - q) <= 0.05
    assert res.measurements[0]["clip"] == 0.05 and final > 1.0  # it moved, up to the quantile
    # the noised count is released with the update, through the same layer, on the ledger
    assert all(set(e.fields) == {"update", "unclipped"} for e in ledger.events)
    assert len(ledger.events) == rounds and ledger.private
    # the count has its small share of the budget: much more noise than the update's
    w = policy.count_weight
    z_update, z_count = z * math.sqrt(1 + w), z * math.sqrt((1 + w) / w)
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(z_update), rounds)
    acc.compose(dp_accounting.GaussianDpEvent(z_count), rounds)
    assert ledger.epsilon(1e-5) == pytest.approx(acc.get_epsilon(1e-5), rel=1e-6)


def test_measurements_report_the_clip_and_the_clipped_clients(part):
    res = Federation(FedAvg(local_epochs=1, feature_dim=16, clip=1e-4), Plaintext(), part,
                     rounds=2, seed=0).run()
    assert [m["round"] for m in res.measurements] == [0, 1]
    for m in res.measurements:
        assert m["phase"] == "train" and m["clip"] == 1e-4
        assert m["clipped"] == m["clients"] == len(part)  # every update is above 1e-4
    assert res.to_dict()["measurements"] == res.measurements


# -- the command line ---------------------------------------------------------------------------

def test_cli_runs_client_level_dp_fedavg_and_reports_it_private(tmp_path, capsys):
    """The issue's command (with fast settings): DistributedDP at client level with a clip
    of 1 runs, and the run is reported private with its epsilon."""
    import json

    from secagg.cli import main

    out = tmp_path / "run"
    code = main(["run", "--algorithm", "fedavg", "--layer", "distributed-dp", "--adjacency",
                 "client", "--clip", "1.0", "--epsilon", "4", "--rounds", "2", "--clients",
                 "6", "--local-epochs", "1", "--quiet", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    holds = [ln for ln in text.splitlines() if ln.startswith("DP guarantee holds")]
    assert holds and holds[0].split()[-1] == "yes"
    result = json.loads((out / "result.json").read_text())
    assert result["privacy"]["private"] is True and result["privacy"]["epsilon"] <= 4.0
    assert result["algorithm"]["clip"] == {"kind": "fixed", "clip": 1.0}
    assert [m["clip"] for m in result["measurements"]] == [1.0, 1.0]


@pytest.mark.parametrize("argv, words", [
    (["--clip", "sometimes"], "adaptive"),
    (["--layer", "plaintext", "--adjacency", "client"], "DP layer"),
    (["--layer", "local-dp", "--epsilon", "1", "--dp-ftrl"], "central-dp"),
    (["--algorithm", "fedlog", "--clip", "1"], "no --clip option"),
    (["--algorithm", "turbosvm", "--server-lr", "0.5"], "server_lr"),
    (["--server-lr", "-1"], "--server-lr"),
])
def test_cli_refuses_bad_client_dp_options_before_any_output(argv, words, tmp_path, capsys):
    from secagg.cli import main

    out = tmp_path / "never"
    assert main(["run", "--quiet", "--out", str(out), *argv]) == 1
    assert words in capsys.readouterr().err
    assert not out.exists()


# -- against whom each epsilon holds ----------------------------------------------------------

@pytest.mark.parametrize("make, server", [
    (lambda: CentralDP(Plaintext(), epsilon=4.0, adjacency="client"), False),
    (lambda: __import__("secagg").LocalDP(Plaintext(), epsilon=4.0, adjacency="client"), True),
    (lambda: __import__("secagg").DistributedDP(__import__("secagg").SecureSum(threshold=0.7),
                                                epsilon=4.0, adjacency="client"), True),
])
def test_the_ledger_and_the_audit_say_against_whom_the_guarantee_holds(make, server, part):
    from secagg.audit import audit, format_audit

    res = Federation(FedAvg(local_epochs=1, feature_dim=16, clip=1.0), make(), part,
                     rounds=1, seed=0).run()
    summary = res.privacy.summary()
    against = " ".join(summary["holds_against"])
    assert ("NOT the aggregator" not in against) == server
    assert "cohort" in summary["amplification"]
    res.privacy.record_in(res.transcript)
    text = format_audit(audit(res.transcript))
    assert "holds against: " + summary["holds_against"][0] in text
    assert "no amplification by cohort sampling" in text
    rows = dict(res.privacy.summary_rows())
    assert rows["DP guarantee holds against"].startswith(summary["holds_against"][0])


def test_a_budget_refusal_of_the_first_release_is_a_failure(part):
    """The guard refused round 0's release (DP-SGD's spend plus the release's exceed the
    budget): nothing was aggregated, and the result must say so (it said no failure)."""
    from secagg.privacy.dpsgd import DPSGD

    res = Federation(FedAvg(local_epochs=1, feature_dim=16, dpsgd=DPSGD(1.0, 1.0)),
                     CentralDP(Plaintext(), epsilon=1.0), part, rounds=1, seed=0).run()
    why = res.failure()
    assert why is not None and "refused the first release" in why and "budget" in why


@pytest.mark.parametrize("make", [
    lambda: CentralDP(__import__("secagg").SecureSum(threshold=0.7), epsilon=4.0,
                      adjacency="client"),
    lambda: CentralDP(__import__("secagg").Homomorphic("bfv"), epsilon=4.0,
                      adjacency="client"),
    lambda: __import__("secagg").LocalDP(__import__("secagg").SecureSum(threshold=0.7),
                                         epsilon=4.0, adjacency="client"),
], ids=["central-dp/secure-sum", "central-dp/bfv", "local-dp/secure-sum"])
def test_adaptive_clipping_count_travels_through_the_same_inner_layer(make, part):
    """The under-the-clip count is carried like the update: no server observation of it is
    a clear individual upload, and its release is on the same ledger events."""
    res = Federation(FedAvg(local_epochs=1, feature_dim=16, clip="adaptive"), make(), part,
                     rounds=2, seed=0).run()
    assert res.failure() is None and res.privacy.private
    seen = [o for o in res.transcript.observations()
            if o["party"] == "server" and "unclipped" in str(o["field"])]
    assert seen
    assert not any(o["form"] == "clear" and o.get("what") == "upload" for o in seen)
    assert all("unclipped" in e.fields and "update" in e.fields
               for e in res.privacy.events)
    assert res.measurements[-1]["next_clip"] != res.measurements[0]["clip"]
