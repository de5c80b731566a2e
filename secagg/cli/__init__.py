"""The ``secagg`` command line.

``secagg run``   run an algorithm under a privacy layer and print the closing table.
``secagg audit`` read a transcript and print what the server saw, per phase and field.
``secagg check`` verify that an algorithm's additive fields are sums over records.
``secagg sweep`` run or resume a privacy-utility sweep; ``secagg plot`` redraws its plots.
``secagg report`` write a run's or a sweep's report.html (one self-contained page).
``secagg dp-audit`` measure a lower bound on each DP mechanism's epsilon (threat_models).

Algorithms are found through the ``secagg.algorithms`` entry-point group (the ``algorithms``
package registers its own; a third-party package can add more), or given as
``module:Class`` (:mod:`secagg.algorithm_registry`); layers by their registered names
(:mod:`secagg.layers.registry`).

This package is the one place that composes secagg with ``algorithms`` and
``threat_models``. One module per subcommand (:mod:`~secagg.cli.run`,
:mod:`~secagg.cli.audit`, :mod:`~secagg.cli.check`, :mod:`~secagg.cli.sweep`,
:mod:`~secagg.cli.plot`, :mod:`~secagg.cli.report`, :mod:`~secagg.cli.dp_audit`), plus
``secagg run``'s options (:mod:`~secagg.cli.run_options`), their checks
(:mod:`~secagg.cli.run_checks`), the algorithm and the layer they build
(:mod:`~secagg.cli.algorithm_options`, :mod:`~secagg.cli.layers`), the output folder
(:mod:`~secagg.cli.out_dir`), the library warnings of a run
(:mod:`~secagg.cli.library_warnings`), the parser (:mod:`~secagg.cli.parser`, with the
shared argparse conventions of :mod:`~secagg.cli.argparsing`), the exit statuses
(:mod:`~secagg.cli.exits`) and the entry point (:mod:`~secagg.cli.app`). The names below
are re-exported so that ``from secagg.cli import main`` (and the other former imports) keep
working.
"""

from secagg.algorithm_registry import available_algorithms, load_algorithm
from secagg.cli.algorithm_options import _algorithm_kwargs
from secagg.cli.app import main
from secagg.cli.dp_audit import DP_AUDIT_EXIT_CODES, DP_AUDIT_LAYERS, EXIT_DP_VIOLATED
from secagg.cli.exits import (
    EXIT_CODES,
    EXIT_ERROR,
    EXIT_INCOMPLETE,
    EXIT_LEAK,
    EXIT_NO_MODEL,
    EXIT_OK,
    EXIT_USAGE,
)
from secagg.cli.layers import DP_LAYERS, LAYERS, build_layer
from secagg.cli.library_warnings import _summarised_warnings
from secagg.cli.out_dir import check_out_dir
from secagg.cli.parser import _make_parser
from secagg.cli.run import _run
from secagg.cli.run_checks import _check_run_args, _client_ledger_kwargs
from secagg.cli.run_options import RUN_EXAMPLES

__all__ = ["DP_LAYERS", "LAYERS", "available_algorithms", "build_layer", "load_algorithm",
           "main"]

#: Former names of the one-module CLI, kept importable (tests and benchmarks use them).
_REEXPORTED = (DP_AUDIT_EXIT_CODES, DP_AUDIT_LAYERS, EXIT_CODES, EXIT_DP_VIOLATED, EXIT_ERROR,
               EXIT_INCOMPLETE, EXIT_LEAK, EXIT_NO_MODEL, EXIT_OK, EXIT_USAGE, RUN_EXAMPLES,
               _algorithm_kwargs, _check_run_args, _client_ledger_kwargs, _make_parser, _run,
               _summarised_warnings, check_out_dir)
