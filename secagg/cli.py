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
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from secagg import __version__
from secagg.algorithm_registry import algorithm_arguments, available_algorithms, load_algorithm
from secagg.costs import PROFILES
from secagg.errors import ConfigurationError, SecaggError, SecureSumAborted
from secagg.layers.registry import LayerOptions, get_layer, layer_names, make_layer

__all__ = ["DP_LAYERS", "LAYERS", "available_algorithms", "build_layer", "load_algorithm",
           "main"]

#: The layer names ``--layer`` accepts (the registry's, in its order).
LAYERS = layer_names()
#: Those that add DP noise.
DP_LAYERS = layer_names(dp=True)

#: Exit statuses of the ``secagg`` command.
EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NO_MODEL, EXIT_INCOMPLETE, EXIT_LEAK = 0, 1, 2, 3, 4, 5
EXIT_CODES = """exit status:
  0    success
  1    error: bad input or a refused configuration (the reason is printed on stderr)
  2    usage error (unknown option, bad value)
  3    run: finished without a usable model (every phase aborted, or the privacy budget
       guard stopped it early); its outputs are still written, the reason is on stderr
  4    audit: the transcript is incomplete (truncated or altered), or, with --identities,
       a client's signed statement is missing, forged or contradicted by a record, or,
       with --node-ledger, a node's ledger file does not reconcile with the transcript
  5    audit --threat: the named coalition can read some field beyond what the layer promises
  6    dp-audit: some lower bound is above its claim (that mechanism is not DP)
  130  interrupted
Every subcommand uses this one table: a bad value of an option, on the command line or
in a config file (run --config, -c), is a usage error (2) wherever it is found."""

RUN_EXAMPLES = """examples:
  secagg run                                         FedLog on digits, 10 clients, plaintext
  secagg run --algorithm fedavg --model linear --dataset synthetic:0.5,0.5 --clients 1000
  secagg run --layer distributed-dp --epsilon 2 --out runs/ddp
  secagg run --dataset my_data.npz --model mypkg.models:factory --algorithm fedavg
  secagg run --config run.toml -c rounds=3 -c layer=central-dp -c epsilon=4
  secagg run --layer secure-sum --out runs/ss
  secagg run --config runs/ss/config.toml --out runs/ss2   the same model, bit for bit
  secagg run --evaluate-only runs/ss                  score the saved model again
  python -c "import secagg; print(secagg.load_model('runs/ss'))"
A config file repeats every choice of a run; DP noise is drawn afresh from the OS's
cryptographic generator, so a DP run's repeat differs by its noise.
"""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_layer(args: argparse.Namespace) -> Any:
    """The layer named by ``--layer`` with its options, routed per field group when
    ``--group-layer GROUP=LAYER`` is given (other groups take ``--layer``)."""
    base = _one_layer(args, args.layer)
    if not args.group_layer:
        return base
    from secagg.layers.per_group import PerGroup

    routes = {}
    for item in args.group_layer:
        group, sep, name = item.partition("=")
        if not sep or not group or name not in LAYERS:
            raise ConfigurationError(
                f"--group-layer expects GROUP=LAYER with LAYER one of {', '.join(LAYERS)}, "
                f"got {item!r}"
            )
        routes[group] = _one_layer(args, name)
    return PerGroup(routes, default=base)


def _one_layer(args: argparse.Namespace, name: str) -> Any:
    """The registered layer ``name`` with the options given on the command line."""
    if get_layer(name).dp and args.epsilon is None:
        raise ConfigurationError(f"--layer {name} needs --epsilon (and optionally --delta)")
    dp: dict[str, Any] = {"adjacency": args.adjacency}
    if name == "central-dp" and args.dp_ftrl:  # plan for the rounds a client can take
        # part in, at most: every round at fraction 1, else twice the expected number
        k = args.rounds if args.fraction >= 1 else min(
            args.rounds, math.ceil(2 * args.fraction * args.rounds))
        dp.update(tree=True, tree_participations=k)
    return make_layer(name, LayerOptions(threshold=args.threshold, graph=args.graph,
                                         he_scheme=args.he_scheme, epsilon=args.epsilon,
                                         delta=args.delta, rounds=args.rounds,
                                         dp=dp if get_layer(name).dp else {},
                                         dropout=args.dropout))


