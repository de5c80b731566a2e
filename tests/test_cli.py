"""The command line: a run writes its outputs, errors are one line."""

import json
from pathlib import Path

import pytest

from secagg.cli import main


def test_run_writes_outputs_and_table(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "--algorithm", "fedavg", "--rounds", "1", "--quiet", "--out", str(out),
                 "--device-profile", "rpi4-lte"]) == 0
    text = capsys.readouterr().out
    assert "accuracy (global test)" in text and "rpi4-lte" in text
    res = json.loads((out / "result.json").read_text())
    assert res["rounds"] == 1 and res["algorithm"]["name"] == "fedavg"
    assert 0.0 <= res["accuracy"] <= 1.0
    assert (out / "costs.csv").read_text().count("\n") > 10
    assert (out / "transcript.jsonl").exists()


@pytest.mark.parametrize("argv,code,needle", [
    (["run", "--rounds", "x"], 2, "invalid int value"),
    (["run", "--layer", "magic"], 2, "invalid choice"),
    (["run", "--algorithm", "nope"], 1, "unknown algorithm 'nope'"),
    (["run", "--clients", "0"], 1, "--clients must be >= 1"),
    (["run", "--layer", "central-dp"], 1, "needs --epsilon"),
    (["audit", "/no/such/file.jsonl"], 1, "no such transcript"),
    (["run", "--algorithm", "turbosvm", "--layer", "secure-sum"], 1,
     "TurboSVM-FL's server needs each client's class embeddings"),
    (["run", "--group-layer", "embeddings"], 1, "GROUP=LAYER"),
])
def test_bad_arguments_give_one_line_errors(argv, code, needle, capsys):
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == code
    assert needle in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    for opt in ("--algorithm", "--layer", "--dataset", "--data-dir", "--clients", "--alpha",
                "--rounds", "--seed", "--device-profile", "--out"):
        assert opt in text


