"""``secagg report``: write a run's or a sweep's report.html (:mod:`secagg.report`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_report_parser(sub: Any) -> None:
    """Add ``secagg report`` and its options to the subcommands ``sub``."""
    rp = sub.add_parser(
        "report", help="write report.html: one self-contained page for a run or a sweep",
        description="Write DIR/report.html, one self-contained HTML page (inline SVG "
        "figures, no script, no network access): for a run folder (result.json) what ran, "
        "accuracy, privacy, what each party saw (the audit), costs; for a sweep folder "
        "(results.jsonl/.csv) its figures and every cell. secagg run and secagg sweep write "
        "it when they finish.")
    rp.add_argument("dir", type=Path, help="a run's or a sweep's output folder")
    rp.add_argument("--out", type=Path, default=None, help="where to write (DIR/report.html)")
    rp.add_argument("--identities", type=Path, default=None, metavar="FILE",
                    help="the clients' public keys to check the transcript against (default: "
                    "the identities.json the run wrote, which proves less: the report says so)")
    rp.add_argument("--threat", default=None, metavar="COALITION",
                    help="also judge every field against a coalition (as secagg audit --threat)")


def _report(args: argparse.Namespace) -> int:
    from secagg.report import write_report

    print(write_report(args.dir, threat=args.threat, identities=args.identities,
                       out=args.out))
    return 0
