"""A server that rewrites its transcript after an attested run (issue 33, item 5): each
rewrite keeps the unkeyed running digest valid (it is recomputed), so only the clients'
signed statements, their sequence numbers and the DP terms they signed can catch it.
Every attack here passed `secagg audit --identities <run folder>/identities.json` with
exit 0 and "attestation: verified" before the audit checked completeness both ways,
sequence numbers and the DP figures; now each exits 4 and names what is wrong."""

import json
import re

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from algorithms.fedlog import FedLog
from secagg import privacy
from secagg.attest import SCHEME, Statement, public_hex, read_identities, sign, write_identities
from secagg.cli import main
from secagg.data import dirichlet_split
from secagg.federation import Federation
from secagg.layers.plaintext import Plaintext
from secagg.transcript import Transcript

VICTIM = 2  # the client whose records the server erases


@pytest.fixture(scope="module")
def run(digits, tmp_path_factory):
    """One honest attested run, central DP over clear uploads at eps 8 over 2 rounds
    (noise multiplier 0.85: eps 7.99 at delta 1e-5; given directly, as calibrating to
    eps 8 costs seconds): (run folder, key directory)."""
    part = dirichlet_split(digits, 4, 0.5, seed=0, local_test_fraction=0.2)
    layer = privacy.CentralDP(Plaintext(), noise_multiplier=0.85, delta=1e-5)
    res = Federation(FedLog(feature_dim=8, local_epochs=1), layer, part, rounds=2, seed=0,
                     progress=False).run()
    folder = tmp_path_factory.mktemp("runs") / "honest"
    paths = res.save(folder)
    return folder, paths["identities"].parent


def _records(folder):
    return [json.loads(ln) for ln in (folder / "transcript.jsonl").read_text().splitlines()]


def _rewrite(records, folder):
    """The server's rewrite: the records changed, the closing digest recomputed."""
    folder.mkdir(parents=True, exist_ok=True)
    t = Transcript()
    t.records = [r for r in records if r.get("type") != "end"]
    t.close()
    t.write(folder / "transcript.jsonl")
    assert Transcript.read(folder / "transcript.jsonl").check() is None  # chain accepts it
    return folder


def _audit(capsys, folder, ids):
    rc = main(["audit", str(folder), "--identities", str(ids)])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _fails(capsys, folder, keys, *words):
    rc, out, err = _audit(capsys, folder, keys / "identities.json")
    assert rc == 4, out
    assert out.splitlines()[0].startswith("attestation: FAILED")
    for w in words:
        assert w in out, (w, out[:3000])
    return out


def _stmt(r):
    return r.get("statement", {}) if r.get("type") == "attestation" else {}


def test_the_honest_run_verifies_and_says_what_it_trusted(run, capsys):
    folder, keys = run
    assert not (folder / "identities.json").exists()  # the keys are not in the run folder
    assert read_identities(keys / "identities.json").scheme == SCHEME
    rc, out, err = _audit(capsys, folder, keys / "identities.json")
    assert rc == 0, (out, err)
    first, second = out.splitlines()[:2]
    assert first.startswith("attestation: verified")
    assert second.startswith(f"trusted: the public keys in {keys / 'identities.json'}")
    assert "recomputed by this audit's accountant from the DP terms 4 parties signed" in out


# -- item 5 of the issue, one test each --------------------------------------------------

def test_privacy_records_rewritten_from_eps_8_to_0_05_fail(run, tmp_path, capsys):
    folder, keys = run
    recs = _records(folder)
    claimed = [r["epsilon"] for r in recs if r["type"] == "privacy"]
    assert claimed and all(7.9 < e <= 8.0 for e in claimed)
    for r in recs:
        if r["type"] == "privacy":
            r["epsilon"] = 0.05
            r["holds_against"] = ["every observer, the aggregator included"]
    out = _fails(capsys, _rewrite(recs, tmp_path / "bad"), keys,
                 "the server's privacy record claims eps=0.05", "gives eps=7.9")
    assert re.search(r"total DP guarantee \(recomputed.*eps=(7\.9|8)", out)


