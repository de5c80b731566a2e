"""Plots of sweep results (matplotlib, PNG and SVG).

:func:`plot_results` draws, from the rows of a sweep (:mod:`secagg.sweep`):

* ``privacy_utility.{png,svg}`` -- accuracy (the y-axis names its kind) against total
  epsilon, one panel per algorithm, one series per DP layer (mean over seeds, the band
  spans the seeds' min to max), plaintext's mean as the dashed non-private reference and
  other layers without noise dotted;
* ``cost_utility.{png,svg}`` -- accuracy against uplink bytes and against estimated client
  energy, one series per layer;
* ``client_epsilon.{png,svg}`` (:func:`plot_client_epsilons`), only when some row carries
  per-client epsilons that differ between clients -- their histogram per observer.

PNG exports are at least 1000 pixels wide (``MIN_WIDTH_IN`` inches at ``PNG_DPI``); an
epsilon axis is logarithmic from one decade up (``EPSILON_LOG_DECADES``); kinds of accuracy
(global test, mean local test) never share an axis; the non-private reference is drawn
above the other series.

Every series carries the SVG id ``series-ALGORITHM-LAYER`` (cost plot:
``cost-bytes-LAYER`` and ``cost-energy-LAYER``), so a reader or a test can find it in the
file. ``secagg plot RESULTS`` redraws from ``results.jsonl`` or ``results.csv`` (the
per-client lists are in ``results.jsonl`` only).

Tick labels are written by :mod:`secagg.plot_ticks`, never by matplotlib's offset or
scientific formatters, and are measured after layout, so no two on an axis overlap or read
alike.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from secagg.errors import DataError
from secagg.plot_ticks import (
    EPSILON_LOG_DECADES,
    LOG_DECADES,
    _AxisTicks,
    _finite,
    _fit_ticks,
    _is_wide,
)

__all__ = ["load_results", "plot_client_epsilons", "plot_results", "series_ids"]

#: Kept importable from here, as before the ticks moved to secagg.plot_ticks.
_REEXPORTED = (LOG_DECADES,)

_OBSERVERS = ("release", "server")  # secagg.sweep.report.CLIENT_OBSERVERS
_OBSERVER_NAMES = {"release": "observers of the released model", "server": "the server"}
_NUMERIC = ("epsilon", "delta", "clip", "dropout", "accuracy", "epsilon_spent",
            "uplink_bytes", "downlink_bytes", "energy_j", "wall_s",
            *(f"client_eps_{o}_{s}" for o in _OBSERVERS
              for s in ("min", "median", "max", "none")))
_STYLE = {"plaintext": "k", "secure-sum": "0.4", "central-dp": "tab:blue",
          "distributed-dp": "tab:green", "local-dp": "tab:red"}
_MARKERS = ("o", "s", "^", "D", "v")


def load_results(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The finished rows of a sweep: ``results.jsonl`` (preferred) or ``results.csv``, or
    a directory holding one.

    Raises:
        DataError: no such file, or no finished row in it.
    """
    p = Path(path)
    if p.is_dir():
        p = p / "results.jsonl" if (p / "results.jsonl").exists() else p / "results.csv"
    if not p.exists():
        raise DataError(f"no sweep results at {p} (expected results.jsonl or results.csv)")
    rows: list[dict[str, Any]] = []
    if p.suffix == ".csv":
        with open(p, newline="") as fh:
            for r in csv.DictReader(fh):
                rows.append({k: (_num(v) if k in _NUMERIC else v) for k, v in r.items()})
    else:
        for line in p.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    rows = [r for r in rows if r.get("status", "ok") == "ok" and r.get("accuracy") is not None]
    if not rows:
        raise DataError(f"{p} holds no finished sweep cell")
    return rows


def _num(v: str) -> float | None:
    return None if v in ("", None) else float(v)


def _series(rows: Iterable[Mapping[str, Any]], x: str) -> dict[float, list[float]]:
    out: dict[float, list[float]] = {}
    for r in rows:
        if r.get(x) is not None:
            out.setdefault(float(r[x]), []).append(float(r["accuracy"]))
    return out


