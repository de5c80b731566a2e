"""A ServerApp that lies to the nodes, from the attacker's seat (issue 33, items 1 and 2).

The lying server is a Grid wrapper in the ServerApp: it rewrites the instruction each node
receives (the cohort size, the secure sum's graph, the DP terms) after secagg's server built
it, as a ServerApp of the attacker's own would send it. The nodes run the real ClientApp
logic. One ``flwr.simulation.run_simulation`` (Flower's simulation runtime, nodes in Ray
workers) runs every lie against nodes that pin their peers' identities (node config
``identity-key``, ``pinned-keys``) and hold a noise floor; the nodes that do not pin (they
add their whole noise alone, or trust the server) run over the in-process Grid of the
runtime tests, where a spy sees whether a node touched its data.
"""

import importlib.util
import json
import math
import os

import numpy as np
import pytest

if importlib.util.find_spec("flwr") is None and os.environ.get("CI") != "true":
    pytest.skip("needs flwr: pip install 'secagg[flower]' (always runs under CI=true)",
                allow_module_level=True)

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from test_flower_runtime import LocalGrid, N, _algo, _partition, task_identity  # noqa: E402,F401

from algorithms import FedLog  # noqa: E402
from secagg import DistributedDP, SecureSum  # noqa: E402
from secagg.data import load_dataset  # noqa: E402
from secagg.errors import SecureSumAborted  # noqa: E402
from secagg.flower.client import _Node, node_partition_loader  # noqa: E402
from secagg.flower.records import read  # noqa: E402
from secagg.flower.server import FlowerFederation  # noqa: E402
from secagg.privacy.client_ledger import ClientEvent, server_epsilon  # noqa: E402
from secagg.privacy.node_budget import node_event  # noqa: E402
from secagg.privacy.node_ledger import read_ledger  # noqa: E402

Z, FLOOR, DELTA = 2.0, 1.0, 1e-5  # the honest multiplier, the nodes' floor
FAKE_N = 100_000  # the cohort the lying server claims (its Harary graph: 70,000 survivors)


def _layer(z=Z):
    return DistributedDP(SecureSum(threshold=0.7), noise_multiplier=z, delta=DELTA,
                         adjacency="client")


def _set_dp(rec, **terms):
    rec["dp"] = json.dumps({**json.loads(rec["dp"]), **terms})


#: name -> how the lying server rewrites each instruction's record (None: honest)
LIES = {
    "honest": None,
    # item 1: 100,000 clients on a Harary graph, so each share is sized for 70,000
    "cohort": lambda rec: (rec.update({k: FAKE_N for k in ("n", "next_n") if k in rec}),
                           [rec.__setitem__(k, json.dumps({**json.loads(rec[k]),
                                                           "graph": "harary"}))
                            for k in ("layer", "next_layer") if k in rec]),
    # item 2: the server's own noise seed; every field public; record-level adjacency
    "seed": lambda rec: "dp" in rec and _set_dp(rec, seed=1234),
    "public": lambda rec: "dp" in rec and _set_dp(rec, public=["stats"]),
    "record": lambda rec: "dp" in rec and _set_dp(rec, adjacency="record"),
    # variants: a delta above the node's bound; a multiplier above the floor whose
    # per-release epsilon is above the node's bound; a cohort above the node's bound
    "delta": lambda rec: "dp" in rec and _set_dp(rec, delta=0.01),
    "epsilon": lambda rec: "dp" in rec and _set_dp(rec, noise_multiplier=1.2),
    "max-cohort": lambda rec: rec.update({k: N + 1 for k in ("n", "next_n") if k in rec}),
}

def _strip_signatures(rec):
    """At the unmask stage, keep two of the consistency signatures the request carries
    (the node's own and one other): fewer than the survivors its share was sized for."""
    from secagg.secure_sum import wire

    if rec.get("step") != "unmask":
        return
    raw = bytes(rec["msg"])
    magic, version, mtype, session, sender, receiver, size = wire.HEADER.unpack(
        raw[:wire.HEADER_BYTES])
    b, sk, sigs = wire.parse_unmask_request(memoryview(raw)[wire.HEADER_BYTES:])
    keep = {v: sigs[v] for v in sorted(sigs, key=lambda v: v != receiver)[:2]}
    rec["msg"] = wire.encode(wire.MsgType(mtype), session, sender, receiver,
                             wire.unmask_request_body(b, sk, keep))


