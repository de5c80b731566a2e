"""Per-client privacy ledgers (issue 28): events, per-observer epsilons, group epsilon,
budgets and admission, persistence; and the embedded engine's use of them."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest

from secagg.errors import PrivacyError
from secagg.privacy.client_ledger import (
    ClientBudget,
    ClientEvent,
    ClientLedger,
    admit,
    charged_events,
    client_epsilons,
    client_summary,
    event_from_dict,
    event_to_dict,
    group_epsilon,
    open_ledgers,
    release_epsilon,
    server_epsilon,
)
from secagg.privacy.events import DiscreteGaussianEvent, GaussianEvent, SkellamEvent
from secagg.privacy.policy import NodePolicy

DELTA = 1e-6
GAUSS = (event_to_dict(GaussianEvent(noise_multiplier=1.0)),)
#: a cheaper mechanism for tests that do not check the issue's figures (small epsilons
#: keep the PLD grid small)
CHEAP = (event_to_dict(GaussianEvent(noise_multiplier=4.0)),)


def ev(r: int, action: str, *, client: str = "a", q: float = 0.01, sampling: str = "poisson",
       events: tuple = GAUSS, run: str = "r0", **kw) -> ClientEvent:
    kw.setdefault("amplifiable", True)
    return ClientEvent(client=client, run=run, round=r, phase="fedavg", action=action,
                       layer="central-dp", sampling=sampling, sampling_rate=q,
                       eligible=1000, cohort=10, noise_multiplier=1.0, clip=1.0,
                       events=events, **kw)


def pld_epsilon(event: dp_accounting.DpEvent, count: int, delta: float = DELTA) -> float:
    """dp-accounting itself, on the same events (the reference of the issue's figures)."""
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    acc.compose(event, count)
    return acc.get_epsilon(delta)


# ---------------------------------------------------------------- events


def test_event_json_round_trip_and_refusals() -> None:
    e = ev(3, "dropped", survivors=7, min_survivors=5, colluders=1, local_steps=4,
           local_rate=0.1, unprotected={"server": "why"}, reason="")
    assert ClientEvent.from_json(e.to_json()) == e
    assert json.loads(e.to_json())["events"][0] == {"mechanism": "gaussian",
                                                    "noise_multiplier": 1.0, "count": 1}
    dg = DiscreteGaussianEvent(l2_sensitivity=3.0, sigma_share=2.0, n_shares=5, dimension=4)
    assert event_from_dict(event_to_dict(dg)) == dg
    with pytest.raises(PrivacyError, match="action"):
        ev(0, "sampled")
    with pytest.raises(PrivacyError, match="unknown client event keys"):
        ClientEvent.from_dict({**e.to_dict(), "epsilon": 1.0})
    with pytest.raises(PrivacyError, match="observers"):
        ev(0, "uploaded", unprotected={"everyone": "x"})


def test_a_skellam_event_keeps_its_dimension_in_the_client_ledger() -> None:
    """The dimension selects the tight (PLD) charge for Skellam (secagg.privacy.pld); a
    client ledger that dropped it charged the looser RDP bound. A ledger written before
    the field existed still loads (the event's default: the RDP bound)."""
    sk = SkellamEvent(l2_sensitivity=3.0, l1_sensitivity=9.0, variance=400.0, dimension=4)
    d = event_to_dict(sk)
    assert d["dimension"] == 4
    assert event_from_dict(d) == sk
    old = {k: v for k, v in d.items() if k != "dimension"}
    assert event_from_dict(old) == SkellamEvent(l2_sensitivity=3.0, l1_sensitivity=9.0,
                                                variance=400.0)


# ---------------------------------------------------------------- the figures


def test_release_epsilon_composes_every_eligible_round() -> None:
    """z 1, q 0.01, delta 1e-6: 1,000 eligible rounds (10 uploaded) give 2.12, where the
    10 participated rounds alone would give 0.59 -- both equal dp-accounting's."""
    events = [ev(r, "uploaded" if r % 100 == 0 else "not_sampled") for r in range(1000)]
    got = release_epsilon(events, DELTA)
    sampled = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0))
    assert got.epsilon == pytest.approx(pld_epsilon(sampled, 1000), rel=1e-9)
    assert round(got.epsilon, 2) == 2.12 and got.amplified and got.charged_rounds == 1000
    only_participated = release_epsilon([e for e in events if e.action == "uploaded"], DELTA)
    assert only_participated.epsilon == pytest.approx(pld_epsilon(sampled, 10), rel=1e-9)
    assert round(only_participated.epsilon, 2) == 0.59


