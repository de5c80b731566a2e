"""Federated GMM under record-level central DP: mean clustering accuracy against epsilon.

    PYTHONPATH=. python benchmarks/gmm_noise.py --seeds 20 --out benchmarks/results/gmm_noise.txt
    PYTHONPATH=. python benchmarks/gmm_noise.py --dataset digits --seeds 5 --eps 1 10 100

``blobs`` (default) is the data set of ``tests/test_gmm.py``: 400 records of three Gaussian
blobs in R^3 scaled into the public box [0, 1]^3, 300 for training over 5 IID clients (split
seed 0), 100 for testing. ``digits`` is scikit-learn's (64 features in [0, 1], 10
components) split as the CLI splits it by default: 10 clients, Dirichlet(0.5), split seed
the run's seed. For every epsilon and seed 0..``--seeds``-1 one run of ``GMM()`` (K the
number of classes) for ``--rounds`` EM rounds (11 releases of 10 rounds: the ``init`` phase
and one ``em`` per round) under ``CentralDP(Plaintext(), epsilon, delta=1e-5,
adjacency="record", seed)``, the layer calibrating its noise multiplier to the whole run;
then the same seeds under ``Plaintext()``. The accuracy is the run's (the test set's
clustering accuracy, components matched to classes by the Hungarian assignment). The table
gives the mean over seeds and its standard error; the last line says whether the means are
non-decreasing in epsilon, and which steps are not.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from algorithms.gmm import GMM  # noqa: E402
from secagg import CentralDP, Federation, Plaintext  # noqa: E402
from secagg.data import Dataset, Partition, iid_split, load_dataset, make_split  # noqa: E402

EPSILONS = (0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0)


def blobs() -> Partition:
    """The blobs of ``tests/test_gmm.py``: 300 training records over 5 IID clients."""
    from sklearn.datasets import make_blobs

    x, y = make_blobs(n_samples=400, centers=[[0, 0, 0], [3, 1, 0], [0, 4, 2]],
                      cluster_std=[0.6, 0.9, 0.7], random_state=0)
    x = (x - x.min(0)) / (x.max(0) - x.min(0))
    ds = Dataset("blobs", x[:300].astype(np.float32), y[:300], x[300:].astype(np.float32),
                 y[300:], 3, (3,))
    return iid_split(ds, n_clients=5, seed=0)


def run_one(dataset: str, eps: float | None, seed: int, rounds: int) -> float:
    """The clustering accuracy of one run (``eps`` None: plaintext)."""
    part = blobs() if dataset == "blobs" else make_split(
        load_dataset("digits"), "dirichlet", 10, alpha=0.5, seed=seed, local_test_fraction=0.2)
    layer = Plaintext() if eps is None else CentralDP(
        Plaintext(), epsilon=eps, delta=1e-5, adjacency="record", seed=seed)
    res = Federation(GMM(), layer, part, rounds=rounds, seed=seed, progress=False).run()
    return float(res.accuracy)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", choices=("blobs", "digits"), default="blobs")
    p.add_argument("--seeds", type=int, default=20, help="seeds 0..N-1 (%(default)s)")
    p.add_argument("--rounds", type=int, default=10, help="EM rounds (%(default)s)")
    p.add_argument("--eps", type=float, nargs="+", default=list(EPSILONS))
    p.add_argument("--out", type=Path, default=None, help="also write the table here")
    args = p.parse_args(argv)

    t0, c0 = time.perf_counter(), time.process_time()
    lines = [f"GMM under record-level CentralDP (delta 1e-5), {args.dataset}, {args.rounds} "
             f"EM rounds, seeds 0-{args.seeds - 1}",
             "command: python benchmarks/gmm_noise.py " + " ".join(sys.argv[1:] if argv is None
                                                                    else argv),
             f"{'epsilon':>10} {'mean acc':>9} {'stderr':>7} {'min':>6} {'max':>6}"]
    means = []
    for eps in [*sorted(args.eps), None]:
        accs = np.array([run_one(args.dataset, eps, s, args.rounds) for s in range(args.seeds)])
        se = float(accs.std(ddof=1) / math.sqrt(len(accs))) if len(accs) > 1 else 0.0
        label = "plaintext" if eps is None else f"{eps:g}"
        lines.append(f"{label:>10} {accs.mean():9.3f} {se:7.3f} {accs.min():6.3f} "
                     f"{accs.max():6.3f}")
        print(lines[-1], flush=True)
        if eps is not None:
            means.append((eps, float(accs.mean())))
    drops = [f"{a:g} -> {b:g} ({ma:.3f} -> {mb:.3f})"
             for (a, ma), (b, mb) in zip(means, means[1:]) if mb < ma]
    lines.append("non-decreasing in epsilon: " + ("yes" if not drops else
                                                  "NO, falls at " + "; ".join(drops)))
    lines.append(f"time: {time.perf_counter() - t0:.0f} s wall, "
                 f"{time.process_time() - c0:.0f} s CPU")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
