"""secagg on Flower's simulation runtime: 20 SuperNodes give the embedded engine's aggregates.

One ``flwr.simulation.run_simulation`` (one Ray start) runs FedLog for 2 rounds under
Plaintext and then under SecureSum; every (round, phase) aggregate must equal the one
``Federation`` computes for the same seed bit for bit (all three are exact), and so must
the server's FedLog head, and so must the per-round accuracy (FedLog is personalized: it is
computed on the nodes). Then BFV (Homomorphic, a designated decryptor node) likewise, and
DistributedDP around SecureSum: every node adds its own noise share to its encoded vector
before masking; with a user seed (reproducible noise, reported not private) the noised sums
equal the embedded engine's bit for bit, and so does the privacy ledger's epsilon.
Layers without a Flower port are refused before any node is contacted.
"""

import importlib.util
import os

import numpy as np
import pytest

if importlib.util.find_spec("flwr") is None and os.environ.get("CI") != "true":
    pytest.skip("needs flwr: pip install 'secagg[flower]' (always runs under CI=true)",
                allow_module_level=True)

from algorithms import FedLog  # noqa: E402
from secagg import DistributedDP, Federation, Homomorphic, Plaintext, SecureSum  # noqa: E402
from secagg.data import dirichlet_split, load_dataset  # noqa: E402
from secagg.errors import ConfigurationError  # noqa: E402

N_NODES = 20
ROUNDS = 2


def _partition():
    return dirichlet_split(load_dataset("digits"), N_NODES, 0.5, seed=3, local_test_fraction=0.2)


def _algo():
    return FedLog(feature_dim=8, local_epochs=1)


def _layers():
    return {"plaintext": Plaintext(), "secure-sum": SecureSum(threshold=0.7),
            "bfv": Homomorphic(scheme="bfv"),
            "distributed-dp": DistributedDP(SecureSum(threshold=0.7), epsilon=4.0, delta=1e-5,
                                            adjacency="client", seed=5)}


def _embedded(layer):
    """Federation's aggregates per (round, phase) and the final head."""
    seen = {}

    class Recording(type(layer)):
        def aggregate(self, uploads, spec, ctx):
            agg = super().aggregate(uploads, spec, ctx)
            seen[(ctx.round, ctx.phase)] = agg
            return agg

    rec = Recording.__new__(Recording)
    rec.__dict__.update(vars(layer))
    algo = _algo()
    result = Federation(algo, rec, _partition(), rounds=ROUNDS, seed=0, progress=False).run()
    return seen, algo.eta, result


@pytest.fixture(scope="module")
def flower_runs():
    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from secagg.flower import FlowerFederation, client_app, node_partition_loader

    out = {}
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        for name, layer in _layers().items():
            algo = _algo()
            aggs = {}
            # node evaluation also under DP (off by default there), to compare accuracies
            fed = FlowerFederation(algo, layer, load_dataset("digits"), rounds=ROUNDS, seed=0,
                                   min_nodes=N_NODES, stage_timeout=300,
                                   connect_timeout=300, node_evaluation=True)
            result = fed.run(grid, on_aggregate=lambda r, p, a, aggs=aggs: aggs.__setitem__(
                (r, p), a))
            out[name] = (aggs, algo.eta, result, fed)

    run_simulation(app, client_app(_algo(), node_partition_loader(_partition)),
                   num_supernodes=N_NODES,
                   backend_config={"client_resources": {"num_cpus": 1}})
    return out


