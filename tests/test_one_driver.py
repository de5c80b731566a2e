"""One server-side secure-sum driver (issue 34): the secure-sum ``Server`` state machine is
constructed in exactly one module, the driver that runs over every link (Flower's, and the
in-process one behind ``run_secure_sum``).

Read from the source with :mod:`ast`: a call of the name ``Server`` imported from
``secagg.secure_sum.server`` (under any alias), or of the attribute ``Server`` of that module
imported under any name, counts as a construction.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("secagg", "algorithms", "threat_models")
MODULE = "secagg.secure_sum.server"


def _constructions(path: Path) -> int:
    """How many calls in ``path`` construct secure_sum.server.Server."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()  # local names bound to the class
    modules: set[str] = set()  # local names bound to the module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == MODULE:
            names.update(a.asname or a.name for a in node.names if a.name == "Server")
        elif isinstance(node, ast.ImportFrom) and node.module == "secagg.secure_sum":
            modules.update(a.asname or a.name for a in node.names if a.name == "server")
        elif isinstance(node, ast.Import):
            modules.update(a.asname for a in node.names if a.name == MODULE and a.asname)
    count = 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id in names:
            count += 1
        elif isinstance(fn, ast.Attribute) and fn.attr == "Server" and (
                (isinstance(fn.value, ast.Name) and fn.value.id in modules)
                or ast.unparse(fn.value) == MODULE):
            count += 1
    return count


def _constructing_modules() -> dict[str, int]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            n = _constructions(path)
            if n:
                out[str(path.relative_to(ROOT))] = n
    return out


