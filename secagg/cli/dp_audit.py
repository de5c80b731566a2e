"""``secagg dp-audit``: the parser and a thin handler of the empirical DP audit; the
audits live in :mod:`threat_models.dp_audit`, imported lazily (secagg never imports
threat_models at module level)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from secagg.cli.argparsing import _bounded
from secagg.errors import SecaggError
from secagg.layers.registry import layer_names

#: ``--layer``'s choices: the layers the registry marks as audited (its ``audit``), then the
#: audit's own mechanisms outside any layer, and ``all``
DP_AUDIT_LAYERS = (*layer_names(audited=True), "dp-ftrl", "dp-sgd", "all")
EXIT_DP_VIOLATED = 6
DP_AUDIT_EXIT_CODES = """exit status:
  0    every lower bound is at most the epsilon its mechanism claims
  1    error: bad input or a refused configuration (the reason is printed on stderr)
  2    usage error (unknown option, bad value)
  6    some lower bound is above its claim: that mechanism is not (epsilon, delta)-DP
       (at the stated confidence); the offending rows are named on stderr
  130  interrupted"""


def _add_dp_audit_parser(sub: Any) -> None:
    d = sub.add_parser(
        "dp-audit",
        help="measure a lower bound on each DP mechanism's epsilon",
        description="Empirical privacy audit (threat_models.dp_audit): run a DP mechanism\n"
        "many times without and with a worst-case canary (a record or client at its\n"
        "bound), and turn how well the two worlds are told apart into a lower bound on\n"
        "epsilon: --mode tight fits Gaussian DP to both worlds' whole distributions,\n"
        "--mode threshold uses the best threshold test (Clopper-Pearson, assumption-free).\n"
        "A lower bound above the claimed epsilon proves the mechanism broken. The DP\n"
        "layers are audited on a bare bounded sum through their\n"
        "own noise paths; dp-sgd trains a linear model with Opacus and a gradient canary\n"
        "(record level; --adjacency, --mechanism and --clients apply to the sums).\n"
        "--release dp-fedavg audits the DP layers on one round of client-level DP-FedAvg\n"
        "instead: a canary client whose update is at the clip bound, background clients,\n"
        "the real clip, upload check, noise and server step (--clients is the cohort;\n"
        "--one-run adds the one-round audit with --canaries canary clients).",
        epilog=DP_AUDIT_EXIT_CODES + "\n\nexample: secagg dp-audit --layer central-dp "
        "--epsilon 2 --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d.add_argument("--layer", action="append", choices=DP_AUDIT_LAYERS, default=None,
                   help="mechanism to audit (repeatable; default: all)")
    d.add_argument("--epsilon", type=_bounded(float, 0.0, what="a positive number"),
                   nargs="+", default=[1.0, 2.0, 4.0], metavar="EPS",
                   help="claimed epsilon(s) to audit (default: 1 2 4)")
    d.add_argument("--delta", type=_bounded(float, 0.0, 1.0, "in (0, 1)"), default=1e-5,
                   help="claimed delta (%(default)g)")
    d.add_argument("--release", choices=("sum", "dp-fedavg", "dp-fedavg-adaptive"),
                   default="sum",
                   help="what the DP layers are audited on: a bare bounded sum, one round "
                   "of client-level DP-FedAvg with a canary update, or one with adaptive "
                   "clipping (the update and the noised clip count) (%(default)s)")
    d.add_argument("--adjacency", choices=("record", "client"), default="record",
                   help="what the canary is: one record or one client (%(default)s)")
    d.add_argument("--mechanism", choices=("discrete_gaussian", "skellam"),
                   default="discrete_gaussian",
                   help="distributed-dp's integer noise (%(default)s)")
    d.add_argument("--clients", type=_bounded(int, 0, what="a positive integer"), default=None,
                   help="cohort size (default: 10, so distributed-dp's secure sum accepts "
                   "fewer survivors than clients)")
    d.add_argument("--survivors", choices=("fewest", "all", "both"), default="both",
                   help="distributed-dp: audit the sum with the fewest survivors the secure "
                   "sum accepts (the others drop), with all of them, or both (%(default)s)")
    d.add_argument("--mode", choices=("tight", "threshold"), default="tight",
                   help="tight: also fit Gaussian DP to both worlds' whole distributions "
                   "(assumes the Gaussian trade-off shape, which the DP layers' noise has); "
                   "threshold: the assumption-free threshold tests only (%(default)s)")
    d.add_argument("--trials", type=_bounded(int, 7, what="an integer >= 8"), default=None,
                   help="releases per world, without and with the canary (default: "
                   "1000000 for the sums (250000 for distributed-dp with all survivors), "
                   "250000 trees for dp-ftrl, 100000 for dp-fedavg, 1000 trainings for "
                   "dp-sgd)")
    d.add_argument("--seed", type=int, default=0,
                   help="seed of the auditor and of the layers' noise streams (%(default)s)")
    d.add_argument("--confidence", type=_bounded(float, 0.0, 1.0, "in (0, 1)"), default=0.95,
                   help="confidence of the whole run's lower bounds together, split between "
                   "its audits (Bonferroni; each row shows its share) (%(default)g)")
    d.add_argument("--one-run", action="store_true",
                   help="dp-sgd and --release dp-fedavg: also audit in one run with many "
                   "canaries (Steinke et al. 2023)")
    d.add_argument("--canaries", type=_bounded(int, 1, what="an integer >= 2"), default=1000,
                   help="--one-run: canaries in the run (%(default)s)")
    d.add_argument("--inject", action="append", default=None,
                   choices=("share-count", "stale-bound", "dropped-field-share",
                            "delta-mixup", "all"),
                   help="audit a layer with an injected 20-30%% miscalibration instead of the "
                   "correct layers (repeatable; threat_models.dp_audit_bugs): the audit must "
                   "exit 6")
    d.add_argument("--json", action="store_true",
                   help="print JSON rows (mechanism, epsilon_claimed, epsilon_lower, "
                   "confidence, trials, canary, ...) instead of the table")
    d.add_argument("--plot", type=Path, default=None, metavar="PATH",
                   help="also draw the empirical trade-off curves against the region each "
                   "claim forbids, to PATH.png and PATH.svg")
    d.add_argument("--quiet", action="store_true", help="no progress bar")


def _dp_audit(args: argparse.Namespace) -> int:
    try:
        from threat_models.dp_audit_run import EXIT_VIOLATED, main_cli
    except ImportError as exc:
        raise SecaggError(f"secagg dp-audit needs the threat_models package: {exc}") from None
    assert EXIT_VIOLATED == EXIT_DP_VIOLATED
    if args.layer is None:
        args.layer = ["all"]
    return main_cli(args)
