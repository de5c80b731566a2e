"""Cross-device DP-FedAvg utility on Fashion-MNIST (issue 25, point 4): one configuration per
invocation, one JSON line per run, and a markdown table from the lines.

    PYTHONPATH=. python benchmarks/cross_device_dp.py run OUT.jsonl --tag NAME [secagg run options]
    PYTHONPATH=. python benchmarks/cross_device_dp.py table OUT.jsonl

``run`` takes the options of ``secagg run`` (``--layer``, ``--epsilon``, ``--adjacency``,
``--clip``, ``--server-opt``, ``--server-lr``, ``--dp-ftrl``, ``--fraction``, ``--rounds``,
``--lr``, ``--local-epochs``, ``--arg NAME=VALUE``, ``--seed``, ...; the data set defaults to
``fashion-mnist`` and the clients to 1,000) and builds the run exactly as ``secagg run``
does (same layer construction, same Dirichlet split with its 20 % local test share, same
``Federation``), with one difference: ``--algorithm`` defaults to ``fedavg-mlp``,
:class:`MLPFedAvg`, FedAvg
on the toolkit's small MLP (:func:`algorithms.models.MLP` on the flattened 28x28 image;
``secagg run --algorithm fedavg`` would build the CNN for 1x28x28 inputs). Its width is
``--arg hidden=H`` and ``--arg feature_dim=D``. Any other algorithm (``fedlog``,
``module:Class``) is accepted too, for the record-level cross-silo rows.

Each line records: the tag, the exact command, the configuration, the accuracy on the
global test set after every round (final and best), the ledger's epsilon at the run's
delta, the planned noise multiplier of the update field (noise std on the sum over the
initial clip, from :meth:`secagg.federation.Federation.plan`), the clip bound in force each
round, the wall time, the time per round, this process's CPU time and the machine's load
average at start and end (the benchmark ran on 2 cores shared with other jobs: wall times
are indicative only; the CPU time is the cost of the run itself).

A line may carry ``"superseded": REASON`` (added by hand when a later configuration replaced
it); ``table`` marks its row so.

``table`` groups the lines by tag (mean and, with several seeds, the min..max band over the
seeds; the final accuracy and the mean of the last three rounds, which is less exposed to
one round's swing) and prints each row's gap in points to the tag named by ``--ref TAG``
at run time, paired by seed (negative: below the reference).
"""

from __future__ import annotations

import json
import math
import os
import shlex
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from algorithms.fedavg import FedAvg  # noqa: E402
from algorithms.models import MLP, SplitModel  # noqa: E402
from secagg.data import Dataset  # noqa: E402

#: the default algorithm of ``run``: this module's :class:`MLPFedAvg`
DEFAULT_ALGORITHM = "fedavg-mlp"


class MLPFedAvg(FedAvg):
    """FedAvg (and DP-FedAvg, with ``clip``) on :func:`algorithms.models.MLP`: the input
    flattened, a hidden layer of ``hidden`` units, a feature layer of ``feature_dim`` and a
    linear head.

    Args:
        hidden: width of the MLP's first layer (default 64).
        feature_dim: width of its feature layer (default 32).
        **kwargs: :class:`~algorithms.fedavg.FedAvg`'s options (``clip``, ``lr``, ...).
    """

    name = "fedavg-mlp"

    def __init__(self, hidden: int = 64, feature_dim: int = 32, **kwargs: Any) -> None:
        super().__init__(feature_dim=feature_dim, **kwargs)
        self.hidden = int(hidden)

    def build_model(self, dataset: Dataset) -> SplitModel:
        """The MLP on the flattened input."""
        return MLP(int(np.prod(dataset.input_shape)), dataset.n_classes, self.feature_dim,
                   hidden=self.hidden)

    def describe(self) -> dict[str, Any]:
        """FedAvg's description plus the MLP's widths."""
        return {**super().describe(), "model": "mlp", "hidden": self.hidden,
                "feature_dim": self.feature_dim}


def _split_args(argv: list[str]) -> tuple[str, str | None, list[str]]:
    """(tag, ref, the remaining ``secagg run`` arguments) from ``--tag T --ref R ...``."""
    tag, ref, rest = "", None, []
    it = iter(argv)
    for a in it:
        if a == "--tag":
            tag = next(it)
        elif a == "--ref":
            ref = next(it)
        else:
            rest.append(a)
    if not tag:
        sys.exit("run: --tag NAME is required (it names the table row)")
    return tag, ref, rest


