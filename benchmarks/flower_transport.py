"""What Flower's transport adds to secagg's messages, and its time, beside the embedded engine.

FedLog on digits over Flower's simulation runtime (``flwr.simulation.run_simulation``, one
Ray start), under Plaintext, SecureSum, BFV and DistributedDP around SecureSum, then the
same runs in the embedded
:class:`~secagg.federation.Federation` in the same process. Per layer and stage it prints the
Flower messages (both ways), secagg's own wire bytes, Flower's serialized message bytes
(its Message, RecordDict and records, before HTTP/gRPC framing) and their ratio (SecureSum's
ADVERTISEs have no message of their own: they ride in the hello and unmask messages); then the
wall seconds per round on Flower's simulation and embedded, and that ratio. The cost ledger
books the same rows either way (tests/test_flower_simulation.py checks it); this table is
what a deployment pays on top.

    python benchmarks/flower_transport.py            # 4 nodes, 2 rounds
    python benchmarks/flower_transport.py --nodes 8 --rounds 3 --out results.txt

Needs the ``flower`` extra (``pip install -e ".[flower]"``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from algorithms import FedLog  # noqa: E402
from secagg import (  # noqa: E402
    DistributedDP,
    Federation,
    Homomorphic,
    Plaintext,
    SecureSum,
)
from secagg.data import dirichlet_split, load_dataset  # noqa: E402


def _layers() -> dict:
    return {"Plaintext": Plaintext(), "SecureSum": SecureSum(threshold=0.7),
            "BFV": Homomorphic(scheme="bfv"),
            # a user seed: reproducible noise, so the histories are comparable (not private)
            "DistDP": DistributedDP(SecureSum(threshold=0.7), epsilon=4.0, delta=1e-5,
                                    adjacency="client", seed=5)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=4, help="SuperNodes (clients); default 4")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per layer; default 2")
    ap.add_argument("--feature-dim", type=int, default=8, help="FedLog feature dim; default 8")
    ap.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from flwr.app import Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from secagg.flower import FlowerFederation, client_app, node_partition_loader

    def partition():
        return dirichlet_split(load_dataset("digits"), args.nodes, 0.5, seed=3,
                               local_test_fraction=0.2)

    def algo():
        return FedLog(feature_dim=args.feature_dim, local_epochs=1)

    runs: dict[str, tuple] = {}
    app = ServerApp()

    @app.main()
    def _main(grid: Grid, context: Context) -> None:
        for name, layer in _layers().items():
            print(f"  flower: {name} ...", file=sys.stderr, flush=True)
            fed = FlowerFederation(algo(), layer, load_dataset("digits"), rounds=args.rounds,
                                   seed=0, min_nodes=args.nodes, stage_timeout=300,
                                   connect_timeout=300)
            result = fed.run(grid)
            runs[name] = (result, fed)

    print(f"Flower simulation: {args.nodes} nodes, {args.rounds} rounds per layer",
          file=sys.stderr, flush=True)
    run_simulation(app, client_app(algo, node_partition_loader(partition)),
                   num_supernodes=args.nodes,
                   backend_config={"client_resources": {"num_cpus": 1}})
    missing = [n for n in _layers() if n not in runs]
    if missing:
        print(f"the ServerApp did not finish: {missing}", file=sys.stderr)
        return 1

    lines = [f"FedLog (feature_dim={args.feature_dim}) on digits, {args.nodes} nodes, "
             f"{args.rounds} rounds; Flower {__import__('flwr').__version__} simulation",
             "",
             f"{'layer':<10} {'stage':<13} {'Flower msgs':>11} {'our bytes':>11} "
             f"{'Flower bytes':>12} {'Flower/ours':>11}"]
    for name in _layers():
        _, fed = runs[name]
        for stage, v in fed.transport.to_dict().items():
            ours, flw = v["secagg_wire_bytes"], v["flower_message_bytes"]
            ratio = f"{flw / ours:.2f}" if ours and flw else "-"
            lines.append(f"{name:<10} {stage:<13} {v['messages']:>11,} {ours:>11,} "
                         f"{flw:>12,} {ratio:>11}")
    lines += ["", f"{'layer':<10} {'Flower s/round':>14} {'embedded s/round':>16} "
                  f"{'Flower/embedded':>15} {'same history':>12}"]
    # warm-up (the first local training initialises torch's optimizer code): not charged
    # to the first layer timed
    Federation(algo(), Plaintext(), partition(), rounds=2, seed=0, progress=False).run()
    for name, layer in _layers().items():
        result, fed = runs[name]
        print(f"  embedded: {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        want = Federation(algo(), layer, partition(), rounds=args.rounds, seed=0,
                          progress=False).run()
        emb = (time.perf_counter() - t0) / args.rounds
        flw = float(np.mean(fed.round_wall_s))
        lines.append(f"{name:<10} {flw:>14.3f} {emb:>16.3f} {flw / emb:>15.1f} "
                     f"{str(result.history == want.history):>12}")
    lines += ["", "DistDP: DistributedDP around SecureSum, epsilon 4 (delta 1e-5, client-level), "
              "noise shares added on the nodes; user seed 5 (reproducible, so not private)"]
    text = "\n".join(lines)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
