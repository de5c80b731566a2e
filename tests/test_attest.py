"""Client-attested transcripts (secagg.attest): an honest run verifies under the clients'
keys; a transcript the server rewrote -- its running digest recomputed, so the unkeyed
chain still checks -- fails `secagg audit --identities` with exit 4, naming the record."""

import json

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from algorithms.fedlog import FedLog
from secagg import privacy
from secagg.attest import Statement, public_hex, read_identities, verify
from secagg.cli import main
from secagg.data import dirichlet_split
from secagg.federation import Federation
from secagg.layers.plaintext import Plaintext
from secagg.secure_sum import SecureSum
from secagg.transcript import Transcript

LAYERS = {
    "plaintext": lambda: Plaintext(),
    "secure-sum": lambda: SecureSum(threshold=0.7),
    "local-dp": lambda: privacy.LocalDP(Plaintext(), noise_multiplier=2.0, delta=1e-5),
}


@pytest.fixture(scope="module")
def runs(digits, tmp_path_factory):
    """One saved two-round FedLog run per layer: name -> (result, run folder)."""
    part = dirichlet_split(digits, 4, 0.5, seed=0, local_test_fraction=0.2)
    out = {}
    for name, make in LAYERS.items():
        res = Federation(FedLog(feature_dim=8, local_epochs=1), make(), part, rounds=2,
                         seed=0, progress=False).run()
        folder = tmp_path_factory.mktemp(name)
        res.save(folder)
        out[name] = (res, folder)
    return out


