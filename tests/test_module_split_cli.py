"""The five modules split by concept (issue 34, point 6): secagg/cli.py, data.py and
report.py became packages, plots.py gave its tick machinery to plot_ticks.py, and
threat_models/dp_audit.py gave its parts to dp_audit_*.py. Every name the old module
defined (and every private one imported elsewhere) is still importable from its old
path; each part stays under 600 lines and says what it holds; the ``secagg`` command is
the same through each of its entry points."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from test_import_graph import PACKAGES, import_graph

ROOT = Path(__file__).resolve().parents[1]

#: old module -> the names it defined before the split (public, and private ones that
#: tests, benchmarks or the report imported from it)
OLD_NAMES = {
    "secagg.cli": [
        "DP_AUDIT_EXIT_CODES", "DP_AUDIT_LAYERS", "DP_LAYERS", "EXIT_CODES",
        "EXIT_DP_VIOLATED", "EXIT_ERROR", "EXIT_INCOMPLETE", "EXIT_LEAK", "EXIT_NO_MODEL",
        "EXIT_OK", "EXIT_USAGE", "LAYERS", "RUN_EXAMPLES", "available_algorithms",
        "build_layer", "check_out_dir", "load_algorithm", "main", "_algorithm_kwargs",
        "_check_run_args", "_client_ledger_kwargs", "_make_parser", "_run",
        "_summarised_warnings"],
    "secagg.data": [
        "ClientData", "DATASETS", "DATA_DIR_ENV", "DEFAULT_DATA_DIRS", "Dataset", "IDX_FILES",
        "Partition", "SPLITS", "dirichlet_split", "iid_split", "label_shards_split",
        "label_skew", "load_dataset", "make_split", "read_idx", "shard_split",
        "_stratified_split"],
    "secagg.report": [
        "REPORT", "RUN_INFO", "VERIFY_AT_RUN_END", "command_from_args", "plan_rows",
        "render_run_report", "render_sweep_report", "save_run_report", "write_report",
        "write_sweep_report"],
    "secagg.plots": [
        "EPSILON_LOG_DECADES", "LOG_DECADES", "MIN_WIDTH_IN", "PNG_DPI", "REFERENCE_ZORDER",
        "load_results", "plot_client_epsilons", "plot_results", "series_ids", "_AxisTicks",
        "_figure", "_fit_ticks", "_is_wide"],
    "threat_models.dp_audit": [
        "ALL_LAYERS", "AuditError", "AuditResult", "BatchRelease", "DEFAULT_CLIENTS",
        "DEFAULT_DELTA", "DPSGD_TRIALS", "EXIT_VIOLATED", "FEDAVG_TRIALS", "FIELD",
        "FTRL_TRIALS", "GDP_ALPHA_SHARE", "LAYER_NAMES", "LayerClaim", "MODES", "PHASE",
        "RELEASES", "Release", "SELECTION_FRACTION", "SURVIVORS_ALL_TRIALS",
        "SURVIVOR_PATTERNS", "Statistic", "SumRelease", "TestOutcome", "allowed_fnr",
        "audit", "audit_dpsgd", "audit_dpsgd_one_run", "audit_modes", "audit_release",
        "audit_sum", "clopper_pearson_lower", "clopper_pearson_upper", "composed_ring",
        "composition_holds", "dropout_pattern", "encoded_sum", "epsilon_from_counts",
        "epsilon_from_rates", "exact_statistic", "format_table", "gdp_fit", "make_layer",
        "one_run_epsilon", "one_run_p_value", "parity_statistic", "plot_tradeoff",
        "shift_statistic", "skellam_sum_holds", "threshold_test", "tradeoff_curve"],
}

#: old module -> the files that hold it now
PARTS = {
    "secagg.cli": sorted((ROOT / "secagg" / "cli").glob("*.py")),
    "secagg.data": sorted((ROOT / "secagg" / "data").glob("*.py")),
    "secagg.report": sorted((ROOT / "secagg" / "report").glob("*.py")),
    "secagg.plots": [ROOT / "secagg" / "plots.py", ROOT / "secagg" / "plot_ticks.py"],
    "threat_models.dp_audit": [ROOT / "threat_models" / f"dp_audit{s}.py" for s in (
        "", "_bounds", "_statistics", "_release", "_sum", "_dpsgd", "_output")],
}


@pytest.mark.parametrize("module", sorted(OLD_NAMES))
def test_every_old_name_is_importable_from_its_old_path(module: str) -> None:
    mod = importlib.import_module(module)
    assert [n for n in OLD_NAMES[module] if not hasattr(mod, n)] == []
    assert all(hasattr(mod, n) for n in getattr(mod, "__all__", ()))


@pytest.mark.parametrize("module", sorted(PARTS))
def test_each_part_is_short_and_says_what_it_holds(module: str) -> None:
    parts = PARTS[module]
    assert len(parts) >= 2 and all(p.is_file() for p in parts)
    for path in parts:
        text = path.read_text()
        assert len(text.splitlines()) <= 600, path
        assert ast.get_docstring(ast.parse(text)), path
        # a part is never named after a name the old module exported (it would shadow it)
        assert path.stem not in OLD_NAMES[module], path


def _help(*args: str) -> str:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "100"}
    proc = subprocess.run([sys.executable, *args, "--help"], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_command_is_the_same_through_every_entry_point() -> None:
    """``python -m secagg``, ``python -m secagg.cli`` and the installed script's target
    (pyproject's [project.scripts]) are one command with one help text."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    from secagg.cli import main

    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = script["secagg"].partition(":")
    assert getattr(importlib.import_module(module), name) is main
    text = _help("-m", "secagg")
    assert text == _help("-m", "secagg.cli")
    for command in ("run", "audit", "check", "sweep", "plot", "report", "dp-audit"):
        assert command in text


def test_only_the_command_line_composes_secagg_with_the_other_packages():
    """secagg imports neither algorithms nor threat_models except in its command line,
    the secagg.cli package (DESIGN.md), split into modules but still the one place; the
    run report's threat section (secagg.report.run_report, which judges a run against a
    coalition as ``secagg audit --threat`` does) is the one known exception."""
    graph = import_graph(ROOT, PACKAGES)
    composing = {m for m, edges in graph.items() if m.split(".")[0] == "secagg"
                 and any(e.split(".")[0] in ("algorithms", "threat_models") for e in edges)}
    outside = {m for m in composing if m != "secagg.cli" and not m.startswith("secagg.cli.")}
    assert outside <= {"secagg.report.run_report"}, outside
    assert {"secagg.cli.run", "secagg.cli.check", "secagg.cli.dp_audit"} <= composing
