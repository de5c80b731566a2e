"""The command line: a run writes its outputs, errors are one line."""

import json

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
    assert main([*argv, "--on-abort", "skip"]) == 0
    out = capsys.readouterr().out
    res = json.loads((tmp_path / "r" / "result.json").read_text())
    assert len(res["aborted"]) >= 1
    got = sum(p[2] for p in res["participation"])
    assert sum(p[3] for p in res["participation"]) == 20 and got < 20
    assert f"{got} / 20" in out and "aborted phases" in out