def _audit(capsys, *argv):
    rc = main(["audit", *map(str, argv)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _keys(folder):
    """The clients' identities file: in the key directory beside the run folder (never in
    the run folder the server writes)."""
    return folder.parent / f"{folder.name}.keys" / "identities.json"


def _records(folder):
    return [json.loads(ln) for ln in (folder / "transcript.jsonl").read_text().splitlines()]


def _rewrite(records, path):
    """The server's rewrite: the records changed, the closing digest recomputed."""
    t = Transcript()
    t.records = [r for r in records if r.get("type") != "end"]
    t.close()
    t.write(path)
    assert Transcript.read(path).check() is None  # the unkeyed chain accepts it
    return path


def test_an_honest_run_verifies_and_writes_its_identities(runs, capsys):
    for name, (res, folder) in runs.items():
        ids = _keys(folder)
        assert ids.exists() and set(read_identities(ids)) == set(res.identities)
        rc, out, err = _audit(capsys, folder, "--identities", ids)
        assert rc == 0, (name, out, err)
        assert out.splitlines()[0].startswith("attestation: verified")


def test_without_identities_the_first_line_says_unattested(runs, capsys):
    _, folder = runs["plaintext"]
    rc, out, _ = _audit(capsys, folder)
    assert rc == 0
    first = out.splitlines()[0]
    assert first.startswith("transcript: UNATTESTED") and "accidental" in first


def test_relabelled_form_with_the_chain_recomputed_exits_4_naming_the_record(
        runs, tmp_path, capsys):
    _, folder = runs["plaintext"]
    recs = _records(folder)
    lines = []
    for i, r in enumerate(recs, 1):
        if r.get("type") == "observation" and r["form"] == "clear" and r["what"] == "upload":
            r["form"] = "masked"
            lines.append(i)
    assert lines
    bad = _rewrite(recs, tmp_path / "relabelled.jsonl")
    rc, plain_out, _ = _audit(capsys, bad)
    assert rc == 0 and "digest verified" in plain_out  # the issue: accepted unattested
    rc, out, err = _audit(capsys, bad, "--identities", _keys(folder))
    assert rc == 4
    assert f"record {lines[0]}: contradicted" in out and "signed it as sent clear" in out
    assert f"record {lines[0]}" in err


def test_relabelled_masked_upload_is_a_contradiction(runs, tmp_path, capsys):
    _, folder = runs["secure-sum"]
    recs = _records(folder)
    i = next(i for i, r in enumerate(recs, 1)
             if r.get("type") == "observation" and r["form"] == "masked")
    recs[i - 1]["form"] = "clear"
    bad = _rewrite(recs, tmp_path / "unmasked.jsonl")
    rc, out, _ = _audit(capsys, bad, "--identities", _keys(folder))
    assert rc == 4 and f"record {i}: contradicted" in out and "as sent masked" in out


def test_relabelled_noise_is_a_contradiction(runs, tmp_path, capsys):
    _, folder = runs["local-dp"]
    recs = _records(folder)
    i = next(i for i, r in enumerate(recs, 1)
             if r.get("type") == "observation" and r["form"] == "noised"
             and r["what"] == "upload")
    recs[i - 1]["form"] = "clear"  # "the client sent it un-noised"
    bad = _rewrite(recs, tmp_path / "unnoised.jsonl")
    rc, out, _ = _audit(capsys, bad, "--identities", _keys(folder))
    assert rc == 4 and f"record {i}: contradicted" in out


def test_changed_digest_exits_4_naming_the_record(runs, tmp_path, capsys):
    _, folder = runs["plaintext"]
    recs = _records(folder)
    i = next(i for i, r in enumerate(recs, 1)
             if r.get("type") == "observation" and r["what"] == "upload")
    recs[i - 1]["digest"] = "0" * 64
    bad = _rewrite(recs, tmp_path / "digest.jsonl")
    rc, out, _ = _audit(capsys, bad, "--identities", _keys(folder))
    assert rc == 4 and f"record {i}: contradicted" in out and "digest" in out


def test_dropped_client_statement_exits_4_naming_the_message(runs, tmp_path, capsys):
    _, folder = runs["secure-sum"]
    recs = _records(folder)
    j = next(j for j, r in enumerate(recs) if r.get("type") == "attestation"
             and r["statement"]["stage"] == "masked-input"
             and r["statement"]["form"] == "masked")
    st = recs[j]["statement"]
    del recs[j]
    bad = _rewrite(recs, tmp_path / "dropped.jsonl")
    rc, out, _ = _audit(capsys, bad, "--identities", _keys(folder))
    assert rc == 4 and ": missing:" in out
    # the record named is the MASKED message of that client, now without its statement
    named = [int(ln.split("record ")[1].split(":")[0]) for ln in out.splitlines()
             if ": missing:" in ln]
    kept = _records(folder)
    del kept[j]
    assert any(kept[n - 1].get("type") == "message" and kept[n - 1]["sender"] == st["sender"]
               and kept[n - 1]["stage"] == "masked-input" for n in named)


def test_a_statement_altered_without_its_key_is_forged(runs, tmp_path, capsys):
    _, folder = runs["plaintext"]
    recs = _records(folder)
    for r in recs:  # relabel the records and the statements alike
        if r.get("type") == "observation" and r["form"] == "clear" and r["what"] == "upload":
            r["form"] = "masked"
        if r.get("type") == "attestation" and r["statement"]["form"] == "clear":
            r["statement"]["form"] = "masked"
    bad = _rewrite(recs, tmp_path / "forged.jsonl")
    rc, out, _ = _audit(capsys, bad, "--identities", _keys(folder))
    assert rc == 4 and ": forged:" in out and "does not verify" in out


def test_a_key_replaced_inside_the_transcript_exits_4(runs, tmp_path, capsys):
    """The server swaps client 0's key in the header for its own and re-signs client 0's
    statements, relabelled: consistent inside the file, but not under the pinned keys."""
    _, folder = runs["plaintext"]
    recs = _records(folder)
    mine = Ed25519PrivateKey.generate()
    header = next(i for i, r in enumerate(recs, 1) if r.get("type") == "run")
    recs[header - 1]["attestation"]["keys"]["0"] = public_hex(mine)
    for r in recs:
        if r.get("type") == "observation" and r["sender"] == 0 and r["what"] == "upload":
            r["form"] = "masked"
        if r.get("type") == "attestation" and r["statement"]["sender"] == 0:
            if r["statement"]["stage"] != "end":  # (its closing statement: re-signed only)
                r["statement"]["form"] = "masked"
            st = Statement.from_json(r["statement"])
            r["signature"] = mine.sign(st.signed_bytes()).hex()
    bad = _rewrite(recs, tmp_path / "rekeyed.jsonl")
    # under the keys the transcript itself carries, the rewrite would pass
    inside = {k: mine.public_key() if k == "0" else v
              for k, v in read_identities(_keys(folder)).items()}
    assert verify(Transcript.read(bad).records, inside) == []
    rc, out, _ = _audit(capsys, bad, "--identities", _keys(folder))
    assert rc == 4 and f"record {header}: key:" in out and "replaced" in out
    assert ": forged:" in out


def test_an_unattested_run_fails_the_attested_audit(digits, tmp_path, capsys):
    part = dirichlet_split(digits, 3, 0.5, seed=0)
    res = Federation(FedLog(feature_dim=4, local_epochs=1), Plaintext(), part, rounds=1,
                     seed=0, progress=False, attest=False).run()
    assert res.identities is None and not [r for r in res.costs.rows if r.stage == "attest"]
    res.save(tmp_path)
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps({"keys": {"0": public_hex(Ed25519PrivateKey.generate())}}))
    rc, out, _ = _audit(capsys, tmp_path, "--identities", ids)
    assert rc == 4 and "carries no client attestation" in out


def test_signing_is_on_the_cost_ledger_per_client_per_round(runs):
    for name, (res, _) in runs.items():
        rows = [r for r in res.costs.rows if r.stage == "attest"]
        clients = {r.sender for r in rows}
        assert clients == {0, 1, 2, 3}, name
        # one statement per message a client sent to the server, each with bytes and CPU
        sent = [r for r in res.costs.rows if r.receiver == "server" and r.stage != "attest"
                and isinstance(r.sender, int) and r.wire_bytes > 0]
        assert len(rows) == len(sent), name
        assert all(r.wire_bytes > 64 and r.direction == "up" for r in rows)
        assert sum(r.client_cpu_s for r in rows) > 0
        assert "signed statements / client / round" in res.table()


def test_pinned_secure_sum_identities_are_the_signing_keys(digits):
    part = dirichlet_split(digits, 3, 0.5, seed=0)
    keys = {c: Ed25519PrivateKey.generate() for c in range(3)}
    res = Federation(FedLog(feature_dim=4, local_epochs=1), SecureSum(threshold=2,
                     identities=keys), part, rounds=1, seed=0, progress=False).run()
    assert {c: res.identities[str(c)] for c in range(3)} == {
        c: public_hex(k) for c, k in keys.items()}
    pinned = {str(c): k.public_key() for c, k in keys.items()}
    assert verify(res.transcript.records, pinned) == []  # the decryptor is not needed here


def test_a_statement_serialises_every_field_and_reads_back():
    """Statement.to_json is written out by hand (for speed): it must carry every field."""
    from dataclasses import asdict, fields

    from secagg.attest import Statement

    st = Statement(run="r", round=2, phase="p", stage="s", sender=3, receiver="server",
                   digest="d", form="noised", fields={"a": "x"}, noised=["a"],
                   params={"layer": "z", "noise": {"z": 1.0}}, seq=5)
    assert set(st.to_json()) == {f.name for f in fields(Statement)}
    assert st.to_json() == asdict(st) and Statement.from_json(st.to_json()) == st


def test_a_node_refuses_dp_terms_that_misdescribe_the_noise_it_applied():
    """check_applied: what a Flower node holds the run's DP terms to before it signs them
    (terms as secagg.attest.dp_terms writes them)."""
    from secagg.attest import applied_release, check_applied

    mine = [applied_release(0, "stats", "local-dp", ["stats"], 1.0, seeded=False)]
    event = {"mechanism": "gaussian", "noise_multiplier": 1.0, "count": 1,
             "fields": ["stats"], "phase": "stats", "round": 0, "not_private_reason": ""}
    terms = {"delta": 1e-5, "events": [event], "unnoised": [], "not_private": []}
    assert check_applied(terms, mine) == []
    assert check_applied(terms, []) == []  # a node that noised nothing checks nothing
    left_out = check_applied({**terms, "events": []}, mine)
    assert len(left_out) == 1 and "leave out the release" in left_out[0]
    less = check_applied({**terms, "events": [{**event, "noise_multiplier": 10.0}]}, mine)
    assert len(less) == 1 and "other noise than this party added" in less[0]
    moved = check_applied({**terms, "events": [{**event, "round": 1}]}, mine)
    assert len(moved) == 1 and "leave out" in moved[0]
    seeded = [applied_release(0, "stats", "local-dp", ["stats"], 1.0, seeded=True)]
    called_private = check_applied(terms, seeded)
    assert len(called_private) == 1 and "fixed seed" in called_private[0]
    assert check_applied({**terms, "not_private": ["seed fixed"]}, seeded) == []


def test_unreadable_attestation_records_are_forged_for_verify_and_skipped_for_the_dp_terms(
        runs):
    """A lying server slips unreadable attestation records into a transcript (one whose
    signature is not hex, one whose statement has a key no statement has): the one reader
    of attestation records (secagg.attest.attestation_records) yields them in file order
    with the reason; verify names each as forged at its line, and the audit's DP terms
    (secagg.audit.signed_dp) are read from the readable closing statements alone, the
    same as without them."""
    from secagg.attest import attestation_records
    from secagg.audit import signed_dp

    _, folder = runs["local-dp"]
    identities = read_identities(_keys(folder))
    recs = _records(folder)
    terms_before = signed_dp(recs, identities)
    at = [i for i, r in enumerate(recs) if r.get("type") == "attestation"]
    bad_sig = {**recs[at[0]], "signature": "not hex"}
    bad_st = {**recs[at[1]], "statement": {**recs[at[1]]["statement"], "extra": 1}}
    recs[at[0] + 1:at[0] + 1] = [bad_sig]
    recs[at[1] + 2:at[1] + 2] = [bad_st]  # after the first insertion
    lines = (at[0] + 2, at[1] + 3)
    read = list(attestation_records(recs))
    assert [r.line for r in read] == [i + 1 for i, r in enumerate(recs)
                                      if r.get("type") == "attestation"]
    unreadable = [r for r in read if r.error is not None]
    assert [r.line for r in unreadable] == list(lines)
    assert all(r.statement is None and r.signature == b"" for r in unreadable)
    assert "statement" in unreadable[1].error
    good = read[0]
    assert good.statement == Statement.from_json(recs[good.line - 1]["statement"])
    assert good.signature == bytes.fromhex(recs[good.line - 1]["signature"])
    forged = [p for p in verify(recs, identities) if "unreadable statement" in p.text]
    assert [(p.line, p.kind) for p in forged] == [(n, "forged") for n in lines]
    assert signed_dp(recs, identities) == terms_before
    assert terms_before[0] is not None and terms_before[1]  # terms signed, and by parties