def _defaults(rest: list[str]) -> list[str]:
    """``secagg run`` arguments with this benchmark's defaults where not given."""
    out = list(rest)
    for opt, value in (("--algorithm", DEFAULT_ALGORITHM), ("--dataset", "fashion-mnist"),
                       ("--clients", "1000")):
        if opt not in out:
            out = [opt, value, *out]
    return out + ["--quiet"]


def run(path: str, argv: list[str]) -> dict[str, Any]:
    """Run one configuration and append its JSON line to ``path``; return the line."""
    from secagg.algorithm_registry import load_algorithm
    from secagg.cli import (
        _algorithm_kwargs,
        _check_run_args,
        _client_ledger_kwargs,
        _make_parser,
        build_layer,
    )
    from secagg.data import dirichlet_split, iid_split, load_dataset
    from secagg.federation import Federation
    from secagg.layers.registry import get_layer
    from secagg.result import client_spread

    tag, ref, rest = _split_args(argv)
    cli = _defaults(rest)
    args = _make_parser().parse_args(["run", *cli])
    _check_run_args(args)
    torch.set_num_threads(1)
    algo_cls = MLPFedAvg if args.algorithm == DEFAULT_ALGORITHM else \
        load_algorithm(args.algorithm)
    ds = load_dataset(args.dataset, args.data_dir)
    split = iid_split if args.alpha == 0 else (
        lambda d, n, seed, local_test_fraction: dirichlet_split(
            d, n, args.alpha, seed=seed, local_test_fraction=local_test_fraction))
    part = split(ds, args.clients, seed=args.seed, local_test_fraction=0.2)

    def federation() -> Federation:  # a fresh algorithm and layer each time
        return Federation(algo_cls(**_algorithm_kwargs(args, algo_cls)), build_layer(args),
                          part, rounds=args.rounds, fraction=args.fraction,
                          dropout=args.dropout, on_abort=args.on_abort, seed=args.seed,
                          progress=False, max_records=args.max_records,
                          **_client_ledger_kwargs(args))

    plan = federation().plan() if get_layer(args.layer).dp else []
    first = [p for p in plan if p.round == min(q.round for q in plan)]
    sigma = {p.field: p.sigma for p in first}
    bound = {p.field: p.signal_bound / max(p.cohort, 1) for p in first}
    z = {f: sigma[f] / bound[f] for f in sigma if bound.get(f)}
    load0 = os.getloadavg()[0]
    t0, c0 = time.time(), time.process_time()
    fed = federation()
    result = fed.run()
    algorithm = fed.algorithm
    wall, cpu = time.time() - t0, time.process_time() - c0
    eps = None
    if result.privacy is not None and args.delta is not None:
        eps = result.privacy.epsilon(args.delta)
    c1 = time.process_time()
    clients = result.client_privacy()
    spread = {} if clients is None else {
        obs: client_spread(clients, obs) for obs in ("release", "server")}
    accounting_cpu = time.process_time() - c1
    clips = [m.get("clip") for m in result.measurements if isinstance(m, dict) and "clip" in m]
    n_params = int(algorithm.params.size) if getattr(algorithm, "params", None) is not None \
        else None
    row = {
        "tag": tag, "ref": ref,
        "command": "PYTHONPATH=. python benchmarks/cross_device_dp.py run "
                   + shlex.quote(path) + " " + shlex.join(argv),
        "algorithm": args.algorithm, "describe": result.algorithm, "layer": args.layer,
        "epsilon_target": args.epsilon, "delta": args.delta, "adjacency": args.adjacency,
        "dp_ftrl": bool(args.dp_ftrl), "clients": args.clients, "alpha": args.alpha,
        "fraction": args.fraction, "rounds": args.rounds, "seed": args.seed,
        "n_params": n_params,
        "accuracy": result.accuracy, "best_accuracy": result.best_accuracy,
        "history": [round(a, 4) for a in result.history],
        "sampling": args.sampling,
        "epsilon": eps, "client_epsilon": spread, "noise_std_round1": sigma, "z_round1": z, "clip": clips,
        "wall_s": round(wall, 1), "s_per_round": round(wall / max(len(result.history), 1), 2),
        "cpu_s": round(cpu, 1), "client_accounting_cpu_s": round(accounting_cpu, 1),
        "load_start": round(load0, 2), "load_end": round(os.getloadavg()[0], 2),
        "failure": result.failure(), "aborted": len(result.aborted),
    }
    print(json.dumps(row), flush=True)
    with open(path, "a") as fh:
        fh.write(json.dumps(row) + "\n")
    return row