#: Resolution of the PNG exports, and the least width of a figure (inches): at least
#: MIN_WIDTH_IN * PNG_DPI = 1050 pixels wide.
PNG_DPI = 150
MIN_WIDTH_IN = 7.0
#: Drawn above every other series, so that a reference is never hidden under them.
REFERENCE_ZORDER = 5


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(width, MIN_WIDTH_IN), height), dpi=72, layout="constrained")
    FigureCanvasAgg(fig)  # a renderer, to measure the tick labels (_fit_ticks)
    return fig


def _accuracy_label(rows: Iterable[Mapping[str, Any]]) -> str:
    """``accuracy (global test)``: the kinds of accuracy the rows measured (a result's
    ``accuracy_kind``), or plain ``accuracy`` when the rows do not say."""
    kinds = sorted({str(r["accuracy_kind"]) for r in rows if r.get("accuracy_kind")})
    return f"accuracy ({', '.join(kinds)})" if kinds else "accuracy"


def _save(fig: Any, out: Path, stem: str, formats: Sequence[str],
          inline: dict[str, str] | None = None) -> dict[str, Path]:
    paths = {}
    if inline is not None:  # the SVG as text, for the HTML report (secagg.report)
        import io

        buf = io.StringIO()
        fig.savefig(buf, format="svg")
        text = buf.getvalue()
        inline[stem] = text[text.index("<svg"):]
    for fmt in formats:
        paths[f"{stem}.{fmt}"] = out / f"{stem}.{fmt}"
        fig.savefig(paths[f"{stem}.{fmt}"], dpi=PNG_DPI if fmt == "png" else "figure")
    return paths