def test_server_epsilon_is_unamplified_over_uploads() -> None:
    """z 1, delta 1e-6: 10 uploads give 19.42 and 20 give 30.58; not-sampled rounds cost
    the server nothing."""
    for n, want in ((10, 19.42), (20, 30.58)):
        events = [ev(r, "uploaded" if r < n else "not_sampled", q=0.5) for r in range(n + 3)]
        got = server_epsilon(events, DELTA)
        if n == 10:  # (one reference is enough: the PLD of a Gaussian is slow to build)
            assert got.epsilon == pytest.approx(
                pld_epsilon(dp_accounting.GaussianDpEvent(1.0), n), rel=1e-9)
        assert round(got.epsilon, 2) == want and got.charged_rounds == n


def test_half_the_rounds_is_half_the_events_not_half_the_epsilon() -> None:
    full = [ev(r, "uploaded", events=CHEAP) for r in range(20)]
    half = [ev(r, "uploaded" if r % 2 else "not_sampled", events=CHEAP) for r in range(20)]
    e_full, e_half = server_epsilon(full, DELTA).epsilon, server_epsilon(half, DELTA).epsilon
    assert e_half == pytest.approx(server_epsilon(full[:10], DELTA).epsilon, rel=1e-12)
    assert e_half > 1.2 * e_full / 2  # composition is sublinear: not half the epsilon


def test_centraldp_gives_no_guarantee_against_the_server() -> None:
    events = [ev(r, "uploaded", events=CHEAP, unprotected={
        "server": "CentralDP: the server adds the noise after seeing the un-noised sum"})
        for r in range(3)]
    eps = client_epsilons(events, DELTA)
    assert eps["server"].epsilon is None and "un-noised sum" in eps["server"].reason
    assert eps["release"].epsilon is not None
    s = client_summary(events, DELTA)
    assert s["epsilon"]["server"] is None and "server" in s["reasons"]


def test_client_added_noise_is_not_amplified() -> None:
    """LocalDP / DistributedDP noise is added by the drawn clients: no amplification."""
    events = [ev(r, "uploaded" if r < 3 else "not_sampled", events=CHEAP, amplifiable=False)
              for r in range(50)]
    rel = release_epsilon(events, DELTA)
    assert not rel.amplified and rel.charged_rounds == 3
    assert rel.epsilon == pytest.approx(server_epsilon(events, DELTA).epsilon, rel=1e-12)


def test_fixed_size_cohort_is_not_amplified() -> None:
    events = [ev(r, "uploaded" if r < 5 else "not_sampled", sampling="fixed", events=CHEAP)
              for r in range(100)]
    rel = release_epsilon(events, DELTA)
    assert not rel.amplified
    assert rel.epsilon == pytest.approx(server_epsilon(events, DELTA).epsilon, rel=1e-12)


def test_distributed_dp_charges_realised_shares_less_colluders() -> None:
    def dg(n: int) -> tuple:
        return (event_to_dict(DiscreteGaussianEvent(l2_sensitivity=1000.0, sigma_share=600.0,
                                                    n_shares=n, dimension=10)),)

    full = [ev(r, "uploaded", events=dg(10), survivors=10, min_survivors=7) for r in range(5)]
    fewer = [ev(r, "uploaded", events=dg(7), survivors=7, min_survivors=7) for r in range(5)]
    e10, e7 = (server_epsilon(x, DELTA).epsilon for x in (full, fewer))
    assert e7 > e10
    # three colluders reveal three of ten shares: the same as seven honest survivors
    assert server_epsilon(full, DELTA, colluders=3).epsilon == pytest.approx(e7, rel=1e-12)
    none_left = server_epsilon(fewer, DELTA, colluders=7)
    assert none_left.epsilon is None and "colluding" in none_left.reason
    evs, why, _ = charged_events(full, "server", colluders=3)
    assert not why and all(e.n_shares == 7 for e in evs)


