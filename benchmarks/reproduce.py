"""Reproduction benchmark for the seed algorithms (issue 6, acceptance 6).

Runs, on one data set split Dirichlet(alpha) over K clients, for every alpha and seed:

* CCVR over FedAvg  -> rows "FedAvg" (accuracy just before calibration) and "FedAvg+CCVR";
* SphereFed          -> rows "FedAvg+SphereFed" (fixed classifier, before FFC) and
  "SphereFed+FFC";
* FedProx, FedUV, FedLog (personalized: mean local test accuracy);
* TurboSVM-FL and FedAvg with 1 local epoch of plain SGD -> rounds to a target accuracy.

Every run goes through the Plaintext layer (the secure layers give the same numbers, see
tests/test_additive_layers.py) and reports the uplink bytes per client per round from the
cost ledger (one-off calibration uploads amortised over the rounds; the training-only figure
is printed beside it). It prints one table, then the papers' directions and whether they held.

The default is a reduced configuration that runs on two CPU cores in minutes:
``python benchmarks/reproduce.py``. The issue's configuration is e.g.
``--subsample 1 --rounds 50 --seeds 0 1 2 --local-epochs 2``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from algorithms.ccvr import CCVR  # noqa: E402
from algorithms.fedavg import FedAvg  # noqa: E402
from algorithms.fedlog import FedLog  # noqa: E402
from algorithms.fedprox import FedProx  # noqa: E402
from algorithms.feduv import FedUV  # noqa: E402
from algorithms.spherefed import SphereFed  # noqa: E402
from algorithms.turbosvm import TurboSVM  # noqa: E402
from secagg.data import Dataset, Partition, dirichlet_split, load_dataset  # noqa: E402
from secagg.errors import SecaggError  # noqa: E402
from secagg.federation import Federation, Result  # noqa: E402
from secagg.layers.plaintext import Plaintext  # noqa: E402

ROWS = ("FedAvg", "FedAvg+CCVR", "FedAvg+SphereFed", "SphereFed+FFC", "FedProx", "FedUV",
        "FedLog (personalized)")


@dataclass
class Cell:
    """Measurements of one table row for one alpha (one entry per seed)."""

    acc: list[float] = field(default_factory=list)
    up_bytes: list[float] = field(default_factory=list)
    up_train_bytes: list[float] = field(default_factory=list)
    rounds_to_target: list[float] = field(default_factory=list)


def subsample(ds: Dataset, fraction: float, test_size: int | None, seed: int) -> Dataset:
    """A class-stratified random fraction of the training set and at most ``test_size``
    test samples (the whole data set when ``fraction >= 1`` and no test size is given)."""
    rng = np.random.default_rng(seed)

    def pick(y: np.ndarray, k: int) -> np.ndarray:
        if k >= len(y):
            return np.arange(len(y))
        idx = []
        for c in np.unique(y):
            pos = np.flatnonzero(y == c)
            idx.append(rng.choice(pos, size=max(1, round(k * len(pos) / len(y))), replace=False))
        return np.sort(np.concatenate(idx))

    tr = pick(ds.y_train, int(round(fraction * len(ds.y_train))))
    te = pick(ds.y_test, test_size if test_size else len(ds.y_test))
    return Dataset(ds.name, ds.x_train[tr], ds.y_train[tr], ds.x_test[te], ds.y_test[te],
                   ds.n_classes, ds.input_shape)


def upload_per_client_round(res: Result, n_clients: int, phase: str | None = None) -> float:
    """Uplink wire bytes per client per round (all phases unless ``phase`` is given)."""
    total = res.costs.total(direction="up", phase=phase)["wire_bytes"]
    return total / (n_clients * res.rounds)


def rounds_to(history: Sequence[float], target: float) -> float:
    """First 1-based round whose accuracy reaches ``target`` (inf if none)."""
    for i, a in enumerate(history):
        if a >= target:
            return float(i + 1)
    return float("inf")


def fmt(values: Sequence[float], pct: bool = True, cap: int = 0) -> str:
    """``mean +- std`` (percent for accuracies); runs that never reached a target (inf)
    are shown as ``>cap`` and counted."""
    if not values:
        return "-"
    v = np.asarray(values, dtype=float)
    if np.isinf(v).any():
        finite = v[np.isfinite(v)]
        if not finite.size:
            return f">{cap}"
        return f"{finite.mean():.1f} ({np.isinf(v).sum()}x >{cap})"
    k = 100.0 if pct else 1.0
    return f"{k * v.mean():.1f}+-{k * v.std():.1f}"



@dataclass
class Grid:
    """The runs of one (alpha, seed) cell of the grid, recording into ``cells``/``turbo``."""

    args: argparse.Namespace
    part: Partition
    alpha: float
    seed: int
    cells: dict[tuple[str, float], Cell]
    turbo: dict[tuple[str, float], Cell]

    def runs(self) -> list[tuple[str, Callable[[], None]]]:
        """(name, run) pairs in table order."""
        return [("FedAvg+CCVR", self.ccvr), ("SphereFed+FFC", self.sphere),
                ("FedProx", self.prox), ("FedUV", self.uv), ("FedLog (personalized)", self.fedlog),
                ("TurboSVM-FL", self.lazy)]

    def cell(self, name: str) -> Cell:
        """The row ``name`` at this alpha."""
        return self.cells.setdefault((name, self.alpha), Cell())

    def run(self, algo: object, rounds: int | None = None) -> Result:
        """One Federation run through the Plaintext layer."""
        return Federation(algo, Plaintext(), self.part, rounds=rounds or self.args.rounds,
                          seed=self.seed, progress=False).run()

    def record(self, name: str, acc: float, res: Result, train_only: bool = False) -> None:
        """Store one accuracy and the run's upload bytes per client per round."""
        c, k = self.cell(name), self.args.clients
        c.acc.append(acc)
        # Algorithms without a "train" phase (FedLog) upload only their statistics.
        train = upload_per_client_round(res, k, "train") or upload_per_client_round(res, k)
        c.up_bytes.append(train if train_only else upload_per_client_round(res, k))
        c.up_train_bytes.append(train)

    def ccvr(self) -> None:
        """FedAvg training then CCVR: two rows from one run."""
        a = CCVR(local_epochs=self.args.local_epochs, lr=self.args.lr)
        res = self.run(a)
        assert a.accuracy_before_calibration is not None
        self.record("FedAvg", a.accuracy_before_calibration, res, train_only=True)
        self.record("FedAvg+CCVR", res.accuracy, res)

    def sphere(self) -> None:
        """SphereFed training then FFC: two rows from one run."""
        a = SphereFed(local_epochs=self.args.local_epochs, lr=self.args.sphere_lr)
        res = self.run(a)
        assert a.accuracy_before_ffc is not None
        self.record("FedAvg+SphereFed", a.accuracy_before_ffc, res, train_only=True)
        self.record("SphereFed+FFC", res.accuracy, res)

    def prox(self) -> None:
        """FedProx (mu = 0.01)."""
        res = self.run(FedProx(mu=0.01, local_epochs=self.args.local_epochs, lr=self.args.lr))
        self.record("FedProx", res.accuracy, res)

    def uv(self) -> None:
        """FedUV with the paper's weights."""
        res = self.run(FedUV(local_epochs=self.args.local_epochs, lr=self.args.lr))
        self.record("FedUV", res.accuracy, res)

    def fedlog(self) -> None:
        """FedLog (personalized; its own local optimiser settings)."""
        res = self.run(FedLog(local_epochs=self.args.local_epochs))
        self.record("FedLog (personalized)", res.accuracy, res)

    def lazy(self) -> None:
        """FedAvg and TurboSVM-FL with 1 local epoch of plain SGD: rounds to the target."""
        lr = self.args.turbo_lr
        for name, algo in (("FedAvg (E=1, SGD)", FedAvg(local_epochs=1, lr=lr, momentum=0.0)),
                           ("TurboSVM-FL (E=1)", TurboSVM(lr=lr))):
            res = self.run(algo, self.args.turbo_rounds)
            c = self.turbo.setdefault((name, self.alpha), Cell())
            c.acc.append(res.accuracy)
            c.rounds_to_target.append(rounds_to(res.history, self.args.target))
            c.up_bytes.append(upload_per_client_round(res, self.args.clients))
            c.up_train_bytes.append(c.up_bytes[-1])


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments, run the grid, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.1, 0.5])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--local-epochs", type=int, default=2)
    ap.add_argument("--subsample", type=float, default=0.1,
                    help="fraction of the training set used (stratified)")
    ap.add_argument("--test-size", type=int, default=2000, help="global test samples (0 = all)")
    ap.add_argument("--local-test-fraction", type=float, default=0.15,
                    help="each client's held-out share, for FedLog's personalized accuracy")
    ap.add_argument("--turbo-rounds", type=int, default=15)
    ap.add_argument("--target", type=float, default=0.70)
    ap.add_argument("--lr", type=float, default=0.05, help="local SGD lr (CE methods)")
    ap.add_argument("--sphere-lr", type=float, default=0.5, help="local SGD lr for SphereFed")
    ap.add_argument("--turbo-lr", type=float, default=0.05,
                    help="plain-SGD lr of the 1-epoch runs (TurboSVM-FL and its FedAvg)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip", nargs="*", default=[], help="row names to skip")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    t0 = time.perf_counter()
    base = load_dataset(args.dataset)
    cells: dict[tuple[str, float], Cell] = {}
    turbo: dict[tuple[str, float], Cell] = {}
    failures: list[str] = []
    for alpha in args.alphas:
        for seed in args.seeds:
            ds = subsample(base, args.subsample, args.test_size or None, seed)
            part = dirichlet_split(ds, args.clients, alpha, seed=seed,
                                   local_test_fraction=args.local_test_fraction)
            grid = Grid(args, part, alpha, seed, cells, turbo)
            for name, fn in grid.runs():
                if name in args.skip:
                    continue
                t = time.perf_counter()
                try:
                    fn()
                    status = "ok"
                except SecaggError as exc:  # a failed run is reported, the grid goes on
                    status = f"FAILED: {exc}"
                    failures.append(f"alpha={alpha} seed={seed} {name}: {exc}")
                print(f"  alpha={alpha} seed={seed} {name}: {time.perf_counter() - t:.1f}s "
                      f"{status}", file=sys.stderr, flush=True)

    print_table(args, cells, turbo, time.perf_counter() - t0)
    for f in failures:
        print(f"run failed (not in the table): {f}")
    return 1 if failures else 0