LIES["signatures"] = _strip_signatures

#: what every node says when it refuses each lie
WHY = {"cohort": f"a cohort of {FAKE_N} clients, but only {N} are pinned",
       "seed": "chosen by the server", "public": "declared public",
       "record": "sized for one record", "delta": "dp-max-delta",
       "epsilon": "dp-max-epsilon",
       "signatures": "2 valid signatures on its survivor set, 3 needed"}


class LyingGrid(Grid):
    """The ServerApp's Grid, with each outgoing instruction rewritten by ``lie``."""

    def __init__(self, grid, lie):
        self.grid, self.lie = grid, lie

    def set_run(self, run):
        self.grid.set_run(run)

    @property
    def run(self):
        return self.grid.run

    def create_message(self, *args, **kwargs):
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self):
        return self.grid.get_node_ids()

    def push_messages(self, messages):
        messages = list(messages)
        if self.lie is not None:
            for m in messages:
                self.lie(read(m))
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids):
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        raise NotImplementedError


def _eps(z, sizing="pinned"):
    """One release's epsilon against the server at multiplier z, as a node of the honest
    cohort of N is charged it (from the node's own accounting, node_event)."""
    from dataclasses import replace

    algo = _algo()
    algo.setup(load_dataset("digits"), [], 0)
    spec = replace(algo.phases(0, 1)[0].spec(), max_records=1000)
    layer = _layer(z)
    layer.plan_releases(1)
    inner = layer.inner
    params = json.dumps({k: getattr(inner, k) for k in ("threshold", "graph", "k",
                                                         "precision", "ring_bits")})
    ev = node_event(0, "r", 0, "stats", layer.node_params(), spec=spec, cohort=N,
                    layer=params, sizing=sizing)
    return server_epsilon([ev], DELTA).epsilon


def _run(grid, lie, z=Z, timeout=0.5):
    """One round of FedLog under DistributedDP through ``grid`` rewritten by ``lie``:
    (the aggregate or None, every node's refusal reasons as one text)."""
    aggs = {}
    fed = FlowerFederation(_algo(), _layer(z), load_dataset("digits"), rounds=1, seed=0,
                           min_nodes=N, stage_timeout=timeout, connect_timeout=300)
    try:
        fed.run(LyingGrid(grid, LIES[lie]), on_aggregate=lambda r, p, a: aggs.__setitem__(
            r, a))
    except SecureSumAborted as exc:
        text = " ".join([str(exc), *getattr(exc, "__notes__", [])])
        return None, text.replace("\\'", "'")  # as the error replies' reprs quote it
    return aggs.get(0), ""


def _keys(root):
    """Each node's identity key file and the pinned public keys (a directory of ID.pub)."""
    (root / "pins").mkdir(parents=True, exist_ok=True)
    for i in range(N):
        k = Ed25519PrivateKey.generate()
        (root / f"node{i}.key").write_bytes(k.private_bytes_raw())
        (root / "pins" / f"{i}.pub").write_text(k.public_key().public_bytes_raw().hex())


def _pinned_config(root, i, max_eps):
    return {"identity-key": str(root / f"node{i}.key"), "pinned-keys": str(root / "pins"),
            "dp-required": "true", "dp-min-noise-multiplier": FLOOR, "dp-max-delta": 1e-4,
            "dp-max-epsilon": max_eps, "ledger-path": str(root / f"ledger{i}.jsonl"),
            "ledger-init": "true"}


class _Configured:
    """A ClientApp handler that sets each node's own config (as ``flower-supernode
    --node-config`` does) by its partition id, then runs the real node logic."""

    def __init__(self, configs):
        self.configs = configs
        self.node = _Node(_algo, node_partition_loader(_partition))

    def __call__(self, msg, context):
        context.node_config.update(self.configs[int(context.node_config["partition-id"])])
        return self.node.handle(msg, context)