def test_group_epsilon_uses_the_group_sensitivity() -> None:
    a = [ev(r, "uploaded" if r % 3 == 0 else "not_sampled", client="a", events=CHEAP)
         for r in range(12)]
    b = [ev(r, "uploaded" if r % 3 == 1 else "not_sampled", client="b", events=CHEAP)
         for r in range(12)]
    for obs in ("release", "server"):
        ea = client_epsilons(a, DELTA)[obs].epsilon
        eb = client_epsilons(b, DELTA)[obs].epsilon
        g = group_epsilon({"a": a, "b": b}, DELTA, obs).epsilon
        assert g > max(ea, eb)
        assert g != pytest.approx(ea + eb, rel=1e-3)
    # both members in every release: sensitivity 2C, i.e. z / 2, never the sum
    both = group_epsilon({"a": [ev(r, "uploaded", events=CHEAP) for r in range(5)],
                          "b": [ev(r, "uploaded", client="b", events=CHEAP)
                                for r in range(5)]}, DELTA, "server").epsilon
    assert both == pytest.approx(pld_epsilon(dp_accounting.GaussianDpEvent(2.0), 5), rel=1e-9)
    # the release figure: drawn when either member is, at twice the sensitivity
    rel = group_epsilon({"a": [ev(r, "not_sampled", events=CHEAP) for r in range(50)],
                         "b": [ev(r, "not_sampled", client="b", events=CHEAP)
                               for r in range(50)]}, DELTA, "release").epsilon
    sampled = dp_accounting.PoissonSampledDpEvent(1 - 0.99 ** 2,
                                                  dp_accounting.GaussianDpEvent(2.0))
    assert rel == pytest.approx(pld_epsilon(sampled, 50), rel=1e-9)


# ---------------------------------------------------------------- budget and policy


def test_budget_parse() -> None:
    assert ClientBudget.parse("3") == ClientBudget(release=3.0, server=3.0)
    assert ClientBudget.parse(["server=2", "release=1.5"]) == ClientBudget(1.5, 2.0)
    assert ClientBudget.parse("server=2").observers == {"server": 2.0}
    for bad in ("client=2", "x", "server=-1", ""):
        with pytest.raises(PrivacyError):
            ClientBudget.parse(bad)


def test_admission_allows_exactly_k_participations() -> None:
    k = 4
    budget = ClientBudget(server=server_epsilon(
        [ev(r, "uploaded", events=CHEAP) for r in range(k)], DELTA).epsilon * (1 + 1e-9))
    led = ClientLedger("a")
    for r in range(k):
        a = led.admit(ev(r, "uploaded", events=CHEAP), budget, DELTA)
        assert a.admitted, a.reason
        led.append(ev(r, "uploaded", events=CHEAP))
    a = led.admit(ev(k, "uploaded", events=CHEAP), budget, DELTA)
    assert not a.admitted and "server" in a.reason and a.projected["server"] > budget.server


def test_server_budget_refuses_rounds_without_a_server_guarantee() -> None:
    terms = ev(0, "uploaded", unprotected={"server": "CentralDP"})
    a = admit([], terms, ClientBudget(server=100.0), DELTA)
    assert not a.admitted and "no guarantee against the server" in a.reason
    assert admit([], terms, ClientBudget(release=100.0), DELTA).admitted


def test_policy_refuses_terms() -> None:
    pol = NodePolicy(min_noise_multiplier=0.8, max_clip=2.0)
    assert admit([], ev(0, "uploaded"), None, DELTA, pol).admitted
    low = ClientEvent(**{**ev(0, "uploaded").to_dict(), "noise_multiplier": 0.5})
    assert "floor" in admit([], low, None, DELTA, pol).reason
    wide = ClientEvent(**{**ev(0, "uploaded").to_dict(), "clip": 3.0})
    assert "ceiling" in admit([], wide, None, DELTA, pol).reason
    claim = ev(0, "uploaded", server_amplification=True)
    a = admit([], claim, None, DELTA, NodePolicy())
    assert not a.admitted and "learns the cohort" in a.reason


def test_ledger_file_persists_and_rejects_foreign_events(tmp_path) -> None:
    led = open_ledgers(tmp_path, [7])["7"]
    for r in range(3):
        led.append(ev(r, "uploaded", client="7"))
    again = open_ledgers(tmp_path, ["7"])["7"]
    assert again.events == led.events and len(again) == 3
    with pytest.raises(PrivacyError, match="client"):
        again.append(ev(3, "uploaded", client="8"))
    (tmp_path / "client-9.jsonl").write_text(ev(0, "uploaded", client="7").to_json() + "\n")
    with pytest.raises(PrivacyError, match="ledger of client"):
        open_ledgers(tmp_path, [9])


