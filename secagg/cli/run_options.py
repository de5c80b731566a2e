"""``secagg run``'s options: its argument groups (data, algorithm, layer, privacy,
output), their defaults and help, and the examples its ``--help`` ends with."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from secagg.cli.argparsing import _bounded
from secagg.cli.exits import EXIT_CODES
from secagg.cli.layers import LAYERS
from secagg.cores import available_cores
from secagg.costs import PROFILES

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


def add_run_parser(sub: Any) -> None:
    """Add ``secagg run`` and its options to the subcommands ``sub``."""
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
        default=None,
        help="processes the simulated clients' secure-sum work (keys, signatures, shares, "
        "DistributedDP's noise, masks) is spread over; the result does not depend on it "
        f"(default: the cores this process may use, os.sched_getaffinity: "
        f"{available_cores()} here; 1 runs it all in this process)",
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
    g_layer.add_argument(
        "--bound", type=float, default=None, metavar="B",
        help="validated-sum: the L2 bound the aggregators verify on each client's whole "
        "upload (default: from the fields' declared client-level bounds)",
    )
    g_layer.add_argument(
        "--cheaters", type=int, default=0, metavar="K",
        help="validated-sum attack switch: K clients of each cohort skip their clip and "
        "scale their update by 100; the aggregators reject them (%(default)s)",
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