def test_group_layer_routes_turbosvm_embeddings_in_the_clear(tmp_path, capsys):
    out = tmp_path / "t"
    assert main(["run", "--algorithm", "turbosvm", "--layer", "secure-sum", "--group-layer",
                 "embeddings=plaintext", "--rounds", "1", "--quiet", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["audit", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    seen = {e["field"]: e["server_saw"] for e in rep["fields"]}
    assert set(seen["weighted_encoder"]) == {"masked upload", "clear sum"}
    assert set(seen["embeddings"]) == {"clear upload"}


def test_aborted_secure_sums_stop_the_run_or_are_skipped_and_counted(tmp_path, capsys):
    argv = ["run", "--layer", "secure-sum", "--dropout", "0.5", "--rounds", "2", "--quiet",
            "--out", str(tmp_path / "r")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "secure sum aborted" in err and "--on-abort skip" in err
    rc = main([*argv, "--on-abort", "skip"])
    cap = capsys.readouterr()
    res = json.loads((tmp_path / "r" / "result.json").read_text())
    assert len(res["aborted"]) >= 1
    got = sum(p[2] for p in res["participation"])
    assert sum(p[3] for p in res["participation"]) == 20 and got < 20
    assert f"{got} / 20" in cap.out and "aborted phases" in cap.out
    # a run in which every phase aborted has no usable model: non-zero exit, reason on stderr
    assert (rc == 3) == (got == 0) and (rc == 0) == (got > 0)
    assert ("every phase aborted" in cap.err) == (got == 0)


FAST = ["--clients", "4", "--local-epochs", "1", "--rounds", "2", "--quiet"]


def _main(argv, capsys):
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_threshold_count_as_documented(tmp_path, capsys):
    rc, out, err = _main(["run", "--layer", "secure-sum", "--threshold", "3", *FAST,
                          "--out", str(tmp_path / "r")], capsys)
    assert rc == 0, err
    res = json.loads((tmp_path / "r" / "result.json").read_text())
    assert res["layer"]["threshold"] == 3
    rc, _, err = _main(["run", "--layer", "secure-sum", "--threshold", "2.5", *FAST], capsys)
    assert rc == 1 and "whole count" in err


@pytest.mark.parametrize("extra", [["--epsilon", "1"], ["--delta", "1e-6"]])
def test_dp_options_without_a_dp_layer_are_refused(extra, capsys):
    rc, _, err = _main(["run", "--layer", "secure-sum", *extra, *FAST], capsys)
    assert rc == 1 and "only apply to a DP layer" in err and extra[0] in err


def test_lr_local_epochs_and_accuracy_curve(tmp_path, capsys):
    rc, out, _ = _main(["run", *FAST, "--lr", "0.01", "--out", str(tmp_path / "r")], capsys)
    assert rc == 0
    res = json.loads((tmp_path / "r" / "result.json").read_text())
    assert res["algorithm"]["lr"] == 0.01 and res["algorithm"]["local_epochs"] == 1
    assert len(res["history"]) == 2
    assert res["best_accuracy"] == max(res["history"])
    assert res["history"][res["best_round"]] == res["best_accuracy"]
    assert res["accuracy"] == res["history"][-1]
    assert "final" in out and "best" in out


def _run_folders(runs):
    """The run folders under ``runs`` (not the clients' key directories, ``<run>.keys``,
    written beside each)."""
    return [p for p in runs.iterdir() if not p.name.endswith(".keys")]


def test_default_output_folder_names_group_layers_and_is_not_overwritten(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--layer", "secure-sum", "--group-layer", "default=plaintext", *FAST]
    rc, out, _ = _main(argv, capsys)
    assert rc == 0
    (folder,) = _run_folders(tmp_path / "runs")
    assert "secure-sum" in folder.name and "default=plaintext" in folder.name
    before = (folder / "result.json").read_text()
    rc, _, err = _main([*argv, "--seed", "0"], capsys)
    assert rc == 1 and "already holds a run" in err and "--force" in err
    assert (folder / "result.json").read_text() == before
    rc, _, _ = _main([*argv, "--force"], capsys)
    assert rc == 0


def test_list_gives_one_line_of_description_per_algorithm(capsys):
    rc, out, _ = _main(["run", "--list"], capsys)
    assert rc == 0
    lines = out.strip().splitlines()
    assert {ln.split()[0] for ln in lines} >= {"fedavg", "fedlog", "turbosvm"}
    for ln in lines:
        name, _, desc = ln.partition(" ")
        assert len(desc.strip()) > 10 and "no description" not in desc, ln


def test_help_documents_exit_codes(capsys):
    for argv in (["--help"], ["run", "--help"], ["audit", "--help"]):
        rc, out, _ = _main(argv, capsys)
        assert rc == 0 and "exit status" in out and "incomplete" in out
    for opt in ("--lr", "--local-epochs", "--force"):
        assert opt in _main(["run", "--help"], capsys)[1]


def test_budget_guard_stop_is_reported_as_no_usable_model(digits):
    from algorithms.fedlog import FedLog
    from secagg.data import dirichlet_split
    from secagg.errors import BudgetExceeded
    from secagg.federation import Federation
    from secagg.layers.plaintext import Plaintext

    class GuardAfterFirstRound(Plaintext):
        """Plaintext whose (stand-in) budget guard refuses every release after round 0."""

        def aggregate(self, uploads, spec, ctx):
            if ctx.round >= 1:
                raise BudgetExceeded("the next release would spend eps 5.1 > budget 4")
            return super().aggregate(uploads, spec, ctx)

    part = dirichlet_split(digits, 4, 0.5, seed=0, local_test_fraction=0.2)
    res = Federation(FedLog(feature_dim=16, local_epochs=1), GuardAfterFirstRound(), part,
                     rounds=3, seed=0, progress=False).run()
    why = res.failure()
    assert why is not None and "privacy budget guard" in why and "2 of 3" in why
    assert "budget 4" in why and res.to_dict()["failure"] == why
    assert res.transcript.check() is None or not res.transcript.closed
    res.transcript.close(res.rounds, why)
    assert res.transcript.records[-1]["stopped"] == why and res.transcript.check() is None


def test_arg_passes_constructor_arguments_checked_against_the_signature(tmp_path, capsys):
    rc, out, err = _main(["run", *FAST, "--arg", "release_rounds=1", "--layer", "central-dp",
                          "--epsilon", "1", "--out", str(tmp_path / "r")], capsys)
    assert rc == 0, err
    res = json.loads((tmp_path / "r" / "result.json").read_text())
    assert res["algorithm"]["release_rounds"] == 1
    assert res["algorithm"]["client_l2"] is None  # one release of untrained bodies: per record
    assert res["privacy"]["epsilon"] == pytest.approx(1.0, abs=1e-3)
    rc, _, err = _main(["run", *FAST, "--arg", "no_such=1"], capsys)
    assert rc == 1 and "no_such" in err and "release_rounds" in err
    rc, _, err = _main(["run", *FAST, "--arg", "release_rounds"], capsys)
    assert rc == 1 and "NAME=VALUE" in err
    rc, _, err = _main(["run", *FAST, "--arg", "release_rounds=0"], capsys)
    assert rc == 1 and "release_rounds" in err


def test_argument_errors_are_reported_in_a_folder_holding_the_default_run(tmp_path, capsys):
    """The README's order: ``secagg run`` (default output folder in the working directory),
    then the tests in the same directory. A bad argument must still be reported as such,
    not as "already holds a run": the CLI validates every argument before it looks at the
    output folder."""
    assert Path.cwd() == tmp_path  # conftest runs every test in its own directory
    rc, _, err = _main(["run", *FAST], capsys)  # FAST changes no part of the default folder
    assert rc == 0, err
    (folder,) = _run_folders(tmp_path / "runs")
    assert folder.name == "fedlog-plaintext-digits-seed0"
    for argv, needle in (
            (["--arg", "no_such=1"], "no_such"),
            (["--arg", "release_rounds"], "NAME=VALUE"),
            (["--arg", "release_rounds=0"], "release_rounds"),
            (["--layer", "central-dp"], "needs --epsilon"),
            (["--group-layer", "embeddings"], "GROUP=LAYER"),
            (["--lr", "0"], "--lr must be > 0")):
        rc, _, err = _main(["run", *FAST, *argv], capsys)
        assert rc == 1 and needle in err and "already holds a run" not in err, (argv, err)
    rc, _, err = _main(["run", *FAST], capsys)  # a valid run is still refused there
    assert rc == 1 and "already holds a run" in err
