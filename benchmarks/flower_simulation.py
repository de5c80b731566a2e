"""FedAvg on Flower's simulation engine vs secagg's embedded engine: seconds per round (issue 21,
point 5).

    PYTHONPATH=. nice -n 10 python benchmarks/flower_simulation.py \\
        --out benchmarks/results/flower_simulation.txt
    PYTHONPATH=. python benchmarks/flower_simulation.py --quick   # smoke: 20 clients, 2 rounds

One FedAvg workload, run three ways in one process, one after the other:

* **Flower**: Flower 1.41's own simulation engine, ``flwr.simulation.run_simulation`` on its
  Ray backend, with a plain Flower app: a ``ServerApp`` running Flower's own
  ``flwr.serverapp.strategy.FedAvg`` (``fraction_train=1``, no federated evaluation, weighted
  by ``num-examples``; the model travels as ``ArrayRecord(model.state_dict())``) and a
  ``ClientApp`` whose ``@train`` builds the model, loads the broadcast state dict, trains with
  :func:`algorithms.training.train_local` and replies with its state dict and its record
  count. One ``run_simulation`` (one Ray start) per population size serves every seed.
* **ours** (FedAvg's default): ``secagg.Federation(FedAvg(...), Plaintext(), clients,
  rounds=R, seed=s)``, the embedded engine as a user runs it (its defaults: every upload
  validated against its spec, the cost ledger and the transcript kept, every client's
  statement signed with its Ed25519 key). FedAvg trains the cohort in batched chunks
  (:func:`algorithms.batched.train_batched`: the stacked clients' models step together),
  which reproduces ``train_local`` client by client up to float32 rounding; it leaves the
  CNN to the per-client loop (batched convolutions were measured no faster on CPU), so
  with ``--model cnn`` "ours" is the loop and ``--no-loop`` avoids running it twice.
* **ours, loop** (``FedAvg(batched=False)``): the same engine, each client trained by
  ``train_local`` one after the other, exactly as the Flower ClientApp trains it: the engine
  alone differs from Flower, not the training.

The same work on every side:

* Fashion-MNIST (``secagg.data.load_dataset("fashion-mnist")``: 60,000 training and 10,000
  test images), split once per population by ``dirichlet_split(alpha=--alpha, seed=
  --split-seed)``; client ``i`` of Flower is partition ``i`` (its ``partition-id``);
* the same model and initial weights: ``--model mlp`` (default) is the toolkit's small MLP
  (:func:`algorithms.models.MLP` on the flattened image, hidden 64, features 32, 52,650
  parameters; :class:`MLPFedAvg` of ``benchmarks/cross_device_dp.py``), ``--model cnn`` the
  toolkit's CNN (:func:`algorithms.models.CNN`, 5x5 convolutions of 16 and 32 channels,
  features 128, 80,202 parameters), both initialised by ``torch.manual_seed(derive_seed(seed,
  "init"))`` as ``FedAvg.setup`` does;
* the same local training: one epoch of SGD (FedAvg's defaults: lr 0.05, momentum 0.9,
  batch 32), batch order seeded by ``derive_seed(seed, round, client)`` on both sides, so each
  client takes exactly the same ceil(n_k / 32) steps on the same batches;
* every client trains every round (full participation), the server takes the weighted mean
  sum(n_k w_k) / sum(n_k) (Flower: its FedAvg; ours: ``weighted_params`` and ``n`` summed);
* one torch thread per training process: each of Flower's 2 Ray actors (``client_resources
  = {"num_cpus": 1, "num_gpus": 0}`` on ``ray.init(num_cpus=2)``: 2 clients train at once,
  one per core) and our one process (``torch.set_num_threads(1)``; the embedded engine is one
  process, and 2 intra-op threads made its small steps slower on the shared 2 cores).

Measured, per side and round: wall seconds and CPU seconds from the end of one evaluation of
the global model to the end of the next (so a round is broadcast, local training, upload,
aggregation and the evaluation on the global test set; the evaluation is the same function
on both sides, :func:`algorithms.training.accuracy`, and its own seconds are printed apart).
Round 1 starts at Flower's evaluation of the initial model (its ``evaluate_fn`` at round 0)
and at our engine's first broadcast. The start-up before that (Ray's start, the actors, the
ServerApp; our engine's setup, key generation) is reported apart, not in the rounds. Flower's
CPU seconds are those of the whole process tree (this process, Ray's GCS, raylet and the
worker processes, read from ``/proc``); ours are this process's. Printed: seconds per round
(mean of rounds 2..R, the steady state, and of all R), the ratio Flower / ours, the accuracy
after each round and the final accuracy gap with its band over the seeds.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))  # an installed package named ``benchmarks`` shadows
#                                               this folder as a package

from cross_device_dp import MLPFedAvg  # noqa: E402

from algorithms.fedavg import FedAvg  # noqa: E402
from algorithms.models import SplitModel, n_params  # noqa: E402
from algorithms.training import accuracy, train_local  # noqa: E402
from secagg import Federation, Plaintext  # noqa: E402
from secagg.data import Dataset, Partition, dirichlet_split, load_dataset  # noqa: E402
from secagg.federation import derive_seed  # noqa: E402

#: local training, identical on every side (FedAvg's defaults, one epoch)
LOCAL = {"epochs": 1, "lr": 0.05, "momentum": 0.9, "batch_size": 32}


# -- the workload ------------------------------------------------------------------------------
def make_algorithm(model: str, batched: bool | None) -> FedAvg:
    """Our FedAvg on ``model`` (``"mlp"``: :class:`MLPFedAvg`; ``"cnn"``: FedAvg's default for
    1x28x28 images) with :data:`LOCAL`'s training."""
    kw = {"local_epochs": LOCAL["epochs"], "lr": LOCAL["lr"], "momentum": LOCAL["momentum"],
          "batch_size": LOCAL["batch_size"], "batched": batched}
    return MLPFedAvg(**kw) if model == "mlp" else FedAvg(**kw)


