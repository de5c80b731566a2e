"""A Flower node's own ledger file and budget, over the in-process Grid of the runtime
tests (real ClientApp logic, real DP noise): a node whose budget allows exactly K releases
takes part K times, then refuses before training (a spy counts its training calls), the
run goes on with the others (the server drops it from the population, and its
``privacy.clients`` books every node's uploads and refusals), the refusal persists after a restart and in a new run, and
``secagg audit --node-ledger`` reconciles the node's file with the server's transcript.
A crash between intent and commit counts as spent, and a replayed message is charged
once and not answered again."""

import importlib.util
import json
import os

import pytest

if importlib.util.find_spec("flwr") is None and os.environ.get("CI") != "true":
    pytest.skip("needs flwr: pip install 'secagg[flower]' (always runs under CI=true)",
                allow_module_level=True)

from flwr.app import Context, Message, RecordDict  # noqa: E402
from test_flower_client_dp import FedAvgGrid, _fedavg  # noqa: E402
from test_flower_runtime import N, _partition, task_identity  # noqa: E402,F401

from algorithms.fedavg import FedAvg  # noqa: E402
from secagg import LocalDP, Plaintext  # noqa: E402
from secagg.cli import main  # noqa: E402
from secagg.data import load_dataset  # noqa: E402
from secagg.errors import ProtocolError  # noqa: E402
from secagg.flower.client import _Node, node_partition_loader  # noqa: E402
from secagg.flower.records import MESSAGE_TYPE, content, read  # noqa: E402
from secagg.flower.server import FlowerFederation  # noqa: E402
from secagg.privacy.client_ledger import ClientEvent, server_epsilon  # noqa: E402
from secagg.privacy.node_budget import node_event  # noqa: E402
from secagg.privacy.node_ledger import read_ledger, reconcile, repair_torn_tail  # noqa: E402

Z, DELTA, K = 2.0, 1e-5, 2


def _layer():
    return LocalDP(Plaintext(), noise_multiplier=Z, delta=DELTA, adjacency="client", seed=None)


def _budget_for(k):
    """An epsilon budget against the server between k and k+1 releases of Gaussian(Z),
    from the accountant itself (so exactly k fit)."""
    def eps(n):
        evs = [node_event(0, "r", r, "train", {"layer": "local-dp", "noise_multiplier": Z})
               for r in range(n)]
        return server_epsilon(evs, DELTA).epsilon

    lo, hi = eps(k), eps(k + 1)
    assert lo < hi
    return (lo + hi) / 2


@pytest.fixture
def trained(monkeypatch):
    """Client id -> rounds in which its training function ran."""
    seen: dict[int, list[int]] = {}
    real = FedAvg.local_update

    def spy(self, client, params, round):
        seen.setdefault(client.id, []).append(round)
        return real(self, client, params, round)

    monkeypatch.setattr(FedAvg, "local_update", spy)
    return seen


def _grid(ledger, budget):
    grid = FedAvgGrid()
    grid.contexts[100].node_config.update({"ledger-path": str(ledger), "ledger-init": "true",
                                           "client-budget": f"server={budget}",
                                           "client-budget-delta": DELTA})
    return grid