def _make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="secagg", description="Privacy-preserving federated learning: run an "
                "algorithm under a privacy layer, and audit what each party saw.",
                epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"secagg {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    r = sub.add_parser(
        "run",
        help="run an algorithm under a privacy layer",
        description="Run a federated algorithm under a privacy layer, write the "
        "result, cost ledger, transcript, trained model (model.pt, model.json: "
        "secagg.load_model) and resolved config (config.toml), and print a summary table.",
        epilog=RUN_EXAMPLES + "\n\n" + EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    g_data = r.add_argument_group("data", "where the clients and their records come from")
    g_alg = r.add_argument_group("algorithm", "what is trained, and how")
    g_layer = r.add_argument_group("layer", "what the server sees of each upload")
    g_priv = r.add_argument_group("privacy", "differential privacy (DP layers, DP-SGD, the "
                                  "clients' own ledgers)")
    g_out = r.add_argument_group("output", "where the run goes, what is printed; config files")
    g_data.add_argument(
        "--dataset",
        default="digits",
        metavar="DATA",
        help="digits, fashion-mnist, mnist, synthetic[:ALPHA,BETA] (the FedProx paper's "
        "federated population; --split does not apply), PATH.npz (x_train, y_train, x_test, "
        "y_test) or module:loader (returns a secagg.data.Dataset or Partition) (%(default)s)",
    )
    g_data.add_argument(
        "--data-dir",
        default=None,
        help="directory of the standard IDX .gz files (fashion-mnist, mnist)",
    )
    g_data.add_argument("--clients", type=int, default=10, help="number of clients (%(default)s)")
    g_data.add_argument(
        "--alpha",
        type=float,
        default=0.5,
        help="Dirichlet label-skew concentration; 0 means IID (%(default)s)",
    )
    g_data.add_argument(
        "--split",
        default="dirichlet",
        choices=("dirichlet", "iid", "shards"),
        help="how the training set is split over the clients: Dirichlet(--alpha) label "
        "skew, IID, or McMahan et al.'s label shards, --shards-per-client each (%(default)s)",
    )
    g_data.add_argument(
        "--shards-per-client",
        type=int,
        default=2,
        help="label shards per client with --split shards (%(default)s)",
    )
    g_alg.add_argument(
        "--algorithm",
        default="fedlog",
        help="algorithm name (%(default)s; see --list) or module:Class",
    )
    g_alg.add_argument(
        "--model", default=None, metavar="MODEL",
        help="the model trained: mlp, cnn, linear, or module:factory (a function "
        "(input_shape, n_classes) -> torch.nn.Module) (default: the algorithm's: an MLP "
        "for flat inputs, a CNN for 28x28 images); FedAvg and the algorithms built on it")
    g_alg.add_argument("--rounds", type=int, default=10, help="rounds (%(default)s)")
    g_alg.add_argument(
        "--fraction",
        type=float,
        default=1.0,
        help="fraction of clients sampled per round (%(default)s)",
    )
    g_alg.add_argument("--seed", type=int, default=0, help="random seed (%(default)s)")
    g_alg.add_argument(
        "--lr", type=float, default=None, help="local learning rate (default: the algorithm's)"
    )
    g_alg.add_argument(
        "--local-epochs",
        type=int,
        default=None,
        help="local epochs per round (default: the algorithm's)",
    )
    g_alg.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an algorithm constructor argument, e.g. release_rounds=1 for fedlog (VALUE is "
        "read as JSON -- 1, 0.5, true, null, [8, 8] -- else as a string; repeatable; names "
        "are checked against the algorithm's signature)",
    )
    g_alg.add_argument(
        "--server-opt", choices=("sgd", "momentum", "adam"), default=None,
        help="server optimizer on the mean update (default: the algorithm's, sgd)")
    g_alg.add_argument(
        "--server-lr", type=float, default=None,
        help="server learning rate (default: the algorithm's, 1.0)")
    g_alg.add_argument(
        "--list", action="store_true", help="list the available algorithms (one line each) and exit"
    )

    g_layer.add_argument(
        "--layer", default="plaintext", choices=LAYERS, help="privacy layer (%(default)s)"
    )
    g_layer.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="injected probability that a client drops out during a round, spread over the "
        "layer's protocol stages; a secure sum on the SecAgg+ graph sizes its degree for it "
        "(%(default)s)",
    )
    g_layer.add_argument(
        "--on-abort",
        choices=["raise", "skip"],
        default="raise",
        help="when too few clients survive a secure sum: stop with an error, or skip that "
        "phase for the round and go on (%(default)s)",
    )
    g_layer.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes the simulated clients' secure-sum work (keys, signatures, shares, "
        "masks) is spread over; the result does not depend on it (%(default)s)",
    )
    g_layer.add_argument(
        "--group-layer",
        action="append",
        default=[],
        metavar="GROUP=LAYER",
        help="route one field group through another layer, e.g. embeddings=plaintext for "
        "turbosvm (repeatable)",
    )
    g_layer.add_argument(
        "--threshold",
        type=float,
        default=0.7,
        help="secure-sum threshold: a fraction of the cohort in (0, 1), or a whole count "
        "of clients >= 1 (%(default)s)",
    )
    g_layer.add_argument(
        "--graph",
        default="complete",
        choices=("complete", "harary", "auto"),
        help="secure-sum neighbour graph (%(default)s)",
    )
    g_layer.add_argument(
        "--he-scheme",
        default="bfv",
        choices=("bfv", "ckks"),
        help="homomorphic scheme (%(default)s)",
    )
    g_priv.add_argument(
        "--dpsgd-noise",
        type=float,
        default=None,
        metavar="Z",
        help="train locally with record-level DP-SGD (Opacus) at noise multiplier Z (needs "
        "a DP layer, whose noise is calibrated to what DP-SGD leaves of --epsilon)",
    )
    g_priv.add_argument(
        "--dpsgd-epsilon",
        type=_bounded(float, 0.0, None, "a positive number"),
        default=None,
        metavar="EPS",
        help="train locally with record-level DP-SGD whose noise is calibrated to spend EPS "
        "of --epsilon over the run; the DP layer gets what is left (needs a DP layer)",
    )
    g_priv.add_argument(
        "--dpsgd-clip",
        type=float,
        default=1.0,
        help="DP-SGD per-sample gradient clipping norm (%(default)s)",
    )
    g_priv.add_argument(
        "--epsilon", type=_bounded(float, 0.0, None, "a positive number"), default=None,
        help="DP layers only: total epsilon of the run"
    )
    g_priv.add_argument(
        "--delta", type=_bounded(float, 0.0, 1.0, "in (0, 1)"), default=None,
        help="DP layers only: delta (default 1e-05)"
    )
    g_priv.add_argument(
        "--adjacency", choices=("record", "client"), default="record",
        help="DP layers only: what a neighbouring data set differs in, one record or one "
        "client's whole data (%(default)s)")
    g_priv.add_argument(
        "--max-records", type=int, default=None, metavar="N",
        help="a public bound on records per client (never the largest client's size); "
        "client-level DP on a per-record bound (e.g. statistics phases) needs it")
    g_priv.add_argument(
        "--clip", default=None, metavar="C|adaptive[:Q]",
        help="client-level DP-FedAvg: each client uploads its model update clipped to L2 "
        "<= C, or with a bound that follows quantile Q of the update norms (default 0.5; "
        "Andrew et al. 2021); training algorithms only")
    g_priv.add_argument(
        "--dp-ftrl", action="store_true",
        help="central-dp only: DP-FTRL, tree-aggregated noise across rounds (Kairouz et "
        "al. 2021), accounted from the real participation, no amplification by sampling; "
        "noise planned for 2 x fraction x rounds participations per client (every round "
        "at fraction 1); the budget guard stops a run whose clients return more often")
    g_priv.add_argument(
        "--client-budget", action="append", default=None, metavar="[OBSERVER=]EPS",
        help="each client's own epsilon budget (repeatable): EPS against every observer, "
        "or server=EPS / release=EPS; before a round touches its data a client projects "
        "its epsilon under the round's terms and refuses when over budget")
    g_priv.add_argument(
        "--client-ledger", type=Path, default=None, metavar="DIR",
        help="directory of the clients' own privacy ledgers (client-<id>.jsonl), read "
        "before the run and extended every round, so spends and refusals carry over runs "
        "(default: in the run's output only, client_ledgers.jsonl)")
    g_priv.add_argument(
        "--sampling", choices=("fixed", "poisson"), default="fixed",
        help="cohort sampling: a fixed-size cohort, or each client drawn independently "
        "with probability --fraction (only then is a client's epsilon against observers "
        "of the releases amplified by sampling) (%(default)s)")
    g_priv.add_argument(
        "--colluders", type=int, default=0,
        help="distributed-dp: clients each client assumes reveal their noise shares to "
        "the server; its epsilon against the server uses the others' (%(default)s)")
    g_priv.add_argument(
        "--client-min-noise", type=float, default=None, metavar="Z",
        help="each client refuses rounds whose noise multiplier is below Z")
    g_priv.add_argument(
        "--client-max-clip", type=float, default=None, metavar="C",
        help="each client refuses rounds whose clip bound is above C")
    g_priv.add_argument(
        "--dry-run", action="store_true",
        help="print the privacy plan (noise per release, the largest sum the cohort could "
        "upload, their ratio, epsilon after each round) and exit: nothing is trained or "
        "written")
    g_out.add_argument(
        "--device-profile",
        default="phone-wifi",
        choices=sorted(PROFILES),
        help="hardware profile for latency/energy estimates (%(default)s)",
    )
    g_out.add_argument(
        "--config", type=Path, default=None, metavar="FILE",
        help="read the options from a TOML file (keys as the long options: clients = 100, "
        "layer = \"central-dp\", optionally under [data], [algorithm], [layer], [privacy], "
        "[output]); every run writes its resolved config.toml, which reproduces it")
    g_out.add_argument(
        "-c", "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config key (repeatable; VALUE in TOML syntax, a bare word is a "
        "string), e.g. -c rounds=3 -c layer=central-dp; options on the command line win")
    g_out.add_argument(
        "--evaluate-only", type=Path, default=None, metavar="RUN_DIR",
        help="train nothing: score the model saved in RUN_DIR on --dataset (default: the "
        "run's own data) and print its accuracy")
    g_out.add_argument(
        "--out",
        default=None,
        type=Path,
        help="output directory (default: runs/ALGORITHM-LAYER[+GROUP=LAYER...]-seedSEED); "
        "a directory holding a previous run is refused unless --force",
    )
    g_out.add_argument(
        "--force", action="store_true", help="overwrite the outputs of a previous run in --out"
    )
    g_out.add_argument(
        "--include-values",
        action="store_true",
        help="store observed values in the transcript (sensitive)",
    )
    g_out.add_argument("--quiet", action="store_true", help="no progress bar")
    a = sub.add_parser(
        "audit",
        help="print what each party saw, from a transcript",
        description="Read a transcript (JSON Lines) and print whether it is complete, "
        "the traffic per direction (checked against costs.csv beside it), and per phase and "
        "field: which clients sent it, in what form each party saw it, bytes, the DP "
        "guarantee and notes.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    a.add_argument("file", type=Path, help="transcript.jsonl (or a run directory holding one)")
    a.add_argument("--json", action="store_true", help="machine-readable output")
    a.add_argument(
        "--identities", type=Path, default=None, metavar="FILE",
        help="the clients' public keys, from outside the run folder (the key directory a "
        "simulated run writes, <run>.keys/identities.json, or your PKI's; a file inside the "
        "run folder is refused): verify every client's signed statement, check the "
        "server's records against them both ways and recompute the DP figures from the "
        "signed terms (exit 4 on a missing, forged or contradicted one); without it the "
        "transcript is unattested: only accidental damage is detected",
    )
    a.add_argument(
        "--node-ledger", action="append", default=[], metavar="CLIENT=PATH",
        help="a Flower node's own ledger file (node config ledger-path; repeatable): verify "
        "its chain, that its head is the one the server recorded, and that its committed "
        "releases of this run are the server's (exit 4 when not)")
    a.add_argument(
        "--threat",
        default=None,
        metavar="COALITION",
        help="also judge every field against a coalition, e.g. server, server+3, "
        "server+decryptor, active-server (threat_models); exits 5 when the coalition can "
        "read a field beyond what the layer promises",
    )

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
                    help="worker processes (default: sweep.workers, else all cores)")
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
    _add_dp_audit_parser(sub)
    return p


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


