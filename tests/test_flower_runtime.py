"""The Flower runtime's fault handling, fast: FlowerFederation against real ClientApp logic
(real keys, masks and shares) over an in-process Grid that delivers each Flower Message to
the addressed node's handler, with a fault hook on the replies.

A node whose reply is malformed is refused and counted as dropped (no crash); a node that
goes silent after sharing its keys is recovered through SecureSum's dropout path. In both
cases the sum equals the embedded engine's with that client dropping at the same stage, and
the ledger names who dropped.
"""

import importlib.util
import os

import numpy as np
import pytest

if importlib.util.find_spec("flwr") is None and os.environ.get("CI") != "true":
    pytest.skip("needs flwr: pip install 'secagg[flower]' (always runs under CI=true)",
                allow_module_level=True)

from flwr.app import Context, Error, Message, RecordDict  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from algorithms import FedLog  # noqa: E402
from secagg import (  # noqa: E402
    CentralDP,
    DistributedDP,
    Federation,
    Homomorphic,
    LocalDP,
    Plaintext,
    ScheduledDropouts,
    SecureSum,
)
from secagg.data import dirichlet_split, load_dataset  # noqa: E402
from secagg.errors import ConfigurationError, UploadError  # noqa: E402
from secagg.flower.client import _Node, node_partition_loader  # noqa: E402
from secagg.flower.records import RECORD, content, read  # noqa: E402
from secagg.flower.server import FlowerFederation  # noqa: E402

N = 4


def _partition():
    return dirichlet_split(load_dataset("digits"), N, 0.5, seed=1, local_test_fraction=0.2)


def _algo():
    return FedLog(feature_dim=4, local_epochs=1)


class LocalGrid(Grid):
    """Delivers each message to its node's ClientApp logic in this process.

    ``fault(step, cid, reply) -> reply | None`` may alter a reply or drop it (None)."""

    def __init__(self, fault=None, algorithm=_algo, partition=None, n=None):
        self.node = _Node(algorithm, node_partition_loader(partition or _partition))
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i,
                                          node_config={"partition-id": i},
                                          state=RecordDict(), run_config={})
                         for i in range(N if n is None else n)}
        self.fault = fault or (lambda step, cid, rep: rep)
        self.replies = []
        self.sent = []  # (step, client, asked to evaluate first) per message
        self.dp_fields = {}  # record field -> messages that carried it ("dp": noise params)

    def set_run(self, run):
        raise NotImplementedError

    @property
    def run(self):
        raise NotImplementedError

    def create_message(self, *args, **kwargs):
        raise NotImplementedError

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        ids = []
        for m in messages:
            m.metadata.__dict__["_message_id"] = m.object_id  # as a SuperLink stamps it
            rec = read(m)
            self.sent.append((rec["step"], m.metadata.dst_node_id - 100,
                              rec.get("evaluate", False)))
            if "dp" in rec:
                self.dp_fields["dp"] = self.dp_fields.get("dp", 0) + 1
            try:
                rep = self.node.handle(m, self.contexts[m.metadata.dst_node_id])
            except Exception as exc:  # as Flower's ClientApp runtime: an error reply
                rep = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                    reason=f"{type(exc)}:<'{exc}'>"), reply_to=m)
            rep = self.fault(read(m)["step"], m.metadata.dst_node_id - 100, rep)
            ids.append(m.metadata.message_id)
            if rep is not None:
                assert rep.metadata.reply_to_message_id == m.metadata.message_id
                self.replies.append(rep)
        return ids

    def pull_messages(self, message_ids):
        out = [r for r in self.replies if r.metadata.reply_to_message_id in message_ids]
        self.replies = [r for r in self.replies if r not in out]
        return out

    def send_and_receive(self, messages, *, timeout=None):
        raise NotImplementedError  # FlowerFederation polls with push/pull itself


