"""The ``secagg`` command's parser: the top-level options, and each subcommand's
parser added in the order ``--help`` lists them."""

from __future__ import annotations

import argparse

from secagg import __version__
from secagg.cli.argparsing import _Parser
from secagg.cli.audit import add_audit_parser
from secagg.cli.check import add_check_parser
from secagg.cli.dp_audit import _add_dp_audit_parser
from secagg.cli.exits import EXIT_CODES
from secagg.cli.plot import add_plot_parser
from secagg.cli.report import add_report_parser
from secagg.cli.run_options import add_run_parser
from secagg.cli.sweep import add_sweep_parser


def _make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="secagg", description="Privacy-preserving federated learning: run an "
                "algorithm under a privacy layer, and audit what each party saw.",
                epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"secagg {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    add_run_parser(sub)
    add_audit_parser(sub)
    add_check_parser(sub)
    add_sweep_parser(sub)
    add_plot_parser(sub)
    add_report_parser(sub)
    _add_dp_audit_parser(sub)
    return p