def _describe(ep: Any) -> str:
    """The first line of an algorithm's docstring (or why it cannot be loaded)."""
    try:
        cls = ep.load()
    except (ImportError, AttributeError) as exc:
        return f"(cannot be loaded: {exc})"
    doc = (cls.__doc__ or "").strip()
    return doc.splitlines()[0].strip() if doc else "(no description)"


#: The layers an option applies to (its reason when refused).
_LAYER_OPTIONS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "threshold": ("--threshold", ("secure-sum", "distributed-dp"),
                  "it is the secure sum's threshold"),
    "graph": ("--graph", ("secure-sum", "distributed-dp"),
              "it is the secure sum's neighbour graph"),
    "he_scheme": ("--he-scheme", ("homomorphic",), "it picks the homomorphic scheme"),
    "colluders": ("--colluders", ("distributed-dp",),
                  "it counts clients revealing their noise shares, which only distributed-dp "
                  "splits among the clients"),
}


def _defaults() -> dict[str, Any]:
    """``secagg run``'s option defaults."""
    return {a.dest: a.default for a in _subparser(_make_parser(), "run")._actions}


def _changed(args: argparse.Namespace, *keys: str) -> set[str]:
    """Which of ``keys`` hold a value other than the option's default."""
    defaults = _defaults()
    return {k for k in keys if getattr(args, k) != defaults.get(k)}