def test_the_reader_finds_a_construction_under_an_alias(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("from secagg.secure_sum.server import Server as S\n"
                   "from secagg.secure_sum import server as srv\n"
                   "a = S(1)\nb = srv.Server(2)\nc = Server(3)\n")
    assert _constructions(src) == 2  # the bare ``Server`` here is another name


def test_the_secure_sum_server_is_constructed_in_one_module():
    found = _constructing_modules()
    assert list(found) == ["secagg/secure_sum/remote.py"], found
    assert found["secagg/secure_sum/remote.py"] == 1


def test_run_secure_sum_streams_each_vector_through_the_driver_when_its_client_masks():
    """Through the one driver, run_secure_sum still holds one vector at a time: every ACK
    arrives first, then each live client's vector is read just before its masked vector is
    sent, and a client dropped before masking is never read."""
    from collections.abc import Mapping

    import numpy as np

    from secagg.costs import Ledger
    from secagg.dropouts import ScheduledDropouts
    from secagg.layers.base import RoundContext
    from secagg.secure_sum.protocol import run_secure_sum
    from secagg.transcript import Transcript

    n, m = 8, 40
    events: list[tuple[str, int]] = []

    class Vectors(Mapping):
        def __getitem__(self, u):
            events.append(("read", u))
            return np.full(m, u + 1, np.uint64)

        def __iter__(self):
            return iter(range(n))

        def __len__(self):
            return n

    def spy(stage, sender, receiver, msg):
        if stage == "masked-input" and receiver == "server":
            events.append(("sent", sender))
        return msg

    ctx = RoundContext(0, "p", 0, Ledger(), Transcript(False),
                       ScheduledDropouts({"masked-input": {3}}))
    rep = run_secure_sum(Vectors(), 16, ctx, threshold=6, entropy_seed=2, length=m,
                         tamper=spy)
    live = [u for u in range(n) if u != 3]
    assert events[:len(live)] == [("sent", u) for u in live]  # the ACKs
    assert events[len(live):] == [e for u in live for e in (("read", u), ("sent", u))]
    assert rep.contributors == tuple(live)
    np.testing.assert_array_equal(rep.total, np.full(m, sum(u + 1 for u in live), np.uint64))
    assert rep.notes["dropped"] == {"masked-input": {3: "injected dropout"}}


def test_the_embedded_secure_sum_aggregate_carries_the_drivers_notes():
    """In one process the SecureSum layer's aggregate carries the notes Flower's carries (the
    one driver's): who dropped where and why, whom the unmasking recovered, the verdicts and
    cut pairs (none here), alongside the layer's scale bits."""
    import numpy as np

    from secagg.costs import Ledger
    from secagg.dropouts import ScheduledDropouts
    from secagg.layers.base import RoundContext
    from secagg.messages import Bound, Field, Upload, UploadSpec
    from secagg.secure_sum import SecureSum
    from secagg.transcript import Transcript

    spec = UploadSpec((Field("x", (3,), "float64", bound=Bound(linf=1.0, adjacency="client"),
                             additive=True),))
    ups = {c: Upload.validate(spec, {"x": np.full(3, 0.25 * (c % 3))}, c, 1)
           for c in range(6)}
    ctx = RoundContext(0, "p", 0, Ledger(), Transcript(False),
                       ScheduledDropouts({"masked-input": {4}}))
    agg = SecureSum(threshold=4).aggregate(ups, spec, ctx)
    notes = agg.notes
    assert agg.contributors == (0, 1, 2, 3, 5)
    assert notes["dropped"] == {"masked-input": {4: "injected dropout"}}
    ss = notes["secure_sum"]
    assert ss["recovered"] == [4] and ss["verdicts"] == [] and ss["cut"] == []
    assert ss["faults"] == {} and ss["live"]["masked-input"] == 5 and "scale_bits" in ss
    np.testing.assert_allclose(agg["x"], np.full(3, 0.25 * (0 + 1 + 2 + 0 + 2)), atol=1e-6)


def test_the_driver_runs_over_local_link_with_live_parties_in_the_node_stores():
    """The one driver runs over the embedded runtime's LocalLink as over Flower's nodes
    (the same node steps): the sum is exact, each reply read once, and an in-process store
    keeps the live party and vector between stages (nothing frozen to bytes)."""
    import numpy as np

    from secagg.costs import Ledger
    from secagg.dropouts import DropoutModel
    from secagg.layers.base import RoundContext, ServerPart
    from secagg.link import PhaseCall
    from secagg.local_link import LocalLink
    from secagg.messages import Bound, ClipReport, Field, Upload, UploadSpec
    from secagg.secure_sum import SecureSum
    from secagg.secure_sum.client import Client
    from secagg.secure_sum.remote import SecureSumServer
    from secagg.stream import UploadStream
    from secagg.transcript import Transcript

    n = 5
    spec = UploadSpec((Field("x", (3,), "float64", bound=Bound(linf=1.0, adjacency="client"),
                             additive=True),), max_records=10)
    seen: dict[str, set[str]] = {}

    class Watched(LocalLink):
        def reached(self, ctx, stage):
            super().reached(ctx, stage)
            seen[stage] = {type(s.get("party")).__name__ for s in self.stores.values()} | {
                type(s.get("vector")).__name__ for s in self.stores.values()}

    def value(c):
        return np.array([0.1 * c, -0.05 * c, 0.5])

    link = Watched(range(n))
    link.serve(UploadStream(list(range(n)), lambda c: Upload.validate(
        spec, {"x": value(c)}, c, 1), keep=False), spec)
    ctx = RoundContext(0, "p", 0, Ledger(), Transcript(False), DropoutModel(0.0))
    call = PhaseCall(spec=spec, cohort=list(range(n)), ctx=ctx, release=ServerPart(spec, ctx),
                     instruction={"round": 0}, clips=ClipReport())
    agg = SecureSumServer(layer=SecureSum(threshold=3)).aggregate(call, link)
    link.settle()
    assert agg.contributors == tuple(range(n)) and agg.notes["dropped"] == {}
    np.testing.assert_allclose(agg["x"], sum(value(c) for c in range(n)), atol=1e-6)
    assert seen["share"] == seen["masked-input"] == {Client.__name__, "ndarray"}