def _band(values: list[float]) -> str:
    """``mean`` or ``mean [min, max]`` in percent."""
    m = 100 * float(np.mean(values))
    if len(values) == 1:
        return f"{m:.2f}"
    return f"{m:.2f} [{100 * min(values):.2f}, {100 * max(values):.2f}]"


def _cpu_per_round(rs: list[dict[str, Any]]) -> str:
    """Mean CPU seconds per round over the lines that recorded it, else ``-``."""
    v = [r["cpu_s"] / max(len(r["history"]), 1) for r in rs if r.get("cpu_s") is not None]
    return f"{np.mean(v):.1f}" if v else "-"


def _client_eps(rs: list[dict[str, Any]]) -> str:
    """The largest client epsilon against observers of the releases and against the server
    over the lines that recorded it (``none`` where some client has no guarantee against
    that observer), else ``-``."""
    parts = []
    for obs in ("release", "server"):
        sp = [r["client_epsilon"][obs] for r in rs if r.get("client_epsilon")
              and r["client_epsilon"].get(obs)]
        if not sp:
            parts.append("-")
        elif any(x["no_guarantee"] for x in sp):
            parts.append("none")
        else:
            parts.append(f"{max(x['max'] for x in sp):.2f}")
    return " / ".join(parts)


def table(path: str) -> str:
    """The markdown table of the lines in ``path``: one row per tag, in first-seen order."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    by_tag: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_tag[r["tag"]].append(r)
    out = ["| tag | layer | eps target | eps ledger | client eps max (release / server) "
           "| z (update) | fraction | rounds | seeds "
           "| accuracy % (final; band over seeds) | last-3 mean % | gap to ref (points; final, "
           "last-3) | s/round | CPU s/round | load |",
           "|---" * 15 + "|"]
    for tag, rs in by_tag.items():
        acc = [r["accuracy"] for r in rs]
        last3 = [float(np.mean(r["history"][-3:])) for r in rs]
        r0 = rs[0]
        gap = "-"
        ref = r0.get("ref")
        if ref and ref in by_tag:
            mine = {r["seed"]: r for r in rs}
            theirs = {r["seed"]: r for r in by_tag[ref]}
            common = sorted(mine.keys() & theirs.keys())
            if common:
                d = [100 * (mine[s]["accuracy"] - theirs[s]["accuracy"]) for s in common]
                d3 = [100 * (np.mean(mine[s]["history"][-3:])
                             - np.mean(theirs[s]["history"][-3:])) for s in common]
                gap = (f"{np.mean(d):+.2f}, {np.mean(d3):+.2f} vs {ref} "
                       f"(n={len(common)})")
        eps = [r["epsilon"] for r in rs if r["epsilon"] is not None]
        z = r0["z_round1"].get("update")
        layer = r0["layer"] + (" + DP-FTRL" if r0.get("dp_ftrl") else "")
        if any(r.get("superseded") for r in rs):  # kept for the record, not comparable
            tag = f"{tag} (superseded)"
        out.append(
            f"| {tag} | {layer} | {r0['epsilon_target'] if r0['epsilon_target'] else '-'} "
            f"| {max(eps):.3f} | " if eps else
            f"| {tag} | {layer} | - | - | ")
        out[-1] += _client_eps(rs) + " | "
        out[-1] += (f"{z:.3g} | " if z is not None and math.isfinite(z) else "- | ")
        out[-1] += (f"{r0['fraction']} | {r0['rounds']} | {len(rs)} | {_band(acc)} | "
                    f"{_band(last3)} | {gap} | {np.mean([r['s_per_round'] for r in rs]):.1f} "
                    f"| {_cpu_per_round(rs)} | {np.mean([r['load_start'] for r in rs]):.1f} |")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "table":
        print(table(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