def _check_applies(args: argparse.Namespace) -> None:
    """Refuse an option that does not apply to the chosen layers, with the reason."""
    names = {args.layer, *(g.partition("=")[2] for g in args.group_layer)}
    for key in sorted(_changed(args, *_LAYER_OPTIONS)):
        flag, layers, why = _LAYER_OPTIONS[key]
        if not names & set(layers):
            raise ConfigurationError(
                f"{flag} does not apply to --layer {', '.join(sorted(names))}: {why} "
                f"({' or '.join(layers)}); drop it or choose such a layer")


def _check_run_args(args: argparse.Namespace) -> None:
    """Validate and normalise the options before anything is built (raises SecaggError)."""
    if args.clients < 1:
        raise ConfigurationError("--clients must be >= 1")
    if args.alpha < 0:
        raise ConfigurationError("--alpha must be >= 0 (0 means IID)")
    if args.shards_per_client < 1:
        raise ConfigurationError("--shards-per-client must be >= 1")
    if args.rounds < 1:
        raise ConfigurationError("--rounds must be >= 1")
    if args.colluders < 0:
        raise ConfigurationError("--colluders must be >= 0")
    if args.workers < 1:
        raise ConfigurationError("--workers must be >= 1")
    _client_ledger_kwargs(args)  # parses --client-budget and the client policy
    from secagg.data_sources import describe_source

    source = describe_source(args.dataset)
    if source == "synthetic" and "split" in _changed(args, "split", "alpha",
                                                     "shards_per_client"):
        raise ConfigurationError(
            f"--split does not apply to --dataset {args.dataset}: Synthetic(alpha, beta) is "
            "federated by construction (each client its own distribution)")
    _check_applies(args)
    t = args.threshold
    if t >= 1:
        if not float(t).is_integer():
            raise ConfigurationError(
                f"--threshold {t:g}: give a fraction in (0, 1) or a whole count of clients")
        args.threshold = int(t)
    elif t <= 0:
        raise ConfigurationError(f"--threshold {t:g}: must be a fraction in (0, 1) or a count")
    names = [args.layer] + [g.partition("=")[2] for g in args.group_layer]
    if not any(n in DP_LAYERS for n in names):
        given = [o for o, v in (("--epsilon", args.epsilon), ("--delta", args.delta))
                 if v is not None]
        if given:
            raise ConfigurationError(
                f"{' and '.join(given)} only apply to a DP layer ({', '.join(DP_LAYERS)}); "
                f"--layer {args.layer} adds no DP noise, so they would be ignored")
        if args.adjacency != "record":
            raise ConfigurationError(
                f"--adjacency only applies to a DP layer ({', '.join(DP_LAYERS)})")
    if args.dpsgd_noise is not None and args.dpsgd_epsilon is not None:
        raise ConfigurationError(
            "give --dpsgd-noise or --dpsgd-epsilon, not both (the epsilon sets the noise)")
    if args.dpsgd_noise is not None or args.dpsgd_epsilon is not None:
        flag = "--dpsgd-noise" if args.dpsgd_noise is not None else "--dpsgd-epsilon"
        if args.group_layer or args.layer not in DP_LAYERS:
            raise ConfigurationError(
                f"{flag}: DP-SGD noises only the model update; the upload's other fields "
                f"(e.g. FedAvg's record count n) would leave --layer {args.layer} without "
                "noise and the run could not end private. Use one DP layer, e.g. --layer "
                "central-dp --epsilon 8 --dpsgd-epsilon 6 (DP-SGD and the layer share the "
                "budget)")
        if args.adjacency == "client":
            raise ConfigurationError(
                f"{flag}: DP-SGD's guarantee is record-level (one record per step), so it "
                "cannot take a share of a client-level --epsilon; drop --adjacency client, "
                "or drop DP-SGD and use --clip C (client-level DP-FedAvg)")
        if args.dpsgd_epsilon is not None and not args.dpsgd_epsilon < args.epsilon:
            raise ConfigurationError(
                f"--dpsgd-epsilon {args.dpsgd_epsilon:g} must be below --epsilon "
                f"{args.epsilon:g}: the layer's releases get what DP-SGD leaves of it")
    if args.dp_ftrl and args.layer != "central-dp":
        raise ConfigurationError(
            "--dp-ftrl adds tree-aggregated noise at the aggregator: it needs --layer "
            "central-dp (the server's noise, not the clients')")
    if args.max_records is not None and args.max_records < 1:
        raise ConfigurationError("--max-records must be >= 1 (a public bound)")
    if args.server_lr is not None and not args.server_lr > 0:
        raise ConfigurationError("--server-lr must be > 0")
    if args.clip is not None:
        from secagg.privacy.clipping import parse_clip

        parse_clip(args.clip)  # refuses a bad value with the accepted forms
    if args.delta is None:
        args.delta = 1e-5
    if args.lr is not None and not args.lr > 0:
        raise ConfigurationError("--lr must be > 0")
    if args.local_epochs is not None and args.local_epochs < 1:
        raise ConfigurationError("--local-epochs must be >= 1")


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


