"""ValidatedSum's cost per client beside SecureSum's on the same work.

What runs: one round of :func:`secagg.validated_sum.protocol.run_round` (both aggregators
and every client in this process, real messages, one BLAS thread) on n honest clients with
float updates of dimension d at 0.9x the L2 bound, and the SecureSum layer on the same n and
d (``benchmarks/secure_sum.py``'s ``run_ours``: threshold 0.7, 2^-20 precision, 32-bit ring).

Reported per d: client CPU s (mean, upload + proof), each aggregator's CPU s per client
(its whole round divided by n), upload bytes per client (to A + to B) relative to a float32
vector, the exactness of the sum, and SecureSum's client CPU s, server CPU s per client and
upload ratio. The machine's load average is printed: the box is shared, so times are CPU
seconds (``time.process_time``), not wall.

Usage::

    python benchmarks/validated_sum.py                      # d = 1e4, 1e5, 1e6 (n = 100)
    python benchmarks/validated_sum.py --dims 10000 --n 20
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def run_validated(n: int, d: int) -> dict:
    """One validated-sum round of n honest clients at dimension d."""
    from secagg.validated_sum import proof as proofs
    from secagg.validated_sum.protocol import run_round

    params = proofs.Params(d, 1.0)
    rng = np.random.default_rng(0)
    pool = []
    for _ in range(4):
        v = rng.normal(size=d)
        pool.append(v * (0.9 / np.linalg.norm(v)))
    ups = {c: pool[c % 4] for c in range(n)}
    t0 = time.perf_counter()
    res = run_round(ups, params, run_id=os.urandom(16))
    wall = time.perf_counter() - t0
    want = sum(proofs.encode(ups[c], params) for c in range(n)).astype(np.float64) / params.scale
    assert res.accepted == tuple(range(n)), res.rejected
    up = np.mean([a + b for a, b in res.upload_bytes.values()])
    return {
        "client_s": float(np.mean(list(res.client_s.values()))),
        "agg_a_s": res.aggregator_s[0] / n, "agg_b_s": res.aggregator_s[1] / n,
        "up_bytes": float(up), "x_float32": float(up) / (4 * d), "wall_s": wall,
        "exact": bool(np.array_equal(res.total, want)),
        "proof_elems": params.proof_len, "soundness_log2": params.soundness_log2(),
        "wbits": params.wbits, "units": params.units,
    }


def run_secure_sum(n: int, d: int) -> dict:
    """SecureSum on the same n and d."""
    from secure_sum import run_ours  # benchmarks/secure_sum.py

    r = run_ours(n, d, [])
    return {"client_s": r["client_cpu_s"], "server_s_per_client": r["server_cpu_s"] / n,
            "x_float32": r["up_bytes"] / (4 * d)}


def main(argv: list[str] | None = None) -> None:
    """Run the grid and print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--n-large", type=int, default=100,
                    help="clients at d >= 1e6 (per-client figures; memory is n x 16 B x d)")
    ap.add_argument("--no-secure-sum", action="store_true")
    args = ap.parse_args(argv)
    from threadpoolctl import threadpool_limits

    print(f"load average before: {os.getloadavg()}  cores: {os.cpu_count()}")
    print(f"{'d':>9} {'n':>4} | {'client s':>9} {'agg A s/cl':>10} {'agg B s/cl':>10} "
          f"{'up x f32':>8} {'exact':>5} | {'SS client s':>11} {'SS srv s/cl':>11} "
          f"{'SS x f32':>8} | {'log2 err':>8} {'B units':>8}")
    for d in args.dims:
        n = args.n if d < 1_000_000 else args.n_large
        v = run_validated(n, d)
        if args.no_secure_sum:
            s = {"client_s": float("nan"), "server_s_per_client": float("nan"),
                 "x_float32": float("nan")}
        else:
            with threadpool_limits(limits=1, user_api="blas"):
                s = run_secure_sum(n, d)
        print(f"{d:>9,} {n:>4} | {v['client_s']:>9.3f} {v['agg_a_s']:>10.3f} "
              f"{v['agg_b_s']:>10.3f} {v['x_float32']:>8.3f} {str(v['exact']):>5} | "
              f"{s['client_s']:>11.4f} {s['server_s_per_client']:>11.4f} "
              f"{s['x_float32']:>8.3f} | {v['soundness_log2']:>8.2f} {v['units']:>8}",
              flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
