"""The ``secagg`` command's entry point: parse, dispatch to the subcommand, and turn
an error into one line on stderr and its exit status."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from secagg.cli.audit import _audit
from secagg.cli.check import _check
from secagg.cli.dp_audit import _dp_audit
from secagg.cli.exits import EXIT_ERROR, EXIT_USAGE
from secagg.cli.parser import _make_parser
from secagg.cli.plot import _plot
from secagg.cli.report import _report
from secagg.cli.run import _resolve_run_options, _run
from secagg.cli.sweep import _sweep
from secagg.errors import SecaggError, SecureSumAborted

#: Python spellings in error hints, and the command line's (a CLI user is told the flag).
_CLI_HINTS: dict[str, str] = {
    "Federation(max_records=...)": "--max-records N",
    "or declare a client-level Bound": "or --clip C (client-level DP-FedAvg: each update "
    "clipped; training algorithms)",
    "UploadSpec(max_records=...) or --max-records N": "--max-records N",
    "on_abort='skip'": "--on-abort skip",
    'on_abort="skip"': "--on-abort skip",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``secagg`` command; returns the exit status."""
    parser = _make_parser()
    args = parser.parse_args(argv)
    if args.command == "run":
        _resolve_run_options(parser, args, sys.argv[1:] if argv is None else argv)
    commands: dict[str, Callable[[argparse.Namespace], int]] = {"run": _run, "audit": _audit,
                                                                 "check": _check}
    commands.update(sweep=_sweep, plot=_plot, report=_report)
    commands["dp-audit"] = _dp_audit
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        return commands[args.command](args)
    except KeyboardInterrupt:
        print("secagg: interrupted", file=sys.stderr)
        return 130
    except (SecaggError, ValueError, OSError) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        for python, flag in _CLI_HINTS.items():
            msg = msg.replace(python, flag)
        if isinstance(exc, SecureSumAborted):
            msg += " (--on-abort skip skips such rounds and goes on)"
        print(f"secagg {args.command}: error: {msg}", file=sys.stderr)
        return EXIT_ERROR