def _algorithm_kwargs(args: argparse.Namespace, algo_cls: type) -> dict[str, Any]:
    """Constructor options from --lr, --local-epochs and --dpsgd-noise (refused, with the
    reason, when the algorithm has no such option)."""
    import inspect

    params = inspect.signature(algo_cls).parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params.values())
    kwargs: dict[str, Any] = {}
    for opt, key, value in (("--lr", "lr", args.lr),
                            ("--local-epochs", "local_epochs", args.local_epochs),
                            ("--clip", "clip", args.clip),
                            ("--server-opt", "server_opt", args.server_opt),
                            ("--server-lr", "server_lr", args.server_lr),
                            ("--model", "model", args.model)):
        if value is None:
            continue
        if key == "server_lr" and not getattr(algo_cls, "server_lr_is_optimizer", True):
            raise ConfigurationError(
                f"algorithm {args.algorithm!r} uses server_lr for another step (see its "
                "docstring); --server-lr would not set its server optimizer's rate")
        if key not in params and not (var_kw and _inherits(algo_cls, key)):
            why = ("it builds its own model" if key == "model"
                   else "it does no local training with that setting")
            raise ConfigurationError(f"algorithm {args.algorithm!r} has no {opt} option "
                                     f"({why})")
        kwargs[key] = value
    for item in args.arg:
        name, eq, raw = item.partition("=")
        name = name.strip().replace("-", "_")
        if not eq or not name.isidentifier():
            raise ConfigurationError(f"--arg {item!r}: expected NAME=VALUE, e.g. "
                                     "--arg release_rounds=1")
        if name not in params and not var_kw:
            raise ConfigurationError(
                f"--arg {name}: algorithm {args.algorithm!r} takes no such argument (it "
                f"takes: {', '.join(p for p in params if p not in ('self', 'kwargs'))})")
        if name in kwargs:
            raise ConfigurationError(f"--arg {name} given twice (or also by another option)")
        try:
            kwargs[name] = json.loads(raw)
        except ValueError:
            kwargs[name] = raw
    if args.dpsgd_noise is not None or args.dpsgd_epsilon is not None:
        from secagg.privacy.dpsgd import DPSGD

        if "dpsgd" not in params and not var_kw:
            raise ConfigurationError(f"algorithm {args.algorithm!r} has no DP-SGD option")
        # with --dpsgd-epsilon, a placeholder until _plan_dpsgd calibrates the noise
        kwargs["dpsgd"] = DPSGD(args.dpsgd_noise or 1.0, args.dpsgd_clip)
    return kwargs


def _plan_dpsgd(args: argparse.Namespace, algo_cls: type, kwargs: dict[str, Any],
                algorithm: Any, layer: Any, part: Any) -> Any:
    """Share the run's --epsilon between DP-SGD and the DP layer, before anything trains:
    with --dpsgd-epsilon, DP-SGD's noise is calibrated to it (the algorithm is rebuilt
    with that noise); with --dpsgd-noise, its planned spend is computed. The layer is then
    calibrated to what DP-SGD leaves (:meth:`_DPLayer.plan_prior`). Returns the algorithm
    to run. Raises ConfigurationError when the split cannot work, with the reason."""
    from secagg.privacy.accountant import PrivacyLedger
    from secagg.privacy.dpsgd import calibrate_dpsgd, planned_round_event

    config = getattr(algorithm, "dpsgd", None)
    if config is None:
        return algorithm
    sizes = [cd.n for cd in part]
    batch, epochs = getattr(algorithm, "batch_size", None), getattr(algorithm, "local_epochs",
                                                                     None)
    if not isinstance(batch, int) or not isinstance(epochs, int) or not callable(
            getattr(layer, "plan_prior", None)):
        raise ConfigurationError(
            f"algorithm {args.algorithm!r}: DP-SGD's spend cannot be planned (it needs the "
            "algorithm's batch_size and local_epochs, and one DP layer)")
    if args.dpsgd_epsilon is not None:
        config = calibrate_dpsgd(args.dpsgd_epsilon, args.delta, args.rounds, sizes, batch,
                                 epochs, args.dpsgd_clip)
        algorithm = algo_cls(**{**kwargs, "dpsgd": config})
    event = planned_round_event(config, sizes, batch, epochs)
    alone = PrivacyLedger()
    alone.extend([event] * args.rounds)
    spent = alone.epsilon(args.delta)
    if not spent < args.epsilon:
        raise ConfigurationError(
            f"DP-SGD at noise multiplier {config.noise_multiplier:g} spends epsilon "
            f"{spent:.3g} over {args.rounds} round(s), which leaves nothing of --epsilon "
            f"{args.epsilon:g} for the layer's releases; raise --dpsgd-noise or --epsilon, "
            f"or give DP-SGD a share with --dpsgd-epsilon (below {args.epsilon:g})")
    layer.plan_prior([event], args.rounds)
    print(f"secagg: DP-SGD at noise multiplier {config.noise_multiplier:.4g} (clip "
          f"{config.max_grad_norm:g}) spends epsilon {spent:.3f} over {args.rounds} round(s); "
          f"the {args.layer} layer is calibrated to the rest of --epsilon {args.epsilon:g}",
          file=sys.stderr)
    return algorithm