PINNED_LIES = ("honest", "cohort", "seed", "public", "record")  # over the simulation
VARIANTS = ("delta", "epsilon", "max-cohort", "signatures")  # over the in-process Grid


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    """Every lie of PINNED_LIES, one after the other, in one simulation of N SuperNodes
    that pin each other's identities and hold a floor: lie -> (aggregate, refusals)."""
    from flwr.app import Context
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp
    from flwr.simulation import run_simulation

    root = tmp_path_factory.mktemp("pinned")
    _keys(root)
    max_eps = _eps(1.5)
    handler = _Configured({i: _pinned_config(root, i, max_eps) for i in range(N)})
    out = {}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        for lie in PINNED_LIES:
            out[lie] = _run(grid, lie, timeout=120)

    client = ClientApp()
    client.train("secagg")(handler)
    run_simulation(app, client, num_supernodes=N,
                   backend_config={"client_resources": {"num_cpus": 1}})
    return out, root, max_eps


def test_an_honest_server_runs_with_pinned_nodes_and_their_ledgers_name_the_pki(simulated):
    out, root, max_eps = simulated
    agg, why = out["honest"]
    assert why == "" and agg is not None and agg.contributors == tuple(range(N))
    for i in range(N):  # one release charged per node: none of the lies after it
        (event,) = read_ledger(root / f"ledger{i}.jsonl").charged()
        assert event["min_survivors"] == 3 and "pinned identities" in event["assumes"]
        assert server_epsilon([ClientEvent.from_dict(event)], DELTA).epsilon <= max_eps


@pytest.mark.parametrize("lie", [lie for lie in PINNED_LIES if lie != "honest"])
def test_every_pinned_node_refuses_the_lie_before_its_data(simulated, lie):
    """Item 1 (cohort) and item 2 (seed, public, record) over Flower's simulation
    runtime: every node refuses; nothing is aggregated, nothing charged (the honest
    run's test reads the ledgers)."""
    out, _, _ = simulated
    agg, why = out[lie]
    assert agg is None
    assert why.count("refused by this node's privacy policy") >= N, why
    assert why.count(WHY[lie]) >= N, why


@pytest.mark.parametrize("lie", VARIANTS)
def test_pinned_nodes_refuse_the_variants_before_their_data(tmp_path, lie, touched):
    """Variants of a lying server against the same pinned nodes with a floor, over the
    in-process Grid (a spy sees that no node touched its data): a delta, an epsilon or a
    cohort out of the node's bounds; and a survivor set signed by fewer pinned clients
    than the shares were sized for, refused at the unmask request."""
    _keys(tmp_path)
    grid = LocalGrid()
    for i, ctx in enumerate(grid.contexts.values()):
        ctx.node_config.update(_pinned_config(tmp_path, i, _eps(1.5)))
    agg, why = _run(grid, lie)
    assert agg is None
    reason = WHY.get(lie, f"a cohort of {N + 1} clients, but only {N} are pinned")
    assert why.count(reason) == N, why
    if lie == "signatures":  # the release went ahead up to the unmask request: spent, and
        # refused there, so the under-signed (under-noised) sum cannot be decoded
        assert sorted(set(touched)) == list(range(N))
        assert "stage 'unmask'" in why
        return
    assert touched == []
    assert all(read_ledger(tmp_path / f"ledger{i}.jsonl").charged() == [] for i in range(N))


# ------------------------------------------------- nodes that do not pin their peers


class _ConfiguredGrid(LocalGrid):
    """The in-process Grid of the runtime tests, every node with ``config``."""

    def __init__(self, config):
        super().__init__()
        for ctx in self.contexts.values():
            ctx.node_config.update(config)


@pytest.fixture
def touched(monkeypatch):
    """Client ids whose data a FedLog step read (a spy on its feature extraction)."""
    seen: list[int] = []
    real = FedLog.client_features

    def spy(self, client):
        seen.append(client.id)
        return real(self, client)

    monkeypatch.setattr(FedLog, "client_features", spy)
    return seen


def test_a_floor_is_not_met_by_a_share_sized_on_the_servers_word(touched):
    """Item 1: without pinned identities a node cannot count its peers, so a node whose
    floor is dp-min-noise-multiplier=1 refuses a DistributedDP share sized for the
    survivors the server claims -- even from an honest server -- before its data."""
    agg, why = _run(_ConfiguredGrid({"dp-min-noise-multiplier": FLOOR}), "honest")
    assert agg is None and touched == []
    assert why.count("on the server's word") == N, why


