"""``secagg run``/``sweep`` refuse what cannot work before doing any work, name the CLI's
own flags, and share one exit-code table (each test here failed on the code before)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from secagg.cli import EXIT_CODES, main

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--rounds", "1", "--local-epochs", "1", "--clients", "4", "--quiet"]


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def test_run_out_naming_a_file_is_refused_before_training(tmp_path, monkeypatch) -> None:
    from secagg.federation import Federation

    def no_training(self):  # noqa: ANN001, ANN202
        raise AssertionError("trained before checking --out")

    monkeypatch.setattr(Federation, "run", no_training)
    (tmp_path / "taken").write_text("a file")
    code, out, err = run(["run", *QUICK, "--out", str(tmp_path / "taken")])
    assert code == 1 and "is a file, not a folder" in err and out == ""
    code, _, err = run(["run", *QUICK, "--out", str(tmp_path / "taken" / "sub")])
    assert code == 1 and "is a file, not a folder" in err


def test_sweep_out_naming_a_file_is_refused_before_any_cell(tmp_path, monkeypatch) -> None:
    import secagg.sweep

    def no_sweep(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("swept before checking --out")

    monkeypatch.setattr(secagg.sweep, "sweep", no_sweep)
    (tmp_path / "taken").write_text("a file")
    code, _, err = run(["sweep", str(ROOT / "examples" / "sweep.toml"), "--out",
                        str(tmp_path / "taken")])
    assert code == 1 and "--out" in err and "is a file, not a folder" in err


@pytest.mark.parametrize("argv, flag", [
    (["--layer", "plaintext", "--threshold", "5"], "--threshold"),
    (["--layer", "secure-sum", "--he-scheme", "ckks"], "--he-scheme"),
    (["--layer", "local-dp", "--epsilon", "4", "--colluders", "2"], "--colluders"),
])
def test_options_that_do_not_apply_to_the_layer_are_refused(argv, flag) -> None:
    code, _, err = run(["run", *argv, *QUICK, "--dry-run"])
    assert code == 1
    assert f"{flag} does not apply to --layer" in err


def test_options_that_apply_still_pass() -> None:
    code, _, err = run(["run", "--layer", "distributed-dp", "--epsilon", "4", "--colluders",
                        "1", "--threshold", "3", *QUICK, "--dry-run"])
    assert code == 0, err


def test_unknown_group_layer_group_is_named() -> None:
    code, _, err = run(["run", "--algorithm", "turbosvm", "--layer", "secure-sum",
                        "--group-layer", "embedingz=plaintext", *QUICK, "--dry-run"])
    assert code == 1
    assert "unknown group(s) 'embedingz'" in err and "'embeddings'" in err


def test_hints_name_cli_flags(tmp_path) -> None:
    code, _, err = run(["run", "--algorithm", "fedavg", "--layer", "central-dp", "--adjacency",
                        "client", "--epsilon", "4", *QUICK, "--out", str(tmp_path / "r")])
    assert code == 1
    assert "--max-records N" in err and "--clip C" in err and "Federation(" not in err


def test_epsilon_zero_is_a_usage_error_in_run_and_dp_audit(capsys) -> None:
    codes = []
    for argv in (["run", "--layer", "central-dp", "--epsilon", "0"],
                 ["dp-audit", "--epsilon", "0"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        codes.append(exc.value.code)
    assert codes == [2, 2]
    assert "6    dp-audit" in EXIT_CODES  # one table names every subcommand's statuses


def test_python_dash_m_secagg() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-m", "secagg", "--version"], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("secagg ")


@pytest.mark.parametrize("command", ["run", "audit", "check", "sweep", "plot"])
def test_every_subcommand_help_shows_the_one_exit_table(command, capsys) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert EXIT_CODES in capsys.readouterr().out


def test_third_party_warnings_are_summarised_in_one_line() -> None:
    # a library warning raised during a run (here numpy's, from its own file; a DP-SGD
    # run no longer shows Opacus' secure-RNG one): the user gets one line, not each
    import warnings

    import numpy as np

    from secagg.cli import _summarised_warnings

    err = io.StringIO()
    with contextlib.redirect_stderr(err), _summarised_warnings():
        warnings.simplefilter("always")
        for _ in range(3):
            np.mean(np.array([]))  # RuntimeWarning: Mean of empty slice (numpy)
    summary = [line for line in err.getvalue().splitlines()
               if "library warning(s) during the run" in line]
    assert len(summary) == 1 and "(numpy 6)" in summary[0], err.getvalue()  # 2 per call
    assert "RuntimeWarning" not in err.getvalue()


def test_absl_warning_logs_are_summarised_in_one_line() -> None:
    # dp-accounting logs through absl (e.g. an RDP order that failed to converge, once per
    # order and call: 112 lines in a DP-SGD run at --epsilon 100 before)
    import logging

    from secagg.cli import _summarised_warnings

    err = io.StringIO()
    with contextlib.redirect_stderr(err), _summarised_warnings():
        for order in (1.1, 1.2, 1.3):
            logging.getLogger("absl").warning("failed to converge, alpha=%s", order)
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and "(absl 3)" in lines[0] and "alpha=1.1" in lines[0], lines
