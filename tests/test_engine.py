"""One round engine, two transports: the runtimes cannot drift apart again.

The Flower server module may hold transport only (Flower messages, grid send/receive,
polling, timing): it must not import a concrete layer nor dispatch on one; every layer's
protocol runs in the layer's own server side, chosen by the engine's registry. And both
runtimes must drive the same engine steps, which the behavioural test below watches.
"""

import ast
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import secagg
from secagg.engine import check_remote, layer_server
from secagg.errors import ConfigurationError
from secagg.layers.plaintext import Plaintext, PlaintextServer
from secagg.link import PhaseCall, book_drops, keep_live, malformed, reply_field

ROOT = Path(secagg.__file__).parent
LAYER_CLASSES = {"SecureSum", "Homomorphic", "CentralDP", "LocalDP", "DistributedDP",
                 "Plaintext", "PerGroup"}
LAYER_MODULES = ("secagg.secure_sum", "secagg.homomorphic", "secagg.privacy",
                 "secagg.layers.plaintext", "secagg.layers.per_group")


def _tree(rel: str) -> ast.Module:
    return ast.parse((ROOT / rel).read_text(), rel)


def _imports(tree: ast.Module) -> list[tuple[str, str]]:
    """(module, name) for every ``from module import name`` and ``import module``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            out.extend((node.module or "", a.name) for a in node.names)
        elif isinstance(node, ast.Import):
            out.extend((a.name, "") for a in node.names)
    return out


#: the server side on Flower: server.py and the parts split from it (issue 34)
SERVER_PARTS = ("flower/server.py", "flower/node_messages.py", "flower/node_evaluation.py")


def test_the_flower_server_imports_no_concrete_layer():
    for part in SERVER_PARTS:
        imports = _imports(_tree(part))
        assert imports  # the parse saw the module's imports
        bad = [(m, n) for m, n in imports
               if n in LAYER_CLASSES
               or any(m == p or m.startswith(p + ".") for p in LAYER_MODULES)]
        assert bad == [], f"secagg/{part} must hold transport only, imports {bad}"


def test_the_flower_server_never_dispatches_on_a_layer_type():
    for part in SERVER_PARTS:
        tree = _tree(part)
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        attrs = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not (names | attrs) & LAYER_CLASSES
        checks = [n for n in ast.walk(tree) if isinstance(n, ast.Call)
                  and isinstance(n.func, ast.Name) and n.func.id in ("isinstance", "issubclass")]
        for call in checks:  # what it does check is not a layer
            assert not {n.id for n in ast.walk(call.args[1]) if isinstance(n, ast.Name)} \
                & LAYER_CLASSES


def test_the_flower_client_holds_no_layer_either():
    """The node side: Flower plumbing and the client step; each layer's node steps are
    looked up, never written out or dispatched on here."""
    for part in ("client", "node_identity", "node_privacy"):  # the node's modules
        tree = _tree(f"flower/{part}.py")
        bad = [(m, n) for m, n in _imports(tree) if n in LAYER_CLASSES]
        assert bad == []
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert not names & LAYER_CLASSES


def test_the_engine_names_no_concrete_layer():
    """The server drivers come from the layer registry (secagg.layers.registry)."""
    tree = _tree("engine.py")
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            inner = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
            assert not inner & LAYER_CLASSES, (fn.name, inner & LAYER_CLASSES)
    top = [(m, n) for m, n in _imports(ast.Module(
        body=[s for s in tree.body if isinstance(s, ast.ImportFrom | ast.Import)],
        type_ignores=[]))]
    assert not [(m, n) for m, n in top if n in LAYER_CLASSES and m != "secagg.privacy.layers"]


def test_the_registry_refuses_what_no_server_side_carries():
    from secagg.layers.per_group import PerGroup

    with pytest.raises(ConfigurationError, match="does not run on Flower"):
        check_remote(PerGroup({"default": Plaintext()}))
    dp, server = layer_server(Plaintext())
    assert dp is None and isinstance(server, PlaintextServer)


class _Loopback:
    """A Link whose nodes are functions here: each client answers an instruction with
    what ``answer(client, instruction)`` returns (None: silent)."""

    def __init__(self, clients, answer):
        self._clients, self.answer = list(clients), answer
        self.sent, self.counted, self.lost_seen = [], {}, []

    @property
    def clients(self):
        return self._clients

    def exchange(self, stage, ctx, instructions, *, needs=(), step=False):
        got, failed = {}, {}
        for c, ins in instructions.items():
            self.sent.append((stage, c, ins["step"], step))
            rep = self.answer(c, ins)
            if rep is None:
                failed[c] = "no reply"
            elif (bad := malformed(rep, needs)) is not None:
                failed[c] = bad
            else:
                got[c] = rep
        return got, failed

    def count(self, stage, nbytes):
        self.counted[stage] = self.counted.get(stage, 0) + nbytes

    def lost(self, dropped):
        self.lost_seen.append({s: dict(v) for s, v in dropped.items()})

    def reached(self, ctx, stage):
        pass


def test_a_layer_server_runs_over_any_link_and_books_what_it_drops():
    """The Plaintext server side over a loopback link: the step runs on the 'nodes'
    (instruction step "upload", as a step), a silent node and a node whose upload breaks
    the spec are dropped and booked, the rest are summed exactly."""
    from secagg.layers.base import RoundContext
    from secagg.messages import Bound, Field, UploadSpec
    from secagg.wire import pack_arrays

    spec = UploadSpec((Field("x", (3,), additive=True, bound=Bound(linf=1.0, adjacency="client")),),
                      max_records=1)
    values = {0: np.array([0.5, -0.25, 1.0]), 1: np.array([0.25, 0.25, 0.25]),
              2: np.array([5.0, 0.0, 0.0]), 3: None}

    def answer(c, ins):
        assert ins["step"] == "upload" and ins["phase"] == "p"
        if values[c] is None:
            return None
        return {"msg": pack_arrays({"x": values[c]}), "cpu_s": 0.0, "flops": 1.0,
                "clipped": "{}"}

    link = _Loopback(range(4), answer)
    ctx = RoundContext(0, "p", 0)
    call = PhaseCall(spec=spec, cohort=[0, 1, 2, 3], ctx=ctx,
                     release=Plaintext().server_part(spec, ctx, 4),
                     instruction={"phase": "p", "broadcast": b""},
                     clips=secagg.messages.ClipReport())
    agg = PlaintextServer(layer=Plaintext()).aggregate(call, link)
    assert agg.contributors == (0, 1)
    np.testing.assert_array_equal(agg["x"], values[0] + values[1])
    assert set(agg.notes["dropped"]["upload"]) == {2, 3}
    assert {(s, c) for s, c, _, step in link.sent if step} == {("upload", c) for c in range(4)}
    stages = [r.stage for r in ctx.ledger.rows]
    assert stages.count("dropped:upload") == 2 and stages.count("upload") == 2
    assert link.lost_seen and set(link.lost_seen[-1]["upload"]) == {2, 3}


def test_link_helpers_check_replies_and_keep_the_live():
    from secagg.dropouts import DropoutModel
    from secagg.layers.base import RoundContext

    assert malformed({"msg": b"x", "cpu_s": 1}, (("msg", bytes), ("cpu_s", float))) is None
    assert "cpu_s" in malformed({"msg": b"x"}, (("msg", bytes), ("cpu_s", float)))
    assert reply_field({"a": 2}, "a", float) == 2.0
    link = _Loopback([0, 1, 2], lambda c, i: None)
    ctx = RoundContext(0, "p", 0, dropouts=DropoutModel(0.0, 0))
    dropped: dict = {}
    live = keep_live(link, ctx, "share", {0: {"m": 1}, 2: {"m": 2}}, {1: "no reply"}, dropped)
    assert list(live) == [0, 2] and dropped == {"share": {1: "no reply"}}
    book_drops(link, ctx, "unmask", {2: "refused"}, dropped)
    assert dropped["unmask"] == {2: "refused"}
    assert [r.stage for r in ctx.ledger.rows] == ["dropped:share", "dropped:unmask"]


@pytest.mark.skipif(importlib.util.find_spec("flwr") is None, reason="needs flwr")
def test_both_runtimes_drive_the_same_engine_steps(monkeypatch):
    """Every phase of either runtime goes through the engine's one solve step, with the
    same aggregates and in the same order: a runtime that re-implemented its own loop
    would not be seen here."""
    import test_flower_runtime as fr

    from secagg import Federation, SecureSum
    from secagg import engine as eng
    from secagg.flower.server import FlowerFederation

    seen: list = []
    real = eng.solve

    def watching(phase, agg, ctx, measurements, cohort):
        seen.append((ctx.round, ctx.phase, agg.contributors, cohort,
                     {k: v.copy() for k, v in agg.sums.items()}))
        return real(phase, agg, ctx, measurements, cohort)

    monkeypatch.setattr(eng, "solve", watching)
    embedded = Federation(fr._algo(), SecureSum(threshold=3), fr._partition(), rounds=2,
                          seed=0, progress=False).run()
    mine, seen[:] = list(seen), []
    with monkeypatch.context() as m:
        m.setattr(fr.TaskIdentity, "_run_id", 1)
        m.setattr(fr.TaskIdentity, "_node_id", 0)
        m.setattr(fr.TaskIdentity, "_task_id", 1)
        flower = FlowerFederation(fr._algo(), SecureSum(threshold=3), fr.load_dataset("digits"),
                                  rounds=2, seed=0, min_nodes=fr.N,
                                  stage_timeout=0.5).run(fr.LocalGrid())
    assert len(mine) == len(seen) == len(embedded.participation) == 2  # one phase a round
    for a, b in zip(mine, seen, strict=True):
        assert a[:4] == b[:4]  # round, phase, contributors, cohort
        assert a[4].keys() == b[4].keys()
        for k in a[4]:
            np.testing.assert_array_equal(a[4][k], b[4][k])
    assert flower.history == embedded.history
    assert flower.participation == embedded.participation
