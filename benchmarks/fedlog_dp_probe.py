"""Why FedLog with one record-level DP release (``release_rounds=1``, epsilon 1) scores above
the same run without DP (issue 25, point 4; ``benchmarks/results/cross_device_dp.txt``).

The probe runs FedLog on the plaintext layer and changes only the server's solve of round
0's exact statistics S, one variant per run (``--variant``):

* ``exact``: the plaintext solve of S (the no-DP row).
* ``shrink``: S through :func:`~algorithms.fedlog_solver.shrink_statistics` at the DP run's
  noise std sigma, with no noise added (is it the DP solve's shrinkage?).
* ``noise``: S plus seeded Gaussian noise of std sigma per entry, then the shrinkage (the
  DP solve, reproduced with a known draw: ``--draw`` picks it).
* ``noise-counts``: noise on the count column only; ``noise-feats``: on the feature sums only.
* ``center``: the exact head with its class-mean row removed (predictions unchanged: the
  softmax ignores a row added to every class).
* ``scale=K``: the exact head times K (a lower softmax temperature, same predictions).
* ``iso=K``: the exact head's class-centred rows C = U S V^T replaced by K U V^T (every
  singular value set to K: the same span, perfectly conditioned; predictions change), a
  test of the head's conditioning at a chosen norm.

and ``dp``: the real central-DP run (CentralDP(Plaintext()), record level, epsilon 1). Each
run appends one JSON line: the variant, the seed, the accuracy after round 1 (head on the
seeded untrained bodies) and round 2 (after one epoch of personalisation against the
frozen head), and the head's geometry (see :func:`head_geometry`).

    PYTHONPATH=. python benchmarks/fedlog_dp_probe.py OUT.jsonl --seed S --variant V [--draw D]
    PYTHONPATH=. python benchmarks/fedlog_dp_probe.py --table OUT.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from algorithms.base import Aggregate  # noqa: E402
from algorithms.fedlog import FedLog, _StatsPhase  # noqa: E402
from algorithms.fedlog_solver import shrink_statistics, solve_map  # noqa: E402
from algorithms.moments import dp_sum_sigma  # noqa: E402


def head_geometry(eta: np.ndarray) -> dict[str, float]:
    """What the softmax sees of a head: the norm of the class-mean row (ignored by the
    softmax), the mean norm of the class-centred rows (the inverse temperature), their mean
    pairwise cosine, and the spread of their singular values (largest / smallest non-zero)."""
    w = np.asarray(eta, dtype=np.float64)
    mean = w.mean(axis=0)
    c = w - mean
    norms = np.linalg.norm(c, axis=1)
    u = c / np.maximum(norms[:, None], 1e-300)
    cos = u @ u.T
    k = len(w)
    off = (cos.sum() - np.trace(cos)) / (k * (k - 1))
    sv = np.linalg.svd(c, compute_uv=False)
    sv = sv[sv > 1e-12 * sv[0]]
    return {"mean_row_norm": float(np.linalg.norm(mean)),
            "centred_row_norm": float(norms.mean()), "centred_cos": float(off),
            "sv_ratio": float(sv[0] / sv[-1]) if len(sv) else float("nan")}


class FedLogProbe(FedLog):
    """FedLog whose server solve applies one probe variant (module docstring) to the exact
    statistics of a plaintext run; ``sigma`` is the DP run's noise std per entry."""

    def __init__(self, variant: str = "exact", sigma: float = 0.0, draw: int = 0,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.variant, self.sigma, self.draw = variant, float(sigma), int(draw)
        self.geometry: list[dict[str, float]] = []

    def phases(self, round: int, rounds: int) -> Any:
        out = super().phases(round, rounds)
        return [_ProbeStats(self, p.round) if isinstance(p, _StatsPhase) else p for p in out]

    def transform(self, stats: np.ndarray) -> np.ndarray:
        """The variant's statistics (before the solve)."""
        v, s = self.variant, self.sigma
        rng = np.random.default_rng([self.seed, self.draw, 7])
        noise = rng.normal(0.0, s, stats.shape)
        if v in ("exact", "center") or v.startswith(("scale=", "iso=")):
            return stats
        if v == "shrink":
            return shrink_statistics(stats, s, self.feature_bound).stats
        if v == "noise":
            return shrink_statistics(stats + noise, s, self.feature_bound).stats
        if v == "noise-counts":
            noise[:, 1:] = 0.0
            return shrink_statistics(stats + noise, s, self.feature_bound).stats
        if v == "noise-feats":
            noise[:, 0] = 0.0
            return shrink_statistics(stats + noise, s, self.feature_bound).stats
        raise ValueError(f"unknown variant {v!r}")

    def post(self, eta: np.ndarray) -> np.ndarray:
        """The variant's change to the solved head."""
        v = self.variant
        if v == "center":
            return eta - eta.mean(axis=0)
        if v.startswith("scale="):
            return eta * float(v.split("=", 1)[1])
        if v.startswith("iso="):
            k = float(v.split("=", 1)[1])
            mean = eta.mean(axis=0)
            u, _, vt = np.linalg.svd(eta - mean, full_matrices=False)
            return mean + k * (u @ vt)
        return eta


class _ProbeStats(_StatsPhase):
    name: ClassVar[str] = "stats"

    def server_step(self, aggregate: Aggregate) -> None:
        a: FedLogProbe = self.algo  # type: ignore[assignment]
        if dp_sum_sigma(aggregate.notes, "stats") > 0:  # the real DP run: FedLog's own step
            super().server_step(aggregate)
        else:
            stats = a.transform(np.asarray(aggregate["stats"], dtype=np.float64))
            a.eta = a.post(solve_map(stats, float(stats[:, 0].sum())).eta)
        a.geometry.append(head_geometry(a.eta))


def main(argv: list[str]) -> None:
    from secagg import CentralDP, Plaintext
    from secagg.data import dirichlet_split, load_dataset
    from secagg.federation import Federation

    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variant", default="exact")
    p.add_argument("--draw", type=int, default=0)
    p.add_argument("--sigma", type=float, default=None,
                   help="noise std per entry (default: the eps-1 central run's plan)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    ds = load_dataset("fashion-mnist")
    part = dirichlet_split(ds, 100, 0.5, seed=a.seed, local_test_fraction=0.2)
    kw = dict(local_epochs=1, release_rounds=1)

    def dp_layer() -> Any:
        return CentralDP(Plaintext(), epsilon=1.0, delta=1e-5, adjacency="record",
                         rounds=2)

    sigma = a.sigma
    if sigma is None:
        plan = Federation(FedLogProbe(**kw), dp_layer(), part, rounds=2, seed=a.seed,
                          progress=False).plan()
        sigma = float(plan[0].sigma)
    layer = dp_layer() if a.variant == "dp" else Plaintext()
    algo = FedLogProbe(variant=a.variant, sigma=sigma, draw=a.draw, **kw)
    t0, c0 = time.time(), time.process_time()
    res = Federation(algo, layer, part, rounds=2, seed=a.seed, progress=False).run()
    row = {"variant": a.variant, "seed": a.seed, "draw": a.draw, "sigma": sigma,
           "history": [round(h, 4) for h in res.history], "geometry": algo.geometry[0],
           "command": "PYTHONPATH=. python benchmarks/fedlog_dp_probe.py " + " ".join(argv),
           "cpu_s": round(time.process_time() - c0, 1), "wall_s": round(time.time() - t0, 1)}
    print(json.dumps(row), flush=True)
    with open(a.out, "a") as fh:
        fh.write(json.dumps(row) + "\n")


def table(path: str) -> str:
    """Per variant: mean round-1 and round-2 accuracy over seeds (and draws), the paired
    gap to ``exact`` and the head geometry."""
    rows = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["variant"]].append(r)
    ref = {r["seed"]: r for r in by.get("exact", [])}
    out = ["| variant | runs | round 1 % | round 2 % | round 2 - exact (points, per run) "
           "| centred row norm | centred cos | sv ratio | mean row norm |",
           "|---" * 9 + "|"]
    for v, rs in by.items():
        r1 = 100 * np.mean([r["history"][0] for r in rs])
        r2 = 100 * np.mean([r["history"][1] for r in rs])
        gaps = [100 * (r["history"][1] - ref[r["seed"]]["history"][1]) for r in rs
                if r["seed"] in ref]
        g = {k: np.mean([r["geometry"][k] for r in rs]) for k in rs[0]["geometry"]}
        gap = (f"{np.mean(gaps):+.2f} ({', '.join(f'{x:+.2f}' for x in gaps)})"
               if gaps else "-")
        out.append(f"| {v} | {len(rs)} | {r1:.2f} | {r2:.2f} | {gap} | "
                   f"{g['centred_row_norm']:.3g} | {g['centred_cos']:.3f} | "
                   f"{g['sv_ratio']:.3g} | {g['mean_row_norm']:.3g} |")
    return "\n".join(out)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--table":
        print(table(sys.argv[2]))
    else:
        main(sys.argv[1:])
