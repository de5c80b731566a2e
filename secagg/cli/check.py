"""``secagg check``: verify that an algorithm's additive fields are sums over records
(threat_models.additivity)."""

from __future__ import annotations

import argparse
from typing import Any

from secagg.algorithm_registry import load_algorithm
from secagg.cli.exits import EXIT_CODES
from secagg.errors import SecaggError


def add_check_parser(sub: Any) -> None:
    """Add ``secagg check`` and its options to the subcommands ``sub``."""
    c = sub.add_parser(
        "check",
        help="check that an algorithm's additive fields are sums over records",
        description="Split clients' records in two and verify f(A u B) = f(A) + f(B) for "
        "every field declared additive (threat_models.additivity); exits 1 when one is not.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    c.add_argument("algorithm", help="algorithm name or module:Class")
    c.add_argument("--dataset", default="digits", choices=("digits", "fashion-mnist", "mnist"))
    c.add_argument("--data-dir", default=None, help="directory of the IDX .gz files")
    c.add_argument("--clients", type=int, default=5, help="clients to split into (%(default)s)")
    c.add_argument("--seed", type=int, default=0, help="random seed (%(default)s)")


def _check(args: argparse.Namespace) -> int:
    from secagg.data import dirichlet_split, load_dataset

    try:
        from threat_models.additivity import check_additivity, format_checks
    except ImportError as exc:
        raise SecaggError(f"secagg check needs the threat_models package: {exc}") from None
    algo = load_algorithm(args.algorithm)()
    part = dirichlet_split(load_dataset(args.dataset, args.data_dir), args.clients, 0.5,
                           seed=args.seed)
    checks = check_additivity(algo, part, seed=args.seed)
    print(format_checks(checks))
    bad = [c for c in checks if not c.ok]
    if bad:
        print(f"\n{len(bad)} field(s) declared additive are not sums over records; upload "
              "sums instead (algorithms.moments) or declare additive=False")
    return 1 if bad else 0
