"""`secagg audit`: bytes reconcile with costs.csv for every layer, one readable row per
(phase, field) with the DP guarantee of what the clients sent, and incomplete transcripts
refused with a non-zero exit."""

import csv
import json

import pytest

from algorithms.fedlog import FedLog
from secagg import privacy
from secagg.audit import audit, format_audit, reconcile
from secagg.cli import main
from secagg.data import dirichlet_split
from secagg.federation import Federation
from secagg.homomorphic import Homomorphic
from secagg.layers.plaintext import Plaintext
from secagg.secure_sum import SecureSum
from secagg.transcript import Transcript

LAYERS = {
    "plaintext": lambda: Plaintext(),
    "secure-sum": lambda: SecureSum(threshold=0.7),
    "homomorphic-bfv": lambda: Homomorphic(scheme="bfv"),
    "central-dp": lambda: privacy.CentralDP(Plaintext(), noise_multiplier=2.0, delta=1e-5),
    "local-dp": lambda: privacy.LocalDP(Plaintext(), noise_multiplier=2.0, delta=1e-5),
    "distributed-dp": lambda: privacy.DistributedDP(SecureSum(threshold=0.7), epsilon=4.0,
                                                    delta=1e-5, rounds=1),
}


@pytest.fixture(scope="module")
def four(digits):
    return dirichlet_split(digits, 4, 0.5, seed=0, local_test_fraction=0.2)


@pytest.fixture(scope="module")
def runs(four, tmp_path_factory):
    """One saved FedLog round per layer: name -> (result, run folder)."""
    out = {}
    for name, make in LAYERS.items():
        res = Federation(FedLog(feature_dim=16, local_epochs=1), make(), four, rounds=1,
                         seed=0, progress=False).run()
        folder = tmp_path_factory.mktemp(name)
        res.save(folder)
        out[name] = (res, folder)
    return out


def _csv_totals(path):
    tot = {}
    with open(path) as fh:
        for row in csv.DictReader(fh):
            tot[row["direction"]] = tot.get(row["direction"], 0) + int(row["wire_bytes"])
    return tot


@pytest.mark.parametrize("name", list(LAYERS))
def test_audit_bytes_equal_costs_csv_per_direction(runs, name):
    res, folder = runs[name]
    report = audit(Transcript.read(folder / "transcript.jsonl"))
    assert report["complete"], report["incomplete_reason"]
    csv_tot = _csv_totals(folder / "costs.csv")
    audit_tot = {d: v["bytes"] for d, v in report["traffic"]["total"].items() if v["messages"]}
    assert {d: b for d, b in audit_tot.items() if b} == {d: b for d, b in csv_tot.items() if b}
    assert csv_tot["up"] > 0
    assert reconcile(report, folder / "costs.csv")["match"]
    # the uploaded field bytes are part of (never more than) the uplink traffic
    assert sum(e["bytes_uploaded"] for e in report["fields"]) <= csv_tot["up"]


def test_homomorphic_parties_decryptor_is_not_a_client(runs):
    res, _ = runs["homomorphic-bfv"]
    rows = res.costs.rows
    assert {r.direction for r in rows} <= {"up", "down", "internal"}
    keys = [r for r in rows if r.stage == "keys" and isinstance(r.receiver, int)]
    assert len(keys) == 4 and all(r.direction == "down" for r in keys)  # key contexts: downlink
    dec = [r for r in rows if "decryptor" in (r.sender, r.receiver)
           and not isinstance(r.receiver, int)]  # server <-> decryptor
    # (attest: the decryptor's signed statements about its keys and result, secagg.attest)
    assert {r.stage for r in dec} == {"keys", "decrypt", "result", "attest"}
    assert all(r.direction == "internal" and r.client is None for r in dec)
    assert all(r.client != "decryptor" for r in rows)
    assert res.costs.client_rounds() == 4  # clients only, not the decryptor
    up = res.costs.total("up")["wire_bytes"]
    table = res.table()
    assert f"{up / 4:,.0f}" in table.split("uplink bytes / client / round")[1].splitlines()[0]
    internal = res.costs.total("internal")["wire_bytes"]
    total = sum(r.wire_bytes for r in rows)
    assert internal > 0 and total == up + res.costs.total("down")["wire_bytes"] + internal


