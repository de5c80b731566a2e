"""A lying ServerApp tells one node other layer parameters than its run header states
(a lower secure-sum threshold: fewer shares then rebuild that node's mask); the nodes sign
what they were told (secagg.attest.told), and the audit with the operators' keys names
the node ("contradicted"). The same signed value on the embedded runtime, and one run tag
format on both runtimes.

The Flower runs go over the in-process grid of the Flower lying-server tests (real
ClientApp logic, real Ed25519 keys, scheme v2)."""

import json

import pytest

pytest.importorskip("flwr")

from test_audit_lying_server_flower import (  # noqa: E402
    VICTIM,
    N,
    _audit,
    _flower,
    _Grid,
    _problems,
    _records,
    _rewrite,
    _stmt,
)

from secagg import CentralDP, DistributedDP, Homomorphic, LocalDP, SecureSum  # noqa: E402
from secagg.attest.told import told_digest, told_params  # noqa: E402
from secagg.flower.records import read  # noqa: E402

HONEST_T, LIED_T = 3, 2


class _ToldLowerThresholdGrid(_Grid):
    """The ServerApp rewrites the secure-sum parameters it sends node VICTIM with its
    share-keys-and-step instruction (``layer``) to a threshold of 2, while its run header
    states 3."""

    fields = ("layer",)

    def push_messages(self, messages):
        for m in messages:
            if m.metadata.dst_node_id != 100 + VICTIM:
                continue
            rec = read(m)
            for name in self.fields:
                if name in rec:
                    told = json.loads(rec[name])
                    assert told["threshold"] == HONEST_T
                    rec[name] = json.dumps({**told, "threshold": LIED_T})
        return super().push_messages(messages)


class _ToldAheadOnlyGrid(_ToldLowerThresholdGrid):
    """The lie rides only on the advertise-ahead parameters (``next_layer``: the hello's
    and each unmask's next session), with which the node builds its secret sharing."""

    fields = ("next_layer",)


def _told_statements(records, sender):
    return [_stmt(r) for r in records if _stmt(r).get("sender") == sender
            and "told" in _stmt(r).get("params", {})]


@pytest.fixture(scope="module")
def honest_run(tmp_path_factory):
    """An honest Flower run of SecureSum(threshold=3), one round: (folder, identities)."""
    return _flower(SecureSum(threshold=HONEST_T), tmp_path_factory.mktemp("told"), rounds=1)


def test_an_honest_flower_secure_sum_run_verifies_with_every_told_statement(
        honest_run, capsys):
    folder, ids = honest_run
    rc, out = _audit(capsys, folder, ids)
    assert rc == 0, out
    recs = _records(folder)
    header = next(r for r in recs if r["type"] == "run")
    want = told_digest(told_params(header["layer"]))
    for c in range(N):  # the advertise (told ahead) and the share+step (told again)
        told = _told_statements(recs, c)
        assert len(told) >= 2 and {s["params"]["told"] for s in told} == {want}
        assert any(s["stage"] == "advertise" for s in told)


@pytest.mark.parametrize("grid", [_ToldLowerThresholdGrid, _ToldAheadOnlyGrid],
                         ids=["layer", "next-layer"])
def test_flower_server_telling_one_node_a_lower_threshold_is_named(grid, tmp_path, capsys):
    folder, ids = _flower(SecureSum(threshold=HONEST_T), tmp_path, rounds=1, grid=grid())
    recs = _records(folder)
    header = next(r for r in recs if r["type"] == "run")
    assert header["layer"]["threshold"] == HONEST_T  # the header states the honest value
    rc, out = _audit(capsys, folder, ids)
    assert rc == 4, out
    told = [p for p in _problems(out) if "told" in p]
    assert told and all(": contradicted: " in p and p.split(": ")[2].startswith(
        f"{VICTIM} was told other layer parameters than the run header states") for p in told
                        ), out
    assert not [p for p in _problems(out) if p not in told], out  # nothing else is wrong
    lied = told_digest({**told_params(header["layer"]), "threshold": LIED_T})
    signed = [s for s in _told_statements(recs, VICTIM) if s["params"]["told"] == lied]
    assert len(signed) == len(told)  # one problem per statement of what it was lied to
    stages = {s["stage"] for s in signed}  # the lie rides the instruction's field named
    assert stages == ({"advertise"} if grid is _ToldAheadOnlyGrid else {"share"}), stages