# ---------------------------------------------------------------- the embedded engine

import numpy as np  # noqa: E402

from secagg import Federation, Plaintext  # noqa: E402
from secagg.data import iid_split, load_dataset  # noqa: E402
from secagg.messages import Bound, Field, UploadSpec  # noqa: E402
from secagg.phase import AlgorithmBase, PhaseBase  # noqa: E402
from secagg.privacy.layers import CentralDP, DistributedDP, LocalDP  # noqa: E402
from secagg.secure_sum.layer import SecureSum  # noqa: E402

DIM, CLIP = 64, 1.0


class _MeanPhase(PhaseBase):
    """Each client uploads a fixed vector of norm CLIP (client-level bound); the server
    keeps the mean over the fixed denominator. ``trained`` spies on the client step."""

    name = "mean"

    def __init__(self, algo: _MeanAlgo) -> None:
        self.algo = algo

    def spec(self) -> UploadSpec:
        return UploadSpec((Field("update", (DIM,), "float64", additive=True,
                                 bound=Bound(l2=CLIP, adjacency="client")),))

    def broadcast(self) -> dict:
        return {"clip": np.array([CLIP])}

    def client_step(self, client, broadcast) -> dict:
        self.algo.trained.append(client.id)
        return {"update": self.algo.value(client.id)}

    def server_step(self, aggregate) -> None:
        self.algo.means.append((np.asarray(aggregate["update"]) / aggregate.cohort,
                                tuple(aggregate.contributors), aggregate.cohort))

    def client_flops(self, client) -> float:
        return 0.0


class _MeanAlgo(AlgorithmBase):
    name, personalized = "mean", False

    def __init__(self, zero: bool = False) -> None:
        self.zero = zero
        self.trained: list[int] = []
        self.means: list[tuple[np.ndarray, tuple[int, ...], int]] = []

    def value(self, c: int) -> np.ndarray:
        if self.zero:
            return np.zeros(DIM)
        v = np.zeros(DIM)
        v[c % DIM] = CLIP
        return v

    def setup(self, dataset, clients, seed) -> None:
        pass

    def phases(self, round: int, rounds: int) -> list:
        return [_MeanPhase(self)]

    def evaluate(self, dataset, clients) -> float:
        return 0.0

    def describe(self) -> dict:
        return {"name": self.name}


@pytest.fixture(scope="module")
def clients():
    return iid_split(load_dataset("digits"), 10, seed=0)


def _fed(parts, layer, **kw):
    kw.setdefault("rounds", 3)
    kw.setdefault("seed", 0)
    algo = kw.pop("algo", None) or _MeanAlgo()
    return algo, Federation(algo, layer, parts, progress=False, attest=False, **kw)


def test_budget_refuses_the_k_plus_first_participation_and_after_restart(clients, tmp_path):
    """A budget that allows exactly K uploads: each client's step (the spy) runs K times;
    the K+1-th round is refused before it runs, recorded, and still refused in a new run
    that reads the same ledgers."""
    k, z = 3, 4.0
    per_upload = [ev(r, "uploaded", events=(event_to_dict(GaussianEvent(noise_multiplier=z)),))
                  for r in range(k)]
    budget = {"server": server_epsilon(per_upload, 1e-5).epsilon * (1 + 1e-9)}
    layer = LocalDP(Plaintext(), noise_multiplier=z, delta=1e-5, adjacency="client")
    algo, fed = _fed(clients, layer, rounds=k + 2, client_budget=budget,
                     client_ledgers=tmp_path / "ledgers")
    res = fed.run()
    assert sorted(algo.trained) == sorted(list(range(10)) * k)
    out = res.to_dict()["privacy"]["clients"]
    assert set(out) == {str(c) for c in range(10)}
    for c in out.values():
        assert c["participations"] == k and c["refusals"] == 1 and c["status"] == "exhausted"
        assert c["eligible_rounds"] == k + 1  # then it left the population
        assert c["epsilon"]["server"] <= budget["server"]
    led = ClientLedger.open(0, tmp_path / "ledgers" / "client-0.jsonl")
    assert [e.action for e in led] == ["uploaded"] * k + ["refused"]
    assert "above its budget" in led.events[-1].reason
    # a restart: a new run over the same ledger directory refuses from its first round
    algo2, fed2 = _fed(clients, LocalDP(Plaintext(), noise_multiplier=z, delta=1e-5,
                                        adjacency="client"),
                       rounds=2, client_budget=budget, client_ledgers=tmp_path / "ledgers")
    res2 = fed2.run()
    assert algo2.trained == []
    again = res2.to_dict()["privacy"]["clients"]
    assert all(c["refusals"] == 2 and c["participations"] == k for c in again.values())


