"""One self-contained HTML page per run and per sweep: ``report.html``.

``secagg report RUN_DIR`` (a folder holding ``result.json``) and ``secagg report SWEEP_DIR``
(one holding ``results.jsonl`` or ``results.csv``) write it; ``secagg run`` and ``secagg
sweep`` write it when they finish (:func:`save_run_report`, :func:`write_sweep_report`).

The page needs nothing but itself: the figures are inline SVG (matplotlib), the style is
inline CSS, there is no script, and a Content-Security-Policy forbids every fetch, so a
reader's browser makes no request when it opens it (tests/test_report.py checks this in
Chromium).

A run report reads, top to bottom: any failure (an audit whose attestation failed, a
transcript cut short, a run without a usable model, a run that is not private) in words;
what ran and the command that reproduces it; the accuracy curve, its kind named; the
privacy summary (the run's epsilon and what it holds against; each client's epsilon, a
histogram only when clients differ; the privacy plan's noise against signal per release);
what each party saw per phase and field (:func:`secagg.audit.audit`, with its attestation
verdict and what it trusted); the costs per phase and direction (``costs.csv``); and the
threat section (:func:`threat_models.audit.threat_audit`) when a coalition is named.

A sweep report: the privacy-utility and cost-utility figures (:mod:`secagg.plots`), the
clients' epsilon spread, and a table of every cell (linking to a cell's run report where
the cell kept its run folder, ``run_dir`` in its row).

Every number the page shows from ``result.json`` carries ``data-key`` (its dotted path in
``result.json``), so that a reader -- or a test -- can check it against the file.

One module per part: the page's HTML building blocks (:mod:`secagg.report.page`), the run
report (:mod:`secagg.report.run_report`), what ``secagg run`` leaves for it
(:mod:`secagg.report.run_info`), the sweep report (:mod:`secagg.report.sweep_report`) and
the writer that picks one by the folder (:mod:`secagg.report.write`); every name is
importable from :mod:`secagg.report` as before.
"""

from secagg.report.page import REPORT
from secagg.report.run_info import command_from_args, plan_rows, save_run_report
from secagg.report.run_report import RUN_INFO, VERIFY_AT_RUN_END, render_run_report
from secagg.report.sweep_report import render_sweep_report, write_sweep_report
from secagg.report.write import write_report

__all__ = ["command_from_args", "plan_rows", "render_run_report", "render_sweep_report",
           "save_run_report", "write_report", "write_sweep_report"]

#: Constants kept importable from here, as before the split.
_REEXPORTED = (REPORT, RUN_INFO, VERIFY_AT_RUN_END)
