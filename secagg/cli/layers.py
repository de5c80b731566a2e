"""The privacy layers the command line names: the names ``--layer`` accepts and the
layer (or per-group routing of layers) that ``secagg run``'s options build."""

from __future__ import annotations

import argparse
import math
from typing import Any

from secagg.errors import ConfigurationError
from secagg.layers.registry import LayerOptions, get_layer, layer_names, make_layer

#: The layer names ``--layer`` accepts (the registry's, in its order).
LAYERS = layer_names()
#: Those that add DP noise.
DP_LAYERS = layer_names(dp=True)


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
                                         dropout=args.dropout, bound=args.bound,
                                         cheaters=args.cheaters))