def _inherits(cls: type, name: str) -> bool:
    """True when ``cls`` takes ``name`` through ``**kwargs`` forwarded to a base class
    that names it (e.g. FedProx(**kwargs) -> FedAvg(clip=...))."""
    import inspect

    for base in cls.__mro__[1:]:
        init = base.__dict__.get("__init__")
        if init is not None and name in inspect.signature(init).parameters:
            return True
    return False


def _quiet_library_warnings() -> None:
    """Stop library warning floods: torch's backward-hook notice (raised on every DP-SGD
    batch, nothing a user can act on) is silenced; Opacus's warnings (e.g. that its noise
    RNG is not the secure one) are shown once per run instead of once per client."""
    import warnings

    warnings.filterwarnings("ignore", message=r"Full backward hook is firing")
    warnings.filterwarnings("ignore", message=r"Using a non-full backward hook")
    warnings.filterwarnings("once", module=r"opacus(\.|$)")
    plain = warnings.formatwarning

    def one_line(message, category, filename, lineno, line=None):  # noqa: ANN001, ANN202
        # secagg's own warnings (e.g. the privacy plan's) are one line, with the fix
        if category.__module__.startswith("secagg."):
            return f"secagg: warning: {message}\n"
        return plain(message, category, filename, lineno, line)

    warnings.formatwarning = one_line  # type: ignore[assignment]


@contextlib.contextmanager
def _summarised_warnings() -> Iterator[None]:
    """secagg's own warnings shown as they come (one line each, with the fix); third-party
    warnings (Opacus, SciPy, torch) and absl's warning logs (dp-accounting's), which a
    user cannot act on line by line, counted and summarised in one line on stderr when the
    block ends."""
    import warnings

    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001, ANN202
            if getattr(category, "__module__", "").startswith("secagg."):
                return shown(message, category, filename, lineno, file, line)
            lib = next((p for p in Path(filename).parts if p in _LIBRARIES), "other")
            counts[lib] = counts.get(lib, 0) + 1
            first.setdefault(lib, str(message).splitlines()[0][:120] if str(message) else "")
            return None

        class _Count(logging.Handler):
            """absl log records (dp-accounting's RDP notes, e.g. an order that failed to
            converge, logged once per order and call) are counted like warnings."""

            def emit(self, record: logging.LogRecord) -> None:
                if record.levelno >= logging.WARNING:
                    counts["absl"] = counts.get("absl", 0) + 1
                    first.setdefault("absl", record.getMessage().splitlines()[0][:120])

        absl, handler = logging.getLogger("absl"), _Count()
        propagate = absl.propagate
        absl.addHandler(handler)
        absl.propagate = False
        warnings.showwarning = show
        try:
            yield
        finally:
            absl.removeHandler(handler)
            absl.propagate = propagate
            if counts:
                per = ", ".join(f"{lib} {n}" for lib, n in sorted(counts.items()))
                lib = max(counts, key=lambda k: counts[k])
                print(f"secagg: {sum(counts.values())} library warning(s) during the run "
                      f"({per}); most from {lib}: {first[lib]}", file=sys.stderr)


#: Libraries named in the warning summary (by a folder in the warning's file path).
_LIBRARIES = ("opacus", "scipy", "torch", "numpy", "sklearn", "tenseal", "flwr", "ray")


