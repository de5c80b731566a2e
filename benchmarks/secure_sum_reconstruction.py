"""The server's secret reconstruction alone: :func:`secagg.secure_sum.shamir.decode` of this
tree against another tree's, on the same shares, in one process (CPU seconds).

Each owner's secret (3 field elements, as a 32-byte key) is shared t-out-of-h among h random
client ids in 1..n (h = 0.9 (k + 1): a SecAgg+ neighbourhood after 10% dropout), and decoded
with the error-correcting path the server uses (one parity polynomial shared by all the
owners where the tree has :class:`~secagg.secure_sum.shamir.ParityPolynomial`, as its
server's finish shares it). The two trees alternate twice.

Usage::

    PYTHONPATH=. python benchmarks/secure_sum_reconstruction.py --other /path/to/main \\
        --n 10000 --k 126 --t 89 --owners 500
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import time
from types import ModuleType

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(path: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--other", required=True, help="root of the tree to compare against")
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--k", type=int, default=126)
    p.add_argument("--t", type=int, default=89)
    p.add_argument("--owners", type=int, default=500)
    a = p.parse_args(argv)
    rel = os.path.join("secagg", "secure_sum", "shamir.py")
    mine = _load(os.path.join(HERE, "..", rel), "shamir_this")
    other = _load(os.path.join(a.other, rel), "shamir_other")
    from secagg.secure_sum.prg import SeededEntropy

    rnd = random.Random(0)
    h = round((a.k + 1) * 0.9)
    cases = []
    for o in range(a.owners):
        xs = sorted(rnd.sample(range(1, a.n + 1), h))
        secret = [rnd.randrange(mine.P) for _ in range(3)]
        cases.append((xs, secret, mine.share(secret, a.t, xs, SeededEntropy(o, "share"))))
    for mod, name in ((other, "other"), (mine, "this"), (other, "other"), (mine, "this")):
        mod.lagrange_at_zero.cache_clear()
        t0 = time.process_time()
        # a tree that shares one parity polynomial over a reconstruction's holder sets (as
        # its server's finish does) gets one here too
        kw = {"parity": mod.ParityPolynomial()} if hasattr(mod, "ParityPolynomial") else {}
        for xs, secret, shares in cases:
            values, _ = mod.decode(xs, shares, a.t, **kw)
            assert values == secret
        print(f"{name:5s} tree: {a.owners} owners, h={h}, t={a.t}: "
              f"{time.process_time() - t0:.2f} CPU s", flush=True)


if __name__ == "__main__":
    main()
