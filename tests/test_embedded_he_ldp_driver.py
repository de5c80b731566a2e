"""Homomorphic(key_holder="clients") and LocalDP run embedded through their one server driver
over the embedded runtime's LocalLink (issue 34, point 1), as on Flower.

Each run over the link is compared with the in-process ``layer.aggregate`` on the same
uploads (the sums bit for bit, the ledger's messages), and the claims are played from the
server's seat: the shared secret context never travels over the link (every instruction and
reply goes through the tamper hook), the server's context holds no secret key, a decrypting
client that lies or vanishes is dropped and the next one decrypts, LocalDP's noise is on
the upload before it leaves the node, and a node refuses DP parameters it cannot check
(it drops; it never noises less). The engine's LocalDP round over the link is checked
against Flower's in tests/test_layer_conformance.py.
"""

import numpy as np
import pytest

from algorithms import FedLog
from secagg import Federation, Homomorphic, LocalDP, Plaintext
from secagg.costs import Ledger
from secagg.data import dirichlet_split, load_dataset
from secagg.dropouts import DropoutModel, ScheduledDropouts
from secagg.errors import ConfigurationError, SecureSumAborted
from secagg.homomorphic.remote import HomomorphicServer
from secagg.layers.base import RoundContext, ServerPart
from secagg.layers.plaintext import PlaintextServer
from secagg.link import PhaseCall
from secagg.local_link import LocalLink
from secagg.messages import Bound, ClipReport, Field, Upload, UploadSpec
from secagg.stream import UploadStream
from secagg.transcript import Transcript
from secagg.wire import unpack_arrays

N = 5
SPEC = UploadSpec((Field("x", (3,), "float64", Bound(linf=1.0, adjacency="client"),
                         additive=True),), max_records=10)


def _value(c: int) -> np.ndarray:
    return np.array([0.1 * c, -0.05 * c, 0.5], dtype=np.float64)


def _upload(c: int) -> Upload:
    return Upload.validate(SPEC, {"x": _value(c)}, c, 1)


def _ctx(dropouts=None, r: int = 0) -> RoundContext:
    return RoundContext(r, "p", 0, Ledger(), Transcript(False), dropouts or DropoutModel(0.0))


def _over_link(server, release=None, tamper=None, dropouts=None, stores=True, instruction=None):
    """One phase of ``server`` over a LocalLink of N clients (the engine's wiring): the
    aggregate, the context, the link and the clients that stepped."""
    stepped: list[int] = []

    def step(c: int) -> Upload:
        stepped.append(c)
        return _upload(c)

    link = LocalLink(range(N), tamper=tamper)
    link.serve(UploadStream(list(range(N)), step, keep=False), SPEC)
    ctx = _ctx(dropouts)
    rel = release(ctx) if release is not None else ServerPart(SPEC, ctx)
    call = PhaseCall(spec=SPEC, cohort=list(range(N)), ctx=ctx, release=rel,
                     instruction={"round": 0, "phase": "p", **(instruction or {}),
                                  "dp": rel.node_params},
                     clips=ClipReport(), stores=link.store if stores else None)
    try:
        agg = rel.end(server.aggregate(call, link), ctx)
    finally:
        link.settle()
    return agg, ctx, link, stepped


def _messages(ctx: RoundContext) -> list[tuple[str, str, str]]:
    return sorted((r.stage, str(r.sender), str(r.receiver)) for r in ctx.ledger.rows)


# -- Homomorphic(key_holder="clients") --------------------------------------------------


def test_clients_mode_over_the_link_equals_the_in_process_layer_bit_for_bit():
    agg, ctx, _, stepped = _over_link(HomomorphicServer(layer=Homomorphic(
        "bfv", key_holder="clients")))
    ref_ctx = _ctx()
    ref = Homomorphic("bfv", key_holder="clients").aggregate(
        {c: _upload(c) for c in range(N)}, SPEC, ref_ctx)
    np.testing.assert_array_equal(agg["x"], ref["x"])  # BFV: exact, both ways
    assert agg.contributors == ref.contributors == tuple(range(N))
    assert sorted(stepped) == list(range(N))
    # the same messages: keys from the provisioner (to the server and each client), the
    # uploads, the aggregate to the decrypting client 0 and its result back
    assert _messages(ctx) == _messages(ref_ctx)
    assert ("keys", "provisioner", "server") in _messages(ctx)
    assert ("decrypt", "server", "0") in _messages(ctx)
    assert ("result", "0", "server") in _messages(ctx)
    # the driver's notes, which the in-process layer did not give
    assert agg.notes["decryptor_client"] == 0 and agg.notes["dropped"] == {}
    assert agg.notes["key_holder"] == "clients"


