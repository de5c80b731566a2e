"""The embedded runtime as a Link (issue 34, point 1): LocalLink answers a layer's server
driver with the node steps a Flower node runs, and the embedded engine runs Plaintext's one
driver over it.

Played from the server's seat: a client whose reply is tampered with (out of its bound,
lost, malformed) is dropped alone, the others are summed; a protocol stage a node's party
refuses is a typed failure of that client, never a crash; and the replies that run the
client step are computed when read (a streamed cohort is never held whole).
"""

import json

import numpy as np
import pytest

from algorithms import FedLog
from secagg import Federation, Plaintext
from secagg.costs import Ledger
from secagg.data import dirichlet_split, load_dataset
from secagg.dropouts import DropoutModel, ScheduledDropouts
from secagg.layers.base import RoundContext, ServerPart
from secagg.layers.plaintext import PlaintextServer
from secagg.link import PhaseCall
from secagg.local_link import LocalLink
from secagg.messages import Bound, ClipReport, Field, Upload, UploadSpec
from secagg.node import runs_client_step
from secagg.stream import UploadStream
from secagg.transcript import Transcript
from secagg.wire import pack_arrays

N = 5
SPEC = UploadSpec((Field("x", (3,), "float64", Bound(linf=1.0, adjacency="client"),
                         additive=True),), max_records=10)


def _value(c: int) -> np.ndarray:
    return np.array([0.1 * c, -0.05 * c, 0.5], dtype=np.float64)


def _phase(tamper=None, dropouts=None, keep=False):
    """A LocalLink serving N clients' uploads of SPEC, the steps they ran (in order), the
    Plaintext driver's call, and the context."""
    stepped: list[int] = []

    def step(c: int) -> Upload:
        stepped.append(c)
        return Upload.validate(SPEC, {"x": _value(c)}, c, 1)

    link = LocalLink(range(N), tamper=tamper)
    uploads = UploadStream(list(range(N)), step, keep=keep)
    link.serve(uploads, SPEC)
    ctx = RoundContext(0, "p", 0, Ledger(), Transcript(False), dropouts or DropoutModel(0.0))
    call = PhaseCall(spec=SPEC, cohort=list(range(N)), ctx=ctx,
                     release=ServerPart(SPEC, ctx), instruction={},
                     clips=ClipReport())
    return link, stepped, call, ctx


def _drive(link, call):
    agg = PlaintextServer(layer=Plaintext()).aggregate(call, link)
    link.settle()
    return agg


def test_plaintext_driver_over_local_link_sums_every_client_and_books_each_upload_once():
    link, stepped, call, ctx = _phase()
    agg = _drive(link, call)
    assert agg.contributors == tuple(range(N))
    np.testing.assert_array_equal(agg["x"], sum(_value(c) for c in range(N)))
    assert sorted(stepped) == list(range(N))  # every client stepped exactly once
    uploads = [r for r in ctx.ledger.rows if r.stage == "upload"]
    assert sorted(r.sender for r in uploads) == list(range(N))
    assert agg.notes["dropped"] == {}


def test_replies_that_run_the_step_are_computed_when_the_driver_reads_them():
    link, stepped, call, ctx = _phase()
    got, failed = link.exchange("upload", ctx, {c: {"step": "upload"} for c in range(N)},
                                step=True)
    assert failed == {} and stepped == []  # nothing computed yet
    rec = got[3]
    assert stepped == [3] and isinstance(rec["msg"], bytes)
    link.settle()  # the steps never read run now, each once
    assert sorted(stepped) == list(range(N))


def test_a_tampered_upload_out_of_its_bound_drops_only_its_sender():
    def tamper(stage, sender, receiver, msg):
        if sender == 2:  # the lying client: ten times its bound
            return {**msg, "msg": pack_arrays({"x": np.full(3, 10.0)})}
        return msg

    link, stepped, call, ctx = _phase(tamper)
    agg = _drive(link, call)
    assert agg.contributors == (0, 1, 3, 4)
    np.testing.assert_array_equal(agg["x"], sum(_value(c) for c in (0, 1, 3, 4)))
    assert "refused" in agg.notes["dropped"]["upload"][2]
    drops = [r for r in ctx.ledger.rows if r.stage == "dropped:upload"]
    assert [r.sender for r in drops] == [2]
    assert sorted(stepped) == list(range(N))


