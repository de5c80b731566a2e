"""cProfile of the SecureSum client side: every client step and the encoding booked to it.

Runs :func:`benchmarks.secure_sum.run_ours` (one process, the layer as the benchmark runs it)
with a profiler switched on only around the clients' work -- each call of a client's method
(:func:`secagg.secure_sum.parties.call`) and the fixed-point encoding of its vector
(:class:`secagg.stream.Booked`) -- so the server's work is left out; the profiler's clock is
the process's CPU time. Prints the top lines by own time and by cumulative time.

Usage::

    PYTHONPATH=. python benchmarks/secure_sum_profile.py --n 100 --m 1000000 --dropout 0.1
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def profile_clients(n: int, m: int, dropout: float, top: int = 25) -> str:
    """Profile the client side of one session; return the report text."""
    import secure_sum as bench

    from secagg import stream
    from secagg.secure_sum import parties

    prof = cProfile.Profile(time.process_time)  # CPU time: steadier than wall on a busy box
    orig_call, orig_booked = parties.call, stream.Booked._booked

    def call(client: Any, method: str, arg: Any) -> Any:
        prof.enable()
        try:
            return orig_call(client, method, arg)
        finally:
            prof.disable()

    def booked(self: Any, c: int, up: Any) -> Any:
        prof.enable()
        try:
            return orig_booked(self, c, up)
        finally:
            prof.disable()

    parties.call, stream.Booked._booked = call, booked
    try:
        out = bench.run_ours(n, m, bench._dropped(n, dropout))
    finally:
        parties.call, stream.Booked._booked = orig_call, orig_booked
    buf = io.StringIO()
    buf.write(f"client-side cProfile, n={n} m={m:,} dropout={dropout:.0%} (k={out['k']}, "
              f"t_k={out['share_threshold']}); client CPU mean {out['client_cpu_s']:.4f} s "
              "(not profiled), all clients together under the profiler below, CPU seconds\n")
    for key in ("tottime", "cumulative"):
        st = pstats.Stats(prof, stream=buf)
        st.sort_stats(key).print_stats(top)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--m", type=int, default=1_000_000)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--top", type=int, default=25)
    a = p.parse_args(argv)
    print(profile_clients(a.n, a.m, a.dropout, a.top))


if __name__ == "__main__":
    main()
