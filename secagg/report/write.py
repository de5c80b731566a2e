"""``secagg report DIR``: the run report of a run folder or the sweep report of a sweep
folder, chosen by what the folder holds, written to ``report.html``."""

from __future__ import annotations

import os
from pathlib import Path

from secagg.errors import DataError
from secagg.report.page import REPORT
from secagg.report.run_report import render_run_report
from secagg.report.sweep_report import render_sweep_report


def write_report(directory: str | os.PathLike[str], *, threat: str | None = None,
                 identities: str | os.PathLike[str] | None = None,
                 out: str | os.PathLike[str] | None = None, verify: bool = True) -> Path:
    """``secagg report DIR``: the run report of a run folder (``result.json``) or the sweep
    report of a sweep folder (``results.jsonl`` / ``results.csv``), written to ``out``
    (default ``DIR/report.html``); returns its path.

    Raises:
        DataError: ``directory`` is neither.
    """
    d = Path(directory)
    target = Path(out) if out is not None else d / REPORT
    if (d / "result.json").exists():
        text = render_run_report(d, threat=threat, identities=identities, verify=verify)
    elif (d / "results.jsonl").exists() or (d / "results.csv").exists():
        if threat or identities:
            raise DataError("--threat and --identities apply to a run folder, not a sweep")
        text = render_sweep_report(d)
    else:
        raise DataError(f"{d} holds neither a run (result.json) nor a sweep "
                        "(results.jsonl / results.csv)")
    target.write_text(text, encoding="utf-8")
    return target
