"""Privacy-utility sweep: accuracy vs epsilon under central, distributed and local DP.

Runs (or resumes) a sweep from a TOML config through :func:`secagg.sweep.sweep` and prints,
per algorithm, the non-private accuracy, then per epsilon the central, distributed and
local DP accuracies (mean over seeds), the gaps the issue asks about (non-private minus
central, central minus distributed), which cells used the statistics cache, and the
measured speed-up of the cache: a cached cell is re-run with the cache off and both wall
times are printed.

    python benchmarks/privacy_utility.py                                   # reduced (minutes)
    python benchmarks/privacy_utility.py examples/privacy_utility_fmnist.toml \
        examples/privacy_utility_fmnist_spherefed.toml \
        --reference examples/privacy_utility_fmnist_reference.toml \
        --reference examples/privacy_utility_fmnist_reference_spherefed.toml  # issue 13 pt 4

Outputs (results.jsonl/.csv, plots) go to the config's ``sweep.out`` or ``--out``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from secagg.sweep import Cell, load_config, run_cell, sweep  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _mean(rows: list[dict]) -> float | None:
    return float(np.mean([r["accuracy"] for r in rows])) if rows else None


def _fmt(x: float | None) -> str:
    return "   -  " if x is None else f"{x:.4f}"


def table(rows: list[dict]) -> str:
    """The closing table: per algorithm, accuracy per layer and epsilon, and the gaps."""
    out: list[str] = []
    for algo in sorted({r["algorithm"] for r in rows}):
        mine = [r for r in rows if r["algorithm"] == algo]
        base = _mean([r for r in mine if r["layer"] == "plaintext"])
        ss = _mean([r for r in mine if r["layer"] == "secure-sum"])
        kind = mine[0].get("accuracy_kind", "")
        out.append(f"\n{algo} ({kind} accuracy; mean over "
                   f"{len({r['seed'] for r in mine})} seed(s))")
        out.append(f"  non-private: plaintext {_fmt(base)}, secure-sum {_fmt(ss)}")
        cells: dict[tuple[float, str], list[dict]] = defaultdict(list)
        for r in mine:
            if r.get("epsilon") is not None:
                cells[(r["epsilon"], r["layer"])].append(r)
        eps = sorted({e for e, _ in cells})
        out.append(f"  {'epsilon':>7} | {'central':>7} | {'distrib.':>8} | {'local':>7} | "
                   f"{'np-central':>10} | {'central-distr.':>14} | cache")
        for e in eps:
            c = _mean(cells.get((e, "central-dp"), []))
            d = _mean(cells.get((e, "distributed-dp"), []))
            lo = _mean(cells.get((e, "local-dp"), []))
            gap1 = "" if base is None or c is None else f"{100 * (base - c):+.2f} pt"
            gap2 = "" if c is None or d is None else f"{100 * (c - d):+.2f} pt"
            used = sorted({r["cache"] for k, v in cells.items() if k[0] == e for r in v})
            out.append(f"  {e:>7g} | {_fmt(c):>7} | {_fmt(d):>8} | {_fmt(lo):>7} | "
                       f"{gap1:>10} | {gap2:>14} | {','.join(used)}")
        spent = [r for r in mine if r.get("epsilon_spent") is not None]
        if spent:
            why = sorted({w for r in spent for w in r.get("not_private_reasons", [])})
            out.append("  every DP cell private: " + (
                "yes" if all(r.get("private") for r in spent) else
                f"NO ({len(why)} reason(s)), e.g. {why[0] if why else 'see the rows'}"))
    return "\n".join(out)


def _run(config: str, out: str | None, workers: int | None) -> tuple[Any, Any]:
    """Run (or resume) one sweep and print its header and table."""
    cfg = load_config(config, out)
    t0 = time.perf_counter()
    res = sweep(cfg, workers=workers, progress=None)
    print(f"\n## {config}")
    print(f"sweep: {len(res.rows)} cells ({len(res.ran)} run now, {len(res.skipped)} "
          f"resumed) in {time.perf_counter() - t0:.0f} s; results in {res.jsonl}")
    d = cfg.data
    print(f"data: {d['dataset']}, {d['clients']} clients, alpha {d['alpha']}, local test "
          f"fraction {d.get('local_test_fraction', 0.2)}"
          + (f", first {d['train_limit']} records" if d.get("train_limit") else "")
          + f"; {cfg.rounds} rounds; DP on phases {list(cfg.dp_phases or ['all'])}, "
          f"rounds {cfg.dp_rounds}; adjacency {cfg.adjacency or 'layer default (record)'}; "
          f"algorithm arguments {cfg.algorithm_args or '(defaults)'}")
    print(table(res.rows))
    print("wall time per cell (s, mean): " + ", ".join(
        f"{algo}/{layer} {np.mean([r['wall_s'] for r in res.rows if r['algorithm'] == algo and r['layer'] == layer]):.0f}"  # noqa: E501
        for algo, layer in sorted({(r["algorithm"], r["layer"]) for r in res.rows})))
    return cfg, res


def main(argv: list[str] | None = None) -> int:
    """Run the sweeps, print their tables, the references and the cache's speed-up."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("config", nargs="*", default=[str(ROOT / "examples" /
                                                     "privacy_utility_reduced.toml")])
    p.add_argument("--out", default=None, help="output directory (one config only)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--reference", action="append", default=[], metavar="CONFIG",
                   help="a sweep (e.g. the papers' variants without DP) whose accuracies are "
                        "printed with their difference to the DP cells (repeatable)")
    p.add_argument("--no-speedup", action="store_true",
                   help="skip re-running one cached cell per algorithm with the cache off")
    a = p.parse_args(argv)
    if a.out and len(a.config) > 1:
        p.error("--out takes one config (each config has its own sweep.out)")
    print("# python benchmarks/privacy_utility.py " + " ".join(a.config)
          + "".join(f" --reference {r}" for r in a.reference)
          + (f" --out {a.out}" if a.out else ""))
    runs = [_run(c, a.out, a.workers) for c in a.config]
    rows = [r for _, res in runs for r in res.rows]
    for ref_path in a.reference:
        ref_cfg = load_config(ref_path)
        ref = sweep(ref_cfg, workers=a.workers, progress=None)
        print(f"\nreference: {ref_path} ({ref_cfg.rounds} rounds, local test fraction "
              f"{ref_cfg.data.get('local_test_fraction', 0.2)}, results in {ref.jsonl})")
        for r in sorted(ref.rows, key=lambda r: (r["algorithm"], r["layer"], r["seed"])):
            args = ref_cfg.algorithm_args.get(r["algorithm"], {})
            print(f"  {r['algorithm']} {args or '(defaults)'} {r['layer']} seed {r['seed']}: "
                  f"final {r['accuracy']:.4f} (best round {max(r['history']):.4f}), "
                  f"{r['wall_s']:.0f} s")
            mine = [x for x in rows if x["algorithm"] == r["algorithm"]]
            for layer in ("plaintext", "central-dp", "distributed-dp", "local-dp"):
                for e in sorted({x.get("epsilon") or 0 for x in mine if x["layer"] == layer}):
                    acc = _mean([x for x in mine if x["layer"] == layer
                                 and (x.get("epsilon") or 0) == e])
                    what = layer if layer == "plaintext" else f"{layer} eps {e:g}"
                    print(f"    {what} (above) minus this reference: "
                          f"{100 * (acc - r['accuracy']):+.2f} pt")
    for cfg, res in runs:
        hits = [r for r in res.rows if r["cache"] == "hit"]
        by_cache: dict[str, int] = defaultdict(int)
        for r in res.rows:
            by_cache[r["cache"]] += 1
        print("\ncache use: " + ", ".join(f"{k} {v}" for k, v in sorted(by_cache.items())))
        if hits and not a.no_speedup:
            for algo in sorted({r["algorithm"] for r in hits}):
                r = next(h for h in hits if h["algorithm"] == algo)
                cell = Cell(**{k: r[k] for k in ("algorithm", "layer", "epsilon", "delta",
                                                  "clip", "dropout", "seed")})
                off = run_cell(cfg, cell, "off")
                print(f"cache speed-up, {algo} {cell.layer} eps {cell.epsilon:g}: uncached "
                      f"{off['wall_s']:.1f} s, cached {r['wall_s']:.1f} s -> "
                      f"{off['wall_s'] / max(r['wall_s'], 1e-9):.1f}x (accuracy "
                      f"{off['accuracy']:.4f} uncached vs {r['accuracy']:.4f} cached: fresh "
                      "noise each run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
