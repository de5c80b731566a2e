"""``secagg sweep``: run or resume a privacy-utility sweep (:mod:`secagg.sweep`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from secagg.cli.exits import EXIT_CODES
from secagg.cli.out_dir import check_out_dir


def add_sweep_parser(sub: Any) -> None:
    """Add ``secagg sweep`` and its options to the subcommands ``sub``."""
    sw = sub.add_parser(
        "sweep",
        help="run (or resume) a privacy-utility sweep from a TOML config",
        description="Run a grid of runs (algorithms x layers x epsilon x delta x clip x "
        "dropout x seeds) in parallel; each finished cell is appended to results.jsonl/.csv "
        "and skipped when the sweep is run again. Keys: see examples/sweep.toml.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sw.add_argument("config", type=Path, help="sweep config (TOML)")
    sw.add_argument("--out", type=Path, default=None, help="output directory (sweep.out)")
    sw.add_argument("--workers", type=int, default=None,
                    help="worker processes (default: sweep.workers, else the cores this "
                    "process may use; 0 runs the cells in this process)")
    sw.add_argument("--no-cache", action="store_true", help="recompute every cell")
    sw.add_argument("--no-keep-cache", action="store_true",
                    help="delete the statistics cache (the clients' raw statistics) when the "
                    "sweep ends (sweep.keep_cache = false)")
    sw.add_argument("--quiet", action="store_true", help="no progress bar")
    sw.add_argument("--force", action="store_true",
                    help="reuse an output folder that holds another sweep's configuration "
                    "or cells, keeping only this grid's finished cells (else refused)")
    sw.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                    help="run the cells as Ray tasks: on a local Ray instance, or on the "
                    "cluster at ADDRESS (HOST:PORT of `ray start --head`, or auto); needs "
                    "the ray extra; --workers is then ignored")


def _interrupt_on_sigterm() -> None:
    """Turn SIGTERM (``kill``, a scheduler's stop) into KeyboardInterrupt, so that a sweep
    stops its workers and exits 130 like Ctrl-C instead of leaving them running."""
    import signal

    def raise_interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, raise_interrupt)


def _sweep(args: argparse.Namespace) -> int:
    from secagg.sweep import sweep

    if args.out is not None:
        check_out_dir(args.out, "--out")  # before any cell runs
    _interrupt_on_sigterm()
    res = sweep(args.config, out=args.out, workers=args.workers,
                cache=False if args.no_cache else None, progress=False if args.quiet else None,
                keep_cache=False if args.no_keep_cache else None, ray=args.ray,
                force=args.force)
    print(f"{len(res.ran)} cell(s) run, {len(res.skipped)} already done; results in "
          f"{res.jsonl} and {res.csv}")
    for name, path in res.plots.items():
        print(f"plot: {path}" if name.endswith(".png") else f"      {path}")
    if res.report is not None:
        print(f"report: {res.report}")
    return 0
