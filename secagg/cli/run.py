"""``secagg run``: resolve the options (config file, overrides), build the algorithm,
layer and clients, run the federation (or print its privacy plan), and write the
outputs and report; ``--evaluate-only`` scores a saved model, ``--list`` lists the
algorithms."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from secagg.algorithm_registry import algorithm_arguments, available_algorithms, load_algorithm
from secagg.cli.algorithm_options import _algorithm_kwargs, _plan_dpsgd
from secagg.cli.argparsing import _subparser
from secagg.cli.exits import EXIT_NO_MODEL, EXIT_OK
from secagg.cli.layers import DP_LAYERS, build_layer
from secagg.cli.library_warnings import _quiet_library_warnings, _summarised_warnings
from secagg.cli.out_dir import _out_dir
from secagg.cli.parser import _make_parser
from secagg.cli.run_checks import _check_run_args, _client_ledger_kwargs
from secagg.errors import ConfigurationError


def _describe(ep: Any) -> str:
    """The first line of an algorithm's docstring (or why it cannot be loaded)."""
    try:
        cls = ep.load()
    except (ImportError, AttributeError) as exc:
        return f"(cannot be loaded: {exc})"
    doc = (cls.__doc__ or "").strip()
    return doc.splitlines()[0].strip() if doc else "(no description)"


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
