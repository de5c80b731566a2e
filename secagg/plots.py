"""Plots of sweep results (matplotlib, PNG and SVG).

:func:`plot_results` draws, from the rows of a sweep (:mod:`secagg.sweep`):

* ``privacy_utility.{png,svg}`` -- accuracy against total epsilon, one panel per algorithm,
  one series per DP layer (mean over seeds, the band spans the seeds' min to max), with the
  non-DP layers as dashed horizontal lines;
* ``cost_utility.{png,svg}`` -- accuracy against uplink bytes and against estimated client
  energy, one series per layer.

Every series carries the SVG id ``series-ALGORITHM-LAYER`` (cost plot:
``cost-bytes-LAYER`` and ``cost-energy-LAYER``), so a reader or a test can find it in the
file. ``secagg plot RESULTS`` redraws from ``results.jsonl`` or ``results.csv``.
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

__all__ = ["load_results", "plot_results", "series_ids"]

_NUMERIC = ("epsilon", "delta", "clip", "dropout", "accuracy", "epsilon_spent",
            "uplink_bytes", "downlink_bytes", "energy_j", "wall_s")
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


def _scale_axis(ax: Any, values: Sequence[float], ticks: Sequence[float] | None = None) -> None:
    """An x-axis a reader can read at any data range: log with a few decade ticks when
    the values span a factor of 10 or more, else linear with at most 4 ticks labelled in
    engineering units (a narrow range such as 1.570e5..1.575e5 would otherwise fill a log
    axis with overlapping minor labels). ``ticks`` (e.g. the swept epsilons) are labelled
    themselves; :func:`_thin_labels` then hides any that would overlap."""
    from matplotlib.ticker import EngFormatter, LogLocator, MaxNLocator, NullFormatter

    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))
            and float(v) > 0]
    wide = bool(vals) and max(vals) / min(vals) >= 10
    if wide:
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())
    if ticks:
        ax.set_xticks(list(ticks), [f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_formatter(NullFormatter())
    elif wide:
        ax.xaxis.set_major_locator(LogLocator(numticks=5))
        ax.xaxis.set_major_formatter(EngFormatter(places=0, sep=""))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))
        ax.xaxis.set_major_formatter(EngFormatter(places=2, sep=""))


def _thin_labels(fig: Any) -> None:
    """Hide x tick labels that would overlap their left neighbour, in every axes of
    ``fig`` (after layout, so the extents are the rendered ones)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        last = -math.inf
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        for t in sorted(labels, key=lambda t: t.get_window_extent(renderer).x0):
            box = t.get_window_extent(renderer)
            if box.x0 < last + 2:
                t.set_visible(False)
            else:
                last = box.x1


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=72, layout="constrained")
    FigureCanvasAgg(fig)  # a renderer, to measure the tick labels (_thin_labels)
    return fig


def plot_results(rows: Sequence[Mapping[str, Any]], out_dir: str | os.PathLike[str],
                 formats: Sequence[str] = ("png", "svg")) -> dict[str, Path]:
    """Draw the privacy-utility and cost-utility figures into ``out_dir``.

    Returns the written paths by file name (``privacy_utility.png``, ...); the series ids
    drawn are those :func:`series_ids` lists.

    Raises:
        DataError: no finished row to plot.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in rows if r.get("accuracy") is not None]
    if not rows:
        raise DataError("no finished sweep cell to plot")
    algos = sorted({r["algorithm"] for r in rows})
    layers = sorted({r["layer"] for r in rows}, key=lambda n: list(_STYLE).index(n)
                    if n in _STYLE else 99)
    paths: dict[str, Path] = {}

    fig = _figure(4.2 * len(algos) + 0.6, 3.4)
    axes = fig.subplots(1, len(algos), squeeze=False)[0]
    for ax, algo in zip(axes, algos, strict=True):
        mine = [r for r in rows if r["algorithm"] == algo]
        for layer in layers:
            sel = [r for r in mine if r["layer"] == layer]
            if not sel:
                continue
            color = _STYLE.get(layer)
            if all(r.get("epsilon") is None for r in sel):
                accs = [float(r["accuracy"]) for r in sel]
                line = ax.axhline(sum(accs) / len(accs), color=color, ls="--", lw=1.2,
                                  label=f"{layer} (no DP)")
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
        eps = sorted({float(r["epsilon"]) for r in mine if r.get("epsilon") is not None})
        _scale_axis(ax, eps, ticks=eps)
        ax.set_xlabel("total epsilon")
        ax.set_ylabel("accuracy")
        ax.set_title(algo)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    seeds = len({r.get("seed") for r in rows})
    fig.suptitle(f"accuracy vs epsilon (band: min-max over {seeds} seed(s))", fontsize=9)
    _thin_labels(fig)
    for fmt in formats:
        paths[f"privacy_utility.{fmt}"] = out / f"privacy_utility.{fmt}"
        fig.savefig(paths[f"privacy_utility.{fmt}"])

    fig = _figure(8.4, 3.4)
    ax_b, ax_e = fig.subplots(1, 2)
    for layer in layers:
        sel = [r for r in rows if r["layer"] == layer and r.get("uplink_bytes") is not None]
        if not sel:
            continue
        for ax, key, name in ((ax_b, "uplink_bytes", "bytes"), (ax_e, "energy_j", "energy")):
            pts = [(float(r[key]), float(r["accuracy"])) for r in sel
                   if r.get(key) is not None and math.isfinite(float(r[key]))]
            if not pts:
                continue
            marks = [_MARKERS[algos.index(r["algorithm"]) % len(_MARKERS)] for r in sel
                     if r.get(key) is not None and math.isfinite(float(r[key]))]
            coll = ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=16,
                              color=_STYLE.get(layer), label=layer, alpha=0.8)
            from matplotlib.markers import MarkerStyle

            coll.set_paths([MarkerStyle(m).get_path().transformed(
                MarkerStyle(m).get_transform()) for m in marks])
            coll.set_gid(f"cost-{name}-{layer}")
    ax_b.set_title("markers: " + ", ".join(
        f"{_MARKERS[i % len(_MARKERS)]} {a}" for i, a in enumerate(algos)), fontsize=8)
    ax_b.set_xlabel("uplink bytes (total)")
    ax_e.set_xlabel(f"est. client energy, J ({rows[0].get('device_profile', '?')})")
    for ax, key in ((ax_b, "uplink_bytes"), (ax_e, "energy_j")):
        _scale_axis(ax, [float(r[key]) for r in rows if r.get(key) is not None])
        ax.set_ylabel("accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _thin_labels(fig)
    for fmt in formats:
        paths[f"cost_utility.{fmt}"] = out / f"cost_utility.{fmt}"
        fig.savefig(paths[f"cost_utility.{fmt}"])
    return paths


def series_ids(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The SVG ids :func:`plot_results` gives the privacy-utility series of ``rows``."""
    return sorted({f"series-{r['algorithm']}-{r['layer']}" for r in rows
                   if r.get("accuracy") is not None})
