"""One cross-device round at scale (issue 21, point 1): ``secagg run`` over n clients, all
of them in the round, with its time and memory.

Each configuration runs ``secagg run`` in a fresh process (exactly the command printed on
its line) and samples the memory of its whole process tree every half second from
``/proc``: the resident set (RSS) of the main process, the sum of RSS over the tree, and the
sum of the proportional set size (PSS: a page shared by k processes -- the forked workers
share the parent's pages copy-on-write -- counts 1/k to each), which is the tree's real
footprint. Reported per run: wall seconds, CPU seconds of the tree (user + system, from
the kernel's accounting of the waited-for children), the peaks, the final accuracy and the
round's facts from ``result.json`` (contributors, the client and server CPU seconds the cost
ledger booked, wire bytes per client).

Usage::

    python benchmarks/scale_round.py --clients 10000 --layer secure-sum --workers 2
    python benchmarks/scale_round.py --clients 1000 10000 --layer secure-sum distributed-dp \\
        --workers 1 2 --out benchmarks/results/scale_round.jsonl

Extra ``secagg run`` options go after ``--`` (e.g. ``-- --epsilon 8 --adjacency client
--clip 1.0`` for the DP layer). The data set is Fashion-MNIST split IID (``--alpha 0``),
one round, FedAvg (the CNN ``secagg run`` builds for 1x28x28 images): the workload of the
issue's measurement (30 s per round at 1,000 clients per round; killed after 280 s at a
peak of 14.2 GB with all 10,000 in the round).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import threading
import time

from secagg.cores import available_cores

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _tree(root: int) -> list[int]:
    """``root`` and its descendants (from /proc/*/stat)."""
    parent: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    stat = fh.read()
                parent[int(name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(c for c, pp in parent.items() if pp == p)
    return out


def _memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in kB (0, 0 once it is gone)."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


class Sampler(threading.Thread):
    """Samples the memory of a process tree until stopped."""

    def __init__(self, pid: int, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.pid, self.every = pid, every
        self.peak_main_rss = self.peak_tree_rss = self.peak_tree_pss = 0
        self.max_procs = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            pids = _tree(self.pid)
            mem = [_memory(p) for p in pids]
            self.peak_main_rss = max(self.peak_main_rss, mem[0][0])
            self.peak_tree_rss = max(self.peak_tree_rss, sum(m[0] for m in mem))
            self.peak_tree_pss = max(self.peak_tree_pss, sum(m[1] for m in mem))
            self.max_procs = max(self.max_procs, sum(1 for m in mem if m[0]))
            self._halt.wait(self.every)

    def stop(self) -> None:
        self._halt.set()


def one(clients: int, layer: str, workers: int, extra: list[str], timeout: float,
        keep: str | None) -> dict:
    """One ``secagg run`` in a fresh process, measured."""
    out = keep or tempfile.mkdtemp(prefix="scale-round-")
    argv = [sys.executable, "-m", "secagg.cli", "run", "--algorithm", "fedavg",
            "--dataset", "fashion-mnist", "--clients", str(clients), "--alpha", "0",
            "--rounds", "1", "--layer", layer, "--graph", "auto",
            *(["--workers", str(workers)] if workers else []),  # 0: secagg run's default
            "--out", out, "--force", "--quiet", *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    sampler = Sampler(proc.pid)
    sampler.start()
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        status = "ok" if proc.returncode == 0 else f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        status = f"killed after {timeout:.0f} s"
    wall = time.perf_counter() - t0
    sampler.stop()
    sampler.join()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    rec = {
        "command": shlex.join(["secagg", *argv[3:]]), "clients": clients, "layer": layer,
        "workers": workers or f"default ({available_cores()})", "status": status, "wall_s": round(wall, 1),
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                       1),
        "peak_main_rss_mb": round(sampler.peak_main_rss / 1024),
        "peak_tree_rss_mb": round(sampler.peak_tree_rss / 1024),
        "peak_tree_pss_mb": round(sampler.peak_tree_pss / 1024),
        "processes": sampler.max_procs,
        "load_start": round(load0, 2), "load_end": round(os.getloadavg()[0], 2),
    }
    if status != "ok":
        rec["stderr_tail"] = stderr.strip().splitlines()[-3:]
        return rec
    with open(os.path.join(out, "result.json")) as fh:
        res = json.load(fh)
    costs = res["costs"]
    rec.update(
        accuracy=res["accuracy"], contributors=res["participation"][0][2],
        # what the ledger booked: the clients' own work (training, encoding, protocol) and
        # the server's, measured where each ran (in the workers for the clients' protocol)
        booked_client_cpu_s=round(costs["up"]["client_cpu_s"] + costs["down"]["client_cpu_s"],
                                  1),
        booked_server_cpu_s=round(costs["up"]["server_cpu_s"] + costs["down"]["server_cpu_s"]
                                  + costs["internal"]["server_cpu_s"], 1),
        up_bytes_per_client=round(costs["up"]["wire_bytes"] / clients),
        down_bytes_per_client=round(costs["down"]["wire_bytes"] / clients),
        run_wall_s=round(res["wall_s"], 1))
    return rec


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[10_000])
    p.add_argument("--layer", nargs="+", default=["secure-sum"])
    p.add_argument("--workers", type=int, nargs="+", default=[1],
                   help="0: secagg run's default (the cores this process may use)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run")
    p.add_argument("--out", help="append one JSON line per run to this file")
    a = p.parse_args(argv)
    for clients, layer, workers in itertools.product(a.clients, a.layer, a.workers):
        rec = one(clients, layer, workers, extra, a.timeout, None)
        print(json.dumps(rec), flush=True)
        if a.out:
            with open(a.out, "a") as fh:
                fh.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