@pytest.fixture(autouse=True)
def task_identity():
    """Flower stamps messages with the running task's identity (set by its runtimes)."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def _sums_by_round(layer, rounds, fraction, dropouts=None, algo=None, max_records=None):
    """The embedded engine's aggregate per round (as the server solves from it), and its
    Result."""
    seen = {}
    result = Federation(algo or _algo(), layer, _partition(), rounds=rounds, seed=0,
                        fraction=fraction, dropout=dropouts if dropouts is not None else 0.0,
                        progress=False, max_records=max_records).run(
        on_aggregate=lambda r, p, agg: seen.__setitem__(r, agg))
    return seen, result


def _embedded(layer, schedule):
    return _sums_by_round(layer, 1, 1.0, ScheduledDropouts(schedule))[0][0]


def _run(layer, fault):
    aggs = {}
    fed = FlowerFederation(_algo(), layer, load_dataset("digits"), rounds=1, seed=0,
                           min_nodes=N, stage_timeout=0.5)
    result = fed.run(LocalGrid(fault), on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    return result, aggs[0]


def test_client_app_given_the_algorithm_class_builds_one_per_node():
    """client_app(FedLog, ...) (its docstring allows a class): each node builds FedLog()
    and the round completes as with an instance. Before, the class itself passed for the
    algorithm (it has ``phases``), every node's reply was an error, and the server ran out
    of live clients."""
    grid = LocalGrid(algorithm=FedLog)
    result = FlowerFederation(FedLog(), Plaintext(), load_dataset("digits"), rounds=1,
                              seed=0, min_nodes=N, stage_timeout=0.5).run(grid)
    assert type(grid.node.algorithm) is FedLog
    embedded = Federation(FedLog(), Plaintext(), _partition(), rounds=1, seed=0,
                          progress=False).run()
    assert result.accuracy == pytest.approx(embedded.accuracy, abs=1e-9)


def test_malformed_plaintext_upload_is_refused_and_counted_as_dropped():
    def fault(step, cid, rep):
        if step == "upload" and cid == 3:
            rec = dict(read(rep))
            rec["msg"] = b"SGW\x01garbage"
            rep.content = RecordDict({RECORD: type(read(rep))(rec)})
        return rep

    result, agg = _run(Plaintext(), fault)
    assert result.participation == [(0, "stats", 3, 4)]
    assert agg.contributors == (0, 1, 2)
    assert "refused" in agg.notes["dropped"]["upload"][3]
    assert [(r.sender, r.stage) for r in result.costs.rows if r.stage.startswith("dropped")] \
        == [(3, "dropped:upload")]
    want = _embedded(Plaintext(), {"upload": [3]})
    np.testing.assert_array_equal(agg["stats"], want["stats"])


def test_reply_missing_a_field_counts_as_a_dropout_not_a_crash():
    def fault(step, cid, rep):
        if step == "share" and cid == 1:
            rep.content = content(cpu_s=0.0)  # no "msg"
        return rep

    result, agg = _run(SecureSum(threshold=3), fault)
    assert "malformed reply" in agg.notes["dropped"]["share"][1]
    want = _embedded(SecureSum(threshold=3), {"share": [1]})
    assert agg.contributors == want.contributors == (0, 2, 3)
    np.testing.assert_array_equal(agg["stats"], want["stats"])


def test_node_silent_after_sharing_keys_is_recovered_by_secure_sum():
    def fault(step, cid, rep):
        return None if cid == 2 and step in ("masked-input", "unmask") else rep

    result, agg = _run(SecureSum(threshold=3), fault)
    assert result.participation == [(0, "stats", 3, 4)]
    assert agg.notes["secure_sum"]["recovered"] == [2]  # its mask key rebuilt from shares
    assert [(r.sender, r.stage) for r in result.costs.rows if r.stage.startswith("dropped")] \
        == [(2, "dropped:masked-input")]
    want = _embedded(SecureSum(threshold=3), {"masked-input": [2]})
    assert agg.contributors == want.contributors == (0, 1, 3)
    np.testing.assert_array_equal(agg["stats"], want["stats"])


def test_node_silent_in_the_consistency_round_is_left_out_of_unmasking():
    def fault(step, cid, rep):
        return None if cid == 1 and step in ("consistency", "unmask") else rep

    result, agg = _run(SecureSum(threshold=3), fault)
    # its masked input is in the sum; it is only not asked for shares
    assert agg.contributors == (0, 1, 2, 3)
    assert [(r.sender, r.stage) for r in result.costs.rows if r.stage.startswith("dropped")] \
        == [(1, "dropped:consistency")]
    assert {r.sender for r in result.costs.rows if r.stage == "consistency"
            and r.direction == "up"} == {0, 2, 3}
    want = _embedded(SecureSum(threshold=3), {"consistency": [1]})
    assert agg.contributors == want.contributors
    np.testing.assert_array_equal(agg["stats"], want["stats"])


def test_ckks_over_flower_is_within_its_precision_of_the_embedded_sum():
    result, agg = _run(Homomorphic(scheme="ckks", precision=1e-6), lambda s, c, r: r)
    want = _embedded(Homomorphic(scheme="ckks", precision=1e-6), {})
    assert agg.contributors == want.contributors == tuple(range(N))
    np.testing.assert_allclose(agg["stats"], want["stats"], rtol=0, atol=2e-6)
    assert {o["form"] for o in result.transcript.observations()
            if o["party"] == "server"} == {"encrypted", "clear"}


def test_dpsgd_training_is_refused_over_flower():
    from secagg.privacy.dpsgd import DPSGD

    algo = FedLog(dpsgd=DPSGD(noise_multiplier=1.0, max_grad_norm=1.0))
    with pytest.raises(ConfigurationError, match="DP-SGD"):
        FlowerFederation(algo, Plaintext(), load_dataset("digits"))


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_personalized_accuracy_is_computed_on_the_nodes_as_the_embedded_engine_does(fraction):
    fed = FlowerFederation(_algo(), Plaintext(), load_dataset("digits"), rounds=3, seed=0,
                           min_nodes=N, stage_timeout=0.5, fraction=fraction)
    grid = LocalGrid()
    result = fed.run(grid)
    want = Federation(_algo(), Plaintext(), _partition(), rounds=3, seed=0, fraction=fraction,
                      progress=False).run()
    assert result.accuracy_kind == want.accuracy_kind == "mean local test"
    assert len(result.history) == 3 and 0.0 < result.history[-1] <= 1.0
    assert result.history == want.history  # bit for bit, per round
    # rounds 0 and 1 are scored in the next round's upload instruction (cohort members) or
    # a message of their own (the others); the last round always in its own messages
    ups = [c for s, c, ev in grid.sent if s == "upload" and ev]
    alone = [c for s, c, _ in grid.sent if s == "evaluate"]
    assert sorted(ups + alone) == [c for c in range(N) for _ in range(3)]
    if fraction == 1.0:
        assert ups == [0, 1, 2, 3] * 2 and alone == [0, 1, 2, 3]
    else:
        assert len(ups) == 2 * 2 and len(alone) == 2 * 2 + N  # 2 of 4 per cohort
    # evaluation is measurement, not protocol: not in the ledger, Flower's bytes apart
    assert not [r for r in result.costs.rows if r.stage == "evaluate"]
    assert fed.transport.to_dict()["evaluate"]["messages"] == 2 * len(alone)


def test_a_node_dropped_in_the_round_is_not_asked_to_evaluate():
    steps = []

    def fault(step, cid, rep):
        steps.append((step, cid))
        return None if cid == 2 and step == "masked-input" else rep

    fed = FlowerFederation(_algo(), SecureSum(threshold=3), load_dataset("digits"), rounds=1,
                           seed=0, min_nodes=N, stage_timeout=0.5)
    result = fed.run(LocalGrid(fault))
    assert [c for s, c in steps if s == "evaluate"] == [0, 1, 3]
    assert 0.0 < result.accuracy <= 1.0


def test_node_evaluation_off_reports_nan_and_a_personalized_algorithm_needs_the_hooks():
    fed = FlowerFederation(_algo(), Plaintext(), load_dataset("digits"), rounds=1, seed=0,
                           min_nodes=N, stage_timeout=0.5, node_evaluation=False)
    steps = []
    result = fed.run(LocalGrid(lambda s, c, r: steps.append(s) or r))
    assert np.isnan(result.accuracy) and "evaluate" not in steps

    class NoHooks(FedLog):
        evaluation_state = None

    with pytest.raises(ConfigurationError, match="evaluation_state"):
        FlowerFederation(NoHooks(), Plaintext(), load_dataset("digits"))


def test_a_local_only_phase_is_refused_before_its_nodes_are_contacted():
    from algorithms.base import LocalPhase

    class LocalOnly(LocalPhase):
        name = "local"

        def client_step(self, client, broadcast):
            return {}

    class WithLocalPhase(FedLog):
        def phases(self, round, rounds):
            return [LocalOnly(), *super().phases(round, rounds)]

    steps = []
    fed = FlowerFederation(WithLocalPhase(feature_dim=4, local_epochs=1), Plaintext(),
                           load_dataset("digits"), rounds=1, seed=0, min_nodes=N,
                           stage_timeout=0.5)
    with pytest.raises(ConfigurationError, match="local-only"):
        fed.run(LocalGrid(lambda s, c, r: steps.append(s) or r))
    assert set(steps) == {"hello"}


class _RoundSchedule(ScheduledDropouts):
    """Drop the named clients at (round, stage) only (the embedded twin of a node that is
    silent in one round)."""

    def __init__(self, plan):
        super().__init__({})
        self.plan = {k: set(v) for k, v in plan.items()}

    def survivors(self, stage, clients):
        gone = self.plan.get((self.round, stage), set())
        return [c for c in clients if c not in gone]


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_every_session_is_advertised_ahead_with_the_hello_or_the_previous_unmask(fraction):
    """Four exchanges per SecureSum session: its ADVERTISE rides on the hello (the first
    session) or on the previous session's unmask (nodes of the next cohort outside that
    unmask get an instruction of their own in the same exchange), and the client step on
    its share instruction; the sums, per round, are the embedded engine's bit for bit."""
    rounds = 3
    aggs = {}
    fed = FlowerFederation(_algo(), SecureSum(threshold=0.6), load_dataset("digits"),
                           rounds=rounds, seed=0, min_nodes=N, stage_timeout=0.5,
                           fraction=fraction)
    grid = LocalGrid()
    result = fed.run(grid, on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    want, embedded = _sums_by_round(SecureSum(threshold=0.6), rounds, fraction)
    for r in range(rounds):
        assert aggs[r].contributors == want[r].contributors
        np.testing.assert_array_equal(aggs[r]["stats"], want[r]["stats"])
    assert result.history == embedded.history
    steps = [s for s, _, _ in grid.sent]
    cohort = len(aggs[0].contributors)
    assert steps.count("advertise") == 0 and steps.count("hello") == N
    assert steps.count("unmask") == rounds * cohort
    ahead = steps.count("advertise-next")
    if fraction == 1.0:
        assert ahead == 0
    else:  # next-cohort nodes that were not in the unmask
        assert ahead == sum(len(set(aggs[r + 1].contributors) - set(aggs[r].contributors))
                            for r in range(rounds - 1)) > 0
    # every session's ADVERTISE is booked in its own round, from every cohort node
    for r in range(rounds):
        assert {row.sender for row in result.costs.rows if row.round == r
                and row.stage == "advertise"} == set(aggs[r].contributors)


def test_a_node_silent_in_an_unmask_misses_the_next_session_it_was_advertised_for():
    """Client 2's unmask reply (which carried its next ADVERTISE) is lost in round 0: round
    0 still sums all four (its masked input is in, its shares are not needed), and round 1
    runs without it (dropped at advertise), equal to the embedded engine with that
    schedule."""
    lost = []

    def fault(step, cid, rep):
        if step == "unmask" and cid == 2 and not lost:
            lost.append(cid)
            return None
        return rep

    aggs = {}
    fed = FlowerFederation(_algo(), SecureSum(threshold=3), load_dataset("digits"), rounds=2,
                           seed=0, min_nodes=N, stage_timeout=0.5)
    result = fed.run(LocalGrid(fault), on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    assert result.participation == [(0, "stats", 4, 4), (1, "stats", 3, 4)]
    assert [(r.round, r.sender, r.stage) for r in result.costs.rows
            if r.stage.startswith("dropped")] == [(0, 2, "dropped:unmask"),
                                                  (1, 2, "dropped:advertise")]
    want, _ = _sums_by_round(SecureSum(threshold=3), 2, 1.0,
                             _RoundSchedule({(0, "unmask"): [2], (1, "advertise"): [2]}))
    for r in (0, 1):
        assert aggs[r].contributors == want[r].contributors
        np.testing.assert_array_equal(aggs[r]["stats"], want[r]["stats"])


def test_a_share_with_the_step_needs_a_party_advertised_ahead_for_that_cohort():
    """A node refuses (typed error, so an error reply: the node drops) a share instruction
    with the client step when it advertised no party ahead, or one for another cohort
    size; it never shares keys under thresholds it did not derive for that session."""
    import json

    from flwr.app import Message

    from secagg.errors import ProtocolError
    from secagg.flower.records import MESSAGE_TYPE

    layer = SecureSum(threshold=0.6)
    params = json.dumps({k: getattr(layer, k) for k in ("threshold", "graph", "k", "precision",
                                                         "ring_bits")})
    node = _Node(_algo, node_partition_loader(_partition))
    ctx = Context(run_id=1, node_id=100, node_config={"partition-id": 0}, state=RecordDict(),
                  run_config={})

    def send(**fields):
        return node.handle(Message(content(run="r1", **fields), dst_node_id=100,
                                   message_type=MESSAGE_TYPE), ctx)

    share = dict(step="share", with_step=True, msg=b"roster", round=1, rounds=2,
                 phase="stats", seed=0, max_records=1000, on_violation="raise", n=4,
                 layer=params)
    with pytest.raises(ProtocolError, match="advertised ahead"):
        send(**share)
    rep = read(send(step="advertise-next", next_session=b"s" * 16, next_round=1, next_n=3,
                    next_layer=params))
    assert isinstance(rep["next_msg"], bytes) and rep["next_msg"]
    with pytest.raises(ProtocolError, match="cohort of 4"):
        send(**share)


@pytest.mark.parametrize("on_abort", ["raise", "skip"])
def test_a_session_below_threshold_aborts_and_names_the_nodes_lost(on_abort):
    """Two of four nodes silent at share under t=3: the session aborts. on_abort="raise"
    raises SecureSumAborted with a note naming the nodes lost; "skip" records the abort,
    books the phase with no uploads, and the next round runs (and advertises afresh)."""
    from secagg.errors import SecureSumAborted

    lost = set()

    def fault(step, cid, rep):  # silent at round 0's share only
        if step == "share" and cid in (1, 2) and cid not in lost:
            lost.add(cid)
            return None
        return rep

    ran = []
    fed = FlowerFederation(_algo(), SecureSum(threshold=3), load_dataset("digits"), rounds=2,
                           seed=0, min_nodes=N, stage_timeout=0.5, on_abort=on_abort)
    grid = LocalGrid(fault)
    if on_abort == "raise":
        with pytest.raises(SecureSumAborted) as info:
            fed.run(grid)
        assert any("nodes lost" in n and "'share'" in n for n in info.value.__notes__)
        return
    result = fed.run(grid, on_aggregate=lambda r, p, a: ran.append(r))
    assert [(r, p) for r, p, _ in result.aborted] == [(0, "stats")]
    assert result.participation == [(0, "stats", 0, 4), (1, "stats", 4, 4)]
    assert ran == [1]
    # round 0 was advertised with the hello; round 0 aborted before its unmask, so round
    # 1 had nothing advertised ahead and advertised afresh
    assert [s for s, _, _ in grid.sent].count("advertise") == N


def test_a_cohort_other_than_the_hello_announced_is_advertised_afresh():
    """Node 3 does not answer the hello: the cohort is 3, not the 4 the hello announced to
    the others, so their early ADVERTISE (sized for 4) is not used; round 0 advertises
    afresh and completes with the three."""
    def fault(step, cid, rep):
        return None if step == "hello" and cid == 3 else rep

    grid = LocalGrid(fault)
    fed = FlowerFederation(_algo(), SecureSum(threshold=0.6), load_dataset("digits"),
                           rounds=2, seed=0, min_nodes=3, stage_timeout=0.5,
                           connect_timeout=0.5)
    result = fed.run(grid)
    assert result.participation == [(0, "stats", 3, 3), (1, "stats", 3, 3)]
    steps = [(s, c) for s, c, _ in grid.sent]
    assert [c for s, c in steps if s == "advertise"] == [0, 1, 2]  # round 0 only
    assert not [r for r in result.costs.rows if r.stage.startswith("dropped")]


def test_the_hello_reveals_no_record_count_and_plans_come_from_the_public_bound():
    """A node's record count is private: the hello carries its client id only, and the
    fixed-point plan comes from the public max_records (default or given), never from the
    largest node's size. FedLog with a per-record bound (client_l2=None) under SecureSum:
    the sums equal Federation's with the same public bound, bit for bit (the old runtime
    planned from the largest node's reported size, so its scale and sums differed)."""
    hellos = []

    def fault(step, cid, rep):
        if step == "hello":
            hellos.append(set(read(rep).keys()))
        return rep

    def algo():
        return FedLog(feature_dim=4, local_epochs=1, client_l2=None)

    for max_records in (None, 600):
        aggs = {}
        hellos.clear()
        grid = LocalGrid(fault)
        grid.node = _Node(algo, node_partition_loader(_partition))
        # at precision 1e-5 the ring is 40 bits for 10,000 records a client (the default
        # bound), 32 for 600 -- and 32 for 470, the largest node's size
        fed = FlowerFederation(algo(), SecureSum(threshold=3, precision=1e-5),
                               load_dataset("digits"), rounds=1, seed=0, min_nodes=N,
                               stage_timeout=0.5, max_records=max_records)
        result = fed.run(grid, on_aggregate=lambda r, p, a, aggs=aggs: aggs.__setitem__(r, a))
        # (identity, att, att_cpu_s: the node's public key and its signed statement about
        # next_msg, secagg.attest -- no record count in either)
        assert hellos and all(keys <= {"cid", "next_msg", "next_cpu_s", "identity", "att",
                                       "att_cpu_s"} for keys in hellos)
        want, embedded = _sums_by_round(SecureSum(threshold=3, precision=1e-5), 1, 1.0,
                                        algo=algo(), max_records=max_records)
        assert aggs[0].notes["secure_sum"]["ring_bits"] == \
            want[0].notes["secure_sum"]["ring_bits"] == (40 if max_records is None else 32)
        np.testing.assert_array_equal(aggs[0]["stats"], want[0]["stats"])
        masked = [[r.wire_bytes for r in res.costs.rows if r.stage == "masked-input"
                   and r.direction == "up"] for res in (result, embedded)]
        assert masked[0] == masked[1]


def test_a_node_above_the_public_max_records_refuses_its_upload():
    """Client 0 holds 470 records, the others 195-254: under max_records=300 client 0
    refuses its own upload (an error reply naming the bound, so it drops) and the round
    sums the other three, as the embedded engine refuses such a client."""
    assert [len(c.y) for c in _partition()] == [470, 195, 254, 230]
    aggs = {}
    fed = FlowerFederation(_algo(), Plaintext(), load_dataset("digits"), rounds=1, seed=0,
                           min_nodes=N, stage_timeout=0.5, max_records=300)
    result = fed.run(LocalGrid(), on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    assert result.participation == [(0, "stats", 3, 4)]
    assert "max_records=300" in aggs[0].notes["dropped"]["upload"][0]
    with pytest.raises(UploadError, match="max_records=300"):
        Federation(_algo(), Plaintext(), _partition(), rounds=1, seed=0, progress=False,
                   max_records=300).run()
    with pytest.raises(ConfigurationError, match="max_records"):
        FlowerFederation(_algo(), Plaintext(), load_dataset("digits"), max_records=0)


# DP layers over Flower: each party's part runs where it belongs (LocalDP and DistributedDP
# noise on the nodes, CentralDP at the server). With a user seed every party's noise stream
# is reproducible (and the run is reported not private), so the sums must equal the embedded
# engine's bit for bit; without one the run is private and its epsilon the embedded run's.
_DP = {
    "central-dp/secure-sum": lambda seed: CentralDP(SecureSum(threshold=3), epsilon=4.0,
                                                    delta=1e-5, adjacency="client", seed=seed),
    "local-dp/plaintext": lambda seed: LocalDP(Plaintext(), epsilon=4.0, delta=1e-5,
                                               adjacency="client", seed=seed),
    "local-dp/secure-sum": lambda seed: LocalDP(SecureSum(threshold=3), epsilon=4.0,
                                                delta=1e-5, adjacency="client", seed=seed),
    "distributed-dp/secure-sum": lambda seed: DistributedDP(
        SecureSum(threshold=3), epsilon=4.0, delta=1e-5, adjacency="client", seed=seed),
    "central-dp/plaintext": lambda seed: CentralDP(Plaintext(), epsilon=4.0, delta=1e-5,
                                                   adjacency="client", seed=seed),
    "local-dp/bfv": lambda seed: LocalDP(Homomorphic(scheme="bfv"), epsilon=4.0, delta=1e-5,
                                         adjacency="client", seed=seed),
    "distributed-dp/skellam": lambda seed: DistributedDP(
        SecureSum(threshold=3), mechanism="skellam", epsilon=4.0, delta=1e-5,
        adjacency="client", seed=seed),
}


def _dp_runs(name, seed, rounds=2, fault=None, node_evaluation=None):
    aggs = {}
    fed = FlowerFederation(_algo(), _DP[name](seed), load_dataset("digits"), rounds=rounds,
                           seed=0, min_nodes=N, stage_timeout=0.5,
                           node_evaluation=node_evaluation)
    grid = LocalGrid(fault)
    result = fed.run(grid, on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    want, embedded = _sums_by_round(_DP[name](seed), rounds, 1.0)
    return aggs, result, want, embedded, grid


@pytest.mark.parametrize("name", sorted(_DP))
def test_seeded_dp_over_flower_equals_the_embedded_engine(name, ledger_messages):
    # node evaluation on (off by default under DP): the accuracies are compared too
    aggs, result, want, embedded, grid = _dp_runs(name, seed=7, node_evaluation=True)
    plain, _ = _sums_by_round(Plaintext(), 2, 1.0)
    for r in (0, 1):
        assert aggs[r].contributors == want[r].contributors == tuple(range(N))
        np.testing.assert_array_equal(aggs[r]["stats"], want[r]["stats"])
        assert not np.array_equal(aggs[r]["stats"], plain[r]["stats"])  # noise was added
        assert aggs[r].notes["dp"]["noise_multiplier"] == want[r].notes["dp"]["noise_multiplier"]
    assert result.history == embedded.history
    # the same ledger of privacy events, and the same verdict: a user seed is not private
    assert result.privacy.epsilon(delta=1e-5) == embedded.privacy.epsilon(delta=1e-5) <= 4.0
    assert not result.privacy.private and not embedded.privacy.private
    assert ledger_messages(result) == ledger_messages(embedded)
    # the nodes were told to noise exactly when the layer's noise is theirs to add
    told = {s for s, _, _ in grid.sent if s in ("upload", "share", "he-upload")}
    assert told
    if name.startswith("central-dp"):
        assert "dp" not in grid.dp_fields
    else:
        assert grid.dp_fields["dp"] > 0


@pytest.mark.parametrize("name", ["local-dp/secure-sum", "distributed-dp/secure-sum",
                                  "central-dp/secure-sum"])
def test_dp_over_flower_is_private_and_the_server_never_sees_an_unnoised_sum(name):
    aggs, result, want, embedded, grid = _dp_runs(name, seed=None)
    assert result.privacy.private and embedded.privacy.private
    # node evaluation is off by default under DP: no node's accuracy reaches the server
    assert "evaluate" not in {s for s, _, _ in grid.sent} and np.isnan(result.history).all()
    assert result.privacy.epsilon(delta=1e-5) == pytest.approx(
        embedded.privacy.epsilon(delta=1e-5), rel=1e-9)
    assert result.privacy.epsilon(delta=1e-5) <= 4.0
    plain, _ = _sums_by_round(Plaintext(), 2, 1.0)
    forms = {(o["stage"], o["form"]) for o in result.transcript.observations()
             if o["party"] == "server" and o["field"] == "stats"}
    if name.startswith("central-dp"):  # the aggregator sees the sum, then noises it
        assert ("unmask", "clear") in forms and ("dp-noise", "noised") in forms
    else:  # noise added on the nodes: no form the server saw is clear
        assert all(form in ("masked", "noised") for _, form in forms), forms
    for r in (0, 1):
        gap = np.abs(aggs[r]["stats"] - plain[r]["stats"])
        sigma = max(aggs[r].notes["dp"]["fields"]["stats"]["sigma"],
                    aggs[r].notes["dp"].get("sum_sigma", {}).get("stats", 0.0))
        assert 0 < gap.max() < 8 * sigma  # noised, at the scale the ledger accounts for
    # the transcript closes with the run's DP guarantee, as the embedded engine's
    assert [p for p in result.transcript.records if p.get("type") == "privacy"]


def test_distributed_dp_over_flower_accounts_for_a_node_that_drops():
    """Node 2 is silent after sharing its keys: the sum holds 3 noise shares, not 4; the
    ledger spends the events of the noise actually added, as the embedded engine does with
    the same dropout, and the sums are bit-equal under a user seed."""
    def fault(step, cid, rep):
        return None if cid == 2 and step in ("masked-input", "unmask") else rep

    aggs = {}
    fed = FlowerFederation(_algo(), _DP["distributed-dp/secure-sum"](3), load_dataset("digits"),
                           rounds=1, seed=0, min_nodes=N, stage_timeout=0.5)
    result = fed.run(LocalGrid(fault), on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    want, embedded = _sums_by_round(_DP["distributed-dp/secure-sum"](3), 1, 1.0,
                                    ScheduledDropouts({"masked-input": [2]}))
    assert aggs[0].contributors == want[0].contributors == (0, 1, 3)
    assert aggs[0].notes["dp"]["survivors"] == 3 and aggs[0].notes["dp"]["min_survivors"] == 3
    np.testing.assert_array_equal(aggs[0]["stats"], want[0]["stats"])
    assert result.privacy.epsilon(delta=1e-5) == embedded.privacy.epsilon(delta=1e-5)


def test_a_node_refuses_dp_parameters_it_cannot_check():
    """Parameters the node cannot rebuild a noise layer from (an unknown layer, a negative
    multiplier) are refused with a typed error, so the node drops; it never uploads
    without the noise it was asked for."""
    import json

    from flwr.app import Message

    from secagg.errors import ProtocolError
    from secagg.flower.records import MESSAGE_TYPE

    node = _Node(_algo, node_partition_loader(_partition))
    ctx = Context(run_id=1, node_id=100, node_config={"partition-id": 0}, state=RecordDict(),
                  run_config={})
    base = dict(run="r1", step="upload", round=0, rounds=1, phase="stats", seed=0,
                max_records=1000, on_violation="raise")
    good = _DP["local-dp/plaintext"](None)
    good.plan_releases(1)
    for bad in ({**good.node_params(), "layer": "central-dp"},
                {**good.node_params(), "noise_multiplier": -1.0},
                {**good.node_params(), "sigma": 0.0}):
        with pytest.raises(ProtocolError, match="DP parameters refused"):
            node.handle(Message(content(**base, dp=json.dumps(bad)), dst_node_id=100,
                                message_type=MESSAGE_TYPE), ctx)
    rep = read(node.handle(Message(content(**base, dp=json.dumps(good.node_params())),
                                   dst_node_id=100, message_type=MESSAGE_TYPE), ctx))
    assert isinstance(rep["msg"], bytes)


def test_layers_flower_cannot_carry_yet_are_refused_with_the_reason():
    from secagg.layers.per_group import PerGroup

    with pytest.raises(ConfigurationError, match="DistributedDP around"):
        FlowerFederation(_algo(), DistributedDP(_FakeSum(), epsilon=1.0, delta=1e-5),
                         load_dataset("digits"))
    with pytest.raises(ConfigurationError, match="does not run on Flower"):
        FlowerFederation(_algo(), PerGroup({"default": Plaintext()}), load_dataset("digits"))


class _FakeSum(SecureSum):
    """A SecureSum subclass (not SecureSum itself): refused by the exact-type check."""


@pytest.mark.parametrize("victims", [(0, 1, 2), (1,)], ids=["everyone", "one"])
def test_a_lying_node_excludes_only_itself(victims):
    # issue 26 on the Flower runtime: node 3's ACK accuses honest nodes of sending shares that
    # failed authentication; the server checks each complaint's evidence (the revealed key
    # does not match what the pair committed to) and excludes the liar, not its victims
    from secagg.secure_sum import wire

    def fault(step, cid, rep):
        if step == "masked-input" and cid == 3:
            rec = dict(read(rep))
            session = rec["ack"][4:4 + wire.SESSION_BYTES]
            if hasattr(wire, "complaints_body"):
                body = wire.complaints_body({v: (os.urandom(32), os.urandom(32))
                                             for v in victims})
            else:  # the wire before verifiable complaints: a bare list of ids
                body = wire.ids_body(set(victims))
            rec["ack"] = wire.encode(wire.MsgType.ACK, session, 3, wire.SERVER_ID, body)
            rep.content = RecordDict({RECORD: type(read(rep))(rec)})
        return rep

    result, agg = _run(SecureSum(threshold=3), fault)
    notes = agg.notes["secure_sum"]
    assert agg.contributors == (0, 1, 2)
    assert notes["excluded"] == [3] and notes["recovered"] == [3]
    assert notes["verdicts"] == [[3, v, "uncommitted key"] for v in victims]
    want = _embedded(SecureSum(threshold=3), {"masked-input": [3]})
    assert want.contributors == (0, 1, 2)
    np.testing.assert_array_equal(agg["stats"], want["stats"])


def test_a_lying_node_revealing_its_true_keys_is_found_out_by_opening_the_shares():
    # the liar reveals the true share keys of the pairs it accuses: the server opens the
    # shares it relayed, finds them well-formed, and excludes the liar ("false")
    from secagg.secure_sum import wire
    from secagg.secure_sum.keys import key_commitment
    from secagg.secure_sum.node import thaw

    grid = None

    def fault(step, cid, rep):
        if step == "masked-input" and cid == 3:
            party = thaw(grid.contexts[103].state.config_records["secagg-node"]["party"])
            ev = {v: (party._channels[v][1], key_commitment(party._channels[v][0]))
                  for v in (0, 2)}
            rec = dict(read(rep))
            rec["ack"] = wire.encode(wire.MsgType.ACK, party.session, 3, wire.SERVER_ID,
                                     wire.complaints_body(ev))
            rep.content = RecordDict({RECORD: type(read(rep))(rec)})
        return rep

    grid = LocalGrid(fault)
    aggs = {}
    fed = FlowerFederation(_algo(), SecureSum(threshold=3), load_dataset("digits"), rounds=1,
                           seed=0, min_nodes=N, stage_timeout=0.5)
    fed.run(grid, on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    agg = aggs[0]
    assert agg.contributors == (0, 1, 2)
    assert agg.notes["secure_sum"]["verdicts"] == [[3, 0, "false"], [3, 2, "false"]]
    want = _embedded(SecureSum(threshold=3), {"masked-input": [3]})
    np.testing.assert_array_equal(agg["stats"], want["stats"])


# -- attestation and the node's stored state (issue 24) ---------------------------------


@pytest.mark.parametrize("make", [lambda: SecureSum(threshold=0.7), lambda: Homomorphic(),
                                  lambda: LocalDP(Plaintext(), epsilon=2.0, delta=1e-5,
                                                  seed=1),
                                  lambda: DistributedDP(SecureSum(threshold=0.7),
                                                        noise_multiplier=1.0, delta=1e-5)],
                         ids=["secure-sum", "homomorphic", "local-dp", "distributed-dp"])
def test_the_nodes_sign_and_an_attested_audit_verifies_and_catches_a_relabel(make):
    """Each node signs its messages with its own key (announced with the hello); the
    transcript verifies under those keys, and a relabelled record is named."""
    from secagg.attest import read_identities, verify, write_identities
    from secagg.transcript import Transcript

    grid = LocalGrid()
    result = FlowerFederation(_algo(), make(), load_dataset("digits"), rounds=1, seed=0,
                              min_nodes=N, stage_timeout=0.5).run(grid)
    assert {str(c) for c in range(N)} <= set(result.identities)
    # the keys are the nodes' own: the public half of the key each keeps in its state
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secagg.attest import public_hex
    for nid, ctx in grid.contexts.items():
        key = Ed25519PrivateKey.from_private_bytes(
            ctx.state.config_records["secagg-identity"]["ed25519"])
        assert result.identities[str(nid - 100)] == public_hex(key)
    import tempfile
    from pathlib import Path

    from secagg.attest import SCHEME

    with tempfile.TemporaryDirectory() as d:  # scheme v2: numbered, and every node closed
        ids = read_identities(write_identities(Path(d) / "ids.json", result.identities,
                                               scheme=SCHEME))
    records = result.transcript.records
    assert verify(records, ids) == []
    closed = {str(r["statement"]["sender"]) for r in records if r.get("type") ==
              "attestation" and r["statement"]["stage"] == "end"}
    assert closed == set(result.identities)  # the HE decryptor closes as itself too
    from secagg.audit import audit

    report = audit(result.transcript, ids)  # the DP figures, recomputed from signed terms
    assert report["attestation"] == []
    if result.privacy is not None:
        assert report["dp_recomputed"]["epsilon"] == pytest.approx(result.privacy.epsilon())
    rows = [r for r in result.costs.rows if r.stage == "attest"]
    assert {r.sender for r in rows} >= set(range(N)) and all(r.wire_bytes > 64 for r in rows)
    i = next(i for i, r in enumerate(records) if r.get("type") == "observation"
             and r["sender"] == 0 and r["form"] in ("masked", "encrypted", "noised"))
    forged = [dict(r) for r in records]
    forged[i]["form"] = "clear"
    t = Transcript()
    t.records = [r for r in forged if r.get("type") != "end"]
    t.close()
    problems = verify(t.records, ids)
    assert [p.line for p in problems] == [i + 1] and problems[0].kind == "contradicted"


def test_node_state_is_stored_without_pickle_and_a_planted_pickle_is_refused(tmp_path):
    """The node keeps its client state (FedLog's model) in secagg.safestore's format;
    a pickle put in its place is refused (the node drops), never unpickled."""
    import pickle
    from pathlib import Path

    grid = LocalGrid()
    FlowerFederation(_algo(), Plaintext(), load_dataset("digits"), rounds=1, seed=0,
                     min_nodes=N, stage_timeout=0.5).run(grid)
    store = grid.contexts[100].state.config_records["secagg-node"]
    raw = store["client_state"]
    assert raw[:4] == b"SGS1"  # arrays + JSON, not a pickle
    from secagg import safestore
    assert "model" in safestore.loads(raw, lambda path, cls: _algo_model())

    marker = tmp_path / "marker"

    class Planted:
        def __reduce__(self):
            return (Path.write_text, (marker, "code ran"))

    store["client_state"] = pickle.dumps(Planted())
    # the same run tag (a new run would forget the state), so the node reads it back
    node_ctx = grid.contexts[100]
    from secagg.flower.records import content as make
    msg = Message(make(step="upload", run=store["run"], round=0, rounds=1, phase="stats",
                       seed=0, max_records=10_000, on_violation="raise", broadcast=b""),
                  dst_node_id=100, message_type="train.secagg")
    with pytest.raises(Exception, match="stored client state"):
        grid.node.handle(msg, node_ctx)
    assert not marker.exists()


def _algo_model():
    """A fresh FedLog body of the test's shape, to load a stored state into."""
    from algorithms.models import build_model

    ds = load_dataset("digits")
    return build_model(ds.input_shape, ds.n_classes, 4)