@pytest.mark.parametrize("fault", ["lost", "malformed"])
def test_a_lost_or_malformed_reply_drops_its_sender_not_the_run(fault):
    def tamper(stage, sender, receiver, msg):
        if sender == 1:
            return None if fault == "lost" else {k: v for k, v in msg.items() if k != "cpu_s"}
        return msg

    link, _, call, _ = _phase(tamper)
    agg = _drive(link, call)
    assert agg.contributors == (0, 2, 3, 4)
    why = agg.notes["dropped"]["upload"][1]
    assert ("no reply" in why) if fault == "lost" else ("cpu_s" in why)


def test_a_lost_instruction_is_a_failed_client():
    def tamper(stage, sender, receiver, msg):
        return None if receiver == 4 else msg

    link, _, call, _ = _phase(tamper)
    agg = _drive(link, call)
    assert agg.contributors == (0, 1, 2, 3)
    assert agg.notes["dropped"]["upload"][4] == "instruction lost"


def test_a_protocol_stage_the_party_refuses_is_a_typed_failure_of_that_client():
    link, _, _, ctx = _phase()
    got, failed = link.exchange("unmask", ctx, {
        0: {"step": "unmask", "msg": b"\x00"}, 1: {"step": "no-such-step", "msg": b""}})
    assert got == {}
    assert "ProtocolError" in failed[0] and "before 'advertise'" in failed[0]
    assert "ProtocolError" in failed[1]


def test_injected_dropouts_are_applied_by_the_driver_as_on_flower():
    link, stepped, call, ctx = _phase(dropouts=ScheduledDropouts({"upload": [0, 3]}))
    agg = _drive(link, call)
    assert agg.contributors == (1, 2, 4)
    assert sorted(stepped) == list(range(N))  # the dropped clients stepped all the same


def test_which_instructions_run_the_client_step():
    assert runs_client_step("upload", {}) and runs_client_step("he-upload", {})
    assert runs_client_step("advertise", {})
    assert runs_client_step("share", {"with_step": True})
    assert not runs_client_step("share", {}) and not runs_client_step("unmask", {})


def _federation(layer, **kw):
    part = dirichlet_split(load_dataset("digits"), 6, 0.5, seed=1, local_test_fraction=0.2)
    aggs = {}
    result = Federation(FedLog(feature_dim=4, local_epochs=1), layer, part, rounds=2,
                        seed=3, progress=False, **kw).run(
        on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    return result, aggs


@pytest.mark.parametrize("stream", [True, False])
def test_the_embedded_plaintext_round_runs_the_one_driver_and_streams(stream):
    result, aggs = _federation(Plaintext(), dropout=0.3, stream=stream)
    for agg in aggs.values():
        # the driver's notes, as on Flower: who it dropped (injected dropouts: none booked)
        assert agg.notes["dropped"] == {}
        assert 0 < len(agg.contributors) <= 6
    again, aggs2 = _federation(Plaintext(), dropout=0.3, stream=not stream)
    assert result.history == again.history  # streamed or not: the same run, bit for bit
    for r in aggs:
        np.testing.assert_array_equal(aggs[r]["stats"], aggs2[r]["stats"])
    uploads = [(r.round, r.sender) for r in result.costs.rows if r.stage == "upload"]
    assert len(uploads) == len(set(uploads))  # each upload booked once
    assert json.dumps(result.clips) == "{}"


def test_a_tampered_ciphertext_drops_only_its_sender_under_homomorphic():
    from secagg import Homomorphic
    from secagg.homomorphic.remote import HomomorphicServer

    def tamper(stage, sender, receiver, msg):
        if stage == "upload" and sender == 3:  # the lying client: frames that do not parse
            return {**msg, "frames": [b"\x00" * 16 for _ in msg["frames"]]}
        return msg

    link, stepped, call, ctx = _phase(tamper, keep=True)
    agg = HomomorphicServer(layer=Homomorphic(scheme="bfv")).aggregate(call, link)
    link.settle()
    assert agg.contributors == (0, 1, 2, 4)
    np.testing.assert_allclose(agg["x"], sum(_value(c) for c in (0, 1, 2, 4)), atol=1e-6)
    assert "refused" in agg.notes["dropped"]["upload"][3]
    assert [r.sender for r in ctx.ledger.rows if r.stage == "dropped:upload"] == [3]
    # the decryptor's keys and result travelled as messages of their own
    assert {r.stage for r in ctx.ledger.rows if "decryptor" in (r.sender, r.receiver)} >= {
        "keys", "decrypt", "result"}
