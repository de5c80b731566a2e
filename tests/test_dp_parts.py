"""One DP orchestration (issue 34, point 2): each DP layer declares a server part and a node
part; the in-process release is written once, on the DP base (begin / inner / end); the
remote release module and the secure sum's driver and node step dispatch on no DP type."""

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from secagg import CentralDP, DistributedDP, LocalDP, Plaintext, SecureSum
from secagg.errors import ProtocolError
from secagg.layers.base import NodePart, RoundContext, ServerPart
from secagg.messages import Bound, Field, Upload, UploadSpec
from secagg.privacy.release import node_part
from secagg.secure_sum import node as ss_node
from secagg.secure_sum import wire as ss_wire
from secagg.wire import unpack_arrays

SECAGG = Path(__file__).resolve().parents[1] / "secagg"
DP_NAMES = {"CentralDP", "LocalDP", "DistributedDP", "DistributedRelease", "DPWrapper",
            "DP_WRAPPERS"}
DP_PROBES = {"release_plan", "encode_noised", "noise_plan", "noise_upload",
             "finish_distributed", "node_release"}


def _classes(paths):
    out = {}
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "")
                         for b in node.bases}
                methods = {f.name for f in node.body
                           if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}
                out[node.name] = (bases, methods, path.name)
    return out


def test_no_dp_layer_subclass_defines_aggregate():
    classes = _classes(sorted((SECAGG / "privacy").rglob("*.py")))
    assert "aggregate" in classes["_DPLayer"][1]  # the one orchestration
    subs, grew = {"_DPLayer"}, True
    while grew:
        new = {c for c, (bases, _, _) in classes.items() if bases & subs} - subs
        subs |= new
        grew = bool(new)
    subs.discard("_DPLayer")
    assert {"CentralDP", "LocalDP", "DistributedDP"} <= subs
    assert [c for c in sorted(subs) if "aggregate" in classes[c][1]] == []


@pytest.mark.parametrize("module", ["privacy/release.py", "secure_sum/node.py",
                                    "secure_sum/remote.py", "flower/client.py",
                                    "flower/node_identity.py", "flower/node_privacy.py",
                                    "link.py"])
def test_the_release_module_and_the_inner_sum_name_no_dp_type(module):
    """The remote release asks the layer for its parts, and the secure sum's driver and
    node step see a generic encoding / node part: no DP class, no isinstance or hasattr
    probe, no DP-specific method."""
    tree = ast.parse((SECAGG / module).read_text())
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assert not (names | attrs) & DP_NAMES
    assert not attrs & DP_PROBES
    probes = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name) and n.func.id in ("isinstance", "hasattr")
              and any(isinstance(a, ast.Constant) and a.value in DP_PROBES for a in n.args)]
    assert probes == []


SPEC = UploadSpec((Field("x", (3,), additive=True, bound=Bound(linf=1.0, adjacency="client")),),
                  max_records=1)


def _uploads(n=4):
    rng = np.random.default_rng(0)
    return {c: Upload.validate(SPEC, {"x": rng.uniform(-1, 1, 3)}, c, 1, "raise")
            for c in range(n)}


@pytest.mark.parametrize("make", [
    lambda: CentralDP(Plaintext(), noise_multiplier=1.0, rounds=1, seed=3),
    lambda: LocalDP(Plaintext(), noise_multiplier=1.0, rounds=1, seed=3),
    lambda: DistributedDP(SecureSum(threshold=3), noise_multiplier=1.0, rounds=1, seed=3),
])
def test_the_parts_compose_to_the_in_process_release(make):
    """begin / the inner layer / end, driven by hand from the declared parts (as a remote
    runtime drives them, each client's node part rebuilt from the part's node_params) gives
    the in-process aggregate bit for bit under a seed."""
    want = make().aggregate(_uploads(), SPEC, RoundContext(0, "p", 0))
    layer = make()
    ctx = RoundContext(0, "p", 0)
    part = layer.server_part(SPEC, ctx, 4)
    assert isinstance(part, ServerPart)
    parts = {}
    for c in range(4):
        if part.node_params is None:
            parts[c] = NodePart()
        else:
            rec = {"dp": part.node_params, "round": 0, "phase": "p"}
            if part.encoding is not None:
                inner = layer.inner
                rec["layer"] = json.dumps({k: getattr(inner, k) for k in (
                    "threshold", "graph", "k", "precision", "ring_bits")})
            parts[c] = node_part(rec, c)
    prepared = {c: parts[c].prepare(up, SPEC)[0] for c, up in _uploads().items()}
    if part.encoding is None:
        agg = layer.inner.aggregate(prepared, part.carried, part.ctx)
    else:
        vectors = {}
        for c, up in prepared.items():
            vec, bits, _ = parts[c].encode(up, SPEC, 4)
            assert bits == part.encoding.ring_bits and vec.size == part.encoding.length
            vectors[c] = vec
        total, contributors = layer.inner.sum_encoded(vectors, part.encoding.ring_bits,
                                                      part.local_ctx, part.encoding.label)
        agg = part.finish(total, contributors, ctx)
    agg = part.end(agg, ctx)
    np.testing.assert_array_equal(agg["x"], want["x"])
    assert agg.notes["dp"] == want.notes["dp"]
    assert not np.array_equal(agg["x"], sum(u["x"] for u in _uploads().values()))


class _Offset(NodePart):
    """A wrapper's node part that is no DP layer: it encodes its own vector."""

    def encode(self, up, spec, n):
        return np.arange(5, dtype=np.uint64) + np.uint64(7), 16, 3


def test_the_secure_sum_node_step_carries_any_node_parts_vector():
    """The node step asks the part for its vector and ring (the fewest survivors it was
    sized for raises the signer threshold); it never learns what the part is."""
    rec = {"layer": json.dumps({"threshold": 2, "graph": "complete", "k": None,
                                "precision": 1e-6, "ring_bits": 64}),
           "n": 3, "round": 0, "step": "advertise",
           "session": bytes(ss_wire.SESSION_BYTES)}
    store: dict = {}
    up = _uploads(1)[0]
    out = ss_node.upload(rec, SPEC, up, 0, _Offset(), {}, 0.0, store)
    assert out["msg"]
    np.testing.assert_array_equal(unpack_arrays(store["vector"])["v"],
                                  np.arange(5, dtype=np.uint64) + np.uint64(7))
    party = ss_node.thaw(store["party"])
    assert (party.ring_bits, party.length, party.threshold) == (16, 5, 3)
    store2: dict = {}
    ss_node.upload(rec, SPEC, up, 0, NodePart(), {}, 0.0, store2)  # the identity part
    assert unpack_arrays(store2["vector"])["v"].size == 3  # the layer's own encoding


def test_a_server_asking_a_node_for_a_noise_it_does_not_add_is_refused():
    """A lying server sends CentralDP's parameters as if the node noised: the node refuses
    (a typed error: it drops, it never runs an unknown release)."""
    params = CentralDP(Plaintext(), noise_multiplier=1.0, rounds=1).node_params()
    with pytest.raises(ProtocolError, match="DP parameters refused"):
        node_part({"dp": json.dumps(params), "round": 0, "phase": "p"}, 0)
    with pytest.raises(ProtocolError, match="DP parameters refused"):
        node_part({"dp": json.dumps([1, 2]), "round": 0, "phase": "p"}, 0)
