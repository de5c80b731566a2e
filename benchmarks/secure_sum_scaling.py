"""SecureSum at growing cohorts: client CPU, server CPU and bytes per client against n, with
the fitted growth (issue 21, point 4).

What runs: ``secagg.secure_sum.SecureSum`` on one round of m float32 values per client
(``run_ours`` of benchmarks/secure_sum.py: the layer as the engine calls it, the five-stage
protocol with real wire messages, the consistency round, threshold 0.7, precision 2^-20),
on the SecAgg+ graph (``--graph auto``: a k-regular Harary graph at these n, k chosen by
the layer from n), with the given fraction of clients dropping before their masked input
(the stage that forces mask reconstruction). Each n runs in a fresh subprocess so that its
peak resident memory is its own.

Reported per n: k and the share threshold t_k, client CPU s (mean over the clients that
sent their masked input, whole protocol), server CPU s (whole protocol), bytes up and down
per client, wall seconds, the peak RSS of the process, the sum's max error. Then the growth:
the least-squares slope of log(cost) against log(n) over the measured n (1 = linear,
0 = flat), and the same quantities divided by k and by log2(n), to show what the client's
work follows. An n that runs past ``--timeout`` or fails is reported as such, not left out.

Usage::

    python benchmarks/secure_sum_scaling.py                     # n = 100, 1000, 10000
    python benchmarks/secure_sum_scaling.py --n 100 1000 --m 10000 --dropout 0.1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def one(n: int, m: int, dropout: float, graph: str, workers: int = 1, sized: bool = False
        ) -> dict:
    """One cohort size, in this process (called in a fresh subprocess by :func:`main`)."""
    sys.path.insert(0, HERE)
    from secure_sum import _dropped, run_ours  # benchmarks/secure_sum.py

    t0 = time.perf_counter()
    r = run_ours(n, m, _dropped(n, dropout), graph=graph, workers=workers,
                 expect_dropout=dropout if sized else 0.0)
    r["total_wall_s"] = time.perf_counter() - t0
    r["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    # the workers' (forked children) largest peak, beside this process's own
    r["peak_rss_worker_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    r["workers"] = workers
    r.update(n=n, m=m, dropout=dropout)
    return r


def abort_risk(n: int, dropout: float, sized: bool, threshold: float = 0.7
               ) -> tuple[int, int, float]:
    """(k, t_k, P(abort)) of the graph the layer builds at n: the plain automatic degree, or
    (``sized``) the one sized for ``dropout`` (:func:`secagg.secure_sum.graph.degree_for`);
    P from :func:`secagg.secure_sum.graph.abort_probability` (conservative)."""
    from secagg.secure_sum.graph import (
        abort_probability,
        auto_degree,
        degree_for,
        share_threshold_for,
    )

    k = degree_for(n, threshold, dropout) if sized else auto_degree(n)
    k = min(k, n - 1)
    tk = share_threshold_for(k, threshold, n)
    return k, tk, abort_probability(n, k, tk, dropout)


def sizing_table(ns: list[int], dropout: float, corrupt: list[float], sized: bool) -> None:
    """Print k and t_k by the rule the layer uses beside the SecAgg+ sizing of Bell et al.
    (:func:`secagg.secure_sum.graph.secagg_plus_sizing`) for each corrupt fraction."""
    from secagg.errors import ConfigurationError
    from secagg.secure_sum.graph import secagg_plus_sizing

    print(f"\nk / t_k at {dropout:.0%} dropout: the layer's rule (threshold 0.7"
          + (", degree sized for the dropout" if sized else ", automatic degree")
          + ") beside Bell et al.'s sizing (2^-40 security against a malicious server with "
          "the corrupt clients, 2^-20 correctness, union bounds over the n clients; "
          "corrupt clients counted as dropping):")
    print(f"  {'n':>6s}  {'layer rule':>12s}  "
          + "  ".join(f"{f'corrupt {c:.0%}':>14s}" for c in corrupt))
    for n in ns:
        k, tk, _ = abort_risk(n, dropout, sized)
        cells = []
        for c in corrupt:
            try:
                z = secagg_plus_sizing(n, dropout, c)
                cells.append(f"{f'{z.k} / {z.share_threshold}':>14s}")
            except ConfigurationError:
                cells.append(f"{'complete':>14s}")
        print(f"  {n:6,d}  {f'{k} / {tk}':>12s}  " + "  ".join(cells))


def slope(ns: list[int], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(n)."""
    return float(np.polyfit(np.log(ns), np.log(ys), 1)[0])


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[100, 1000, 10_000])
    p.add_argument("--m", type=int, default=10_000)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--graph", default="auto", help="auto | harary | complete (%(default)s)")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per n")
    p.add_argument("--workers", type=int, default=1,
                   help="processes the clients' work is spread over (%(default)s)")
    p.add_argument("--sized", action="store_true",
                   help="SecureSum(dropout=--dropout): the degree sized for the dropout rate")
    p.add_argument("--corrupt", type=float, nargs="*", default=[0.0, 0.05, 0.1],
                   help="corrupt fractions for the Bell et al. sizing shown beside the rule "
                   "the layer uses (%(default)s)")
    p.add_argument("--json", help="also write the results to this file")
    a = p.parse_args(argv)
    print(f"SecureSum scaling: m={a.m:,} float32 per client, {a.dropout:.0%} dropout before the "
          f"masked input, graph={a.graph}, threshold 0.7, precision 2^-20, "
          f"{a.workers} worker process(es) for the clients"
          + (", degree sized for the dropout (SecureSum(dropout=...))" if a.sized else ""))
    print(f"{'n':>6s} {'graph':>8s} {'k':>4s} {'t_k':>4s} {'client CPU s':>13s} "
          f"{'server CPU s':>13s} {'up B/client':>12s} {'down B/client':>14s} {'wall s':>8s} "
          f"{'peak RSS MB':>12s} {'worker MB':>10s} {'max |err|':>10s}")
    done: list[dict] = []
    for n in a.n:
        cmd = [sys.executable, os.path.abspath(__file__), "--one",
               json.dumps([n, a.m, a.dropout, a.graph, a.workers, a.sized])]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            print(f"{n:6d}  not measured: over --timeout {a.timeout:.0f} s")
            continue
        if proc.returncode != 0:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1][:150]
            print(f"{n:6d}  not measured: exit {proc.returncode} ({tail})")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        done.append(r)
        print(f"{n:6d} {r['graph']:>8s} {r['k']:4d} {r['share_threshold']:4d} "
              f"{r['client_cpu_s']:13.4f} {r['server_cpu_s']:13.2f} {r['up_bytes']:12,.0f} "
              f"{r['down_bytes']:14,.0f} {r['total_wall_s']:8.1f} {r['peak_rss_mb']:12.0f} "
              f"{r.get('peak_rss_worker_mb', 0):10.0f} "
              f"{r['max_abs_err']:10.1e}", flush=True)
    print("\nabort risk of the graph at this dropout (a live client left with fewer than t_k "
          "live in its closed neighbourhood; hypergeometric, see abort_probability):")
    for n in a.n:
        k, tk, prob = abort_risk(n, a.dropout, a.sized)
        print(f"  n={n:6,d}: k={k}, t_k={tk}: P(abort) ~ {prob:.2e}")
    if a.corrupt:
        sizing_table(a.n, a.dropout, a.corrupt, a.sized)
    if len(done) >= 2:
        ns = [r["n"] for r in done]
        print(f"\ngrowth over n = {', '.join(f'{x:,}' for x in ns)} "
              "(least-squares slope of log cost on log n; 1 = linear in n, 0 = flat):")
        for key, name in (("client_cpu_s", "client CPU"), ("server_cpu_s", "server CPU"),
                          ("up_bytes", "bytes up per client"),
                          ("down_bytes", "bytes down per client"), ("k", "k (neighbours)")):
            print(f"  {name:22s} slope {slope(ns, [float(r[key]) for r in done]):6.3f}")
        print("  for comparison, log2(n) itself has slope "
              f"{slope(ns, [math.log2(x) for x in ns]):.3f} over these n")
        print("\nper neighbour and per log2(n):")
        for r in done:
            print(f"  n={r['n']:6,d}: client CPU / k = {r['client_cpu_s'] / r['k'] * 1e3:.3f} ms, "
                  f"client CPU / log2 n = {r['client_cpu_s'] / math.log2(r['n']) * 1e3:.3f} ms, "
                  f"server CPU / n = {r['server_cpu_s'] / r['n'] * 1e3:.3f} ms, "
                  f"server CPU / (n k) = {r['server_cpu_s'] / (r['n'] * r['k']) * 1e6:.2f} us")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(done, fh, indent=1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--one":
        n, m, dropout, graph, workers, sized = json.loads(sys.argv[2])
        print(json.dumps(one(n, m, dropout, graph, workers, sized), default=float))
    else:
        main()