def test_a_node_adding_its_noise_alone_keeps_it_whatever_cohort_the_server_claims():
    """Item 1, dp-noise-alone: the share a node adds is sized for one survivor, so ten
    real nodes' sum carries at least the promised noise whatever n the server claims
    (trusting the server's 100,000 on a Harary graph: 1/sqrt(70,000) of it, std 0.012)."""
    from dataclasses import replace

    from secagg.messages import Upload
    from secagg.privacy.layers import noise_generator
    from secagg.privacy.release import node_noiser

    algo = _algo()
    algo.setup(load_dataset("digits"), [], 0)
    spec = replace(algo.phases(0, 1)[0].spec(), max_records=1000)
    layer = _layer(1.0)
    rec = {"dp": json.dumps(layer.node_params()),
           "layer": json.dumps({"threshold": 0.7, "graph": "harary", "k": None,
                                "precision": layer.inner.precision,
                                "ring_bits": layer.inner.ring_bits})}
    noiser = node_noiser(rec)
    honest = node_noiser({**rec, "layer": json.dumps({**json.loads(rec["layer"]),
                                                      "graph": "auto"})})
    promised = honest.release_plan(spec, 10)  # 10 real nodes, honestly counted
    target = promised.share_std["stats"] * math.sqrt(promised.worst)  # the sum's std
    zero = Upload.validate(spec, {"stats": np.zeros(spec.fields[0].shape)}, 0, 1, "raise")
    real = 10
    for sizing, low, high in (("alone", 1.0, None), ("server", None, 0.02)):
        release, _ = noiser.node_release(spec, FAKE_N, sizing)
        sums = sum(noiser.encode_noised(release, zero, noise_generator(seed).rng)
                   for seed in range(real))
        mask = (1 << release.ring_bits) - 1
        got = release.plans["stats"].decode_sum(np.asarray(sums, np.uint64) & np.uint64(mask))
        ratio = float(np.std(got)) * 2.0 ** release.scales["stats"] / target
        print(f"{sizing}: the sum of {real} real shares has {ratio:.4f} of the noise")
        if low is not None:
            assert ratio >= low * 0.9, (sizing, ratio)  # sampling error on 10 x entries
        if high is not None:
            assert ratio <= high, (sizing, ratio)


