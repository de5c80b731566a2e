"""What a lying client can do to a secure-sum round, and what the checks against it cost.

Two parts, each run in a fresh subprocess per code tree (this branch, and an older tree such
as main's checkout, given with ``--baseline``), with the same process settings (one thread
per BLAS/OpenMP pool, the same seeds):

1. Outcomes. Each client attack of issue 33 (the lying clients of tests/lying_clients.py),
   on the embedded runtime (``run_secure_sum``, n = 10, threshold 7 -- 6 where two liars
   must stay within the decoding bound) and on the Flower runtime (the Flower driver and
   node code over an in-process grid, n = 8, threshold 5): refused / excluded / corrected,
   or the exception that ended the round, and whether the sum is exact.
2. Costs at n = 100, m = 10^5 (complete graph, threshold 0.7, 32-bit ring): bytes up and
   down and CPU seconds per client and the server's CPU seconds per client, honest, on both
   trees; and on this branch with one liar (a wrong unmask response: every share it sends is
   decoded with error correction; a bad integrity tag: the sender dropped and its mask key
   rebuilt).

Usage:
    PYTHONPATH=. python benchmarks/active_adversaries.py --baseline /work/main \
        [--out benchmarks/results/active_adversaries_client.txt]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TESTS = ROOT / "tests"

ATTACKS = [
    # (name, lie, step, liar ids, threshold embedded, needs this branch's signed tag)
    ("bad integrity tag", "bad_tag", "masked_input", [4], 7, False),
    ("tag for another round", "other_round_tag", "masked_input", [4], 7, True),
    ("inconsistent seed commitment", "bad_commitment", "share_keys", [4], 7, False),
    ("one wrong share in a signed ciphertext", "wrong_share_to([5])", "share_keys", [4], 7,
     False),
    ("wrong values in unmask response", "wrong_unmask()", "unmask", [6], 7, False),
    ("unpinned key at advertise (pinned ids)", "unpinned", None, [3], 7, False),
    ("2 colluding unmask liars (within bound)", "wrong_unmask()", "unmask", [1, 8], 6, False),
    ("2 unmask liars on one seed (past bound)", "wrong_unmask({5})", "unmask", [1, 8], 7,
     False),
    ("wrong shares to some peers only", "wrong_share_to([3, 7])", "share_keys", [0], 6, False),
]

WORKER = r'''
import json, sys, time
import numpy as np
import lying_clients as L
import secagg.secure_sum.protocol as protocol
from secagg.dropouts import ScheduledDropouts
from secagg.layers.base import RoundContext
from secagg.secure_sum import run_secure_sum
from secagg.secure_sum.client import Client
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

task = json.loads(sys.argv[1])


def vectors(n, m, bits):
    rng = np.random.default_rng(0)
    return {u: rng.integers(0, 2**bits, m, dtype=np.uint64) for u in range(n)}


def ring_sum(vecs, ids, bits):
    return (sum(vecs[u].astype(object) for u in ids) % (1 << bits)).astype(np.uint64)


class Unpinned(Client):
    def __init__(self, cid, *args, **kwargs):
        super().__init__(cid, *args, **kwargs)
        self._sign = Ed25519PrivateKey.from_private_bytes(b"\x99" * 32)


def liar_class(lie, step):
    if lie == "unpinned":
        return Unpinned
    return L.liar(eval("L." + lie), step)


def install(bad):
    def make(cid, *args, **kwargs):
        return bad.get(cid, Client)(cid, *args, **kwargs)
    protocol.Client = make


def describe(vecs, rep, bits, n):
    exact = bool(np.array_equal(rep.total, ring_sum(vecs, rep.contributors, bits)))
    out = []
    if rep.refused:
        out.append(f"refused at advertise {sorted(rep.refused)}")
    gone = sorted(set(range(n)) - set(rep.contributors) - set(rep.refused))
    if gone:
        out.append(f"excluded (dropped) {gone}")
    faults = getattr(rep, "faults", {})
    named = sorted(set(faults) - set(gone))
    if named:
        out.append(f"named {named}")
    out.append("sum exact" if exact else "SUM WRONG")
    return "; ".join(out)


if task["kind"] == "outcome":
    n, bits = 10, 24
    bad = {u: liar_class(task["lie"], task["step"]) for u in task["liars"]}
    install(bad)
    ids = None
    if task["lie"] == "unpinned":
        ids = {u: Ed25519PrivateKey.from_private_bytes(bytes([u + 1]) * 32) for u in range(n)}
    vecs = vectors(n, 6, bits)
    try:
        rep = run_secure_sum(vecs, bits, RoundContext(round=2, phase="t", seed=0,
                             dropouts=ScheduledDropouts({})), threshold=task["t"],
                             entropy_seed=1, identities=ids)
        print(json.dumps({"outcome": describe(vecs, rep, bits, n)}))
    except Exception as exc:
        print(json.dumps({"outcome": f"round aborted: {type(exc).__name__}: {exc}"[:220]}))

elif task["kind"] == "flower":
    import test_flower_lying_client as F
    from flwr.supercore.task_identity import TaskIdentity
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1

    class Patch:  # the bits of pytest's monkeypatch the runner uses
        def setattr(self, obj, name, value):
            setattr(obj, name, value)

    bad = {u: liar_class(task["lie"], task["step"]) for u in task["liars"]}
    try:
        result, agg = F._flower(Patch(), bad)
        ss = agg.notes["secure_sum"]
        want = F._embedded({"masked-input": [u for u in task["liars"]]}
                           if task["step"] == "masked_input" else None)
        exact = bool(np.array_equal(agg["stats"], want["stats"]))
        out = []
        if ss.get("recovered"):
            out.append(f"excluded (dropped) {ss['recovered']}")
        named = sorted(set(ss.get("faults", {})) - set(ss.get("recovered", [])))
        if named:
            out.append(f"named {named}")
        out.append("sum = embedded engine's" if exact else "SUM DIFFERS")
        print(json.dumps({"outcome": "; ".join(out)}))
    except Exception as exc:
        print(json.dumps({"outcome": f"round aborted: {type(exc).__name__}: {exc}"[:220]}))

else:  # cost
    n, m, bits = task["n"], task["m"], 32
    bad = {u: liar_class(task["lie"], task["step"]) for u in task["liars"]}
    install(bad)
    vecs = vectors(n, m, bits)
    t0 = time.perf_counter()
    rep = run_secure_sum(vecs, bits, RoundContext(round=1, phase="t", seed=0,
                         dropouts=ScheduledDropouts({})), threshold=0.7, graph="complete",
                         entropy_seed=1)
    wall = time.perf_counter() - t0
    honest = [u for u in range(n) if u not in task["liars"]]
    print(json.dumps({
        "up": float(np.mean([rep.bytes_up.get(u, 0) for u in honest])),
        "down": float(np.mean([rep.bytes_down.get(u, 0) for u in honest])),
        "client_cpu": float(np.mean([rep.client_cpu_s.get(u, 0.0) for u in honest])),
        "server_cpu": rep.server_cpu_s / n, "wall": wall,
        "outcome": describe(vecs, rep, bits, n),
    }))
'''


def run(tree: Path, task: dict) -> dict:
    """One task in a fresh interpreter with ``tree`` first on the path (same settings for
    every tree: one BLAS/OpenMP thread, the tests' lying clients importable)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), str(TESTS)]),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONHASHSEED="0")
    proc = subprocess.run([sys.executable, "-c", WORKER, json.dumps(task)], env=env,
                          cwd=str(tree), capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"outcome": f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"}
    return json.loads(lines[-1])


def main() -> None:
    """Run both parts and write the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="the older tree (main)")
    ap.add_argument("--out", type=Path,
                    default=HERE / "results" / "active_adversaries_client.txt")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--m", type=int, default=100_000)
    args = ap.parse_args()
    trees = {"branch": ROOT, "main": args.baseline.resolve()}
    lines = [
        "# Lying clients against SecureSum (issue 33): outcomes and the cost of the checks",
        f"# command: PYTHONPATH=. python benchmarks/active_adversaries.py --baseline "
        f"{args.baseline} --n {args.n} --m {args.m}",
        f"# date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}; "
        "machine: shared 2-core CPU (timings are noisy)",
        "",
        "## Outcomes (embedded: run_secure_sum n = 10; flower: Flower driver + node code, "
        "n = 8, threshold 5)",
        f"{'attack':42s} {'runtime':9s} {'tree':7s} outcome",
    ]
    for name, lie, step, liars, t, branch_only in ATTACKS:
        for tree in ("branch", "main"):
            if branch_only and tree == "main":
                lines.append(f"{name:42s} {'embedded':9s} {tree:7s} n/a (no signed tag on "
                             "main; main aborts on any tag mismatch, row 1)")
                continue
            got = run(trees[tree], {"kind": "outcome", "lie": lie, "step": step,
                                    "liars": liars, "t": t})
            lines.append(f"{name:42s} {'embedded':9s} {tree:7s} {got['outcome']}")
        if lie != "unpinned" and t == 7 and len(liars) == 1:
            fl_liars = [3] if lie not in ("wrong_unmask()",) else [4]
            for tree in ("branch", "main"):
                if branch_only and tree == "main":
                    continue
                got = run(trees[tree], {"kind": "flower", "lie": lie.replace("[5]", "[4]"),
                                        "step": step, "liars": fl_liars})
                lines.append(f"{name:42s} {'flower':9s} {tree:7s} {got['outcome']}")
        print(lines[-1], flush=True)
    lines += [
        "",
        f"## Cost per client per round, n = {args.n}, m = {args.m}, complete graph, "
        "threshold 0.7, 32-bit ring, embedded runtime",
        f"{'case':34s} {'tree':7s} {'up B':>10s} {'down B':>8s} {'client s':>9s} "
        f"{'server s':>9s} {'wall s':>7s}  outcome",
    ]
    cases = [("honest", "branch", None, None, []), ("honest", "main", None, None, []),
             ("wrong unmask response (1 liar)", "branch", "wrong_unmask()", "unmask", [6]),
             ("bad integrity tag (1 liar)", "branch", "bad_tag", "masked_input", [4])]
    for case, tree, lie, step, liars in cases:
        got = run(trees[tree], {"kind": "cost", "n": args.n, "m": args.m, "lie": lie or "bad_tag",
                                "step": step or "masked_input", "liars": liars})
        if "up" not in got:
            lines.append(f"{case:34s} {tree:7s} {got['outcome']}")
            continue
        lines.append(f"{case:34s} {tree:7s} {got['up']:10.0f} {got['down']:8.0f} "
                     f"{got['client_cpu']:9.4f} {got['server_cpu']:9.4f} {got['wall']:7.1f}  "
                     f"{got['outcome']}")
        print(lines[-1], flush=True)
    lines += [
        "",
        "# up/down: mean wire bytes per honest client; client s: its mean CPU seconds (all "
        "stages); server s: the server's CPU seconds / n.",
        "# The signed tag adds 32 bytes up per client (64-byte Ed25519 signature for the 32-byte "
        "HMAC), one signature per client and one verification per vector at the server;",
        "# error-correcting decoding adds one random parity check per secret group (h x 3 "
        "products) and Berlekamp-Welch only for columns that fail it.",
    ]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
