"""The sweep report: a sweep folder's page: its privacy-utility and cost-utility
figures, the clients' epsilon spread, and a table of every cell."""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from secagg.report.page import REPORT, _e, _figure_html, _fmt, _page, _table

_CELL_COLUMNS = (("algorithm", "algorithm"), ("layer", "layer"), ("epsilon", "epsilon"),
                 ("delta", "delta"), ("clip", "clip"), ("dropout", "dropout"),
                 ("seed", "seed"), ("accuracy", "accuracy"), ("accuracy_kind", "kind"),
                 ("epsilon_spent", "epsilon spent"), ("uplink_bytes", "uplink bytes"),
                 ("energy_j", "energy J"), ("client_eps_release_min", "client eps min"),
                 ("client_eps_release_median", "client eps median"),
                 ("client_eps_release_max", "client eps max"), ("cache", "cache"))


def render_sweep_report(sweep_dir: str | os.PathLike[str],
                        rows: Sequence[Mapping[str, Any]] | None = None,
                        svgs: Mapping[str, str] | None = None) -> str:
    """The sweep report of ``sweep_dir`` as HTML: ``rows`` (default: read from its
    ``results.jsonl`` / ``results.csv``) and ``svgs`` (figure stem -> inline SVG, as
    :func:`secagg.plots.plot_results` returns them through ``inline``; default: drawn
    here).

    Raises:
        DataError: no finished cell.
    """
    from secagg.plots import load_results, plot_results

    d = Path(sweep_dir)
    if rows is None:
        rows = load_results(d)
    if svgs is None:
        inline: dict[str, str] = {}
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            plot_results(rows, tmp, formats=(), inline=inline)
        svgs = inline
    algos = sorted({str(r["algorithm"]) for r in rows})
    layers = sorted({str(r["layer"]) for r in rows})
    seeds = sorted({r.get("seed") for r in rows}, key=str)
    name = d.resolve().name
    body = [f"<h1>secagg sweep: {_e(name)}</h1>", f"<p class=\"muted\">{_e(d.resolve())}</p>"]
    info = {}
    if (d / "sweep.json").exists():
        try:
            info = json.loads((d / "sweep.json").read_text())
        except json.JSONDecodeError:
            info = {}
    body.append("<h2 id=\"ran\">What ran</h2>")
    body.append(f"<p id=\"what-ran\">{len(rows):,} finished cells: algorithms "
                f"{_e(', '.join(algos))}; layers {_e(', '.join(layers))}; "
                f"{len(seeds)} seed(s).</p>")
    if info.get("command"):
        body.append("<p>Reproduce (resumes: finished cells are skipped) with:</p>"
                    f"<pre id=\"command\">{_e(shlex.join(info['command']))}</pre>")
    if info.get("config"):
        body.append("<details><summary>The sweep's configuration</summary><pre>"
                    + _e(json.dumps(info["config"], indent=2, default=str)) + "</pre></details>")
    body.append("<h2 id=\"privacy-utility\">Privacy against utility</h2>")
    body.append(_figure_html(svgs["privacy_utility"], "Accuracy against the total epsilon, "
                             "one panel per algorithm; the line is the mean over seeds, the "
                             "band their min to max; the dashed line is the non-private "
                             "reference.", "fig-privacy-utility"))
    body.append("<h2 id=\"cost-utility\">Cost against utility</h2>")
    body.append(_figure_html(svgs["cost_utility"], "Accuracy against uplink bytes and "
                             "estimated client energy; one row per kind of accuracy; hollow "
                             "black markers: plaintext.", "fig-cost-utility"))
    body.append("<h2 id=\"client-epsilon\">Each client's epsilon</h2>")
    spread = [r for r in rows if r.get("client_eps_release_max") is not None
              or r.get("client_eps_server_max") is not None]
    if "client_epsilon" in svgs:
        body.append(_figure_html(svgs["client_epsilon"], "Histograms of the clients' own "
                                 "epsilons, seeds pooled, where clients differ.",
                                 "fig-client-epsilon"))
    if spread:
        uniform = [r for r in spread
                   if r.get("client_eps_release_min") == r.get("client_eps_release_max")
                   and r.get("client_eps_server_min") == r.get("client_eps_server_max")]
        body.append(f"<p>{len(spread):,} cell(s) report per-client epsilons; in "
                    f"{len(uniform):,} of them every client has the same figure against each "
                    "observer (no histogram is drawn for those). The spread per cell is in "
                    "the table below.</p>")
    else:
        body.append("<p>No cell reports per-client epsilons.</p>")
    body.append("<h2 id=\"cells\">Every cell</h2>")
    trs = []
    def order(r: Mapping[str, Any]) -> tuple[Any, ...]:
        return (str(r["algorithm"]), str(r["layer"]),
                *(-1.0 if r.get(k) is None else float(r[k])
                  for k in ("epsilon", "delta", "clip", "dropout")), str(r.get("seed")))

    for r in sorted(rows, key=order):
        cells = []
        for key, _ in _CELL_COLUMNS:
            v = r.get(key)
            cells.append(f'<span data-cell="{_e(r.get("id", ""))}" data-key="{key}">'
                         f'{_e(f"{v:.4f}" if key == "accuracy" and v is not None else _fmt(v))}'
                         "</span>")
        run = r.get("run_dir")
        link = (f'<a href="{_e(Path(str(run)).as_posix())}/{REPORT}">run report</a>'
                if run and (d / str(run) / REPORT).exists() else "not kept")
        trs.append((*cells, link))
    body.append("<div class=\"wide\" id=\"cells-table\">"
                + _table([h for _, h in _CELL_COLUMNS] + ["run"], trs,
                         numeric=(2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14)) + "</div>")
    body.append(f"<p class=\"muted\">Written by secagg report at "
                f"{_e(time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime()))}.</p>")
    return _page(f"secagg sweep report: {name}", body)


def write_sweep_report(sweep_dir: str | os.PathLike[str],
                       rows: Sequence[Mapping[str, Any]] | None = None,
                       svgs: Mapping[str, str] | None = None) -> Path:
    """Write ``report.html`` into ``sweep_dir`` (:func:`render_sweep_report`)."""
    path = Path(sweep_dir) / REPORT
    path.write_text(render_sweep_report(sweep_dir, rows, svgs), encoding="utf-8")
    return path
