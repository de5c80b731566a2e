"""The secure-sum server's two costliest per-client parts at scale, timed alone (CPU s).

* ``unmask``: one UNMASK_RESPONSE of ``--shares`` self-mask shares -- parse, convert to field
  elements, check each share's digest (what :meth:`Server.receive_unmask` does per holder).
* ``decode``: error-correcting reconstruction of ``--owners`` secrets whose holders are each
  owner's ring neighbours (``--k`` of them, 10% gone), the ids a fixed permutation of
  1..``--n`` -- overlapping neighbourhoods as on the SecAgg+ Harary graph; one parity
  polynomial shared by all owners where the tree has
  :class:`~secagg.secure_sum.shamir.ParityPolynomial`, as its server's finish does.

Run it under each tree to compare (same box, back to back)::

    PYTHONPATH=/work/main python benchmarks/secure_sum_server_parts.py
    PYTHONPATH=. python benchmarks/secure_sum_server_parts.py
"""

from __future__ import annotations

import argparse
import random
import time


def unmask(shares: int, repeats: int = 5) -> float:
    """Best CPU seconds of parsing and checking one response of ``shares`` shares."""
    from secagg.secure_sum import shamir, wire
    from secagg.secure_sum import statements as st

    rnd = random.Random(0)
    sess = bytes(16)
    b = {v: [rnd.randrange(shamir.P) for _ in range(3)] for v in range(shares)}
    body = memoryview(wire.unmask_response_body(b, {}))
    digests = {v: st.share_digest(sess, 1, v, 999_999, "b", els) for v, els in b.items()}
    raw_path = hasattr(wire, "parse_unmask_response_raw")
    best = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        for _ in range(100):
            if raw_path:
                raw, _ = wire.parse_unmask_response_raw(body)
                wire.shares_elements(raw)
                ok = all(st.share_digest_raw(sess, 1, u, 999_999, "b", raw[u]) == digests[u]
                         for u in raw)
            else:
                got, _ = wire.parse_unmask_response(body)
                ok = all(st.share_digest(sess, 1, u, 999_999, "b", got[u]) == digests[u]
                         for u in got)
            assert ok
        best = min(best, (time.process_time() - t0) / 100)
    return best


def decode(n: int, k: int, t: int, owners: int) -> tuple[float, int]:
    """(CPU seconds per owner, h of the first owner) of decoding ring-neighbourhood secrets."""
    from secagg.secure_sum import shamir
    from secagg.secure_sum.prg import SeededEntropy

    rnd = random.Random(0)
    perm = list(range(1, n + 1))
    rnd.shuffle(perm)
    cases = []
    for u in range(owners):
        nb = [perm[(u + d) % n] for d in range(-k // 2, k // 2 + 1)]
        xs = sorted(x for x in nb if rnd.random() > 0.1)
        secret = [rnd.randrange(shamir.P) for _ in range(3)]
        cases.append((xs, secret, shamir.share(secret, t, xs, SeededEntropy(u, "s"))))
    kw = {"parity": shamir.ParityPolynomial()} if hasattr(shamir, "ParityPolynomial") else {}
    t0 = time.process_time()
    for xs, secret, shares in cases:
        values, _ = shamir.decode(xs, shares, t, **kw)
        assert values == secret
    return (time.process_time() - t0) / owners, len(cases[0][0])


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shares", type=int, default=115)
    p.add_argument("--n", type=int, default=10_000)
    p.add_argument("--k", type=int, default=126)
    p.add_argument("--t", type=int, default=89)
    p.add_argument("--owners", type=int, default=400)
    a = p.parse_args(argv)
    s = unmask(a.shares)
    print(f"unmask: {s * 1e3:.3f} ms per response of {a.shares} shares "
          f"({s / a.shares * 1e6:.1f} us a share)")
    d, h = decode(a.n, a.k, a.t, a.owners)
    print(f"decode: {d * 1e3:.3f} ms per owner (h ~ {h}, t = {a.t}, {a.owners} owners)")


if __name__ == "__main__":
    main()