def test_the_secret_context_never_crosses_the_link_and_the_server_holds_none():
    seen: list[bytes] = []

    def tamper(stage, sender, receiver, msg):
        for v in msg.values():
            seen.extend(v if isinstance(v, list) else [v])
        return msg

    server = HomomorphicServer(layer=Homomorphic("bfv", key_holder="clients"))
    _, _, link, _ = _over_link(server, tamper=tamper)
    secrets = {bytes(v) for st in link.stores.values() for k, v in st.items()
               if k.startswith("he-secret/") and k.count("/") == 1}
    assert len(secrets) == 1  # every client holds the one shared secret context
    (secret,) = secrets
    # no message on the link (instruction or reply) carries it, whole or in part
    probe = secret[len(secret) // 2:len(secret) // 2 + 64]
    assert not [b for b in seen if isinstance(b, bytes) and probe in b]
    (_, aggregator, _, _), = server.keys.values()
    assert not aggregator.context.has_secret_key() and not aggregator.context.is_private()


@pytest.mark.parametrize("fault", ["lost", "garbage"])
def test_a_decrypting_client_that_fails_is_dropped_and_the_next_one_decrypts(fault):
    def tamper(stage, sender, receiver, msg):
        if stage == "decrypt" and sender == 0:
            return None if fault == "lost" else {**msg, "msg": b"\x01\x02"}
        return msg

    agg, ctx, _, _ = _over_link(HomomorphicServer(layer=Homomorphic(
        "bfv", key_holder="clients")), tamper=tamper)
    np.testing.assert_allclose(agg["x"], sum(_value(c) for c in range(N)), atol=1e-6)
    assert agg.contributors == tuple(range(N))  # its upload stays in the sum
    assert 0 in agg.notes["dropped"]["decrypt"] and agg.notes["decryptor_client"] == 1
    assert [r.sender for r in ctx.ledger.rows if r.stage == "dropped:decrypt"] == [0]


def test_no_client_left_to_decrypt_aborts():
    with pytest.raises(SecureSumAborted):
        _over_link(HomomorphicServer(layer=Homomorphic("bfv", key_holder="clients")),
                   dropouts=ScheduledDropouts({"decrypt": set(range(N))}))


def test_a_runtime_that_cannot_reach_the_nodes_out_of_band_is_refused_before_any_step():
    with pytest.raises(ConfigurationError, match="out of band"):
        _over_link(HomomorphicServer(layer=Homomorphic("bfv", key_holder="clients")),
                   stores=False)


def _federation(layer, **kw):
    part = dirichlet_split(load_dataset("digits"), 4, 0.5, seed=1, local_test_fraction=0.2)
    aggs = {}
    result = Federation(FedLog(feature_dim=4, local_epochs=1), layer, part, rounds=2,
                        seed=0, progress=False, **kw).run(
        on_aggregate=lambda r, p, a: aggs.__setitem__(r, a))
    return result, aggs


def test_the_engine_runs_clients_mode_through_the_driver_and_books_its_drops():
    result, aggs = _federation(Homomorphic("bfv", key_holder="clients"),
                               dropout={"upload": 0.3})
    assert any(agg.notes["dropped"] for agg in aggs.values())  # the seed drops someone
    for r, agg in aggs.items():
        assert "decryptor_client" in agg.notes  # the one driver ran (its note)
        gone = sorted(agg.notes["dropped"].get("upload", {}))
        assert sorted(set(range(4)) - set(agg.contributors)) == gone
        # the ledger row that legitimately changes: an injected upload dropout is booked
        # as "dropped:upload" (the in-process layer booked none), as on Flower
        booked = sorted(row.sender for row in result.costs.rows
                        if row.round == r and row.stage == "dropped:upload")
        assert booked == gone
    keys = [(row.sender, row.receiver) for row in result.costs.rows if row.stage == "keys"]
    assert ("provisioner", "server") in keys and len(keys) == 1 + 4  # provisioned once


# -- LocalDP ---------------------------------------------------------------------------


def _ldp(inner=None):
    return LocalDP(inner or Plaintext(), noise_multiplier=1.0, adjacency="client", rounds=1,
                   seed=7)


def test_local_dp_over_the_link_noises_on_the_node_and_equals_the_in_process_release():
    layer = _ldp()
    seen: dict[int, np.ndarray] = {}

    def tamper(stage, sender, receiver, msg):
        if receiver == "server" and "msg" in msg:  # what leaves the node
            seen[sender] = unpack_arrays(msg["msg"])["x"]
        return msg

    agg, ctx, _, _ = _over_link(PlaintextServer(layer=Plaintext()),
                                release=lambda c: layer.server_part(SPEC, c, N), tamper=tamper)
    ref_ctx = _ctx()
    ref = _ldp().aggregate({c: _upload(c) for c in range(N)}, SPEC, ref_ctx)
    np.testing.assert_array_equal(agg["x"], ref["x"])  # the same seeded noise, bit for bit
    assert agg.notes["dp"] == ref.notes["dp"]
    assert _messages(ctx) == _messages(ref_ctx)
    # the noise is on each upload before it leaves its node
    assert sorted(seen) == list(range(N))
    assert all(not np.allclose(seen[c], _value(c)) for c in range(N))
    np.testing.assert_array_equal(sum(seen[c] for c in range(N)), agg["x"])
    # the server transcripts the noised uploads as noised, never in the clear
    forms = {o["form"] for o in ctx.transcript.observations() if o["what"] == "upload"}
    assert forms == {"noised"}


def test_a_node_refuses_dp_parameters_it_cannot_check_and_only_it_drops():
    layer = _ldp()

    def tamper(stage, sender, receiver, msg):
        if sender == "server" and receiver == 2:  # the lying server: unreadable noise terms
            return {**msg, "dp": '{"layer": "local-dp", "noise_multiplier": -1}'}
        return msg

    agg, _, _, _ = _over_link(PlaintextServer(layer=Plaintext()),
                              release=lambda c: layer.server_part(SPEC, c, N), tamper=tamper)
    assert agg.contributors == (0, 1, 3, 4)
    assert "DP parameters refused" in agg.notes["dropped"]["upload"][2]


def test_local_dp_around_homomorphic_over_the_link_equals_the_in_process_release():
    layer = _ldp(Homomorphic("bfv"))
    agg, _, _, _ = _over_link(HomomorphicServer(layer=layer.inner),
                              release=lambda c: layer.server_part(SPEC, c, N))
    ref = _ldp(Homomorphic("bfv")).aggregate({c: _upload(c) for c in range(N)}, SPEC, _ctx())
    np.testing.assert_array_equal(agg["x"], ref["x"])
