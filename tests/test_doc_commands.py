"""Every ``secagg ...`` command line shown in README.md and docs/*.md runs.

The commands of each page run in order, in one fresh directory per page (as a reader who
follows the page runs them: an ``audit`` reads the run shown above it), through the same
entry point as the ``secagg`` script. Only the length of the work is cut, by this mapping:

* ``secagg run``: ``--rounds 1 --quiet`` appended (a later option wins in argparse), and
  ``--local-epochs 1`` when the algorithm takes it (its own parameter, or through
  ``**kwargs`` as the CLI accepts it);
* ``secagg sweep CONFIG``: CONFIG is a copy of the checkout's file at the same relative
  path, with ``sweep.rounds = 1``, ``sweep.workers = 0``, one seed and the first epsilon
  of each axis;
* ``secagg dp-audit``: ``--quiet`` appended; ``--epsilon 1`` (the first of its default
  1, 2, 4) when the command names no epsilon; and :data:`AUDIT_TRIALS` trials when it
  names none and the page says it exits 0. Soundness and tightness at the full trial
  counts are tested in tests/test_dp_audit.py and tests/test_dp_audit_tight.py; here the
  command must run and exit as shown. A command the page says finds a violation (``exit
  6``) keeps its trials, since finding it depends on them;
* everything else runs as written.

A command whose comment says ``exit N`` must exit with N; every other one with 0. A new
command on a page is picked up and run without changing this file.

Python code blocks run too, in page order with the commands, in one namespace per page and
as written (no cut: their printed numbers are checked):

* a block whose first line is ``# NAME.py`` is a file the reader saves: it is written to
  NAME.py in the page's folder (importable from there, e.g. by ``--model NAME:function``);
* a block preceded by ``<!-- not run: REASON -->`` is not run (signatures, placeholders,
  work of minutes); the reason is required;
* on a ``print(...)`` line, every decimal number in its comment (``# 0.9365``) must be
  printed by the block within :data:`TOLERANCE` (the runs are seeded: the figure shown is
  the figure printed, to the digits shown), or within the tolerance the page states
  (``# 0.91 ± 0.03``: DP noise is drawn from the OS's cryptographic generator, so noised
  results vary from run to run), and every ``'key': N`` pair in the comment must be
  printed with that key and value.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import shlex
from pathlib import Path

import pytest

from secagg.algorithm_registry import load_algorithm
from secagg.cli import main
from secagg.cli.algorithm_options import _inherits

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console", ""}
#: How far a printed number may be from the one a page shows (half a unit of the 4th decimal).
TOLERANCE = 5e-4
FASHION = Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")
#: Releases per world for a ``dp-audit`` command cut to run (DP-SGD: trainings; as many as
#: tests/test_dp_audit.py audits DP-SGD with).
AUDIT_TRIALS = 300


def shell_lines(text: str) -> list[str]:
    """The command lines of a page's shell code blocks (continuations joined, prompts
    stripped)."""
    out: list[str] = []
    lang: str | None = None
    pending = ""
    for raw in text.splitlines():
        fence = re.match(r"^\s*```\s*([\w-]*)", raw)
        if fence:
            lang = None if lang is not None else fence.group(1).lower()
            continue
        if lang is None or lang not in SHELL_LANGS:
            continue
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def secagg_commands(text: str) -> list[tuple[list[str], int, str]]:
    """``(argv after "secagg", expected exit status, the line)`` for each ``secagg``
    command of a page, in order; a line's comment ``exit N`` sets the expected status."""
    found = []
    for line in shell_lines(text):
        comment = line.partition(" #")[2]
        code = re.search(r"\bexit (\d+)", comment)
        for part in re.split(r"&&|\|\||;", line):
            try:
                tokens = shlex.split(part, comments=True)
            except ValueError:
                continue
            if tokens and tokens[0] == "secagg":
                found.append((tokens[1:], int(code.group(1)) if code else 0, line))
    return found