def _layer_order(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    return sorted({r["layer"] for r in rows},
                  key=lambda n: (list(_STYLE).index(n) if n in _STYLE else 99, n))


def plot_results(rows: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike[str],
                 formats: Sequence[str] = ("png", "svg"),
                 inline: dict[str, str] | None = None) -> dict[str, Path]:
    """Draw the sweep's figures into ``out_dir``: ``privacy_utility`` and
    ``cost_utility``, and ``client_epsilon`` (:func:`plot_client_epsilons`) when some
    row carries per-client epsilons.

    Privacy-utility: one panel per algorithm; per DP layer, the mean accuracy over seeds
    against the total epsilon with a band from the seeds' minimum to their maximum; the
    non-private reference (plaintext's mean over seeds, else another layer without DP
    noise) as a dashed line, other layers without noise dotted; the y-axis names the
    accuracy measured (``accuracy_kind``).

    Returns the written paths by file name (``privacy_utility.png``, ...); the series ids
    drawn are those :func:`series_ids` lists. ``inline``, when given, receives each
    figure's SVG as text by stem (``privacy_utility``, ...), for the HTML report.

    Raises:
        DataError: no finished row to plot.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in rows if r.get("accuracy") is not None]
    if not rows:
        raise DataError("no finished sweep cell to plot")
    paths = _plot_privacy_utility(rows, out, formats, inline)
    paths.update(_plot_cost_utility(rows, out, formats, inline))
    paths.update(plot_client_epsilons(rows, out, formats, inline))
    return paths


def _plot_privacy_utility(rows: Sequence[Mapping[str, Any]], out: Path,
                          formats: Sequence[str],
        inline: dict[str, str] | None = None) -> dict[str, Path]:
    from matplotlib.patches import Patch

    algos = sorted({r["algorithm"] for r in rows})
    layers = _layer_order(rows)
    seeds = len({r.get("seed") for r in rows})
    fig = _figure(4.2 * len(algos) + 0.6, 3.6)
    axes = fig.subplots(1, len(algos), squeeze=False)[0]
    plans = []
    for ax, algo in zip(axes, algos, strict=True):
        mine = [r for r in rows if r["algorithm"] == algo]
        flat = [ly for ly in layers if any(r["layer"] == ly for r in mine)
                and all(r.get("epsilon") is None for r in mine if r["layer"] == ly)]
        reference = "plaintext" if "plaintext" in flat else (flat[0] if flat else None)
        banded = False
        for layer in layers:
            sel = [r for r in mine if r["layer"] == layer]
            if not sel:
                continue
            color = _STYLE.get(layer)
            if layer in flat:
                accs = [float(r["accuracy"]) for r in sel]
                n = len({r.get("seed") for r in sel})
                name = ("non-private reference: " if layer == reference else "no DP: ")
                line = ax.axhline(sum(accs) / len(accs), color=color,
                                  ls="--" if layer == reference else ":",
                                  lw=1.4 if layer == reference else 1.0,
                                  zorder=REFERENCE_ZORDER,
                                  label=f"{name}{layer} (mean of {n} seed(s))")
                line.set_gid(f"series-{algo}-{layer}")
                continue
            s = _series(sel, "epsilon")
            xs = sorted(s)
            mean = [sum(s[x]) / len(s[x]) for x in xs]
            (line,) = ax.plot(xs, mean, marker="o", ms=3, color=color, label=layer)
            line.set_gid(f"series-{algo}-{layer}")
            if any(len(s[x]) > 1 for x in xs):
                band = ax.fill_between(xs, [min(s[x]) for x in xs], [max(s[x]) for x in xs],
                                       color=line.get_color(), alpha=0.2, lw=0)
                band.set_gid(f"spread-{algo}-{layer}")
                banded = True
        handles, labels = ax.get_legend_handles_labels()
        if banded:
            handles.append(Patch(color="0.5", alpha=0.3, lw=0))
            labels.append(f"band: min-max over {seeds} seeds")
        eps = sorted({float(r["epsilon"]) for r in mine if r.get("epsilon") is not None})
        if eps:
            plans.append(_AxisTicks(ax.xaxis, eps, fixed=eps,
                                    log=_is_wide(eps, EPSILON_LOG_DECADES)))
        else:
            ax.set_xticks([])  # no DP cell: no epsilon to mark
        ax.set_xlabel("total epsilon")
        ax.set_ylabel(_accuracy_label(mine))
        plans.append(_AxisTicks(ax.yaxis, [float(r["accuracy"]) for r in mine]))
        ax.set_title(algo)
        ax.grid(alpha=0.3)
        ax.legend(handles, labels, fontsize=7)
    fig.suptitle(f"accuracy vs epsilon\nline: mean over {seeds} seed(s); band: their min "
                 "to max", fontsize=9)
    _fit_ticks(fig, plans)
    paths = _save(fig, out, "privacy_utility", formats, inline)
    return paths


def _kinds(rows: Iterable[Mapping[str, Any]]) -> list[str | None]:
    """The accuracy kinds of ``rows`` (``accuracy_kind``; None where a row does not say)."""
    return sorted({r.get("accuracy_kind") or None for r in rows}, key=lambda k: (k is None, k))


def _plot_cost_utility(rows: Sequence[Mapping[str, Any]], out: Path,
                       formats: Sequence[str],
        inline: dict[str, str] | None = None) -> dict[str, Path]:
    """Accuracy against uplink bytes and against estimated client energy: one row of two
    panels per kind of accuracy (global test, mean local test: never mixed on one axis),
    one series per layer, markers per algorithm; plaintext (the non-private reference)
    drawn hollow above the others so that it is never hidden."""
    from matplotlib.markers import MarkerStyle

    algos = sorted({r["algorithm"] for r in rows})
    kinds = _kinds(rows)
    fig = _figure(8.4, 3.4 * len(kinds))
    grid = fig.subplots(len(kinds), 2, squeeze=False)
    plans = []
    for (ax_b, ax_e), kind in zip(grid, kinds, strict=True):
        mine = [r for r in rows if (r.get("accuracy_kind") or None) == kind]
        for layer in _layer_order(mine):
            sel = [r for r in mine if r["layer"] == layer and r.get("uplink_bytes") is not None]
            ref = layer == "plaintext"
            for ax, key, name in ((ax_b, "uplink_bytes", "bytes"), (ax_e, "energy_j", "energy")):
                have = [r for r in sel if r.get(key) is not None
                        and math.isfinite(float(r[key]))]
                if not have:
                    continue
                color = _STYLE.get(layer)
                coll = ax.scatter([float(r[key]) for r in have],
                                  [float(r["accuracy"]) for r in have],
                                  s=40 if ref else 16, label=layer,
                                  facecolors="none" if ref else color,
                                  edgecolors=color, linewidths=1.3 if ref else 0.0,
                                  alpha=1.0 if ref else 0.8,
                                  zorder=REFERENCE_ZORDER if ref else 2)
                marks = [MarkerStyle(_MARKERS[algos.index(r["algorithm"]) % len(_MARKERS)])
                         for r in have]
                coll.set_paths([m.get_path().transformed(m.get_transform()) for m in marks])
                coll.set_gid(f"cost-{name}-{layer}" + ("" if len(kinds) == 1 or kind is None
                                                       else f"-{kind.replace(' ', '_')}"))
        ax_b.set_title("markers: " + ", ".join(
            f"{_MARKERS[i % len(_MARKERS)]} {a}" for i, a in enumerate(algos)
            if any(r["algorithm"] == a for r in mine)), fontsize=8)
        ax_b.set_xlabel("uplink bytes (total)")
        ax_e.set_xlabel(f"est. client energy, J ({rows[0].get('device_profile', '?')})")
        for ax, key in ((ax_b, "uplink_bytes"), (ax_e, "energy_j")):
            plans.append(_AxisTicks(ax.xaxis, [r[key] for r in mine if r.get(key) is not None]))
            plans.append(_AxisTicks(ax.yaxis, [r["accuracy"] for r in mine]))
            ax.set_ylabel(_accuracy_label(mine))
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    _fit_ticks(fig, plans)
    return _save(fig, out, "cost_utility", formats, inline)


def plot_client_epsilons(rows: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike[str],
                         formats: Sequence[str] = ("png", "svg"),
                         inline: dict[str, str] | None = None) -> dict[str, Path]:
    """Draw ``client_epsilon.{png,svg}``: histograms of the clients' own epsilons, from
    the rows that carry them (``client_epsilons``, recorded by the sweep from
    ``result.json``'s ``privacy.clients``; see :func:`secagg.sweep.report.client_spread`).

    One row of panels per (algorithm, layer, epsilon, and delta / clip / dropout where
    the rows differ in them) -- seeds pooled -- and one panel per observer (``release``:
    who sees the released models; ``server``). The run's global epsilon
    (``client_eps_global``: ``result.json``'s ``privacy.epsilon``, the largest over the
    pooled seeds), where recorded, is a dashed vertical line on each panel that has
    per-client figures. Clients without a figure against an observer (null: no guarantee
    against it, as for the server under central DP) are counted in the panel, never drawn
    as a number. Each panel's SVG id is ``clients-ALGORITHM-LAYER-EPSILON-OBSERVER``
    (``...-EPSILON-clip1-OBSERVER`` and so on where clip, delta or dropout vary).

    Only the (group, observer) pairs whose clients' epsilons differ get a panel: a panel
    of one bar (every client the same figure) or of none (no guarantee against that
    observer) tells nothing the sweep's table does not (``client_eps_*`` columns; the
    report, :mod:`secagg.report`, states them in words), so it is left out.

    Returns the written paths by file name; empty (nothing drawn) when no row carries
    per-client epsilons, or no group's clients differ.
    """
    have = [r for r in rows if r.get("client_epsilons")]
    if not have:
        return {}
    # the grid's other axes split groups too, where the rows differ in them
    varied = [k for k in ("delta", "clip", "dropout") if len({r.get(k) for r in have}) > 1]
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in have:
        eps = None if r.get("epsilon") is None else float(r["epsilon"])
        extra = tuple((k, r.get(k)) for k in varied)
        groups.setdefault((str(r["algorithm"]), str(r["layer"]), eps, extra), []).append(r)
    keys = sorted(groups, key=lambda k: (k[0], _layer_order([{"layer": k[1]}])[0],
                                         -1.0 if k[2] is None else k[2],
                                         [(n, -1.0 if v is None else v) for n, v in k[3]]))
    found = {o for r in have for o in r["client_epsilons"]}
    observers = [o for o in _OBSERVERS if o in found] + sorted(found - set(_OBSERVERS))
    panels = []  # (key, observer) whose clients' figures differ: the others carry one value
    for key in keys:
        for obs in observers:
            vals = _finite(v for r in groups[key] for v in (r["client_epsilons"].get(obs) or []))
            if len(set(vals)) > 1:
                panels.append((key, obs))
    if not panels:
        return {}
    ncols = min(len(observers), len(panels))
    nrows = -(-len(panels) // ncols)
    fig = _figure(3.8 * ncols + 0.4, 2.6 * nrows + 0.4)
    grid = list(fig.subplots(nrows, ncols, squeeze=False).flat)
    for ax in grid[len(panels):]:
        ax.remove()
    plans = []
    for ax, (key, obs) in zip(grid, panels, strict=False):
        algo, layer, eps, extra = key
        name = "-".join([algo, layer, "none" if eps is None else f"{eps:g}"]
                        + [f"{n}{'none' if v is None else f'{v:g}'}" for n, v in extra])
        also = "".join(f", {n} {'none' if v is None else f'{v:g}'}" for n, v in extra)
        members = groups[key]
        seeds = len({r.get("seed") for r in members})
        spent = _finite(r.get("client_eps_global") for r in members)
        delta = next((r["delta"] for r in members if r.get("delta") is not None), None)
        ax.set_gid(f"clients-{name}-{obs}")
        allv = [v for r in members for v in (r["client_epsilons"].get(obs) or [])]
        vals = _finite(allv)
        missing = len(allv) - len(vals)
        head = f"{algo}, {layer}" + ("" if eps is None else f", epsilon {eps:g}") + also
        ax.set_title(f"{head}\nagainst {_OBSERVER_NAMES.get(obs, obs)}", fontsize=8)
        ax.set_xlabel("client's epsilon" + ("" if delta is None else
                                            f" (delta {float(delta):g})"))
        ax.set_ylabel("clients" + (f" ({seeds} seeds pooled)" if seeds > 1 else ""))
        xs = vals + spent
        log = _is_wide(xs, EPSILON_LOG_DECADES)
        if log:
            lo, hi = math.log10(min(vals)), math.log10(max(vals))
            n = max(1, min(30, int(math.sqrt(len(vals))) + 1))
            bins: Any = [10 ** (lo + (hi - lo) * i / n) for i in range(n + 1)]
            if hi == lo:
                bins = 1
        else:
            bins = max(1, min(30, int(math.sqrt(len(vals))) + 1))
        ax.hist(vals, bins=bins, color=_STYLE.get(layer, "tab:blue"), alpha=0.8,
                label=f"{len(vals)} client(s)" if seeds == 1
                else f"{len(vals)} (client, seed) figures")
        if spent:
            ax.axvline(max(spent), color="k", ls="--", lw=1.2,
                       label=f"run's global epsilon {max(spent):.3g}")
        if missing:
            ax.plot([], [], " ", label=f"{missing} without a figure (no guarantee)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        plans.append(_AxisTicks(ax.xaxis, xs, log=log))
        plans.append(_AxisTicks(ax.yaxis, [0.0] + [p.get_height() for p in ax.patches],
                                integer=True))
    _fit_ticks(fig, plans)
    return _save(fig, Path(out_dir), "client_epsilon", formats, inline)


def series_ids(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The SVG ids :func:`plot_results` gives the privacy-utility series of ``rows``."""
    return sorted({f"series-{r['algorithm']}-{r['layer']}" for r in rows
                   if r.get("accuracy") is not None})