def test_privacy_clients_schema_and_global_bounds_every_client(clients):
    """result.json's privacy.clients, beside the global figure: global >= max over
    clients for each observer the global figure holds against; CentralDP has none
    against the server."""
    for layer, server_none in (
            (LocalDP(Plaintext(), noise_multiplier=3.0, delta=1e-5, adjacency="client"),
             False),
            (CentralDP(Plaintext(), noise_multiplier=3.0, delta=1e-5, adjacency="client"),
             True)):
        _, fed = _fed(clients, layer, rounds=4, fraction=0.3, sampling="poisson")
        d = fed.run().to_dict()
        glob, cl = d["privacy"]["epsilon"], d["privacy"]["clients"]
        assert set(cl) == {str(c) for c in range(10)}
        for c in cl.values():
            assert set(c) >= {"epsilon", "participations", "eligible_rounds", "refusals",
                              "status"}
            assert set(c["epsilon"]) == {"release", "server"}
            assert c["eligible_rounds"] == 4 and c["refusals"] == 0
        rel = [c["epsilon"]["release"] for c in cl.values()]
        assert all(isinstance(e, float) for e in rel) and glob >= max(rel)
        srv = [c["epsilon"]["server"] for c in cl.values()]
        if server_none:  # none for every client that uploaded; 0 for one never drawn
            up = [c for c in cl.values() if c["participations"]]
            assert up and all(c["epsilon"]["server"] is None for c in up)
            assert all("un-noised sum" in c["reasons"]["server"] for c in up)
            assert all(c["epsilon"]["server"] == 0.0 for c in cl.values()
                       if not c["participations"])
        else:
            assert glob >= max(srv)
            # a client that uploaded fewer times has a smaller figure against the server
            by_n = {c["participations"]: c["epsilon"]["server"] for c in cl.values()}
            ns = sorted(by_n)
            assert all(by_n[a] < by_n[b] for a, b in zip(ns, ns[1:]))
        if server_none:  # CentralDP's server-added noise: amplified by Poisson sampling
            assert max(rel) < glob
        else:  # noise the clients add comes and goes with the cohort: not amplified
            assert all(c["epsilon"]["release"] == c["epsilon"]["server"] for c in cl.values())


def test_fixed_denominator_keeps_the_noise_scale_with_30_percent_dropped(clients):
    """CentralDP over a cohort of 10 with 30% of the replies dropped: the released mean's
    noise std is the planned sigma / 10 (dividing by the 7 replies would give sigma / 7)."""
    z = 2.0
    layer = CentralDP(Plaintext(), noise_multiplier=z, delta=1e-5, adjacency="client")
    algo, fed = _fed(clients, layer, rounds=40, dropout=0.3, algo=_MeanAlgo(zero=True))
    fed.run()
    noise = np.concatenate([m for m, _, _ in algo.means])
    replies = [len(c) for _, c, _ in algo.means]
    assert all(n == 10 for _, _, n in algo.means)
    assert 0.55 < np.mean(replies) / 10 < 0.85  # about 30% dropped
    planned = z * CLIP / 10
    assert np.std(noise) == pytest.approx(planned, rel=0.05)
    assert abs(np.std(noise) - z * CLIP / np.mean(replies)) > 0.2 * planned