def test_distributed_dp_row_is_the_field_the_clients_sent_with_its_guarantee(runs):
    res, folder = runs["distributed-dp"]
    report = audit(Transcript.read(folder / "transcript.jsonl"))
    rows = {(e["phase"], e["field"]): e for e in report["fields"]}
    assert list(rows) == [("stats", "stats")]  # one row: not "stats (dp-noised)" + "stats"
    e = rows[("stats", "stats")]
    assert e["senders"] == [0, 1, 2, 3]
    assert e["server_saw"] == {"masked upload": 4, "noised sum": 2}
    assert e["dp"]["private"] is True
    assert e["dp"]["mechanism"] == "discrete_gaussian" and e["dp"]["adjacency"] == "record"
    assert e["dp"]["epsilon"] == pytest.approx(res.privacy.epsilon(field="stats"))
    text = format_audit(report)
    assert "DP guarantee : none" not in text and "senders      : none" not in text
    assert "eps=" in text and "delta=1e-05" in text


def test_plaintext_field_is_never_called_private(runs):
    report = audit(runs["plaintext"][0].transcript)
    (e,) = report["fields"]
    assert e["dp"]["private"] is False and e["clear_individual_uploads"] == 4
    assert "YES - the server read individual uploads in the clear" in format_audit(report)


def _transcript_with(privacy_records):
    t = Transcript()
    t.meta(algorithm={"name": "x"}, layer={"name": "central-dp", "noise_multiplier": 1.0,
                                           "adjacency": "record", "inner": {"name": "plaintext"}},
           seed=0, rounds=1, clients=2)
    for c in (0, 1):
        for f in ("a", "n"):
            t.observe(round=0, phase="p", stage="upload", party="server", sender=c, field=f,
                      form="clear", value=[1.0, 2.0])
    t.observe(round=0, phase="p", stage="dp-noise", party="server", sender="server",
              field="a", form="noised", value=[1.0, 2.0], what="sum")
    for rec in privacy_records:
        t.privacy(**rec)
    t.close()
    return t


def test_public_and_unnoised_fields_read_as_no_with_the_reason():
    t = _transcript_with([
        {"field": "a", "epsilon": 1.5, "delta": 1e-5, "accountant": "pld", "private": True},
        {"field": "n", "public": True, "round": 0, "phase": "p", "layer": "central-dp",
         "note": "declared public: released without DP noise"},
        {"field": None, "epsilon": 1.5, "delta": 1e-5, "private": True, "n_events": 1},
    ])
    rep = audit(t)
    dp = {e["field"]: e["dp"] for e in rep["fields"]}
    assert dp["n"]["private"] is False and dp["n"]["text"].startswith("no: declared public")
    assert dp["a"]["private"] is True and "eps=1.5" in dp["a"]["text"]
    text = format_audit(rep)
    assert "{'" not in text and "public': True" not in text  # readable, not a raw dict


def test_field_marked_not_private_prints_no_and_the_reason():
    t = _transcript_with([
        {"field": "a", "epsilon": 1.5, "delta": 1e-5, "private": False,
         "reason": "field 'a' released through plaintext without DP noise"},
    ])
    dp = {e["field"]: e["dp"] for e in audit(t)["fields"]}
    assert dp["a"]["text"] == "no: field 'a' released through plaintext without DP noise"
    assert dp["n"]["private"] is False


def _cli(argv, capsys):
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_cli_audit_complete_truncated_tampered_and_result_json(runs, tmp_path, capsys):
    _, folder = runs["secure-sum"]
    rc, out, err = _cli(["audit", str(folder)], capsys)
    assert rc == 0 and "transcript: complete" in out and "costs.csv: matches" in out
    lines = (folder / "transcript.jsonl").read_text().splitlines(keepends=True)
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(lines[: len(lines) // 2]))
    rc, out, err = _cli(["audit", str(cut)], capsys)
    assert rc == 4 and "INCOMPLETE" in out and "incomplete" in err
    mid = tmp_path / "mid.jsonl"
    mid.write_text("".join(lines)[:-40])  # cut inside the closing record
    rc, out, _ = _cli(["audit", str(mid)], capsys)
    assert rc == 4 and "INCOMPLETE" in out
    rec = json.loads(lines[3])
    rec["bytes"] = rec["bytes"] + 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(lines[:3]) + json.dumps(rec) + "\n" + "".join(lines[4:]))
    rc, out, _ = _cli(["audit", str(bad)], capsys)
    assert rc == 4 and "digest does not match" in out
    rc, out, err = _cli(["audit", str(folder / "result.json")], capsys)
    assert rc == 1 and "result.json" in err and "transcript.jsonl" in err
    assert len(err.strip().splitlines()) == 1 and not out
