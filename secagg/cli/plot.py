"""``secagg plot``: redraw a sweep's plots from its results (:mod:`secagg.plots`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from secagg.cli.exits import EXIT_CODES


def add_plot_parser(sub: Any) -> None:
    """Add ``secagg plot`` and its options to the subcommands ``sub``."""
    pl = sub.add_parser("plot", help="redraw the plots of a sweep",
                        description="Redraw privacy_utility.{png,svg} and cost_utility.{png,svg} "
                        "from a sweep's results.jsonl or results.csv (several sweeps: their "
                        "rows are drawn together, one panel per algorithm).",
                        epilog=EXIT_CODES,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    pl.add_argument("results", type=Path, nargs="+",
                    help="results.jsonl/.csv or the sweep's directory (repeatable)")
    pl.add_argument("--out", type=Path, default=None,
                    help="where to draw (default: beside the first results)")


def _plot(args: argparse.Namespace) -> int:
    from secagg.plots import load_results, plot_results

    first = args.results[0]
    out = args.out or (first if first.is_dir() else first.parent)
    rows = [r for path in args.results for r in load_results(path)]
    for path in plot_results(rows, out).values():
        print(path)
    return 0