def _fast_sweep_config(source: Path, target: Path) -> None:
    """A copy of a sweep config that runs in seconds (see the module docstring)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    cfg = tomllib.loads(source.read_text())
    cfg.setdefault("sweep", {}).update(rounds=1, workers=0)
    grid = cfg.get("grid", {})
    for axis in ("seeds", "epsilon"):
        if grid.get(axis):
            grid[axis] = grid[axis][:1]

    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = []
    for table, keys in cfg.items():
        if table == "algorithm":
            for name, args in keys.items():
                lines.append(f"[algorithm.{name}]")
                lines += [f"{k} = {value(v)}" for k, v in args.items()]
            continue
        lines.append(f"[{table}]")
        lines += [f"{k} = {value(v)}" for k, v in keys.items()]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\n".join(lines) + "\n")


def _names(argv: list[str], option: str) -> bool:
    return any(tok == option or tok.startswith(option + "=") for tok in argv)


def fast_argv(argv: list[str], expected: int = 0) -> list[str]:
    """The command with the flags that cut its work (see the module docstring);
    ``expected`` is the exit status the page shows for it."""
    if argv and argv[0] == "dp-audit":
        extra = [] if _names(argv, "--epsilon") else ["--epsilon", "1"]
        if expected == 0 and not _names(argv, "--trials"):
            extra += ["--trials", str(AUDIT_TRIALS)]
        return [*argv, *extra, "--quiet"]
    if not argv or argv[0] != "run":
        return list(argv)
    extra = ["--rounds", "1", "--quiet"]
    name = "fedlog"
    for i, tok in enumerate(argv):
        if tok == "--algorithm" and i + 1 < len(argv):
            name = argv[i + 1]
        elif tok.startswith("--algorithm="):
            name = tok.split("=", 1)[1]
    if _takes_local_epochs(load_algorithm(name)):
        extra += ["--local-epochs", "1"]
    return [*argv, *extra]


def _takes_local_epochs(cls: type) -> bool:
    """Whether ``secagg run`` accepts ``--local-epochs`` for the algorithm: the CLI's rule,
    a parameter of its own or one its ``**kwargs`` forward to a base class that names it
    (FedProx, SphereFed)."""
    params = inspect.signature(cls).parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    return "local_epochs" in params or (var_kw and _inherits(cls, "local_epochs"))


def _needs_fashion(argv: list[str]) -> bool:
    return any(t in ("fashion-mnist", "--dataset=fashion-mnist") for t in argv)


def test_the_pages_show_commands_and_the_extraction_reads_them():
    """The extraction finds what a reader sees (so the test below is not vacuous)."""
    text = "```bash\npip install -e . && secagg run\nsecagg audit runs/x --threat server+3 " \
           "   # who reads it; exit 5\n$ secagg sweep a.toml \\\n    --quiet\n```\n" \
           "```python\nsecagg = 1\n```\n"
    assert secagg_commands(text) == [
        (["run"], 0, "pip install -e . && secagg run"),
        (["audit", "runs/x", "--threat", "server+3"], 5,
         "secagg audit runs/x --threat server+3    # who reads it; exit 5"),
        (["sweep", "a.toml", "--quiet"], 0, "secagg sweep a.toml  --quiet")]
    shown = [argv for page in PAGES for argv, _, _ in secagg_commands(page.read_text())]
    assert len(shown) >= 12 and {a[0] for a in shown} >= {"run", "audit", "check", "sweep",
                                                           "plot"}
    assert fast_argv(["run", "--algorithm", "gmm", "--rounds", "20"]) == [
        "run", "--algorithm", "gmm", "--rounds", "20", "--rounds", "1", "--quiet"]
    # FedProx takes local_epochs through **kwargs (FedAvg's): the CLI accepts it, so it is cut
    assert fast_argv(["run", "--algorithm", "fedprox"]) == [
        "run", "--algorithm", "fedprox", "--rounds", "1", "--quiet", "--local-epochs", "1"]
    assert fast_argv(["dp-audit", "--layer", "dp-sgd"]) == [
        "dp-audit", "--layer", "dp-sgd", "--epsilon", "1", "--trials", str(AUDIT_TRIALS),
        "--quiet"]
    shown = ["dp-audit", "--inject", "all", "--epsilon", "2"]  # exit 6: its trials kept
    assert fast_argv(shown, 6) == [*shown, "--quiet"]
    assert fast_argv(["dp-audit", "--trials=50"]) == ["dp-audit", "--trials=50", "--epsilon",
                                                      "1", "--quiet"]


def blocks(text: str) -> list[tuple[str, str, str | None]]:
    """``(language, code, reason not run or None)`` of each fenced block, in page order."""
    out: list[tuple[str, str, str | None]] = []
    lang: str | None = None
    body: list[str] = []
    reason: str | None = None
    previous = ""
    for raw in text.splitlines():
        fence = re.match(r"^\s*```\s*([\w-]*)", raw)
        if fence and lang is None:
            lang, body = fence.group(1).lower(), []
            marker = re.match(r"^\s*<!--\s*not run:\s*(.+?)\s*-->\s*$", previous)
            reason = marker.group(1) if marker else None
        elif fence:
            out.append((lang, "\n".join(body) + "\n", reason))
            lang = None
        elif lang is not None:
            body.append(raw)
        if raw.strip():
            previous = raw
    return out


def shown_numbers(code: str) -> tuple[list[tuple[float, float]], list[tuple[str, float]]]:
    """The decimals (with their tolerance: ``0.91 ± 0.03``, else :data:`TOLERANCE`) and
    the ``'key': N`` pairs the comments of a block's print lines show."""
    decimals, pairs = [], []
    for line in code.splitlines():
        if "print(" not in line or "#" not in line:
            continue
        comment = line.split("#", 1)[1]
        pairs += [(k, float(v)) for k, v in re.findall(r"'(\w+)': (-?\d+(?:\.\d+)?)", comment)]
        plain = re.sub(r"'\w+': -?\d+(?:\.\d+)?", "", comment)
        for v, tol in re.findall(r"(?<![\w.±])(-?\d+\.\d+)(?:\s*±\s*(\d+(?:\.\d+)?))?(?![\w.])",
                                 plain):
            decimals.append((float(v), float(tol) if tol else TOLERANCE))
    return decimals, pairs