def test_server_observations_of_clear_uploads_deleted_fail(run, tmp_path, capsys):
    folder, keys = run
    recs = [r for r in _records(folder) if not (
        r["type"] == "observation" and r["form"] == "clear" and r["what"] == "upload")]
    _fails(capsys, _rewrite(recs, tmp_path / "bad"), keys,
           "signed a clear upload", "never records seeing")


def test_one_clients_records_all_removed_fail(run, tmp_path, capsys):
    folder, keys = run
    recs = [r for r in _records(folder) if VICTIM not in (
        r.get("sender"), r.get("receiver"), _stmt(r).get("sender"))]
    for r in recs:  # the header's keys and client count no longer name it either
        if r["type"] == "run":
            r["attestation"]["keys"].pop(str(VICTIM))
            r["clients"] = 3
    _fails(capsys, _rewrite(recs, tmp_path / "bad"), keys,
           f"party {VICTIM} signed no closing statement: all its records were removed")


def test_message_records_moved_to_another_round_fail(run, tmp_path, capsys):
    folder, keys = run
    recs = _records(folder)
    moved = 0
    for r in recs:
        if r["type"] == "message" and r["round"] == 0 and r["sender"] == 1:
            r["round"] = 1
            moved += 1
    assert moved
    _fails(capsys, _rewrite(recs, tmp_path / "bad"), keys,
           "has no signed statement (of that round", "does not record (removed or moved)")


def test_a_server_that_mints_its_own_keys_and_rewrites_identities_fails(run, tmp_path, capsys):
    folder, keys = run
    recs = _records(folder)
    mine = {}
    for r in recs:
        st = _stmt(r)
        if st:
            key = mine.setdefault(str(st["sender"]), Ed25519PrivateKey.generate())
            if st["form"] == "clear":  # the server's own story: the uploads were noised
                st["form"], st["noised"] = "noised", sorted(st["fields"])
            r.update(sign(key, Statement.from_json(st)))
    for r in recs:
        if r["type"] == "run":
            r["attestation"]["keys"] = {p: public_hex(k) for p, k in mine.items()}
        if r["type"] == "observation" and r["form"] == "clear" and r["what"] == "upload":
            r["form"] = "noised"
    bad = _rewrite(recs, tmp_path / "bad")
    forged = write_identities(bad / "identities.json",
                              {p: public_hex(k) for p, k in mine.items()}, scheme=SCHEME)
    # the server's own file is refused as a trust root ...
    rc, out, _ = _audit(capsys, bad, forged)
    assert rc == 4 and "lies in the run folder" in out and "not a trust root" in out
    # ... and against the keys the clients published, every statement is forged
    out = _fails(capsys, bad, keys, "is not its key in the identities file (replaced)",
                 "does not verify")


# -- variants of our own (transcript class) -----------------------------------------------

def _drop_upload(recs, client, rnd):
    """Every trace of one upload message: its message record, statement, observations."""
    st = next(_stmt(r) for r in recs if _stmt(r).get("sender") == client
              and _stmt(r)["round"] == rnd and _stmt(r)["stage"] == "upload")
    return [r for r in recs if not (
        _stmt(r) == st
        or (r["type"] == "message" and r.get("digest") == st["digest"])
        or (r["type"] == "message" and r["stage"] == "attest" and r["sender"] == client
            and r["round"] == rnd)
        or (r["type"] == "observation" and r["sender"] == client and r["round"] == rnd))]


def test_one_upload_dropped_with_its_statement_leaves_a_sequence_gap(run, tmp_path, capsys):
    folder, keys = run
    recs = _drop_upload(_records(folder), 1, 0)
    _fails(capsys, _rewrite(recs, tmp_path / "bad"), keys,
           "party 1: statements number 0 of its 0-1 are missing")


def test_a_whole_round_erased_fails(run, tmp_path, capsys):
    folder, keys = run
    recs = [r for r in _records(folder) if r.get("round", 0) != 1
            and _stmt(r).get("round", 0) != 1 or _stmt(r).get("stage") == "end"]
    _fails(capsys, _rewrite(recs, tmp_path / "bad"), keys, "statements number 1")


