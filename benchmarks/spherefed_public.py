"""SphereFed-FFC on a public (seeded, never-trained) body, full Fashion-MNIST (issue 13, pt 4).

100 clients (Dirichlet alpha 0.1, split seed = run seed), one round: the ``center`` and
``ffc`` releases are the whole run, so a DP layer's (epsilon, delta) is the run's guarantee
(record-level adjacency). Each cell is one :class:`~secagg.federation.Federation` run of
``SphereFed(body="public", feature_dim=D, channels=(C1, C2), lam="auto")`` under

* ``plaintext``: ``Plaintext()``
* ``central``: ``CentralDP(Plaintext(), epsilon=1, delta=1e-5)``
* ``distributed``: ``DistributedDP(SecureSum(), epsilon=1, delta=1e-5)`` (threshold 0.7)
* ``distributed90``: ``DistributedDP(SecureSum(threshold=0.9), epsilon=1, delta=1e-5)``
* ``local``: ``LocalDP(Plaintext(), epsilon=1, delta=1e-5)``

    python benchmarks/spherefed_public.py run OUT.jsonl plaintext,central,distributed,local 32,64:64:0
    python benchmarks/spherefed_public.py table OUT.jsonl

``run`` appends one JSON line per cell (accuracy, wall time, the noise on V and the floor
``lam="auto"`` used, the ledger's epsilon); ``table`` prints mean accuracies per
configuration and the gaps plaintext - central and central - distributed.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from algorithms.spherefed import SphereFed  # noqa: E402
from secagg.data import dirichlet_split, load_dataset  # noqa: E402
from secagg.federation import Federation  # noqa: E402
from secagg.layers.plaintext import Plaintext  # noqa: E402
from secagg.privacy.layers import CentralDP, DistributedDP, LocalDP  # noqa: E402
from secagg.secure_sum import SecureSum  # noqa: E402

EPS, DELTA = 1.0, 1e-5
LAYERS = {
    "plaintext": lambda: Plaintext(),
    "central": lambda: CentralDP(Plaintext(), epsilon=EPS, delta=DELTA),
    "distributed": lambda: DistributedDP(SecureSum(), epsilon=EPS, delta=DELTA),
    "distributed90": lambda: DistributedDP(SecureSum(threshold=0.9), epsilon=EPS, delta=DELTA),
    "local": lambda: LocalDP(Plaintext(), epsilon=EPS, delta=DELTA),
}


def run(out: str, layers: list[str], specs: list[str]) -> None:
    """Run the cells ``specs`` ("C1,C2:D:SEED") under ``layers``; append rows to ``out``."""
    torch.set_num_threads(1)
    ds = load_dataset("fashion-mnist")
    for spec in specs:
        ch, d, seed = spec.split(":")
        channels = tuple(int(c) for c in ch.split(","))
        part = dirichlet_split(ds, 100, alpha=0.1, seed=int(seed))
        for name in layers:
            algo = SphereFed(body="public", feature_dim=int(d), channels=channels, lam="auto")
            res = Federation(algo, LAYERS[name](), part, rounds=1, seed=int(seed),
                             progress=False).run()
            row = {"channels": list(channels), "d": int(d), "seed": int(seed), "layer": name,
                   "accuracy": res.accuracy, "before_ffc": algo.accuracy_before_ffc,
                   "wall_s": round(res.wall_s, 1), **algo.ffc_solve_info,
                   "epsilon": None if res.privacy is None else res.privacy.epsilon(DELTA),
                   "events": None if res.privacy is None else len(res.privacy.events)}
            print(json.dumps(row), flush=True)
            with open(out, "a") as fh:
                fh.write(json.dumps(row) + "\n")


def table(path: str) -> None:
    """Mean accuracy, seeds and mean wall time per configuration and layer; each gap is the
    mean over the seeds both of its layers ran."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    acc: dict[tuple, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    wall: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        key = (tuple(r["channels"]), r["d"])
        acc[key][r["layer"]][r["seed"]] = r["accuracy"]
        wall[key][r["layer"]].append(r["wall_s"])
    names = [n for n in LAYERS if any(n in acc[k] for k in acc)]

    def gap(a: dict[int, float], b: dict[int, float]) -> str:
        common = sorted(a.keys() & b.keys())
        if not common:
            return "-"
        return f"{100 * np.mean([a[s] - b[s] for s in common]):+.2f} (n={len(common)})"

    print("| channels | d | " + " | ".join(names)
          + " | plain - central (points) | central - distributed (points) |")
    print("|---" * (len(names) + 4) + "|")
    for key in sorted(acc):
        a = acc[key]
        cells = [f"{np.mean(list(a[n].values())):.4f} (n={len(a[n])}, "
                 f"{np.mean(wall[key][n]):.0f} s)" if n in a else "-" for n in names]
        g1 = gap(a["plaintext"], a["central"]) if "plaintext" in a and "central" in a else "-"
        g2 = gap(a["central"], a["distributed"]) if "central" in a and "distributed" in a \
            else "-"
        print(f"| {key[0]} | {key[1]} | " + " | ".join(cells) + f" | {g1} | {g2} |")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "table":
        table(sys.argv[2])
    elif len(sys.argv) >= 5 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3].split(","), sys.argv[4:])
    else:
        sys.exit(__doc__)