def build(model: str, dataset: Dataset) -> SplitModel:
    """The model (random initial weights from torch's global generator)."""
    return make_algorithm(model, None).build_model(dataset)


def initial_model(model: str, dataset: Dataset, seed: int) -> SplitModel:
    """The global model before round 1: what ``FedAvg.setup(seed)`` builds."""
    torch.manual_seed(derive_seed(seed, "init"))
    return build(model, dataset)


def partition(args: argparse.Namespace, n: int) -> Partition:
    """The clients of one population size (the same on every side)."""
    return dirichlet_split(load_dataset("fashion-mnist"), n, args.alpha, seed=args.split_seed)


# -- clocks ------------------------------------------------------------------------------------
_TICK = os.sysconf("SC_CLK_TCK")


def own_cpu() -> float:
    """User + system CPU seconds of this process (all its threads), as /proc counts them."""
    t = os.times()
    return t.user + t.system


def tree_cpu_seconds(root: int | None = None) -> float:
    """User + system CPU seconds of process ``root`` (default: this one) and all its living
    descendants, from ``/proc`` (Ray's GCS, raylet and workers are started below this
    process)."""
    root = os.getpid() if root is None else root
    stats: dict[int, tuple[int, float]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                s = f.read()
        except OSError:
            continue
        rest = s[s.rindex(")") + 2:].split()  # fields after the command name
        stats[int(d)] = (int(rest[1]), (int(rest[11]) + int(rest[12])) / _TICK)
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            total += stats[pid][1]
        todo.extend(children.get(pid, []))
    return total


@dataclass
class Clock:
    """Wall and CPU readings at the start of round 1 and after each evaluation."""

    cpu: Callable[[], float]
    marks: list[tuple[float, float]] = field(default_factory=list)  # (wall, cpu)
    eval_s: list[float] = field(default_factory=list)  # wall seconds of each evaluation

    def mark(self) -> None:
        """Read both clocks now."""
        self.marks.append((time.perf_counter(), self.cpu()))

    def rounds(self) -> tuple[list[float], list[float]]:
        """Wall and CPU seconds of each round (between consecutive marks)."""
        w = [b[0] - a[0] for a, b in zip(self.marks, self.marks[1:])]
        c = [b[1] - a[1] for a, b in zip(self.marks, self.marks[1:])]
        return w, c


@dataclass
class Run:
    """One side's run of one population and seed."""

    acc: list[float] = field(default_factory=list)  # after each round
    wall: list[float] = field(default_factory=list)  # seconds of each round
    cpu: list[float] = field(default_factory=list)
    eval_s: list[float] = field(default_factory=list)
    startup_wall: float = 0.0
    startup_cpu: float = 0.0


# -- ours --------------------------------------------------------------------------------------
def run_ours(args: argparse.Namespace, part: Partition, seed: int, batched: bool) -> Run:
    """FedAvg + Plaintext in ``secagg.Federation`` (the embedded engine)."""
    algo = make_algorithm(args.model, None if batched else False)
    clock = Clock(cpu=time.process_time)
    evaluate, phases = algo.evaluate, algo.phases

    def timed_evaluate(dataset, clients):  # the engine's evaluation after each round
        t = time.perf_counter()
        acc = evaluate(dataset, clients)
        clock.eval_s.append(time.perf_counter() - t)
        clock.mark()
        return acc

    def timed_phases(r: int, rounds: int):  # round 1 starts at its first broadcast
        out = phases(r, rounds)
        if r == 0 and not clock.marks:
            for ph in out:
                bcast = ph.broadcast

                def first_broadcast(bcast=bcast):
                    if not clock.marks:
                        clock.mark()
                    return bcast()

                ph.broadcast = first_broadcast
        return out

    algo.evaluate, algo.phases = timed_evaluate, timed_phases  # this instance only
    t, c = time.perf_counter(), time.process_time()
    res = Federation(algo, Plaintext(), part, rounds=args.rounds, seed=seed,
                     progress=False).run()
    if algo.clamped:
        raise RuntimeError(f"{algo.clamped} parameters were clamped to +-{algo.param_bound}: "
                           "the two sides would then differ in what they average")
    out = Run(acc=[float(a) for a in res.history], eval_s=clock.eval_s,
              startup_wall=clock.marks[0][0] - t, startup_cpu=clock.marks[0][1] - c)
    out.wall, out.cpu = clock.rounds()
    return out


# -- Flower ------------------------------------------------------------------------------------
def worker_cache() -> dict:
    """A dict that lives as long as the process calling it. Flower's Ray backend unpickles the
    ClientApp afresh for every message (``ClientAppActor.run`` calls the app loader each time),
    so a cache in its closure would be empty at every call and each client would reload the
    data set; a Flower app keeps such state in module globals (its module is imported once per
    worker), which is what this gives a function pickled from ``__main__``."""
    mod = sys.modules.setdefault("_flower_simulation_cache",
                                 types.ModuleType("_flower_simulation_cache"))
    return mod.__dict__.setdefault("cache", {})


def run_flower(args: argparse.Namespace, n: int, seeds: list[int]) -> tuple[dict[int, Run], dict]:
    """Every seed of population ``n`` in one ``run_simulation`` (one Ray start). Returns the
    runs by seed and the start-up (seconds from ``run_simulation`` to round 1 of the first
    seed, wall and process-tree CPU)."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg as FlowerFedAvg
    from flwr.simulation import run_simulation

    model_name, alpha, split_seed = args.model, args.alpha, args.split_seed

    client = ClientApp()

    @client.train()
    def _train(msg: Message, context: Context) -> Message:
        torch.set_num_threads(1)
        cache = worker_cache()
        if cache.get("key") != (n, alpha, split_seed):
            cache["part"] = dirichlet_split(load_dataset("fashion-mnist"), n, alpha,
                                            seed=split_seed)
            cache["key"] = (n, alpha, split_seed)
        part = cache["part"]
        data = part[int(context.node_config["partition-id"])]
        cfg = msg.content["config"]
        seed, rnd = int(cfg["seed"]), int(cfg["server-round"]) - 1
        model = build(model_name, part.dataset)
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        train_local(model, data.x, data.y, epochs=LOCAL["epochs"],
                    batch_size=LOCAL["batch_size"], lr=LOCAL["lr"],
                    momentum=LOCAL["momentum"], seed=derive_seed(seed, rnd, data.id))
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                   "metrics": MetricRecord({"num-examples": len(data.y)})}),
                       reply_to=msg)

    out: dict[int, Run] = {}
    startup: dict = {}
    server = ServerApp()
    t0, c0 = time.perf_counter(), tree_cpu_seconds()

    @server.main()
    def _main(grid: Grid, context: Context) -> None:
        dataset = load_dataset("fashion-mnist")
        model = build(model_name, dataset)
        for seed in seeds:
            print(f"  flower n={n} seed {seed} ...", file=sys.stderr, flush=True)
            clock = Clock(cpu=tree_cpu_seconds)
            run = Run()
            strategy = FlowerFedAvg(fraction_train=1.0, fraction_evaluate=0.0,
                                    min_train_nodes=n, min_available_nodes=n)

            def evaluate(rnd: int, arrays: ArrayRecord, run=run, clock=clock) -> MetricRecord:
                t = time.perf_counter()
                model.load_state_dict(arrays.to_torch_state_dict())
                acc = float(accuracy(model, dataset.x_test, dataset.y_test))
                if rnd > 0:
                    run.acc.append(acc)
                    clock.eval_s.append(time.perf_counter() - t)
                clock.mark()
                if not startup:
                    startup.update(wall=clock.marks[0][0] - t0, cpu=clock.marks[0][1] - c0)
                return MetricRecord({"accuracy": acc})

            init = initial_model(model_name, dataset, seed)
            strategy.start(grid, ArrayRecord(init.state_dict()), num_rounds=args.rounds,
                           train_config=ConfigRecord({"seed": seed}), evaluate_fn=evaluate)
            run.wall, run.cpu = clock.rounds()
            run.eval_s = clock.eval_s
            out[seed] = run
        # Ray's processes' CPU so far (they are gone once run_simulation returns)
        startup["children_cpu"] = tree_cpu_seconds() - own_cpu()

    logging.getLogger("flwr").setLevel(logging.WARNING)
    run_simulation(server, client, num_supernodes=n,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": args.cpus,
                                                 "include_dashboard": False}},
                   verbose_logging=False)
    missing = [s for s in seeds if s not in out or len(out[s].acc) != args.rounds]
    if missing:
        raise RuntimeError(f"Flower simulation returned no complete result for seeds {missing}")
    return out, startup


# -- report ------------------------------------------------------------------------------------
def _mean(xs: list[float]) -> float:
    return float(np.mean(xs)) if xs else float("nan")


def steady(run: Run, key: str) -> list[float]:
    """Rounds 2..R of a run (all of them when there is one round)."""
    xs = getattr(run, key)
    return xs[1:] if len(xs) > 1 else xs


def report(args: argparse.Namespace, n: int, sides: dict[str, dict[int, Run]],
           flower_startup: dict, seeds: list[int]) -> list[str]:
    """The table of one population size."""
    names = list(sides)
    lines = [f"== {n} clients (Dirichlet alpha={args.alpha}, split seed {args.split_seed}), "
             f"seeds {seeds}, {args.rounds} rounds"]
    lines.append(f"{'round':>5} " + " ".join(f"{s + ' s':>16} {s + ' cpu':>16}" for s in names)
                 + " " + " ".join(f"{s + ' acc':>12}" for s in names))
    for r in range(args.rounds):
        cells = []
        for s in names:
            cells.append(f"{_mean([x.wall[r] for x in sides[s].values()]):>16.3f} "
                         f"{_mean([x.cpu[r] for x in sides[s].values()]):>16.3f}")
        accs = [f"{_mean([x.acc[r] for x in sides[s].values()]):>12.4f}" for s in names]
        lines.append(f"{r + 1:>5} " + " ".join(cells) + " " + " ".join(accs))
    lines.append("   (mean over the seeds; wall and CPU seconds of each round, evaluation "
                 "included; accuracy on the 10,000 test images)")
    per = {s: {k: _mean([v for x in sides[s].values() for v in steady(x, k)])
               for k in ("wall", "cpu")} for s in names}
    allr = {s: {k: _mean([v for x in sides[s].values() for v in getattr(x, k)])
                for k in ("wall", "cpu")} for s in names}
    ev = {s: _mean([v for x in sides[s].values() for v in x.eval_s]) for s in names}
    for s in names:
        lines.append(f"   {s}: {per[s]['wall']:.3f} s per round (rounds 2..{args.rounds}), "
                     f"{per[s]['cpu']:.3f} CPU s; all {args.rounds} rounds {allr[s]['wall']:.3f}"
                     f" s, {allr[s]['cpu']:.3f} CPU s; of which the evaluation {ev[s]:.3f} s")
    lines.append(f"   start-up (not in the rounds): flower {flower_startup['wall']:.1f} s wall, "
                 f"{flower_startup['cpu']:.1f} CPU s (Ray, actors, ServerApp, to round 1 of the "
                 "first seed); "
                 + "; ".join(f"{s} {_mean([x.startup_wall for x in sides[s].values()]):.2f} s "
                             f"wall, {_mean([x.startup_cpu for x in sides[s].values()]):.2f} "
                             "CPU s" for s in names if s != "flower"))
    for s in names:
        if s == "flower":
            continue
        rw = per["flower"]["wall"] / per[s]["wall"]
        rc = per["flower"]["cpu"] / per[s]["cpu"]
        ra = allr["flower"]["wall"] / allr[s]["wall"]
        lines.append(f"   RATIO flower / {s}: {rw:.1f}x wall per round (rounds 2..{args.rounds}"
                     f"; {ra:.1f}x over all {args.rounds}), {rc:.1f}x CPU per round "
                     f"({'>=' if rw >= 10 else 'BELOW'} the 10x goal)")
    fl = [sides["flower"][sd].acc[-1] for sd in seeds]
    for s in names:
        if s == "flower":
            continue
        gaps = [100 * (sides[s][sd].acc[-1] - f) for sd, f in zip(seeds, fl)]
        worst = max(abs(g) for g in gaps)
        per_seed = ", ".join(f"seed {sd}: {g:+.2f}" for sd, g in zip(seeds, gaps))
        lines.append(f"   accuracy after round {args.rounds}, {s} - flower: mean "
                     f"{_mean(gaps):+.2f} points, band {min(gaps):+.2f} .. {max(gaps):+.2f} "
                     f"({per_seed}); flower {_mean(fl):.4f}, {s} "
                     f"{_mean([sides[s][sd].acc[-1] for sd in seeds]):.4f} "
                     f"({'within' if worst <= 1.0 else 'NOT within'} 1 point on every seed)")
    return lines


def profile_ours(args: argparse.Namespace, n: int, seed: int) -> list[str]:
    """Where our round's CPU time goes: cProfile (timed by process time) over one run of ``args.rounds`` rounds (after an
    unprofiled warm-up run), cumulative seconds per round of the toolkit's functions and the
    builtins that cost the most (cProfile inflates Python-heavy code; the unprofiled CPU
    seconds per round are printed beside them)."""
    import cProfile
    import pstats

    part = partition(args, n)
    plain = run_ours(args, part, seed, batched=True)
    prof = cProfile.Profile(time.process_time)  # CPU seconds: the load inflates wall time
    prof.enable()
    run_ours(args, part, seed, batched=True)
    prof.disable()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    r = args.rounds
    rows = []
    for (path, line, func), (_, calls, tt, ct, _) in stats.items():
        rel = path.replace(str(ROOT) + os.sep, "")
        if rel.startswith(("secagg", "algorithms")):
            rows.append((ct / r, tt / r, calls / r, f"{rel}:{line}({func})"))
        elif path == "~":
            rows.append((ct / r, tt / r, calls / r, func))
    toolkit = sorted((x for x in rows if not x[3].startswith("<")), reverse=True)[:28]
    builtin = sorted((x for x in rows if x[3].startswith("<")), key=lambda x: -x[1])[:10]
    lines = [f"== where our round goes: {n} clients, seed {seed}, {r} rounds, cProfile "
             f"(unprofiled: {_mean(steady(plain, 'cpu')):.3f} CPU s per round, rounds 2..{r};"
             f" {_mean(plain.cpu):.3f} over all {r}), seconds per round",
             f"{'cumulative':>10} {'own':>8} {'calls':>8}  function"]
    lines += [f"{ct:>10.3f} {tt:>8.3f} {c:>8.1f}  {name}" for ct, tt, c, name in toolkit]
    lines.append("   builtins by own time:")
    lines += [f"{ct:>10.3f} {tt:>8.3f} {c:>8.1f}  {name}" for ct, tt, c, name in builtin]
    return lines


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="FedAvg on Flower 1.41's simulation engine (Ray) vs secagg's embedded "
                    "engine, same clients, model, initial weights and local training; prints "
                    "seconds per round, their ratio and the accuracy after each round.")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 20 clients, 2 rounds, seed 0 (overrides those flags)")
    ap.add_argument("--clients", default="100,1000",
                    help="comma-separated population sizes (default 100,1000)")
    ap.add_argument("--rounds", type=int, default=5, help="rounds (default 5)")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    ap.add_argument("--model", choices=("mlp", "cnn"), default="mlp",
                    help="mlp (default: the toolkit's small MLP) or cnn")
    ap.add_argument("--alpha", type=float, default=1.0, help="Dirichlet alpha (default 1.0)")
    ap.add_argument("--split-seed", type=int, default=0, help="data split seed (default 0)")
    ap.add_argument("--no-loop", action="store_true",
                    help="skip our per-client loop (FedAvg(batched=False))")
    ap.add_argument("--cpus", type=int, default=2, help="CPUs for Ray (default 2)")
    ap.add_argument("--profile", type=int, default=None, metavar="N",
                    help="only profile our side (FedAvg's default) at N clients, first seed")
    ap.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = ap.parse_args(argv)
    if args.quick:
        args.clients, args.rounds, args.seeds = "20", 2, "0"
    pops = [int(x) for x in args.clients.split(",") if x.strip()]
    seeds = [int(x) for x in args.seeds.split(",") if x.strip()]
    torch.set_num_threads(1)
    command = ("python benchmarks/flower_simulation.py "
               + " ".join(sys.argv[1:] if argv is None else argv)).rstrip()
    if args.profile is not None:
        text = "\n".join([f"command: {command}", f"load average at start: {_load()}",
                          *profile_ours(args, args.profile, seeds[0]),
                          f"load average at end: {_load()}"])
        print(text)
        if args.out is not None:
            args.out.write_text(text + "\n")
        return 0

    import flwr
    import ray

    t0 = time.perf_counter()
    ray_cpu = 0.0
    loads = [_load()]
    ds = load_dataset("fashion-mnist")
    ours_names = ["ours"] + ([] if args.no_loop else ["ours-loop"])
    head = [f"FedAvg: Flower {flwr.__version__} simulation engine (Ray {ray.__version__}) vs "
            f"secagg embedded engine, Fashion-MNIST, {args.rounds} rounds, full participation, "
            f"1 local epoch (SGD lr {LOCAL['lr']}, momentum {LOCAL['momentum']}, batch "
            f"{LOCAL['batch_size']})",
            f"command: {command}",
            f"model: {args.model} ({n_params(build(args.model, ds)):,} parameters); "
            "flower: run_simulation, Ray backend, client_resources num_cpus=1 num_gpus=0, "
            f"ray num_cpus={args.cpus}, 1 torch thread per actor; ours: one process, 1 torch "
            "thread; 'ours' = FedAvg's default (batched=None: batched chunks for the MLP, the "
            "per-client loop for the CNN), 'ours-loop' = FedAvg(batched=False)",
            f"machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), "
            f"torch {torch.__version__}, Python {platform.python_version()}, shared with other "
            "jobs (load average below); wall seconds are inflated by the load, CPU seconds "
            "less so", ""]
    body: list[str] = []
    for n in pops:
        part = partition(args, n)
        sides: dict[str, dict[int, Run]] = {"flower": {}}
        for s in ours_names:
            sides[s] = {}
            for seed in seeds:
                print(f"  {s} n={n} seed {seed} ...", file=sys.stderr, flush=True)
                sides[s][seed] = run_ours(args, part, seed, batched=(s == "ours"))
        loads.append(_load())
        sides["flower"], startup = run_flower(args, n, seeds)
        ray_cpu += startup["children_cpu"]
        loads.append(_load())
        body += report(args, n, sides, startup, seeds) + [""]
        print("\n".join(body[-20:]), file=sys.stderr, flush=True)
    body.append(f"load average (1, 5, 15 min) at start, after each side: {' | '.join(loads)}")
    body.append(f"total: {time.perf_counter() - t0:.0f} s wall, {own_cpu() + ray_cpu:.0f} CPU s "
                f"(this process {own_cpu():.0f}, Ray's processes {ray_cpu:.0f})")
    text = "\n".join(head + body)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