@pytest.mark.parametrize("name", ["plaintext", "secure-sum", "bfv", "distributed-dp"])
def test_simulation_20_nodes_equals_federation(flower_runs, name, ledger_messages):
    assert name in flower_runs, "the ServerApp did not finish this layer's run"
    aggs, eta, result, fed = flower_runs[name]
    want, want_eta, want_result = _embedded(_layers()[name])
    assert sorted(aggs) == sorted(want) == [(0, "stats"), (1, "stats")]
    for key in want:
        assert aggs[key].contributors == want[key].contributors == tuple(range(N_NODES))
        np.testing.assert_array_equal(aggs[key]["stats"], want[key]["stats"])
    np.testing.assert_array_equal(eta, want_eta)
    # FedLog is personalized: its accuracy comes from the nodes, per round as Federation's
    assert result.accuracy_kind == want_result.accuracy_kind == "mean local test"
    assert len(result.history) == ROUNDS and not np.isnan(result.history).any()
    assert result.history == want_result.history
    assert result.participation == [(0, "stats", N_NODES, N_NODES),
                                    (1, "stats", N_NODES, N_NODES)]
    # the ledger books real messages: every client sends in each stage of each round
    # (and each message's signed statement, stage "attest": secagg.attest)
    stages = {r.stage for r in result.costs.rows if r.direction == "up"}
    secure = {"advertise", "share", "masked-input", "consistency", "unmask", "attest"}
    assert stages == {"plaintext": {"upload", "attest"}, "secure-sum": secure,
                      "bfv": {"upload", "attest"}, "distributed-dp": secure}[name]
    if name == "bfv":  # the decryptor is a party, not a client: its messages are internal
        assert {r.stage for r in result.costs.rows if r.direction == "internal"
                and r.sender == "decryptor"} == {"keys", "result", "attest"}
    # the nodes signed every message they sent: the transcript verifies under their keys
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from secagg.attest import verify
    keys = {k: Ed25519PublicKey.from_public_bytes(bytes.fromhex(v))
            for k, v in result.identities.items()}
    assert verify(result.transcript.records, keys) == []
    # the same messages as the embedded engine's ledger, stage by stage
    assert ledger_messages(result) == ledger_messages(want_result)
    ups = [r for r in result.costs.rows if r.direction == "up" and r.sender != "decryptor"]
    assert {r.sender for r in ups} == set(range(N_NODES))
    # and Flower's envelopes are measured beside our bytes; SecureSum's ADVERTISEs travel
    # inside the hello and the previous unmask messages (our bytes, no message of their own)
    t = fed.transport.to_dict()
    assert t["hello"]["messages"] == 2 * N_NODES and t["hello"]["secagg_wire_bytes"] == 0
    for stage, v in t.items():
        if stage == "advertise":
            assert v["messages"] == v["flower_message_bytes"] == 0 < v["secagg_wire_bytes"]
        elif stage != "hello":
            assert v["flower_message_bytes"] > 0 and v["secagg_wire_bytes"] > 0, stage
    assert ("advertise" in t) == (name in ("secure-sum", "distributed-dp"))
    observed = list(result.transcript.observations())
    # the nodes' evaluation is on the record: each node's accuracy, in the clear
    assert sorted((o["round"], o["sender"]) for o in observed if o["phase"] == "evaluate"
                  and o["form"] == "clear") == [(r, c) for r in range(ROUNDS)
                                                for c in range(N_NODES)]
    observed = [o for o in observed if o["phase"] == "stats"]
    if name != "plaintext":  # the server saw only masked/encrypted uploads and the sum
        forms = {o["form"] for o in observed if o["party"] == "server"}
        assert forms == {"secure-sum": {"masked", "clear"}, "bfv": {"encrypted", "clear"},
                         # noise added on the nodes: not even the sum was clear
                         "distributed-dp": {"masked", "noised"}}[name]
        clear = [o for o in observed if o["party"] == "server" and o["form"] == "clear"]
        assert all(o["what"] == "sum" for o in clear)
    if name == "distributed-dp":  # one ledger of DP events, as the embedded run's
        assert result.privacy.epsilon(delta=1e-5) == want_result.privacy.epsilon(delta=1e-5)
        assert not result.privacy.private  # the user seed: reproducible, so not private
        plain, _, _ = _embedded(Plaintext())
        assert not np.array_equal(aggs[(0, "stats")]["stats"], plain[(0, "stats")]["stats"])


def test_bfv_decryptor_is_a_node_and_the_server_holds_no_secret_key(flower_runs):
    aggs, _, result, fed = flower_runs["bfv"]
    assert aggs[(0, "stats")].notes["decryptor_client"] == 0
    _, aggregator, provisioned, sent = next(iter(fed.layer_server.keys.values()))
    assert not aggregator.context.has_secret_key()
    assert provisioned == sent == set(range(N_NODES))
    keys = [r for r in result.costs.rows if r.stage == "keys"]
    assert len(keys) == 1 + N_NODES  # generated once, then reused in round 1
    assert {r.receiver for r in result.costs.rows if r.stage == "decrypt"} == {"decryptor"}


def test_layers_without_a_flower_port_are_refused():
    from secagg.flower import server_app

    with pytest.raises(ConfigurationError, match="does not run on Flower"):
        server_app(_algo(), Homomorphic(scheme="bfv", key_holder="clients"),
                   load_dataset("digits"))
    with pytest.raises(ConfigurationError, match="does not run on Flower yet"):
        server_app(_algo(), DistributedDP(_NotSecureSum(), noise_multiplier=1.0),
                   load_dataset("digits"))


class _NotSecureSum(SecureSum):
    """Not the SecureSum the nodes rebuild (a subclass): refused."""
