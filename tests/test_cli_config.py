"""``secagg run --config FILE -c KEY=VALUE``: every option has a key, a run's resolved
config.toml reproduces it bit for bit, and --help groups the options."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from secagg.cli import main

QUICK = ["--algorithm", "fedavg", "--rounds", "2", "--local-epochs", "1", "--clients", "4",
         "--quiet"]


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_config_toml_reproduces_the_run_bit_for_bit(tmp_path) -> None:
    code, _, err = run(["run", *QUICK, "--alpha", "0.3", "--seed", "5", "--lr", "0.1",
                        "--out", str(tmp_path / "a")])
    assert code == 0, err
    config = (tmp_path / "a" / "config.toml").read_text()
    assert 'algorithm = "fedavg"' in config and "alpha = 0.3" in config and "seed = 5" in config
    code, _, err = run(["run", "--config", str(tmp_path / "a" / "config.toml"), "--out",
                        str(tmp_path / "b")])
    assert code == 0, err
    ra, rb = (json.loads((tmp_path / d / "result.json").read_text()) for d in "ab")
    assert ra["history"] == rb["history"] and ra["algorithm"] == rb["algorithm"]
    ma, mb = (torch.load(tmp_path / d / "model.pt", weights_only=True)["global"] for d in "ab")
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)
    assert (tmp_path / "b" / "config.toml").read_text() == config


def test_overrides_and_precedence(tmp_path) -> None:
    cfg = tmp_path / "run.toml"
    cfg.write_text('[data]\nclients = 3\n\n[algorithm]\nalgorithm = "fedavg"\nrounds = 3\n'
                   'local-epochs = 1\n')
    # file < -c < command line
    code, _, err = run(["run", "--config", str(cfg), "-c", "rounds=2", "-c", "seed=4",
                        "--seed", "6", "--quiet", "--out", str(tmp_path / "r")])
    assert code == 0, err
    res = json.loads((tmp_path / "r" / "result.json").read_text())
    assert (res["rounds"], res["seed"], res["n_clients"]) == (2, 6, 3)
    written = (tmp_path / "r" / "config.toml").read_text()
    assert "rounds = 2" in written and "seed = 6" in written and "clients = 3" in written


@pytest.mark.parametrize("extra, message", [
    (["-c", "roundz=2"], "unknown config key 'roundz'"),
    (["-c", "epsilon=0", "-c", "layer=central-dp"], "config key 'epsilon': 0 is not a positive"),
    (["-c", "layer=nope"], "config key 'layer': 'nope' is not one of"),
    (["-c", "rounds"], "expected KEY=VALUE"),
])
def test_bad_config_values_are_usage_errors(extra, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--dry-run", *extra])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_help_groups_options_and_ends_with_examples(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    for group in ("data:", "algorithm:", "layer:", "privacy:", "output:"):
        assert f"\n{group}\n" in text
    assert text.index("\nexamples:\n") > text.index("\noutput:\n")
    assert "secagg run --config runs/ss/config.toml" in text
