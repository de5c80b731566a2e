"""Output folders: ``--out`` refused before any work is done when it cannot be one, or
when it holds a previous run (unless ``--force``); ``secagg run``'s default folder name."""

from __future__ import annotations

import argparse
from pathlib import Path

from secagg.errors import ConfigurationError


def check_out_dir(out: Path, option: str) -> None:
    """Refuse an output folder that cannot be one before any work is done: a path that is
    a file, or under a file, or in a folder this user cannot write."""
    if out.exists() and not out.is_dir():
        raise ConfigurationError(f"{option} {out}: is a file, not a folder; give a folder "
                                 "(it is created when missing)")
    parent = out
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigurationError(f"{option} {out}: {parent} is a file, not a folder")
    import os

    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigurationError(f"{option} {out}: cannot write in {parent} (permission)")


def _out_dir(args: argparse.Namespace) -> Path:
    """The output directory; refuses one holding a previous run unless --force."""
    if args.out is not None:
        out = args.out
    else:
        layer = "+".join([args.layer, *args.group_layer])
        name = f"{args.algorithm.replace(':', '.')}-{layer}-{args.dataset}-seed{args.seed}"
        out = Path("runs") / name.replace("/", "_")
    check_out_dir(out, "--out")
    previous = [n for n in ("result.json", "costs.csv", "transcript.jsonl") if (out / n).exists()]
    if previous and not args.force:
        raise ConfigurationError(
            f"{out} already holds a run ({', '.join(previous)}); pass --force to overwrite "
            "it, or --out DIR for another folder")
    return out