def test_distributed_dp_charges_the_realised_survivors(clients):
    """Under DistributedDP with dropouts, each uploading client is charged the noise the
    survivors actually added (their number of shares), and its figure against the server
    is the composition of those realised events."""
    layer = DistributedDP(SecureSum(threshold=0.6), noise_multiplier=2.0, delta=1e-5,
                          adjacency="client")
    _, fed = _fed(clients, layer, rounds=3, dropout=0.1, seed=3, on_abort="skip")
    res = fed.run()
    acc = res.client_accounts
    seen = 0
    for led in acc.ledgers.values():
        for e in led:
            if e.action != "uploaded":
                continue
            (dg,) = e.privacy_events()
            assert dg.n_shares == e.survivors and e.survivors >= e.min_survivors
            seen += 1
    assert seen > 0
    # someone dropped in a completed sum: fewer shares than planned
    assert any(0 < p[2] < p[3] for p in res.participation)


def test_exhausted_clients_leave_and_the_rate_changes(clients):
    """A fixed-size cohort of 5: when clients exhaust their budget the others face a
    higher sampling rate, recorded with the eligible population every round."""
    z = 4.0
    one = server_epsilon([ev(0, "uploaded", events=(event_to_dict(
        GaussianEvent(noise_multiplier=z)),))], 1e-5).epsilon
    layer = LocalDP(Plaintext(), noise_multiplier=z, delta=1e-5, adjacency="client")
    _, fed = _fed(clients, layer, rounds=4, fraction=0.5, client_budget=f"server={one * 1.0001}")
    res = fed.run()
    events = [e for led in res.client_accounts.ledgers.values() for e in led]
    by_round: dict[int, set] = {}
    for e in events:
        by_round.setdefault(e.round, set()).add((e.eligible, e.sampling_rate, e.cohort))
    assert by_round[0] == by_round[1] == {(10, 0.5, 5)}
    # the five of round 0 refused (or would have) in round 1 and left
    left = {e.client for e in events if e.round == 1 and e.action in ("refused", "declined")}
    assert len(left) == 5
    assert by_round[2] == {(5, 1.0, 5)}  # the others now face a rate of 1
    assert all(len(v) == 1 for v in by_round.values())
    assert sum(1 for e in events if e.action == "uploaded") == 10


