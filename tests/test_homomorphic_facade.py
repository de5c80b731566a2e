"""Homomorphic's in-process ``aggregate`` is a thin facade over its one driver (issue 34,
point 1): the protocol is written once, in :class:`~secagg.homomorphic.remote.HomomorphicServer`.

Checked here: the facade gives what the driver gives over the embedded engine's LocalLink
(the sums bit for bit under BFV, the same ledger messages and notes); the ledger rows that
legitimately changed from the in-process copy are pinned (an injected upload dropout is
booked ``dropped:upload``; the decryptor's result message is the flat decrypted sum the
driver receives, not a re-packing of the decoded fields); a client dropped before its upload
was read is sent the public context again next round (before, a lazy link's driver counted
it as holding the context, so its node refused the next upload and an honest client was
dropped); and, from the source, no module of the package but the driver books a message.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from secagg.costs import Ledger
from secagg.dropouts import DropoutModel, ScheduledDropouts
from secagg.homomorphic import Homomorphic
from secagg.homomorphic.remote import HomomorphicServer
from secagg.layers.base import RoundContext, ServerPart
from secagg.link import PhaseCall
from secagg.local_link import LocalLink
from secagg.messages import Bound, ClipReport, Field, Upload, UploadSpec
from secagg.stream import UploadStream
from secagg.transcript import Transcript
from secagg.wire import pack_arrays

N = 5
SPEC = UploadSpec((
    Field("x", (6,), "float64", Bound(linf=1.0, adjacency="client"), additive=True),
    Field("n", (1,), "int64", Bound(linf=50.0, adjacency="client"), additive=True),
), max_records=10)


def _upload(c: int, r: int = 0) -> Upload:
    x = np.linspace(-1.0, 1.0, 6) * ((c + 2 * r) % 7) / 7
    return Upload.validate(SPEC, {"x": x, "n": np.array([c + 1])}, c, 1)


def _ctx(r: int, dropouts=None) -> RoundContext:
    return RoundContext(r, "p", 0, Ledger(), Transcript(False), dropouts or DropoutModel(0.0))


def _phase(server: HomomorphicServer, link: LocalLink, r: int, dropouts=None):
    """One phase of ``server`` over ``link`` as the engine wires it; (aggregate, context,
    the clients whose step ran)."""
    stepped: list[int] = []

    def step(c: int) -> Upload:
        stepped.append(c)
        return _upload(c, r)

    link.serve(UploadStream(list(range(N)), step, keep=False), SPEC)
    ctx = _ctx(r, dropouts)
    call = PhaseCall(spec=SPEC, cohort=list(range(N)), ctx=ctx, release=ServerPart(SPEC, ctx),
                     instruction={"round": r, "phase": "p"}, clips=ClipReport(),
                     stores=link.store)
    try:
        return server.aggregate(call, link), ctx, stepped
    finally:
        link.settle()


def _rows(ctx: RoundContext) -> list[tuple]:
    """The ledger's messages without what is random (the keys' and ciphertexts' sizes)."""
    return [(r.stage, r.sender, r.receiver, r.plaintext_bytes) for r in ctx.ledger.rows]


def _seen(ctx: RoundContext) -> list[tuple]:
    """The transcript: who saw what of whom, in which form (ciphertexts' sizes are random)."""
    return [(o["stage"], o["party"], o["sender"], o["field"], o["form"], o["what"])
            for o in ctx.transcript.observations()]


ROUNDS = [None, ScheduledDropouts({"upload": {1, 3}}), None]


@pytest.mark.parametrize("key_holder", ["decryptor", "clients"])
def test_the_facade_gives_what_the_driver_gives_over_the_engines_link(key_holder):
    layer = Homomorphic("bfv", key_holder=key_holder)
    server = HomomorphicServer(layer=Homomorphic("bfv", key_holder=key_holder))
    link = LocalLink(range(N))
    for r, drops in enumerate(ROUNDS):
        got, got_ctx, _ = _phase(server, link, r, drops)
        ref_ctx = _ctx(r, drops)
        agg = layer.aggregate({c: _upload(c, r) for c in range(N)}, SPEC, ref_ctx)
        for name in ("x", "n"):  # BFV: exact, both ways
            np.testing.assert_array_equal(agg[name], got[name])
        assert agg.contributors == got.contributors
        assert agg.notes == got.notes
        assert _rows(ref_ctx) == _rows(got_ctx)
        assert _seen(ref_ctx) == _seen(got_ctx)
        if drops is not None:
            assert agg.contributors == (0, 2, 4)
    # the clients dropped in round 1 are back in round 2's sum
    assert agg.contributors == tuple(range(N))
    np.testing.assert_array_equal(agg["n"], [sum(range(1, N + 1))])