def test_flower_header_rewritten_to_a_higher_threshold_is_named_for_every_node(
        honest_run, tmp_path, capsys):
    """The other way round: every node was told 3, the server's header claims 4."""
    folder, ids = honest_run
    recs = _records(folder)
    for r in recs:
        if r["type"] == "run":
            r["layer"]["threshold"] = HONEST_T + 1
    rc, out = _audit(capsys, _rewrite(recs, tmp_path / "bad"), ids)
    assert rc == 4, out
    named = {p.split(": ")[2].split(" ")[0] for p in _problems(out)
             if "was told other layer parameters" in p}
    assert named == {str(c) for c in range(N)}, out


def test_embedded_statements_sign_the_same_told_value_and_a_rewritten_header_fails(
        tmp_path, capsys):
    from test_audit_lying_server_flower import _algo

    from secagg import Federation
    from secagg.cli import main
    from secagg.data import dirichlet_split, load_dataset

    part = dirichlet_split(load_dataset("digits"), N, 0.5, seed=1, local_test_fraction=0.2)
    res = Federation(_algo(), SecureSum(threshold=HONEST_T), part, rounds=1, seed=0,
                     progress=False).run()
    paths = res.save(tmp_path / "run")
    recs = _records(tmp_path / "run")
    header = next(r for r in recs if r["type"] == "run")
    want = told_digest(told_params(header["layer"]))
    sts = [_stmt(r) for r in recs if _stmt(r) and _stmt(r)["stage"] != "end"]
    assert sts and {s["params"].get("told") for s in sts} == {want}
    # one run tag format on both runtimes: 16 random bytes, hex
    assert len(header["attestation"]["run"]) == 32
    int(header["attestation"]["run"], 16)
    ids = paths["identities"]
    for r in recs:
        if r["type"] == "run":
            r["layer"]["threshold"] = 2
    rc = main(["audit", str(_rewrite(recs, tmp_path / "bad")), "--identities", str(ids)])
    out = capsys.readouterr().out
    assert rc == 4 and "was told other layer parameters" in out, out


def test_flower_run_tags_have_the_embedded_format(honest_run):
    folder, _ = honest_run
    header = next(r for r in _records(folder) if r["type"] == "run")
    tag = header["attestation"]["run"]
    assert len(tag) == 32 and int(tag, 16) >= 0


def test_told_params_are_the_carrying_layers_whatever_wraps_it():
    """One definition: the parameters each server driver tells a node (its ``layer`` JSON,
    as the node digests it) are the carrying layer's parameters that the run header's
    description of the (wrapped) layer states."""
    from secagg.homomorphic.node import LAYER_KEYS
    from secagg.secure_sum.remote import SecureSumServer

    ss = SecureSum(threshold=0.7, graph="complete", precision=1e-4, ring_bits=40)
    for layer in (ss, CentralDP(ss, epsilon=2.0, delta=1e-5),
                  DistributedDP(ss, epsilon=2.0, delta=1e-5),
                  LocalDP(ss, epsilon=2.0, delta=1e-5)):
        desc = json.loads(json.dumps(layer.describe()))
        sent = json.loads(SecureSumServer(layer=ss).params())
        assert told_digest(sent) == told_digest(told_params(desc))
        assert told_digest({**sent, "threshold": 0.5}) != told_digest(told_params(desc))
        assert told_digest({k: v for k, v in sent.items() if k != "threshold"}) != \
            told_digest(told_params(desc))  # a parameter left out is a lie too
    he = Homomorphic(scheme="bfv")
    for layer in (he, CentralDP(he, epsilon=2.0, delta=1e-5)):
        desc = json.loads(json.dumps(layer.describe()))
        sent = {k: getattr(he, k) for k in LAYER_KEYS}  # what the HE driver sends
        assert told_digest(sent) == told_digest(told_params(desc))
        assert told_digest({**sent, "precision": 1.0}) != told_digest(told_params(desc))
    assert told_params({"name": "plaintext"}) is None  # a layer that tells nodes nothing