def test_with_neither_the_ledger_says_the_figure_rests_on_the_server(tmp_path):
    """Without pinned keys and without dp-noise-alone, a node without a floor takes
    part, and its ledger (and the server's copy of it) says what its figure rests on."""
    from secagg.privacy.node_ledger import reconcile

    grid = _ConfiguredGrid({})
    grid.contexts[100].node_config.update({"ledger-path": str(tmp_path / "l.jsonl"),
                                           "ledger-init": "true"})
    aggs = {}
    fed = FlowerFederation(_algo(), _layer(), load_dataset("digits"), rounds=1, seed=0,
                           min_nodes=N, stage_timeout=0.5)
    result = fed.run(grid, on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    assert aggs[0].contributors == tuple(range(N))
    (event,) = read_ledger(tmp_path / "l.jsonl").charged()
    assert "the server following the protocol" in event["assumes"]
    assert "cohort of 4" in event["assumes"]
    assert reconcile(tmp_path / "l.jsonl", result.transcript.records, 0)["ok"]
    # and so does the run's printed guarantee
    (said,) = [h for h in result.privacy.holds_against if "only as far as this server follows" in h]
    assert "node(s) [0, 1, 2, 3]" in said


def test_a_node_alone_takes_part_and_is_charged_its_own_share(tmp_path, touched):
    """dp-noise-alone with a floor: the honest run completes, and the node is charged
    its own share only (one share, sized for one survivor; nothing assumed)."""
    grid = _ConfiguredGrid({"dp-min-noise-multiplier": FLOOR, "dp-noise-alone": "true"})
    grid.contexts[100].node_config.update({"ledger-path": str(tmp_path / "l.jsonl"),
                                           "ledger-init": "true"})
    agg, why = _run(grid, "honest")
    assert why == "" and agg.contributors == tuple(range(N))
    (event,) = read_ledger(tmp_path / "l.jsonl").charged()
    assert event["min_survivors"] == 1 and "assumes" not in event
    assert all(e["n_shares"] == 1 for e in event["events"])
    assert sorted(set(touched)) == list(range(N))


@pytest.mark.parametrize("lie,config,reason", [
    ("max-cohort", {"dp-max-cohort": N}, "dp-max-cohort"),
    ("seed", {"dp-noise-alone": "true", "dp-required": "true"}, "chosen by the server"),
    ("public", {"dp-noise-alone": "true", "dp-required": "true"}, "declared public"),
])
def test_unpinned_nodes_with_a_floor_refuse_the_lies_before_their_data(lie, config, reason,
                                                                       touched):
    agg, why = _run(_ConfiguredGrid(config), lie)
    assert agg is None and touched == []
    assert why.count(reason) == N, why


def test_a_server_seed_is_accepted_only_where_the_node_allows_reproducible_noise():
    from secagg.errors import PrivacyError
    from secagg.privacy.policy import NodePolicy

    terms = {"layer": "local-dp", "noise_multiplier": 2.0, "seed": 7, "delta": 1e-5}
    with pytest.raises(PrivacyError, match="chosen by the server"):
        NodePolicy(dp_required=True).check(terms, None)
    NodePolicy(dp_required=True, allow_server_seed=True).check(terms, None)
    NodePolicy().check(terms, None)  # no floor: the ledger says the seed leaves no figure
    pol = NodePolicy.from_node_config({"dp-min-noise-multiplier": 1, "dp-public-fields":
                                       "n, counts", "dp-adjacency": "record"})
    pol.check({**terms, "seed": None, "public": ["n"], "adjacency": "record"}, None)
    with pytest.raises(PrivacyError, match="declared public"):
        pol.check({**terms, "seed": None, "public": ["n", "update"]}, None)
    with pytest.raises(PrivacyError):
        NodePolicy.from_node_config({"dp-noise-alone": "maybe"})


def test_pinned_keys_come_from_the_node_config_not_the_hello(tmp_path):
    """The node's identity and its peers' keys are read from files its operator holds
    (PEM, raw or hex; a JSON map or a directory of ID.pub); the hello announces that key;
    a node whose own key is not the one pinned for it refuses to take part."""
    from cryptography.hazmat.primitives import serialization
    from flwr.app import Context, Message, RecordDict

    from secagg.errors import ConfigurationError
    from secagg.flower.client import load_identity_key, load_pinned_keys
    from secagg.flower.records import MESSAGE_TYPE, content

    key = Ed25519PrivateKey.generate()
    pub = key.public_key().public_bytes_raw()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    for name, data in (("raw", key.private_bytes_raw()), ("pem", pem),
                       ("hex", key.private_bytes_raw().hex().encode())):
        (tmp_path / name).write_bytes(data)
        assert load_identity_key(tmp_path / name).public_key().public_bytes_raw() == pub
    (tmp_path / "bad").write_bytes(b"not a key")
    with pytest.raises(ConfigurationError, match="identity-key"):
        load_identity_key(tmp_path / "bad")
    (tmp_path / "pins.json").write_text(json.dumps({"0": pub.hex()}))
    assert load_pinned_keys(tmp_path / "pins.json") == {0: pub}
    with pytest.raises(ConfigurationError, match="pinned-keys"):
        load_pinned_keys(tmp_path / "missing")
    node = _Node(_algo, node_partition_loader(_partition))
    hello = {"run": "r1", "step": "hello"}
    ctx = Context(run_id=1, node_id=100, run_config={}, state=RecordDict(),
                  node_config={"partition-id": 0, "identity-key": str(tmp_path / "pem"),
                               "pinned-keys": str(tmp_path / "pins.json")})
    rep = read(node.handle(Message(content(**hello), dst_node_id=100,
                                   message_type=MESSAGE_TYPE), ctx))
    assert rep["identity"] == pub.hex()  # the operator's key, not one made on first use
    other = Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    (tmp_path / "pins.json").write_text(json.dumps({"0": other.hex()}))
    layer = json.dumps({"threshold": 0.7, "graph": "auto", "k": None, "precision": 1e-9,
                        "ring_bits": 64})
    ask = {**hello, "run": "r2", "next_session": bytes(16), "next_round": 0, "next_n": N,
           "next_layer": layer}
    with pytest.raises(ConfigurationError, match="not the one pinned"):
        node.handle(Message(content(**ask), dst_node_id=100, message_type=MESSAGE_TYPE), ctx)
