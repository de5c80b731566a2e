"""How FedLog's defaults under record-level DP were chosen (issue 25, point 3).

Everything here is measured on *validation* records: each client of the README sweep's
partition (digits, 10 clients, Dirichlet 0.5, local test fraction 0.2, split seed = run
seed) keeps three quarters of its training records for the statistics and holds out the
other quarter to score the head; the local test sets the sweep reports are never read.
Each cell is one real run, ``Federation(FedLog(release_rounds=1, ...), layer, partition,
rounds=1, seed=seed)``: the seeded untrained body's statistics, released once through the
layer, solved by the server (posterior-mean shrinkage, exact MAP), scored on the held-out
records. The layers carry a noise seed (``draw``), so each cell is reproducible.

    python benchmarks/fedlog_dp_defaults.py run OUT.jsonl [SEEDS] [DRAWS]
    python benchmarks/fedlog_dp_defaults.py table OUT.jsonl
    python benchmarks/fedlog_dp_defaults.py split
    python benchmarks/fedlog_dp_defaults.py spread

``run`` appends one JSON line per cell; ``table`` prints the mean validation accuracy per
configuration and (layer, epsilon), averaged over seeds and draws. ``split`` is a numpy
simulation of another lever, the budget split between the count column and the feature
sums (the count column scaled by c before the release, so that it gets 1/c of the noise
and the sums a little more; the same guarantee): it re-noises the exact statistics of the
same validation setup with the std the layers calibrate. ``spread`` measures how much one
seed's accuracy moves from one noise draw to the next under the chosen default (central
DP, 10 draws per seed and epsilon, real runs): what separates neighbouring epsilons once a
curve has met plaintext.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from algorithms.fedlog import FedLog, class_statistics  # noqa: E402
from secagg.data import ClientData, Partition, load_dataset, make_split  # noqa: E402
from secagg.engine import ClientState  # noqa: E402
from secagg.federation import Federation  # noqa: E402
from secagg.layers.registry import LayerOptions, make_layer  # noqa: E402

DELTA = 1e-5
EPSILONS = (1.0, 4.0, 16.0, 64.0)
LAYERS = ("central-dp", "distributed-dp", "local-dp")
#: name -> FedLog arguments (all with release_rounds=1)
CONFIGS: dict[str, dict] = {
    "box b=2 (old default)": {"feature_bound": 2.0},
    "box b=0.5": {"feature_bound": 0.5},
    "box b=0.25": {"feature_bound": 0.25},
    "norm R=2": {"feature_norm": 2.0},
    "norm R=4": {"feature_norm": 4.0},
    "norm R=8": {"feature_norm": 8.0},
    "norm R=16": {"feature_norm": 16.0},
    "norm R=8, d=32": {"feature_norm": 8.0, "feature_dim": 32},
    "norm R=8, d=16": {"feature_norm": 8.0, "feature_dim": 16},
}


def validation_partition(seed: int) -> Partition:
    """The sweep's partition for ``seed`` with each client's local test set replaced by a
    quarter of its training records (fixed by the seed); the local test sets are dropped."""
    ds = load_dataset("digits")
    part = make_split(ds, "dirichlet", 10, alpha=0.5, seed=seed, local_test_fraction=0.2)
    rng = np.random.default_rng(1000 + seed)
    clients = []
    for c in part:
        order = rng.permutation(len(c.y))
        k = len(c.y) // 4
        held, kept = order[:k], order[k:]
        clients.append(ClientData(c.id, c.x[kept], c.y[kept], c.x[held], c.y[held]))
    return Partition(ds, clients, scheme="dirichlet-validation", params={"seed": seed})


def run(out: str, seeds: list[int], draws: int) -> None:
    """Every configuration x (plaintext, every DP layer x epsilon) x seed x noise draw."""
    torch.set_num_threads(1)
    for seed in seeds:
        part = validation_partition(seed)
        for name, args in CONFIGS.items():
            cells = [("plaintext", None, 0)] + [(layer, eps, draw) for layer in LAYERS
                                               for eps in EPSILONS for draw in range(draws)]
            for layer_name, eps, draw in cells:
                dp = {} if eps is None else {"seed": 7919 * seed + draw}
                layer = make_layer(layer_name, LayerOptions(
                    threshold=0.7, epsilon=eps, delta=DELTA, dp=dp))
                algo = FedLog(release_rounds=1, **args)
                res = Federation(algo, layer, part, rounds=1, seed=seed,
                                 progress=False).run()
                row = {"config": name, "seed": seed, "layer": layer_name, "epsilon": eps,
                       "draw": draw, "accuracy": res.accuracy,
                       "sigma": 0.0 if algo.shrinkage is None else algo.shrinkage.sigma,
                       "record_l2": algo.record_l2()}
                with open(out, "a") as fh:
                    fh.write(json.dumps(row) + "\n")
            print(f"seed {seed} {name}: done", flush=True)


def table(path: str) -> None:
    """Mean validation accuracy per configuration and cell (over seeds and draws)."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    acc: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    seeds: dict[str, set[int]] = defaultdict(set)
    bound: dict[str, float] = {}
    for r in rows:
        key = "plaintext" if r["epsilon"] is None else f"{r['layer']} {r['epsilon']:g}"
        acc[r["config"]][key].append(r["accuracy"])
        seeds[r["config"]].add(r["seed"])
        bound[r["config"]] = r["record_l2"]
    cols = ["plaintext"] + [f"{layer} {e:g}" for layer in LAYERS for e in EPSILONS]
    print("| configuration | record L2 bound | seeds | "
          + " | ".join(c.replace("-dp", "") for c in cols) + " |")
    print("|---|---:|---:|" + "---:|" * len(cols))
    for name in CONFIGS:
        if name not in acc:
            continue
        cells = [f"{np.mean(acc[name][c]):.3f}" if acc[name][c] else "-" for c in cols]
        print(f"| {name} | {bound[name]:.2f} | {len(seeds[name])} | " + " | ".join(cells)
              + " |")


