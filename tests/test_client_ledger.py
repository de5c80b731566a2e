"""Per-client privacy ledgers (issue 28): events, per-observer epsilons, group epsilon,
budgets and admission, persistence; and the embedded engine's use of them."""

from __future__ import annotations

import json

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
from secagg.privacy.events import DiscreteGaussianEvent, GaussianEvent
from secagg.privacy.policy import NodePolicy

DELTA = 1e-6
GAUSS = (event_to_dict(GaussianEvent(noise_multiplier=1.0)),)
#: a cheaper mechanism for tests that do not check the issue's figures (small epsilons
#: keep the PLD grid small)
CHEAP = (event_to_dict(GaussianEvent(noise_multiplier=4.0)),)


def ev(r: int, action: str, *, client: str = "a", q: float = 0.01, sampling: str = "poisson",
       events: tuple = GAUSS, run: str = "r0", **kw) -> ClientEvent:
    return ClientEvent(client=client, run=run, round=r, phase="fedavg", action=action,
                       layer="local-dp", sampling=sampling, sampling_rate=q,
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
