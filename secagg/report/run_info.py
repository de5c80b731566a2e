"""What ``secagg run`` leaves for its report: the command that reproduces the run, the
privacy plan, and ``run.json`` beside the outputs, then the report itself."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from secagg.report.run_report import RUN_INFO, VERIFY_AT_RUN_END
from secagg.report.write import write_report


def command_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
                      skip: Sequence[str] = ("force", "quiet")) -> list[str]:
    """The command line (``secagg SUBCOMMAND --option value ...``) that gives ``args``
    from ``parser`` (the ``secagg`` parser): every option whose value differs from its
    default, flags and repeatable options included; ``skip`` names destinations left out
    (they change no result)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = args.command
    words = ["secagg", command]
    positional: list[str] = []
    for act in sub.choices[command]._actions:
        if act.dest in ("help", *skip) or not hasattr(args, act.dest):
            continue
        value = getattr(args, act.dest)
        if not act.option_strings:
            positional.extend(str(v) for v in (value if isinstance(value, list) else [value]))
            continue
        if value == act.default:
            continue
        flag = max(act.option_strings, key=len)
        if act.nargs == 0:  # store_true / store_false
            words.append(flag)
        elif isinstance(value, list):
            for v in value:
                words.extend([flag, str(v)])
        elif value is not None:
            words.extend([flag, str(value)])
    return words + positional


def plan_rows(fed: Any, with_epsilon: bool = False) -> list[dict[str, Any]]:
    """The privacy plan of a (run) :class:`~secagg.federation.Federation`: per DP release
    and field, the noise per entry and its norm, the largest sum the cohort could upload
    and their ratio (:func:`secagg.privacy.plan.plan_run`), as dicts; empty without DP
    noise. The planned epsilon after each round only ``with_epsilon`` (NaN otherwise: it
    costs an accountant call per round, minutes over a hundred rounds; the run's spent
    epsilon is in ``result.json``)."""
    from dataclasses import asdict

    from secagg.engine import cohort_size
    from secagg.messages import DEFAULT_MAX_RECORDS
    from secagg.privacy.plan import plan_run

    rows = plan_run(fed.algorithm, fed.layer, fed.rounds,
                    cohort_size(len(fed.partition), fed.fraction),
                    fed.max_records or DEFAULT_MAX_RECORDS, with_epsilon=with_epsilon)
    return [asdict(r) for r in rows]


def save_run_report(out_dir: str | os.PathLike[str], *, command: Sequence[str] | None = None,
                    data: Mapping[str, Any] | None = None, fed: Any | None = None) -> Path:
    """What ``secagg run`` calls once its outputs are saved: write :data:`RUN_INFO`
    (``command``, ``data`` -- dataset, split, ... -- and the privacy plan of ``fed``) and
    then ``report.html``. A plan that cannot be computed is recorded with the reason; the
    signed statements of a run over more than :data:`VERIFY_AT_RUN_END` clients are left
    unchecked, and the report says so."""
    out = Path(out_dir)
    info: dict[str, Any] = {"command": list(command) if command else None,
                            "data": dict(data or {})}
    if fed is not None:
        try:
            info["plan"] = plan_rows(fed)
        except Exception as exc:  # noqa: BLE001 -- the report says why, the run stands
            info["plan_error"] = f"{type(exc).__name__}: {exc}"
    (out / RUN_INFO).write_text(json.dumps(info, indent=2, default=str) + "\n")
    clients = len(fed.partition) if fed is not None else 0
    return write_report(out, verify=clients <= VERIFY_AT_RUN_END)
