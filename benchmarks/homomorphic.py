"""Homomorphic layer vs raw TenSEAL vs SecureSum, side by side on the same uploads.

For uploads of 10^3, 10^5 and 10^6 values (one float64 field, |x| <= 1) from a few clients,
prints per implementation: bytes on the wire per value (one client's upload), client encrypt
time per upload, server add time per upload, decrypt time, and the ratio of this layer to
raw TenSEAL calls on the same chunks with the same parameters (``ts.ckks_vector`` /
``ts.bfv_vector`` on the same vectors, serialize, load against the public context, ``add_``,
decrypt). Times are CPU seconds (``time.process_time``, single-threaded contexts), the
median of ``--repeats`` runs (more for small uploads, see :func:`repeats_for`), with layer
and raw runs interleaved. Targets (issue 5): layer / raw <= 1.2 in time and bytes, and
slot utilisation >= 95% for uploads of more than one ciphertext.

SecureSum rows (``secagg.secure_sum``) come from its ledger: bytes are everything one client
sends over the whole protocol, per value; "encrypt" is the clients' CPU per client, "add" the
server's CPU per client, decrypt is n/a (unmasking is in the server's time).

Usage: python benchmarks/homomorphic.py [--clients 3] [--sizes 1000 100000 1000000]
       [--schemes ckks bfv] [--repeats 1] [--no-secure-sum]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import tenseal as ts

from secagg.homomorphic import Homomorphic
from secagg.homomorphic.keys import KeyHolder
from secagg.homomorphic.packing import Packing
from secagg.layers.base import RoundContext
from secagg.messages import Bound, Field, Upload, UploadSpec


def make_uploads(size: int, n_clients: int, seed: int = 0) -> tuple[UploadSpec, dict[int, Upload]]:
    """One float64 field of ``size`` values per client, bounded by 1 (client adjacency)."""
    spec = UploadSpec((Field("x", (size,), bound=Bound(linf=1.0, adjacency="client"), additive=True),))
    rng = np.random.default_rng(seed)
    ups = {c: Upload.validate(spec, {"x": rng.uniform(-1, 1, size)}, c, 1)
           for c in range(n_clients)}
    return spec, ups


def run_layer(layer: Any, spec: UploadSpec, ups: dict[int, Upload], rnd: int) -> dict[str, float]:
    """Run one aggregate through a secagg layer and read its costs from the ledger."""
    ctx = RoundContext(rnd, "bench", 0)
    layer.aggregate(ups, spec, ctx)
    n = len(ups)
    size = spec.fields[0].size
    rows = [r for r in ctx.ledger.rows if r.stage != "keys"]
    up = [r for r in rows if r.stage == "upload"]
    client_sent = sum(r.wire_bytes for r in rows if isinstance(r.sender, int))
    res = [r for r in rows if r.stage == "result"]
    return {
        "bytes_per_value": (sum(r.wire_bytes for r in up) if res else client_sent) / n / size,
        "encrypt_s": sum(r.client_cpu_s for r in rows if isinstance(r.sender, int)) / n,
        "add_s": sum(r.server_cpu_s for r in rows) / n,
        "decrypt_s": res[0].client_cpu_s if res else float("nan"),
    }


def run_raw(holder: KeyHolder, packing: Packing, flats: list[np.ndarray]) -> dict[str, float]:
    """The same work with bare TenSEAL calls: encrypt chunks, serialize, load, add_, decrypt."""
    scheme = holder.params.scheme
    make = ts.ckks_vector if scheme == "ckks" else ts.bfv_vector
    load = ts.ckks_vector_from if scheme == "ckks" else ts.bfv_vector_from
    client_ctx = ts.context_from(holder.client_context, n_threads=1)
    server_ctx = ts.context_from(holder.public_context, n_threads=1)
    chunks = packing.chunks()
    enc = add = 0.0
    nbytes = 0
    acc: list[Any] = []
    for flat in flats:
        t0 = time.process_time()
        cts = [make(client_ctx, flat[a:b].tolist()).serialize() for a, b in chunks]
        enc += time.process_time() - t0
        nbytes += sum(len(c) for c in cts)
        t0 = time.process_time()
        vecs = [load(server_ctx, c) for c in cts]
        if not acc:
            acc = vecs
        else:
            for x, v in zip(acc, vecs, strict=True):
                x.add_(v)
        add += time.process_time() - t0
    t0 = time.process_time()
    sums = [a.serialize() for a in acc]
    add += time.process_time() - t0
    t0 = time.process_time()
    out = np.concatenate([np.asarray(load(holder._ctx, s).decrypt()) for s in sums])
    dec = time.process_time() - t0
    assert out.shape == (packing.total,)
    n = len(flats)
    return {"bytes_per_value": nbytes / n / packing.total, "encrypt_s": enc / n,
            "add_s": add / n, "decrypt_s": dec}


def median_of(fn: Callable[[int], dict[str, float]], repeats: int) -> dict[str, float]:
    """Median of each metric over ``repeats`` runs."""
    runs = [fn(i) for i in range(repeats)]
    return _medians(runs)


def _medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def repeats_for(size: int, repeats: int) -> int:
    """At least ``repeats``; more for small uploads, whose sub-millisecond timings are
    noisy (about 10^6 values' worth of work per measurement, at most 50 runs)."""
    return max(repeats, min(50, 1_000_000 // max(size, 1)))


def bench_scheme(scheme: str, size: int, n_clients: int, repeats: int) -> list[dict[str, Any]]:
    """Layer and raw TenSEAL rows for one scheme and upload size."""
    spec, ups = make_uploads(size, n_clients)
    layer = Homomorphic(scheme)
    n_plan = layer.planned_clients(n_clients)
    params = layer.params_for(spec, n_plan)
    holder = KeyHolder(params, layer.key_holder)  # a one-off, kept out of the timings
    packing = Packing.from_spec(spec, params.slots)
    fps = layer.fixed_point(spec, n_plan) if scheme == "bfv" else None
    flats = [layer._flatten(ups[c], spec, packing, fps) for c in sorted(ups)]
    mine_runs, raw_runs = [], []
    for i in range(repeats_for(size, repeats)):  # interleaved, so drift hits both alike
        mine_runs.append(run_layer(layer, spec, ups, i))
        raw_runs.append(run_raw(holder, packing, flats))
    mine, raw = _medians(mine_runs), _medians(raw_runs)
    base = {"scheme": scheme, "values": size, "ciphertexts": packing.n_ciphertexts,
            "utilisation": packing.utilisation, "N": params.poly_modulus_degree,
            "coeff_bits": "+".join(map(str, params.coeff_mod_bit_sizes))}
    return [{**base, "impl": "layer", **mine}, {**base, "impl": "raw tenseal", **raw}]


def bench_secure_sum(size: int, n_clients: int, repeats: int) -> dict[str, Any] | None:
    """SecureSum on the same uploads, or None if it is not available."""
    try:
        from secagg.secure_sum import SecureSum
    except ImportError:
        return None
    spec, ups = make_uploads(size, n_clients)
    layer = SecureSum()
    out = median_of(lambda i: run_layer(layer, spec, ups, i), repeats_for(size, repeats))
    return {"scheme": "-", "values": size, "ciphertexts": 0, "utilisation": float("nan"),
            "N": 0, "coeff_bits": "-", "impl": "secure sum", **out}


def _fmt(x: float) -> str:
    return "n/a" if x != x else f"{x:.4f}"


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark and print the table and the layer/raw ratios."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 100_000, 1_000_000])
    ap.add_argument("--schemes", nargs="+", default=["ckks", "bfv"], choices=["ckks", "bfv"])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-secure-sum", action="store_true")
    args = ap.parse_args(argv)

    print(f"clients per aggregate: {args.clients}; CPU seconds; median of "
          + ", ".join(f"{repeats_for(n, args.repeats)} (n={n})" for n in args.sizes))
    head = (f"{'impl':<12} {'scheme':<6} {'values':>8} {'N':>6} {'coeff bits':<11} {'cts':>4} "
            f"{'util':>6} {'B/value':>8} {'enc s':>8} {'add s':>8} {'dec s':>8}")
    print(head)
    print("-" * len(head))
    ratios = []
    for size in args.sizes:
        rows = []
        for scheme in args.schemes:
            pair = bench_scheme(scheme, size, args.clients, args.repeats)
            rows += pair
            mine, raw = pair
            ratios.append((scheme, size, mine["ciphertexts"], mine["utilisation"],
                           {k: mine[k] / raw[k] for k in
                            ("bytes_per_value", "encrypt_s", "add_s", "decrypt_s")},
                           (mine["encrypt_s"] + mine["add_s"] + mine["decrypt_s"] / args.clients)
                           / (raw["encrypt_s"] + raw["add_s"] + raw["decrypt_s"] / args.clients)))
        ss = None if args.no_secure_sum else bench_secure_sum(size, args.clients, args.repeats)
        if ss is not None:
            rows.append(ss)
        for r in rows:
            print(f"{r['impl']:<12} {r['scheme']:<6} {r['values']:>8} {r['N'] or '-':>6} "
                  f"{r['coeff_bits']:<11} {r['ciphertexts'] or '-':>4} "
                  f"{_fmt(r['utilisation']) if r['ciphertexts'] else '-':>6} "
                  f"{r['bytes_per_value']:>8.2f} {_fmt(r['encrypt_s']):>8} {_fmt(r['add_s']):>8} "
                  f"{_fmt(r['decrypt_s']):>8}")
        if ss is None:
            print(f"{'secure sum':<12} n/a (secagg.secure_sum not available or skipped)")
    print()
    print("layer / raw TenSEAL (target <= 1.2; utilisation target >= 0.95 when cts > 1)")
    print(f"{'scheme':<6} {'values':>8} {'cts':>4} {'util':>6} {'bytes':>6} {'enc':>6} "
          f"{'add':>6} {'dec':>6} {'total':>6}")
    for scheme, size, cts, util, r, total in ratios:
        print(f"{scheme:<6} {size:>8} {cts:>4} {util:>6.3f} {r['bytes_per_value']:>6.3f} "
              f"{r['encrypt_s']:>6.2f} {r['add_s']:>6.2f} {r['decrypt_s']:>6.2f} {total:>6.2f}")


if __name__ == "__main__":
    main()