def test_a_replayed_upload_fails(run, tmp_path, capsys):
    folder, keys = run
    recs = _records(folder)
    i = next(i for i, r in enumerate(recs) if _stmt(r).get("sender") == 3
             and _stmt(r)["stage"] == "upload")
    msg = next(r for r in recs if r["type"] == "message" and
               r.get("digest") == recs[i]["statement"]["digest"])
    recs[i + 1:i + 1] = [dict(msg), dict(recs[i])]  # counted twice in the aggregate
    _fails(capsys, _rewrite(recs, tmp_path / "bad"), keys, "party 3: statements number 0",
           "(replayed)")


def test_a_statement_moved_ahead_of_an_earlier_one_fails(run, tmp_path, capsys):
    folder, keys = run
    recs = _records(folder)
    mine = [i for i, r in enumerate(recs) if _stmt(r).get("sender") == 0]
    a, b = mine[0], mine[1]
    recs[a], recs[b] = recs[b], recs[a]
    _fails(capsys, _rewrite(recs, tmp_path / "bad"), keys, "party 0: statement number 0 "
           "stands after number 1 (records moved)")


def test_a_per_field_privacy_record_alone_rewritten_fails(run, tmp_path, capsys):
    folder, keys = run
    recs = _records(folder)
    for r in recs:
        if r["type"] == "privacy" and r.get("field"):
            r["epsilon"] = 1.0
    _fails(capsys, _rewrite(recs, tmp_path / "bad"), keys,
           "claims eps=1.0 for 'stats'")


def test_privacy_records_planted_in_a_run_without_dp_fail(digits, tmp_path, capsys):
    part = dirichlet_split(digits, 3, 0.5, seed=0, local_test_fraction=0.2)
    res = Federation(FedLog(feature_dim=8, local_epochs=1), Plaintext(), part, rounds=1,
                     seed=0, progress=False).run()
    paths = res.save(tmp_path / "plain")
    recs = _records(tmp_path / "plain")
    recs.insert(-1, {"type": "privacy", "field": None, "epsilon": 1.0, "delta": 1e-5,
                     "private": True, "n_events": 1})
    _fails(capsys, _rewrite(recs, tmp_path / "bad"), paths["identities"].parent,
           "no party signed any DP terms")


def test_keys_are_refused_inside_the_run_folder(run, tmp_path):
    from secagg.errors import ConfigurationError
    from secagg.result import Result

    res = Result(algorithm={}, layer={}, rounds=0, seed=0, accuracy=0.0,
                 accuracy_kind="global test", history=[], costs=None, transcript=Transcript(),
                 identities={"0": "00" * 32}, attest_scheme=SCHEME)
    with pytest.raises(ConfigurationError, match="inside the run folder"):
        res.save(tmp_path / "r", keys_dir=tmp_path / "r" / "keys")


def test_secagg_run_suggests_the_key_directory_not_the_run_folder(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--algorithm", "fedlog", "--dataset", "digits", "--clients", "3",
                 "--rounds", "1", "--quiet", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    keys = tmp_path / "run.keys" / "identities.json"
    line = next(ln for ln in text.splitlines() if ln.startswith("audit with:"))
    assert line.endswith(f"--identities {keys}") and keys.exists()
    assert not (out / "identities.json").exists()
    rc, got, _ = _audit(capsys, out, keys)
    assert rc == 0 and got.splitlines()[1].startswith(f"trusted: the public keys in {keys}")


def test_keys_announced_to_a_remote_server_are_not_published_as_a_trust_root(digits, tmp_path,
                                                                              capsys):
    """Keys a server collected from its nodes' hellos (scheme v1, as on Flower) are its own
    word: they stay in its run folder, named as announced, and the audit refuses them."""
    from secagg.attest import SCHEME_V1

    part = dirichlet_split(digits, 3, 0.5, seed=0, local_test_fraction=0.2)
    res = Federation(FedLog(feature_dim=8, local_epochs=1), Plaintext(), part, rounds=1,
                     seed=0, progress=False).run()
    res.attest_scheme = SCHEME_V1  # as a remote runtime's collector reports it
    paths = res.save(tmp_path / "remote")
    assert "identities" not in paths and not (tmp_path / "remote.keys").exists()
    assert paths["announced_identities"].parent == tmp_path / "remote"
    rc, out, _ = _audit(capsys, tmp_path / "remote", paths["announced_identities"])
    assert rc == 4 and "lies in the run folder" in out