def check_printed(code: str, printed: str, where: str) -> int:
    """Assert every number a block's comments show was printed; returns how many."""
    decimals, pairs = shown_numbers(code)
    numbers = [float(v) for v in re.findall(r"-?\d+\.\d+(?:e-?\d+)?|-?\d+", printed)]
    for v, tol in decimals:
        assert any(abs(n - v) <= tol for n in numbers), (
            f"{where}: the page shows {v}, the block printed: {printed[-600:]}")
    for k, v in pairs:
        got = [float(x) for x in re.findall(rf"'{k}': (-?\d+(?:\.\d+)?)", printed)]
        assert any(abs(g - v) <= TOLERANCE for g in got), (
            f"{where}: the page shows '{k}': {v}, the block printed: {printed[-600:]}")
    return len(decimals) + len(pairs)


def test_the_python_blocks_are_read_and_marked():
    """Every Python block of the pages is run or marked not run with a reason, and the
    number check reads what a page shows."""
    text = ("<!-- not run: a signature -->\n```python\ndef f(): ...\n```\n"
            "```python\nprint(0.5, {'clipped': 7})  # 0.5 and {'clipped': 7}\n```\n")
    got = [(lang, reason) for lang, _, reason in blocks(text)]
    assert got == [("python", "a signature"), ("python", None)]
    assert shown_numbers(blocks(text)[1][1]) == ([(0.5, TOLERANCE)], [("clipped", 7.0)])
    assert shown_numbers("print(x)  # 0.91 ± 0.03 with noise\n") == ([(0.91, 0.03)], [])
    assert check_printed(blocks(text)[1][1], "0.5 {'clipped': 7}\n", "x") == 2
    with pytest.raises(AssertionError):
        check_printed(blocks(text)[1][1], "0.51 {'clipped': 7}\n", "x")
    runnable = [(page.name, code) for page in PAGES for lang, code, reason in
                blocks(page.read_text()) if lang == "python" and reason is None]
    assert len(runnable) >= 6


def _run_python(code: str, namespace: dict, where: str) -> int:
    first = code.lstrip().splitlines()[0] if code.strip() else ""
    name = re.match(r"^#\s*([\w.]+\.py)\s*$", first)
    if name:  # a file the reader saves
        Path(name.group(1)).write_text(code)
        return 0
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, where, "exec"), namespace)  # noqa: S102 -- the page's own code
    return check_printed(code, out.getvalue(), where)


@pytest.mark.parametrize("page", [p for p in PAGES if secagg_commands(p.read_text()) or any(
    lang == "python" and reason is None for lang, _, reason in blocks(p.read_text()))],
                         ids=lambda p: p.name)
def test_every_secagg_command_on_the_page_runs(page, tmp_path, capsys, monkeypatch):
    assert Path.cwd() == tmp_path
    monkeypatch.syspath_prepend(str(tmp_path))
    ran = 0
    namespace: dict = {"__name__": f"page_{page.stem}"}
    steps: list[tuple[str, object]] = []
    for lang, code, reason in blocks(page.read_text()):
        if lang == "python" and reason is None:
            steps.append(("python", code))
        elif lang in SHELL_LANGS:
            steps += [("cmd", c) for c in secagg_commands(f"```{lang}\n{code}```\n")]
    for kind, step in steps:
        if kind == "python":
            _run_python(step, namespace, f"{page.name} (python block)")
            ran += 1
            continue
        argv, expected, line = step
        if _needs_fashion(argv) and not FASHION.exists():
            if os.environ.get("CI") == "true":
                pytest.fail(f"{line}: Fashion-MNIST is not installed (CI installs it)")
            continue
        if argv and argv[0] == "sweep":
            config = next((a for a in argv[1:] if not a.startswith("-")), None)
            if config is not None and (ROOT / config).exists():
                _fast_sweep_config(ROOT / config, tmp_path / config)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                rc = main(fast_argv(argv, expected))
        except SystemExit as exc:  # argparse: usage errors, --help
            rc = exc.code if isinstance(exc.code, int) else 1
        err = capsys.readouterr().err
        assert rc == expected, f"{page.name}: `{line}` exited {rc}, not {expected}: {err}"
        ran += 1
    assert ran >= 1


def test_ci_runs_the_readme_run_command_then_its_test_command():
    """.ci/run extracts README's run command and its test command with the same awk as a
    reader's eye, and runs them in that order in the same checkout."""
    import subprocess

    script = (ROOT / ".ci" / "run").read_text()
    extract = {m.group(1): m.group(2)
               for m in re.finditer(r"^(run_cmd|cmd)=\$\((awk .*)\)$", script, re.M)}
    assert set(extract) == {"run_cmd", "cmd"}
    got = {k: subprocess.run(["bash", "-c", v], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip() for k, v in extract.items()}
    readme = (ROOT / "README.md").read_text()
    assert got["run_cmd"].endswith("secagg run") and got["run_cmd"] in readme
    assert "python -m pytest" in got["cmd"] and got["cmd"] in readme
    assert script.index('bash -c "$run_cmd"') < script.index('bash -c "$cmd"')