def test_the_ledger_rows_that_changed_from_the_in_process_copy():
    layer = Homomorphic("bfv")
    ctx = _ctx(0, ScheduledDropouts({"upload": {2}}))
    agg = layer.aggregate({c: _upload(c) for c in range(N)}, SPEC, ctx)
    # an injected upload dropout is booked as the driver books it on every runtime
    assert [(r.sender, r.wire_bytes) for r in ctx.ledger.rows
            if r.stage == "dropped:upload"] == [(2, 0)]
    assert agg.notes["dropped"] == {"upload": {2: "injected dropout"}}
    assert agg.notes["decryptor_client"] == 0  # the smallest client's node holds the keys
    # the result is the flat decrypted sum (int64 slots under BFV), as the driver gets it
    total = layer.packing(SPEC, layer.planned_clients(N)).total
    (result,) = [r for r in ctx.ledger.rows if r.stage == "result"]
    assert result.wire_bytes == len(pack_arrays({"flat": np.zeros(total, np.int64)}))
    assert (result.sender, result.receiver) == ("decryptor", "server")
    assert result.plaintext_bytes == SPEC.nbytes  # the decoded fields, as before


def test_a_client_dropped_unread_gets_the_context_again_over_the_engines_link():
    """Round 0 drops client 1 before its upload is read (a LocalLink computes a reply when
    the driver reads it, so its node never stored the public context); round 1 must send it
    again. Fails before: client 1's node refused the upload ('he-upload without the public
    context') and the honest client was dropped from round 1's sum."""
    server = HomomorphicServer(layer=Homomorphic("bfv"))
    link = LocalLink(range(N))
    _, _, stepped = _phase(server, link, 0, ScheduledDropouts({"upload": {1}}))
    assert sorted(stepped) == list(range(N))  # it stepped (settled), its upload unread
    agg, ctx, _ = _phase(server, link, 1)
    assert agg.notes["dropped"] == {}
    assert agg.contributors == tuple(range(N))
    np.testing.assert_array_equal(agg["n"], [sum(range(1, N + 1))])
    assert not [r for r in ctx.ledger.rows if r.stage.startswith("dropped")]


def test_the_facade_sends_the_context_again_to_a_client_dropped_unread():
    layer = Homomorphic("bfv")
    ups = {c: _upload(c) for c in range(N)}
    layer.aggregate(ups, SPEC, _ctx(0, ScheduledDropouts({"upload": {1}})))
    agg = layer.aggregate(ups, SPEC, _ctx(1))
    assert agg.contributors == tuple(range(N)) and agg.notes["dropped"] == {}


def test_each_upload_is_read_once_in_order_and_a_dropped_one_never():
    read: list[int] = []

    def step(c: int) -> Upload:
        read.append(c)
        return _upload(c)

    stream = UploadStream(list(range(N)), step, keep=False)  # a second read would raise
    agg = Homomorphic("bfv").aggregate(stream, SPEC, _ctx(0, ScheduledDropouts(
        {"upload": {3}})))
    assert read == [0, 1, 2, 4] and agg.contributors == (0, 1, 2, 4)


def test_the_protocol_is_written_once_in_the_package():
    """Only the driver books ledger messages and makes the server's aggregator; the layer
    module holds no key, ciphertext or ledger call."""
    pkg = Path(__file__).resolve().parents[1] / "secagg" / "homomorphic"
    booking: dict[str, set[str]] = {}
    for path in sorted(pkg.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
                if name in ("message", "observe", "Aggregator", "KeyHolder", "Encryptor"):
                    booking.setdefault(name, set()).add(path.name)
    assert booking["message"] == booking["observe"] == {"remote.py"}
    assert booking["Aggregator"] == {"remote.py"}
    assert "layer.py" not in set().union(*booking.values())


def test_the_package_imports_first_in_a_fresh_interpreter():
    """The layer reaches its driver only when aggregating: the driver's module pulls in the
    link, whose import of the layers package must not find it half made (every submodule
    is imported after the package, so this covers them all)."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    subprocess.run([sys.executable, "-c", "import secagg.homomorphic.remote"], cwd=root,
                   env=env, check=True, capture_output=True, timeout=120)
