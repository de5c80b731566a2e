"""``secagg run``'s refusals before anything is built: each option checked against
its range and against the chosen layers, the output folder, and the clients' own
ledger and policy options."""

from __future__ import annotations

import argparse
import math
from typing import Any

from secagg.cli.argparsing import _subparser
from secagg.cli.layers import DP_LAYERS
from secagg.cli.parser import _make_parser
from secagg.errors import ConfigurationError
from secagg.layers.registry import get_layer, layer_names

#: The layer-specific options (its flag, and the reason when refused); the layers each
#: applies to are the registry's (its entries' ``options``).
_LAYER_OPTIONS: dict[str, tuple[str, str]] = {
    "threshold": ("--threshold", "it is the secure sum's threshold"),
    "graph": ("--graph", "it is the secure sum's neighbour graph"),
    "he_scheme": ("--he-scheme", "it picks the homomorphic scheme"),
    "colluders": ("--colluders", "it counts clients revealing their noise shares, which only "
                  "distributed-dp splits among the clients"),
    "bound": ("--bound", "it is the validated sum's verified L2 bound"),
    "cheaters": ("--cheaters", "it makes clients cheat against the validated sum's check"),
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
        flag, why = _LAYER_OPTIONS[key]
        layers = [n for n in layer_names() if key in get_layer(n).options]
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
    if args.cheaters < 0:
        raise ConfigurationError("--cheaters must be >= 0")
    if args.bound is not None and not (math.isfinite(args.bound) and args.bound > 0):
        raise ConfigurationError(f"--bound must be a positive finite number, got {args.bound}")
    if args.workers is not None and args.workers < 1:
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