def _client_ledger_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Federation's client-ledger arguments from ``secagg run``'s flags."""
    from secagg.privacy.client_ledger import ClientBudget
    from secagg.privacy.policy import NodePolicy

    policy = None
    if args.client_min_noise is not None or args.client_max_clip is not None:
        policy = NodePolicy(min_noise_multiplier=args.client_min_noise,
                            max_clip=args.client_max_clip)
    return {"sampling": args.sampling, "client_ledgers": args.client_ledger,
            "client_budget": None if not args.client_budget
            else ClientBudget.parse(args.client_budget),
            "client_policy": policy, "colluders": args.colluders}


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The subcommand ``name``'s parser."""
    sub = next(a for a in parser._actions  # noqa: SLF001
               if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001
    return sub.choices[name]


def _resolve_run_options(parser: argparse.ArgumentParser, args: argparse.Namespace,
                         argv: Sequence[str]) -> None:
    """Fill ``args`` from ``--config`` (for ``--evaluate-only``, by default the run's own
    config.toml) and ``-c`` overrides, under the options given on the command line; keep
    the resolved values for config.toml."""
    from secagg.run_config import apply_config, given_options

    run_parser = _subparser(parser, "run")
    rest = list(argv)
    rest = rest[rest.index("run") + 1:] if "run" in rest else rest
    given = given_options(run_parser, rest)
    config = args.config
    if config is None and args.evaluate_only is not None:
        own = args.evaluate_only / "config.toml"
        config = own if own.is_file() else None
    apply_config(run_parser, args, given, config)
    args.resolved_options = dict(vars(args))


def _write_run_config(args: argparse.Namespace, out: Path) -> Path:
    """The run's resolved options as ``out/config.toml`` (secagg.run_config)."""
    from secagg.run_config import write_config

    values = getattr(args, "resolved_options", None) or vars(args)
    return write_config(_subparser(_make_parser(), "run"), values, out / "config.toml")


def _partition(args: argparse.Namespace, local_test_fraction: float = 0.2) -> Any:
    """The clients ``--dataset`` names, split as the options say
    (:func:`secagg.data_sources.load_partition`)."""
    from secagg.data_sources import load_partition

    return load_partition(args.dataset, args.clients, split=args.split, alpha=args.alpha,
                          shards_per_client=args.shards_per_client, seed=args.seed,
                          local_test_fraction=local_test_fraction, data_dir=args.data_dir)


def _check_groups(args: argparse.Namespace, algorithm: Any, part: Any) -> None:
    """Refuse a ``--group-layer`` group the algorithm's uploads do not have, naming the
    groups they have (the algorithm is set up on a copy of the clients' state; the run sets
    it up afresh)."""
    from secagg.federation import ClientState

    try:
        algorithm.setup(part.dataset, [ClientState(cd) for cd in part], args.seed)
        groups = {f.group for r in sorted({0, args.rounds - 1})
                  for ph in algorithm.phases(r, args.rounds) for f in ph.spec().fields}
    except Exception:  # noqa: BLE001 -- the run itself reports a failing setup
        return
    unknown = sorted({g.partition("=")[0] for g in args.group_layer} - groups)
    if unknown:
        raise ConfigurationError(
            f"--group-layer: unknown group(s) {', '.join(map(repr, unknown))}: "
            f"{args.algorithm}'s uploads have the group(s) {', '.join(map(repr, sorted(groups)))}")


def _evaluate_only(args: argparse.Namespace) -> int:
    """``run --evaluate-only RUN_DIR``: score the saved model on the data the options name
    (the run's own config by default), as the run scored it."""
    from algorithms.training import accuracy
    from secagg.model_io import load_model, read_model_info

    info = read_model_info(args.evaluate_only)
    model = load_model(args.evaluate_only)
    part = _partition(args)
    try:
        if info["kind"] == "personalized":
            accs = [accuracy(model[c.id], c.x_test, c.y_test) for c in part
                    if c.y_test is not None and len(c.y_test) and c.id in set(model)]
            if not accs:
                raise ConfigurationError(
                    f"--evaluate-only: no client of --dataset {args.dataset} has a saved model "
                    "and a local test set (a personalized model scores its own clients)")
            acc, kind = sum(accs) / len(accs), "mean local test"
        else:
            ds = part.dataset
            acc, kind = accuracy(model, ds.x_test, ds.y_test), "global test"
    except RuntimeError as exc:  # shapes that do not fit the model
        raise ConfigurationError(f"--evaluate-only: the saved model does not take "
                                 f"--dataset {args.dataset}'s records: "
                                 f"{str(exc).splitlines()[0]}") from None
    print(f"accuracy ({kind}) of {args.evaluate_only} on {args.dataset}: {acc:.4f}")
    if info.get("accuracy") is not None:
        print(f"the run measured: {float(info['accuracy']):.4f} ({info.get('accuracy_kind')})")
    return EXIT_OK


def _run(args: argparse.Namespace) -> int:
    if args.list:
        for name, ep in sorted(available_algorithms().items()):
            print(f"{name:<12} {_describe(ep)}")
        return EXIT_OK
    if args.evaluate_only is not None:
        return _evaluate_only(args)
    from secagg.federation import Federation

    # Every argument is checked (and the algorithm and layer built) before the output
    # folder is looked at, so a bad argument is reported as such even where a previous run
    # left its outputs.
    _check_run_args(args)
    algo_cls = load_algorithm(args.algorithm)
    given = _algorithm_kwargs(args, algo_cls)
    names = [args.layer] + [g.partition("=")[2] for g in args.group_layer]
    kwargs = algorithm_arguments(algo_cls, given, args.adjacency if any(
        n in DP_LAYERS for n in names) else None)
    algorithm = algo_cls(**kwargs)
    layer = build_layer(args)
    out = None if args.dry_run else _out_dir(args)  # checked before any work
    for key in sorted(kwargs.keys() - given.keys()):  # the algorithm's DP defaults: say so
        print(f"secagg: {args.algorithm} under {args.adjacency}-level DP: {key}="
              f"{json.dumps(kwargs[key])} by default (--arg {key}=... to choose)",
              file=sys.stderr)
    part = _partition(args)
    with _summarised_warnings():
        algorithm = _plan_dpsgd(args, algo_cls, kwargs, algorithm, layer, part)
    if args.group_layer:
        _check_groups(args, algorithm, part)
    _quiet_library_warnings()
    fed = Federation(
        algorithm,
        layer,
        part,
        rounds=args.rounds,
        fraction=args.fraction,
        dropout=args.dropout,
        on_abort=args.on_abort,
        seed=args.seed,
        include_values=args.include_values,
        progress=False if args.quiet else None,
        max_records=args.max_records,
        workers=args.workers,
        **_client_ledger_kwargs(args),
    )
    if args.dry_run:  # the plan only: nothing trained, nothing written
        from secagg.privacy.plan import format_plan, swamped

        with _summarised_warnings():
            rows = fed.plan()
        print(format_plan(rows))
        for line in swamped(rows):
            print(f"warning: {line}", file=sys.stderr)
        return EXIT_OK
    assert out is not None
    with _summarised_warnings():
        result = fed.run()
    paths = result.save(out, args.device_profile)
    paths["config"] = _write_run_config(args, out)
    data = {k: getattr(args, k) for k in ("dataset", "split", "alpha", "shards_per_client")}
    print(result.table(args.device_profile, data))
    print(f"\nwrote {paths['result']}, {paths['costs']}, {paths['transcript']}"
          + (f"; the clients' public keys to {paths['identities']} (apart from the run "
             "folder: keep them where the server cannot write)"
             if "identities" in paths else ""))
    print(f"audit with: secagg audit {paths['transcript']}"
          + (f" --identities {paths['identities']}" if "identities" in paths else ""))
    if "model" in paths:
        print(f"model: {paths['model']} (load with secagg.load_model({str(out)!r})); "
              f"rerun with: secagg run --config {paths['config']} --out DIR")
    from secagg.report import command_from_args, save_run_report

    try:  # the run's outputs are saved: a report that cannot be written does not undo them
        report = save_run_report(out, command=command_from_args(_make_parser(), args),
                                 data=data, fed=fed)
        print(f"report: {report}")
    except Exception as exc:  # noqa: BLE001
        print(f"secagg run: report.html not written: {type(exc).__name__}: {exc} (retry with "
              f"secagg report {out})", file=sys.stderr)
    failure = result.failure()
    if failure:
        print(f"secagg run: no usable model: {failure}", file=sys.stderr)
        return EXIT_NO_MODEL
    return EXIT_OK


def _audit(args: argparse.Namespace) -> int:
    from secagg.audit import audit, format_audit, reconcile
    from secagg.transcript import Transcript

    path = args.file / "transcript.jsonl" if args.file.is_dir() else args.file
    if not path.exists():
        raise ConfigurationError(f"no such transcript: {path}")
    transcript = Transcript.read(path)
    identities = None
    if args.identities is not None:
        from secagg.attest import read_identities

        identities = read_identities(args.identities)
    report = audit(transcript, identities, transcript_path=path)
    costs = path.parent / "costs.csv"
    if costs.exists():
        report["reconcile"] = reconcile(report, costs)
    result_json = path.parent / "result.json"
    if result_json.exists():
        from secagg.audit import client_distribution

        dist = client_distribution(json.loads(result_json.read_text()))
        if dist is not None:
            report["clients"] = dist
    ledgers = _node_ledgers(args.node_ledger, transcript)
    if ledgers:
        report["node_ledgers"] = ledgers
    print(json.dumps(report, indent=2, default=str) if args.json else format_audit(report))
    if ledgers and not args.json:
        from secagg.privacy.node_ledger import format_reconcile

        print("\n" + format_reconcile(ledgers))
    bad = [r for r in ledgers if not r["ok"]]
    if bad:
        print(f"secagg audit: {len(bad)} node ledger(s) do not reconcile; first: "
              f"{bad[0]['problems'][0]}", file=sys.stderr)
        return EXIT_INCOMPLETE
    if not report["complete"]:
        print(f"secagg audit: transcript incomplete: {report['incomplete_reason']}",
              file=sys.stderr)
        return EXIT_INCOMPLETE
    if report["attestation"]:
        print(f"secagg audit: {len(report['attestation'])} attestation problem(s); first: "
              f"{report['attestation'][0]}", file=sys.stderr)
        return EXIT_INCOMPLETE
    if getattr(args, "threat", None):
        try:
            from threat_models.audit import threat_audit
        except ImportError as exc:
            raise SecaggError(f"audit --threat needs the threat_models package: {exc}") from None
        text, leaks = threat_audit(transcript, args.threat)
        print("\n" + text)
        return EXIT_LEAK if leaks else EXIT_OK
    return EXIT_OK


def _node_ledgers(specs: list[str], transcript: Any) -> list[dict[str, Any]]:
    """``audit --node-ledger CLIENT=PATH``: each node's file reconciled with the server's
    copy in the transcript (:func:`secagg.privacy.node_ledger.reconcile`)."""
    from secagg.privacy.node_ledger import reconcile

    out = []
    for spec in specs:
        client, sep, path = spec.partition("=")
        if not sep or not client.strip().lstrip("-").isdigit() or not path:
            raise ConfigurationError(f"--node-ledger wants CLIENT=PATH (a client id and its "
                                     f"ledger file), got {spec!r}")
        out.append(reconcile(Path(path), transcript.records, int(client)))
    return out


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


def _report(args: argparse.Namespace) -> int:
    from secagg.report import write_report

    print(write_report(args.dir, threat=args.threat, identities=args.identities,
                       out=args.out))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from secagg.plots import load_results, plot_results

    first = args.results[0]
    out = args.out or (first if first.is_dir() else first.parent)
    rows = [r for path in args.results for r in load_results(path)]
    for path in plot_results(rows, out).values():
        print(path)
    return 0


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


# --- secagg dp-audit (issue 22) ----------------------------------------------------------
# Self-contained: the parser and a thin handler; the audits live in threat_models.dp_audit,
# imported lazily (secagg never imports threat_models at module level).

DP_AUDIT_LAYERS = ("central-dp", "local-dp", "distributed-dp", "dp-ftrl", "dp-sgd", "all")
EXIT_DP_VIOLATED = 6
DP_AUDIT_EXIT_CODES = """exit status:
  0    every lower bound is at most the epsilon its mechanism claims
  1    error: bad input or a refused configuration (the reason is printed on stderr)
  2    usage error (unknown option, bad value)
  6    some lower bound is above its claim: that mechanism is not (epsilon, delta)-DP
       (at the stated confidence); the offending rows are named on stderr
  130  interrupted"""


def _bounded(kind: type, low: float, high: float | None = None, what: str = "") -> Any:
    """An argparse type: ``kind`` in (low, high), exclusive (high None: no upper end); a
    value outside is a usage error (exit 2), as in every subcommand."""
    def parse(text: str) -> Any:
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (v > low and (high is None or v < high)):
            raise argparse.ArgumentTypeError(f"{text} is not {what}")
        return v
    return parse


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


if __name__ == "__main__":
    sys.exit(main())
