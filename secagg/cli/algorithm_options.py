"""The algorithm ``secagg run`` trains, built from its options: the constructor
arguments (``--lr``, ``--arg``, ...) checked against the algorithm's signature, and
DP-SGD's share of ``--epsilon`` planned before anything trains."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from secagg.errors import ConfigurationError


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
