"""Client-level DP-FedAvg on the Flower runtime: the clip and the noise are applied on the
node, a node refuses terms weaker than its own floor (so a ServerApp cannot lower the
noise a node adds), and a seeded run equals the embedded engine's bit for bit."""

import importlib.util
import json
import os

import pytest

if importlib.util.find_spec("flwr") is None and os.environ.get("CI") != "true":
    pytest.skip("needs flwr: pip install 'secagg[flower]' (always runs under CI=true)",
                allow_module_level=True)

from flwr.app import Context, Message, RecordDict  # noqa: E402
from test_flower_runtime import LocalGrid, N, _partition, task_identity  # noqa: E402,F401

from algorithms.fedavg import FedAvg  # noqa: E402
from secagg import DistributedDP, Federation, LocalDP, Plaintext, SecureSum  # noqa: E402
from secagg.data import load_dataset  # noqa: E402
from secagg.errors import PrivacyError, ProtocolError, SecureSumAborted  # noqa: E402
from secagg.flower.client import _Node, node_partition_loader  # noqa: E402
from secagg.flower.records import MESSAGE_TYPE, content, read  # noqa: E402
from secagg.flower.server import FlowerFederation  # noqa: E402
from secagg.privacy.policy import NodePolicy  # noqa: E402


def _fedavg():
    return FedAvg(local_epochs=1, feature_dim=8, clip=0.5)


LAYERS = {
    "local-dp": lambda seed: LocalDP(Plaintext(), epsilon=4.0, delta=1e-5,
                                     adjacency="client", seed=seed),
    "distributed-dp": lambda seed: DistributedDP(SecureSum(threshold=0.7), epsilon=4.0,
                                                 delta=1e-5, adjacency="client", seed=seed),
}


class FedAvgGrid(LocalGrid):
    """The in-process grid of the runtime tests, with FedAvg nodes and a node config."""

    def __init__(self, node_config=None, fault=None):
        super().__init__(fault)
        self.node = _Node(_fedavg, node_partition_loader(_partition))
        for ctx in self.contexts.values():
            ctx.node_config.update(node_config or {})


def _flower(layer, grid, rounds=2):
    aggs = {}
    fed = FlowerFederation(_fedavg(), layer, load_dataset("digits"), rounds=rounds, seed=0,
                           min_nodes=N, stage_timeout=0.5)
    result = fed.run(grid, on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    return result, aggs


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_seeded_dp_fedavg_over_flower_equals_the_embedded_engine(name):
    result, aggs = _flower(LAYERS[name](11), FedAvgGrid())
    embedded = Federation(_fedavg(), LAYERS[name](11), _partition(), rounds=2, seed=0,
                          progress=False).run()
    assert result.history == embedded.history
    assert result.privacy.epsilon(1e-5) == embedded.privacy.epsilon(1e-5) <= 4.0
    assert [m["clip"] for m in result.measurements] == [0.5, 0.5]
    for r in (0, 1):
        assert aggs[r].contributors == tuple(range(N))
        assert aggs[r].cohort == N


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_a_serverapp_asking_for_zero_noise_is_refused_by_every_node(name, monkeypatch):
    """The ServerApp ships noise multiplier 0 (or one below the nodes' floor): every node
    refuses before training, nothing is sent, no round aggregates a single upload."""
    from secagg.privacy import layers as dp_layers

    real = dp_layers._DPLayer.node_params
    for z in (0.0, 0.05):
        def weak(self, noise_multiplier=None, z=z):
            return {**real(self, noise_multiplier), "noise_multiplier": z}

        monkeypatch.setattr(dp_layers._DPLayer, "node_params", weak)
        grid = FedAvgGrid({"dp-min-noise-multiplier": 0.5})
        trained: list[int] = []

        def spy(self, *a, trained=trained, **k):
            trained.append(1)
            raise AssertionError("the node trained")

        monkeypatch.setattr(FedAvg, "local_update", spy)
        if name == "distributed-dp":  # the secure sum loses every node: an exact abort
            with pytest.raises(SecureSumAborted) as err:
                _flower(LAYERS[name](None), grid, rounds=1)
            why = " ".join([str(err.value), *getattr(err.value, "__notes__", [])])
            assert why.count("refused by this node's privacy policy") == N, why
        else:
            result, aggs = _flower(LAYERS[name](None), grid, rounds=1)
            assert all(p[2] == 0 for p in result.participation)
            assert not any(a.contributors for a in aggs.values())
            assert result.failure() is not None
        assert trained == []  # refused before the node touched its data
        monkeypatch.undo()


def test_a_node_refuses_a_clip_above_its_ceiling_and_an_instruction_without_noise():
    node = _Node(_fedavg, node_partition_loader(_partition))
    ctx = Context(run_id=1, node_id=100, run_config={}, state=RecordDict(),
                  node_config={"partition-id": 0, "dp-max-clip": 0.1, "dp-required": "true"})
    algo = _fedavg()
    algo.setup(load_dataset("digits"), [], 0)
    from secagg.wire import pack_arrays

    bcast = pack_arrays(algo.phases(0, 1)[0].broadcast())  # clip 0.5 > ceiling 0.1
    layer = LAYERS["local-dp"](None)
    layer.plan_releases(1)
    base = dict(run="r1", step="upload", round=0, rounds=1, phase="train", seed=0,
                max_records=1000, on_violation="raise", broadcast=bcast)
    with pytest.raises(ProtocolError, match="dp-max-clip"):
        node.handle(Message(content(**base, dp=json.dumps(layer.node_params())),
                            dst_node_id=100, message_type=MESSAGE_TYPE), ctx)
    with pytest.raises(ProtocolError, match="dp-required"):
        node.handle(Message(content(**base), dst_node_id=100, message_type=MESSAGE_TYPE),
                    ctx)
    ctx.node_config.update({"dp-max-clip": 1.0})
    rep = read(node.handle(Message(content(**base, dp=json.dumps(layer.node_params())),
                                   dst_node_id=100, message_type=MESSAGE_TYPE), ctx))
    assert isinstance(rep["msg"], bytes)


def test_node_policy_parsing():
    p = NodePolicy.from_node_config({"dp-min-noise-multiplier": 0.7, "dp-required": "false"})
    assert p == NodePolicy(min_noise_multiplier=0.7)
    p.check({"noise_multiplier": 0.7}, None)
    with pytest.raises(PrivacyError):
        p.check({"noise_multiplier": 0.69}, None)
    with pytest.raises(PrivacyError):
        NodePolicy.from_node_config({"dp-required": "maybe"})
    with pytest.raises(PrivacyError):
        NodePolicy(max_clip=-1.0)
    NodePolicy().check({"noise_multiplier": 1e-9}, 1e9)  # no floor set: only validity
    with pytest.raises(PrivacyError, match="dp-required"):
        NodePolicy(dp_required=True).check(None, None)