def _run(grid, rounds):
    aggs = {}
    fed = FlowerFederation(_fedavg(), _layer(), load_dataset("digits"), rounds=rounds, seed=0,
                           min_nodes=N, stage_timeout=0.5)
    result = fed.run(grid, on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    return result, aggs


def test_a_node_refuses_once_its_budget_is_spent_and_the_run_goes_on(tmp_path, trained):
    ledger = tmp_path / "node0" / "ledger.jsonl"
    budget = _budget_for(K)
    grid = _grid(ledger, budget)
    result, aggs = _run(grid, rounds=K + 2)
    # node 0 took part in the first K rounds, then refused before training
    assert trained[0] == list(range(K))
    assert all(trained[c] == list(range(K + 2)) for c in range(1, N))
    for r in range(K + 2):
        assert aggs[r].contributors == (tuple(range(N)) if r < K else tuple(range(1, N)))
        # the round it refused keeps its drawn cohort (the fixed denominator); after it,
        # node 0 has left the population and is not drawn again
        assert aggs[r].cohort == (N if r <= K else N - 1)
    assert [p[2] for p in result.participation] == [N] * K + [N - 1] * 2
    assert [p[3] for p in result.participation] == [N] * (K + 1) + [N - 1]
    # node 0 was asked to upload K + 1 times (its K releases and its refusal), no more
    assert sum(1 for (step, c, _) in grid.sent if c == 0 and step == "upload") == K + 1
    assert all(sum(1 for (step, c2, _) in grid.sent if c2 == c and step == "upload")
               == K + 2 for c in range(1, N))
    why = aggs[K].notes["dropped"]["upload"][0]
    assert "refused by this node's privacy budget" in why and "above its budget" in why
    # its ledger: K releases charged and committed, 1 refusal, and its epsilon is in budget
    state = read_ledger(ledger)
    assert len(state.charged()) == len(state.committed()) == K
    assert [p["round"] for p in state.refusals()] == [K]
    spent = server_epsilon([ClientEvent.from_dict(p) for p in state.charged()], DELTA)
    assert spent.epsilon <= budget
    # the server's copy agrees: the last head it holds is the file's, the same releases
    rec = reconcile(ledger, result.transcript.records, 0)
    assert rec["ok"], rec["problems"]
    last_commit = [e for e in state.entries if e.kind == "commit"][-1]
    assert rec["server_head"] == last_commit.digest and rec["committed"] == K
    assert rec["refusals"] == 1 and rec["later_entries"] == 1  # the refusal after it
    # result.json's privacy.clients, the server's view of every node's ledger: what each
    # node uploaded, node 0's refusal, and the population each round was drawn from
    d = result.to_dict()
    glob, cl = d["privacy"]["epsilon"], d["privacy"]["clients"]
    assert set(cl) == {str(c) for c in range(N)}
    assert cl["0"]["participations"] == K and cl["0"]["refusals"] == 1
    assert cl["0"]["eligible_rounds"] == K + 1
    for c in range(1, N):
        assert cl[str(c)]["participations"] == K + 2 and cl[str(c)]["refusals"] == 0
        assert cl[str(c)]["eligible_rounds"] == K + 2
    uploaded = {c: [r for r in range(K + 2) if c in aggs[r].contributors] for c in range(N)}
    assert all(len(uploaded[c]) == cl[str(c)]["participations"] for c in range(N))
    # node 0's figure against the server is the one its own ledger holds
    assert cl["0"]["epsilon"]["server"] == pytest.approx(spent.epsilon)
    for observer in ("release", "server"):
        assert glob >= max(c["epsilon"][observer] for c in cl.values())
    seen = [ev.eligible for ev in result.client_accounts.ledgers["1"].events]
    assert seen == [N] * (K + 1) + [N - 1]
    # the nodes without a ledger report no head
    assert {r["client"] for r in result.transcript.records
            if r.get("type") == "node-ledger"} == {0}

    # after a restart (a new ClientApp, new node state) and in a new run: still refused
    trained.clear()
    again, aggs2 = _run(_grid(ledger, budget), rounds=1)
    assert 0 not in trained and aggs2[0].contributors == tuple(range(1, N))
    assert len(read_ledger(ledger).charged()) == K
    assert reconcile(ledger, again.transcript.records, 0)["ok"]
    # the first run's transcript still reconciles: its head is in the file, later entries
    # are the second run's
    assert reconcile(ledger, result.transcript.records, 0)["ok"]


def test_audit_reconciles_a_node_ledger_and_catches_a_rewritten_one(tmp_path, trained,
                                                                      capsys):
    ledger = tmp_path / "ledger.jsonl"
    result, _ = _run(_grid(ledger, _budget_for(1)), rounds=2)
    out = tmp_path / "run"
    result.save(out)
    assert main(["audit", str(out), "--node-ledger", f"0={ledger}"]) == 0
    assert "node ledger of client 0: reconciled" in capsys.readouterr().out
    # a node that rewrites its history (drops its only upload) no longer reconciles
    lines = ledger.read_bytes().split(b"\n")
    ledger.write_bytes(b"\n".join(lines[2:]).replace(json.loads(lines[2])["prev"].encode(),
                                                     json.loads(lines[0])["prev"].encode()))
    assert main(["audit", str(out), "--node-ledger", f"0={ledger}"]) == 4
    err = capsys.readouterr()
    assert "DOES NOT RECONCILE" in err.out and "not in the file" in err.out
    # the file of another node is not this node's
    other = tmp_path / "other.jsonl"
    other.write_bytes(b"")
    assert main(["audit", str(out), "--node-ledger", f"0={other}"]) == 4
    assert main(["audit", str(out), "--node-ledger", f"1={ledger}"]) == 4  # no copy held


def _step_message(node, ctx, run="r1", rnd=0):
    algo = _fedavg()
    algo.setup(load_dataset("digits"), [], 0)
    from secagg.wire import pack_arrays

    layer = _layer()
    layer.plan_releases(1)
    rec = dict(run=run, step="upload", round=rnd, rounds=2, phase="train", seed=0,
               max_records=1000, on_violation="raise",
               broadcast=pack_arrays(algo.phases(rnd, 2)[0].broadcast()),
               dp=json.dumps(layer.node_params()))
    return Message(content(**rec), dst_node_id=100, message_type=MESSAGE_TYPE)


def _context(ledger, **extra):
    return Context(run_id=1, node_id=100, run_config={}, state=RecordDict(),
                   node_config={"partition-id": 0, "ledger-path": str(ledger), "ledger-init": "true", **extra})


def test_a_crash_between_intent_and_commit_counts_as_spent_on_the_node(tmp_path,
                                                                        monkeypatch):
    ledger = tmp_path / "ledger.jsonl"
    node = _Node(_fedavg, node_partition_loader(_partition))

    def crash(self, *a, **k):
        raise MemoryError("the node died while training")

    monkeypatch.setattr(FedAvg, "local_update", crash)
    with pytest.raises(MemoryError):
        node.handle(_step_message(node, None), _context(ledger))
    state = read_ledger(ledger)
    assert len(state.charged()) == 1 and state.committed() == []
    monkeypatch.undo()
    # restarted, asked again for the same release: refused, still charged once
    node = _Node(_fedavg, node_partition_loader(_partition))
    with pytest.raises(ProtocolError, match="already charged"):
        node.handle(_step_message(node, None), _context(ledger))
    assert len(read_ledger(ledger).charged()) == 1
    # a budget of one release refuses the next one: the crashed release counts as spent
    budget = _budget_for(1)
    with pytest.raises(ProtocolError, match="privacy budget"):
        node.handle(_step_message(node, None, rnd=1),
                    _context(ledger, **{"client-budget": budget,
                                        "client-budget-delta": DELTA}))
    assert len(read_ledger(ledger).charged()) == 1
    # a crash in the middle of an append: the node refuses until an operator repairs it
    with ledger.open("ab") as fh:
        fh.write(b'{"id":"r1/2/train","kind":"int')
    with pytest.raises(ProtocolError, match="cut by a crash"):
        node.handle(_step_message(node, None, rnd=2), _context(ledger))
    # and a file holding another client's releases is not this node's
    repair_torn_tail(ledger)
    with pytest.raises(ProtocolError, match="own ledger-path"):
        node.handle(_step_message(node, None, rnd=2),
                    Context(run_id=1, node_id=101, run_config={}, state=RecordDict(),
                            node_config={"partition-id": 1, "ledger-path": str(ledger), "ledger-init": "true"}))


def test_a_replayed_message_is_charged_once_and_answered_once(tmp_path):
    ledger = tmp_path / "ledger.jsonl"
    node = _Node(_fedavg, node_partition_loader(_partition))
    ctx = _context(ledger)
    msg = _step_message(node, None)
    rep = read(node.handle(msg, ctx))
    assert isinstance(rep["msg"], bytes)
    assert rep["ledger_head"] == read_ledger(ledger).head
    with pytest.raises(ProtocolError, match="replayed"):
        node.handle(msg, ctx)
    state = read_ledger(ledger)
    assert len(state.charged()) == len(state.committed()) == 1
    # a node with a budget sends nothing un-noised: no local test accuracy, alone or riding
    budgeted = _context(tmp_path / "b.jsonl", **{"client-budget": "server=50",
                                                 "client-budget-delta": DELTA})
    ask = Message(content(run="r1", step="evaluate", seed=0, state=b""), dst_node_id=100,
                  message_type=MESSAGE_TYPE)
    with pytest.raises(ProtocolError, match="does not answer evaluation"):
        node.handle(ask, budgeted)
    riding = _step_message(node, None)
    read(riding).update({"evaluate": True, "eval_state": b""})
    rep = read(node.handle(riding, budgeted))
    assert isinstance(rep["msg"], bytes) and "acc" not in rep and "has_test" not in rep
    # a budget without a ledger file is refused (it would reset with the process)
    bare = Context(run_id=1, node_id=100, run_config={}, state=RecordDict(),
                   node_config={"partition-id": 0, "client-budget": "server=3"})
    with pytest.raises(ProtocolError, match="needs ledger-path"):
        node.handle(_step_message(node, None, run="r2"), bare)


def test_under_distributed_dp_the_node_charges_the_plans_worst_case(tmp_path, trained):
    """DistributedDP over SecureSum: the node derives the release plan itself and is
    charged the shares of the fewest survivors the secure sum accepts; its budget holds
    across runs, and the server's copy of its releases agrees."""
    from secagg import DistributedDP, SecureSum

    def layer():
        return DistributedDP(SecureSum(threshold=0.7), noise_multiplier=Z, delta=DELTA,
                             adjacency="client")

    def run(grid, rounds):
        fed = FlowerFederation(_fedavg(), layer(), load_dataset("digits"), rounds=rounds,
                               seed=0, min_nodes=N, stage_timeout=0.5)
        return fed.run(grid)

    ledger = tmp_path / "ledger.jsonl"
    grid = FedAvgGrid()
    grid.contexts[100].node_config.update({"ledger-path": str(ledger), "ledger-init": "true"})
    first = run(grid, 1)
    (event,) = read_ledger(ledger).charged()
    assert event["layer"] == "distributed-dp" and event["cohort"] == N
    assert event["min_survivors"] == 3 and event["events"]  # ceil(0.7 * 4) shares
    assert {e["mechanism"] for e in event["events"]} == {"discrete_gaussian"}
    assert all(e["n_shares"] == 3 for e in event["events"])
    assert reconcile(ledger, first.transcript.records, 0)["ok"]

    def eps(n):
        evs = [ClientEvent.from_dict({**event, "round": r}) for r in range(n)]
        return server_epsilon(evs, DELTA).epsilon

    budget = (eps(2) + eps(3)) / 2  # one charged already: one more fits, not two
    trained.clear()
    grid = FedAvgGrid()
    grid.contexts[100].node_config.update({"ledger-path": str(ledger), "ledger-init": "true",
                                           "client-budget": f"server={budget}",
                                           "client-budget-delta": DELTA})
    second = run(grid, 4)
    assert trained[0] == [0] and trained[1] == [0, 1, 2, 3]
    state = read_ledger(ledger)
    # the secure sum advertises for round 2 during round 1, so round 2's cohort is drawn
    # before node 0's refusal arrives: it is asked once more, refuses again, then leaves
    assert len(state.charged()) == 2 and [p["round"] for p in state.refusals()] == [1, 2]
    assert [p[2] for p in second.participation] == [N, N - 1, N - 1, N - 1]
    assert [p[3] for p in second.participation] == [N, N, N, N - 1]
    rec = reconcile(ledger, second.transcript.records, 0)
    assert rec["ok"], rec["problems"]
    assert rec["committed"] == 1 and rec["refusals"] == 2
    # the server's view of node 0 (this run only): one upload, both refusals
    d = second.to_dict()
    cl = d["privacy"]["clients"]
    assert d["privacy"]["epsilon"] >= max(c["epsilon"]["server"] for c in cl.values())
    assert cl["0"]["participations"] == 1 and cl["0"]["refusals"] == 2
    assert cl["0"]["eligible_rounds"] == 3 and cl["1"]["eligible_rounds"] == 4


@pytest.mark.parametrize("abuse,why", [({"seed": 7}, "noise seed is fixed"),
                                       ({"public": ["update"]}, "without noise: ['update']")])
def test_terms_that_leave_the_noise_to_the_server_void_the_nodes_figure(tmp_path, abuse, why):
    """A server that fixes the nodes' noise seed knows their noise, and one that declares
    the upload public gets it un-noised: the node claims no guarantee for such a release,
    and a node holding any budget refuses it before training."""
    from secagg.privacy.client_ledger import release_epsilon

    algo = _fedavg()
    algo.setup(load_dataset("digits"), [], 0)
    spec = algo.phases(0, 1)[0].spec()
    local = {"layer": "local-dp", "noise_multiplier": Z, "delta": DELTA,
             "adjacency": "client", "public": [], "seed": None}
    fine = node_event(0, "r", 0, "train", local, spec=spec)
    assert server_epsilon([fine], DELTA).epsilon > 0
    bad = node_event(0, "r", 0, "train", {**local, **abuse}, spec=spec)
    for observer in (server_epsilon, release_epsilon):
        assert observer([bad], DELTA).epsilon is None
        assert why in observer([bad], DELTA).reason
    node = _Node(_fedavg, node_partition_loader(_partition))
    msg = _step_message(node, None)
    read(msg)["dp"] = json.dumps({**json.loads(read(msg)["dp"]), **abuse})
    ctx = _context(tmp_path / "l.jsonl", **{"client-budget": "server=1000",
                                            "client-budget-delta": DELTA})
    with pytest.raises(ProtocolError, match=why.replace("[", r"\[").replace("]", r"\]")):
        node.handle(msg, ctx)
    assert read_ledger(tmp_path / "l.jsonl").charged() == []


def test_a_budget_is_client_level_so_record_level_terms_are_refused():
    """A record-level figure bounds one record, not the node's whole contribution: a
    budgeted node refuses such terms however loose its budget."""
    from secagg.privacy.client_ledger import ClientBudget
    from secagg.privacy.node_budget import node_admit

    local = {"layer": "local-dp", "noise_multiplier": Z}
    budget = ClientBudget.parse("server=1000")
    assert node_admit([], node_event(0, "r", 0, "train", local), budget, DELTA).admitted
    record = node_event(0, "r", 0, "train", {**local, "adjacency": "record"})
    no = node_admit([], record, budget, DELTA)
    assert not no.admitted and "record-level" in no.reason