def print_table(args: argparse.Namespace, cells: dict[tuple[str, float], Cell],
                turbo: dict[tuple[str, float], Cell], wall: float) -> None:
    """The one results table, then the papers' directions checked against it."""
    alphas = args.alphas
    print(f"\n{args.dataset}: {args.clients} clients, Dirichlet alpha in {alphas}, "
          f"{args.rounds} rounds x {args.local_epochs} local epochs, subsample "
          f"{args.subsample}, seeds {args.seeds}; CPU ({args.threads} thread), "
          f"{wall / 60:.1f} min")
    head = f"{'method':<24}" + "".join(f"{'acc% a=' + str(a):>16}" for a in alphas)
    head += f"{'up B/client/rnd':>17}{'(training only)':>17}"
    print(head)
    print("-" * len(head))

    def line(name: str, c_of: Callable[[float], Cell | None], extra: str = "") -> None:
        cs = [c_of(a) for a in alphas]
        acc = "".join(f"{fmt(c.acc) if c else '-':>16}" for c in cs)
        some = next((c for c in cs if c), None)
        up = f"{np.mean(some.up_bytes):>17,.0f}{np.mean(some.up_train_bytes):>17,.0f}" if some else ""
        print(f"{name:<24}{acc}{up}{extra}")

    for name in ROWS:
        line(name, lambda a, n=name: cells.get((n, a)))
    if turbo:
        print(f"\nrounds to {100 * args.target:.0f}% (of {args.turbo_rounds}), lazy clients, "
              "1 local epoch of plain SGD")
        for name in ("FedAvg (E=1, SGD)", "TurboSVM-FL (E=1)"):
            cs = [turbo.get((name, a)) for a in alphas]
            r = "".join(f"{fmt(c.rounds_to_target, False, args.turbo_rounds) if c else '-':>16}" for c in cs)
            acc = "  final acc% " + " / ".join(fmt(c.acc) for c in cs if c)
            some = next((c for c in cs if c), None)
            up = f"{np.mean(some.up_bytes):>17,.0f}" if some else ""
            print(f"{name:<24}{r}{up}{acc}")

    print("\ndirections from the papers (checked on the means above, not forced):")

    def mean(name: str, a: float) -> float | None:
        c = cells.get((name, a))
        return float(np.mean(c.acc)) if c and c.acc else None

    def say(text: str, ok: bool | None) -> None:
        print(f"  [{'holds' if ok else 'n/a' if ok is None else 'does NOT hold'}] {text}")

    lo, hi = min(alphas), max(alphas)
    for cal, basename in (("FedAvg+CCVR", "FedAvg"), ("SphereFed+FFC", "FedAvg+SphereFed")):
        g = {a: (mean(cal, a), mean(basename, a)) for a in (lo, hi)}
        ok = None
        if all(x is not None and y is not None for x, y in g.values()) and lo != hi:
            ok = (g[lo][0] - g[lo][1]) > (g[hi][0] - g[hi][1])
        say(f"calibration gain of {cal} over {basename} grows as alpha falls", ok)
    for a in alphas:
        s, f = mean("SphereFed+FFC", a), mean("FedAvg", a)
        say(f"SphereFed+FFC >= FedAvg at alpha={a}", None if s is None or f is None else s >= f)
    u, f = mean("FedUV", lo), mean("FedAvg", lo)
    say(f"FedUV >= FedAvg at alpha={lo}", None if u is None or f is None else u >= f)
    for a in alphas:
        t, f = turbo.get(("TurboSVM-FL (E=1)", a)), turbo.get(("FedAvg (E=1, SGD)", a))
        ok = None
        if t and f and np.isfinite(t.rounds_to_target).any():
            ok = np.mean(t.rounds_to_target) < np.mean(f.rounds_to_target)
        say(f"TurboSVM-FL reaches {100 * args.target:.0f}% in fewer rounds than FedAvg "
            f"at alpha={a}", ok)
    fl, fa = cells.get(("FedLog (personalized)", lo)), cells.get(("FedAvg", lo))
    ok = None if not (fl and fa) else np.mean(fl.up_train_bytes) <= np.mean(fa.up_bytes) / 10
    say("FedLog's upload <= 1/10 of FedAvg's", ok)


if __name__ == "__main__":
    raise SystemExit(main())