def test_cli_client_budget_ledger_and_audit(tmp_path, capsys):
    """``secagg run --client-budget --client-ledger`` reports privacy.clients, writes the
    ledgers, and ``secagg audit`` prints the per-client distribution."""
    from secagg.cli import main

    argv = ["run", "--clients", "4", "--local-epochs", "1", "--rounds", "1", "--quiet",
            "--layer", "local-dp", "--epsilon", "1", "--sampling", "poisson",
            "--fraction", "0.5", "--client-budget", "server=100",
            "--client-ledger", str(tmp_path / "led"), "--out", str(tmp_path / "r")]
    assert main(argv) == 0
    res = json.loads((tmp_path / "r" / "result.json").read_text())
    cl = res["privacy"]["clients"]
    assert set(cl) == {"0", "1", "2", "3"}
    assert sorted(p.name for p in (tmp_path / "led").iterdir()) == [
        f"client-{i}.jsonl" for i in range(4)]
    assert (tmp_path / "r" / "client_ledgers.jsonl").exists()
    capsys.readouterr()
    assert main(["audit", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "per-client epsilon (4 clients" in out and "vs release" in out
    assert "vs server" in out and "worst:" in out
    assert main(["run", "--client-budget", "client=3", "--out", str(tmp_path / "x")]) == 1
    assert "client budget observer" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------- data-dependent filters

from secagg.privacy.client_ledger import (  # noqa: E402
    IndividualFilter,
    UnsoundFilter,
    gdp_delta,
    gdp_epsilon,
    gdp_mu,
)


def test_a_pld_filter_is_refused() -> None:
    with pytest.raises(UnsoundFilter, match="PLD"):
        IndividualFilter("pld", 2.0, 1e-5)
    with pytest.raises(PrivacyError):
        IndividualFilter("moments", 2.0, 1e-5)
    with pytest.raises(PrivacyError, match="order"):
        IndividualFilter("rdp", 0.5, 1e-5, order=2)  # log(1/delta) alone is above 0.5


def test_gdp_conversion_matches_dp_accounting() -> None:
    """mu-GDP is the Gaussian mechanism of multiplier 1/mu: the closed form agrees with
    dp-accounting's PLD of it."""
    for mu in (0.3, 1.0):
        ref = pld_epsilon(dp_accounting.GaussianDpEvent(1 / mu), 1, 1e-5)
        assert gdp_epsilon(mu, 1e-5) == pytest.approx(ref, rel=2e-3)
    assert gdp_delta(gdp_mu(2.0, 1e-5), 2.0) == pytest.approx(1e-5, rel=1e-6)


@pytest.mark.parametrize("kind", ["gdp", "rdp"])
def test_filter_stops_exactly_before_the_budget(kind) -> None:
    f = IndividualFilter(kind, 3.0, 1e-5, order=16)
    state: dict = {}
    mus = [0.2, 0.5, 0.1, 0.4, 0.3, 0.05, 0.6, 0.01]
    passed = [f.step(state, m) for m in mus]
    k = passed.index(False)
    assert all(passed[:k]) and not any(passed[k:])  # halted for good
    assert sum(f.cost(m) for m in mus[:k]) <= f.capacity < sum(f.cost(m) for m in mus[:k + 1])
    assert f.spent_epsilon(state["spent"]) <= 3.0 + 1e-9


class _Neighbour(_MeanAlgo):
    """Client 0 uploads a vector of norm ``norm0``, the others of norm 0.01."""

    def __init__(self, norm0: float) -> None:
        super().__init__()
        self.norm0 = norm0

    def value(self, c: int) -> np.ndarray:
        v = np.zeros(DIM)
        v[0] = self.norm0 if c == 0 else 0.01
        return v


def test_filtered_client_is_invisible_to_the_server(clients) -> None:
    """Two neighbouring inputs of client 0 (update norms a > b) stop its GDP filter at
    different rounds; the server-visible transcripts (every record the server saw:
    round, stage, sender, field, form, shape, bytes -- the values are masked) and the
    cost ledger's messages are identical, and result.json is too; the filter's figures
    appear nowhere in it."""
    z = 1.0
    filt = IndividualFilter("gdp", 4.0, 1e-5)
    cap = filt.capacity
    runs = []
    for share in (4.5, 6.5):  # client 0 passes 4 rounds, then 6
        norm0 = z * math.sqrt(cap / share)

        algo = _Neighbour(norm0)
        _, fed = _fed(clients, LocalDP(SecureSum(threshold=0.7), noise_multiplier=z,
                                       delta=1e-5, adjacency="client"),
                      rounds=8, algo=algo, individual_filter=filt)
        res = fed.run()
        seen = [{k: v for k, v in r.items() if k not in ("digest", "values")}
                for r in res.transcript.records if r.get("type") == "observation"
                and r.get("party") == "server"]
        msgs = [(r.round, r.stage, r.sender, r.receiver, r.wire_bytes)
                for r in res.costs.rows]
        d = res.to_dict()
        d.pop("wall_s")
        d.pop("device")
        runs.append((algo.trained.count(0), seen, msgs, d))
    (t_a, seen_a, msgs_a, d_a), (t_b, seen_b, msgs_b, d_b) = runs
    assert (t_a, t_b) == (5, 7)  # the step that would cross the budget ran, then none
    assert seen_a and seen_a == seen_b and msgs_a == msgs_b
    for key in ("participation", "aborted", "client_rounds"):
        assert d_a[key] == d_b[key]
    for way in ("up", "down", "internal"):  # byte and message totals (CPU times vary)
        assert d_a["costs"][way]["wire_bytes"] == d_b["costs"][way]["wire_bytes"]
        assert d_a["costs"][way]["messages"] == d_b["costs"][way]["messages"]
    assert d_a["privacy"]["clients"] == d_b["privacy"]["clients"]
    assert "individual" not in json.dumps(d_a) and "spent" not in json.dumps(d_a)


def test_a_round_every_drawn_client_refuses_releases_nothing(clients, tmp_path):
    """A budget below one release: every client refuses round 0, the secure sum is not
    started (it would abort below its threshold), nothing is released or aggregated."""
    layer = DistributedDP(SecureSum(threshold=0.7), noise_multiplier=2.0, delta=1e-5,
                          adjacency="client")
    algo, fed = _fed(clients, layer, rounds=2, fraction=0.5, client_budget="server=0.01")
    res = fed.run()
    assert algo.trained == [] and algo.means == []
    assert [p[2] for p in res.participation] == [0, 0]
    assert res.privacy.events == ()
    cl = res.to_dict()["privacy"]["clients"]
    assert sum(c["refusals"] for c in cl.values()) == 5
    assert all(c["status"] == "exhausted" and c["epsilon"]["server"] == 0.0
               for c in cl.values())
    assert "5 refusal(s)" in res.failure()


def test_a_round_without_noise_gives_no_guarantee_but_a_zero_charge_is_kept() -> None:
    plain = ClientEvent(client="a", run="r", round=0, phase="p", action="uploaded",
                        layer="secure-sum")
    assert all(e.epsilon is None and "no DP noise" in e.reason
               for e in client_epsilons([plain], DELTA).values())
    # a DP layer's round that charged nothing (a DP-FTRL leaf adding no tree node)
    free = ClientEvent(client="a", run="r", round=0, phase="p", action="uploaded",
                       layer="central-dp", noise_multiplier=1.0)
    assert release_epsilon([free], DELTA).epsilon == 0.0


def test_filter_state_stays_with_the_client_across_runs(clients, tmp_path) -> None:
    """The filter's spend is kept beside the client's ledger (not in the result): a client
    the filter stopped in one run sends zeros from the first round of the next."""
    filt = IndividualFilter("gdp", 2.0, 1e-5)
    layer = CentralDP(Plaintext(), noise_multiplier=1.0, delta=1e-5, adjacency="client")
    algo, fed = _fed(clients, layer, rounds=3, algo=_Neighbour(0.4),
                     individual_filter=filt, client_ledgers=tmp_path)
    fed.run()
    assert algo.trained.count(0) == 2  # mu 0.4: one round fits under mu_B 0.50, not two
    state = json.loads((tmp_path / "client-0.filter.json").read_text())
    assert state["halted"] is True
    algo2, fed2 = _fed(clients, CentralDP(Plaintext(), noise_multiplier=1.0, delta=1e-5,
                                          adjacency="client"),
                       rounds=2, algo=_Neighbour(0.4), individual_filter=filt,
                       client_ledgers=tmp_path)
    fed2.run()
    assert algo2.trained.count(0) == 0 and algo2.trained.count(1) == 2


def test_an_individual_filter_needs_a_gaussian_release_per_round(clients) -> None:
    from secagg.errors import ConfigurationError

    filt = IndividualFilter("rdp", 4.0, 1e-5)
    for layer in (Plaintext(), DistributedDP(SecureSum(), noise_multiplier=1.0,
                                             adjacency="client"),
                  CentralDP(Plaintext(), noise_multiplier=1.0, adjacency="client",
                            tree=True)):
        with pytest.raises(ConfigurationError, match="Gaussian release per round"):
            _fed(clients, layer, individual_filter=filt)[1].run()


def test_summary_counts_rounds_not_phases() -> None:
    evs = [ClientEvent(client="a", run="r", round=r, phase=p, action=a, layer="central-dp",
                       noise_multiplier=4.0, events=CHEAP)
           for r, a in ((0, "uploaded"), (1, "not_sampled"), (2, "refused"))
           for p in ("stats", "train")]
    s = client_summary(evs, DELTA)
    assert (s["participations"], s["eligible_rounds"], s["refusals"]) == (1, 3, 1)
    assert s["status"] == "exhausted"


class _LocalPhase(_MeanPhase):
    """A phase that uploads nothing (local work on the client's data)."""

    name = "local"

    def spec(self) -> UploadSpec:
        return UploadSpec(())

    def client_step(self, client, broadcast) -> dict:
        self.algo.local.append(client.id)
        return {}


class _TwoPhaseAlgo(_MeanAlgo):
    def __init__(self) -> None:
        super().__init__()
        self.local: list[int] = []

    def phases(self, round: int, rounds: int) -> list:
        return [_LocalPhase(self), _MeanPhase(self)]


def test_a_refusing_client_skips_local_phases_too(clients) -> None:
    z = 4.0
    one = server_epsilon([ev(0, "uploaded", events=(event_to_dict(
        GaussianEvent(noise_multiplier=z)),))], 1e-5).epsilon
    algo = _TwoPhaseAlgo()
    _, fed = _fed(clients, LocalDP(Plaintext(), noise_multiplier=z, delta=1e-5,
                                   adjacency="client"),
                  rounds=3, algo=algo, client_budget={"server": one * 1.0001})
    fed.run()
    assert sorted(algo.local) == sorted(algo.trained) == list(range(10))