def _noise_ratio(layer_name: str, eps: float) -> float:
    """The layer's calibrated noise std on the released sum per unit of record bound (one
    real run at the default bound; the ratio does not depend on the bound)."""
    part = validation_partition(0)
    algo = FedLog(release_rounds=1)
    layer = make_layer(layer_name, LayerOptions(threshold=0.7, epsilon=eps, delta=DELTA,
                                                dp={"seed": 1}))
    Federation(algo, layer, part, rounds=1, seed=0, progress=False).run()
    assert algo.shrinkage is not None
    return algo.shrinkage.sigma / algo.record_l2()


def split(seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5), draws: int = 8) -> None:
    """Count-column scale c in (1, 2, 4, 8) with feature norm 8: mean validation accuracy
    per (layer, epsilon), simulated (see the module docstring)."""
    from algorithms.fedlog_solver import _box_mean, _positive_count_mean, solve_map

    torch.set_num_threads(1)
    radius = 8.0
    cells = [(layer, eps) for layer in LAYERS for eps in (1.0, 2.0, 4.0, 16.0)]
    ratios = {cell: _noise_ratio(*cell) for cell in cells}
    data = []
    for seed in seeds:
        part = validation_partition(seed)
        algo = FedLog(release_rounds=1, feature_norm=radius)
        states = [ClientState(c) for c in part]
        algo.setup(part.dataset, states, seed)
        stats = sum(class_statistics(algo.client_features(s), s.data.y, 10) for s in states)
        val = [(algo.client_features(ClientState(ClientData(s.id, s.data.x_test,
                                                            s.data.y_test), s.state)),
                s.data.y_test) for s in states]
        data.append((stats, val))
    rng = np.random.default_rng(0)
    print("| count scale c | " + " | ".join(f"{la.replace('-dp', '')} {e:g}"
                                            for la, e in cells) + " |")
    print("|---:|" + "---:|" * len(cells))
    for c in (1.0, 2.0, 4.0, 8.0):
        means = []
        for cell in cells:
            sigma = ratios[cell] * math.sqrt(c * c + radius * radius)
            accs = []
            for stats, val in data:
                for _ in range(draws):
                    noise = rng.normal(0.0, sigma, stats.shape)
                    noised = stats + noise
                    noised[:, 0] = stats[:, 0] + noise[:, 0] / c
                    n_hat = _positive_count_mean(noised[:, 0], sigma / c)
                    xbar = noised[:, 1:] / n_hat[:, None]
                    mu = _box_mean(xbar, (sigma / n_hat)[:, None] * np.ones_like(xbar), radius)
                    shrunk = n_hat[:, None] * np.concatenate([np.ones((10, 1)), mu], axis=1)
                    eta = solve_map(shrunk, float(n_hat.sum())).eta
                    accs.append(np.mean([np.mean(np.argmax(phi @ eta[:, 1:].T + eta[:, 0], 1)
                                                 == y) for phi, y in val]))
            means.append(float(np.mean(accs)))
        print(f"| {c:g} | " + " | ".join(f"{m:.3f}" for m in means) + " |", flush=True)


def spread(seeds: tuple[int, ...] = (0, 1, 2), draws: int = 10) -> None:
    """Per seed, the mean and std over noise draws of the validation accuracy of FedLog's DP
    default (norm 8) under central DP at epsilon 4, 16, 64; then the std of a mean over
    the seeds (the root mean square of the per-seed stds over sqrt(#seeds))."""
    torch.set_num_threads(1)
    print("| seed | plaintext | " + " | ".join(f"central {e:g}: mean, std over draws"
                                            for e in (4.0, 16.0, 64.0)) + " |")
    print("|---:|---:|---:|---:|---:|")
    sds: dict[float, list[float]] = defaultdict(list)
    for seed in seeds:
        part = validation_partition(seed)
        plain = Federation(FedLog(release_rounds=1, feature_norm=8.0), make_layer(
            "plaintext"), part, rounds=1, seed=seed, progress=False).run().accuracy
        cells = []
        for eps in (4.0, 16.0, 64.0):
            accs = []
            for draw in range(draws):
                layer = make_layer("central-dp", LayerOptions(
                    epsilon=eps, delta=DELTA, dp={"seed": 104729 * seed + draw}))
                accs.append(Federation(FedLog(release_rounds=1, feature_norm=8.0), layer,
                                       part, rounds=1, seed=seed, progress=False).run().accuracy)
            sds[eps].append(float(np.std(accs)))
            cells.append(f"{np.mean(accs):.3f}, {np.std(accs):.4f}")
        print(f"| {seed} | {plain:.3f} | " + " | ".join(cells) + " |", flush=True)
    print("std of a mean over the seeds: " + ", ".join(
        f"epsilon {e:g}: {math.sqrt(np.mean(np.square(v)) / len(v)):.4f}"
        for e, v in sds.items()))


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "run":
        run(sys.argv[2], [int(s) for s in (sys.argv[3] if len(sys.argv) > 3
                                           else "0,1,2,3,4,5").split(",")],
            int(sys.argv[4]) if len(sys.argv) > 4 else 2)
    elif cmd == "table":
        table(sys.argv[2])
    elif cmd == "split":
        split()
    elif cmd == "spread":
        spread()
    else:
        sys.exit(__doc__)
