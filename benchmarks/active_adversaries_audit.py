"""Issue 33, items 5 and 7: each transcript rewrite by a lying server, and each planted
link against the safe store, run against two checkouts side by side (the one before the
fix and this one), with the exit code and the first words of `secagg audit --identities`
and the audit's wall time.

    python benchmarks/active_adversaries_audit.py --before /work/main --after . \\
        > benchmarks/results/active_adversaries_audit.txt

Embedded runtime, FedLog on digits, 4 clients, 2 rounds, CentralDP(Plaintext) calibrated to
eps 8 at delta 1e-5 (clear uploads, so both the DP records and the clear-upload observations
can be rewritten). "before" audits with the run folder's own identities.json (what its
`secagg run` suggested); "after" with the key directory `<run>.keys/identities.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DOMAIN = b"secagg/attest/v1\n"

MAKE_RUN = """
import sys
from algorithms.fedlog import FedLog
from secagg import privacy
from secagg.data import dirichlet_split, load_dataset
from secagg.federation import Federation
from secagg.layers.plaintext import Plaintext
part = dirichlet_split(load_dataset("digits"), 4, 0.5, seed=0, local_test_fraction=0.2)
layer = privacy.CentralDP(Plaintext(), epsilon=8.0, delta=1e-5)
res = Federation(FedLog(feature_dim=8, local_epochs=1), layer, part, rounds=2, seed=0,
                 progress=False).run()
res.save(sys.argv[1])
"""


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONWARNINGS": "ignore"}


def _run(argv: list[str], tree: Path, **kw) -> subprocess.CompletedProcess:
    """``argv`` with ``tree``'s packages (run from ``tree``: ``-m`` and ``-c`` put the
    working directory first on the path)."""
    return subprocess.run(argv, env=_env(tree), cwd=tree, **kw)


def _head(tree: Path) -> str:
    p = subprocess.run(["git", "-C", str(tree), "log", "-1", "--format=%h"],
                       capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", "secagg"],
                           capture_output=True, text=True).stdout.strip()
    return p.stdout.strip() + (" (+ uncommitted)" if dirty else "")


def _records(folder: Path) -> list[dict]:
    return [json.loads(ln) for ln in (folder / "transcript.jsonl").read_text().splitlines()]


def _write(tree: Path, records: list[dict], folder: Path) -> None:
    """The server's rewrite, closed by the checkout's own Transcript (digest recomputed)."""
    folder.mkdir(parents=True, exist_ok=True)
    src = ("import json,sys\nfrom secagg.transcript import Transcript\nt=Transcript()\n"
           "t.records=[r for r in json.load(sys.stdin) if r.get('type')!='end']\n"
           "t.close(); t.write(sys.argv[1])\n")
    _run([sys.executable, "-c", src, str(folder / "transcript.jsonl")], tree,
         input=json.dumps(records), text=True, check=True)


def _stmt(r: dict) -> dict:
    return r.get("statement", {}) if r.get("type") == "attestation" else {}


def _sign(key, st: dict) -> str:
    return key.sign(DOMAIN + json.dumps(st, sort_keys=True, separators=(",", ":")).encode()
                    ).hex()


def attacks() -> dict:
    """name -> (records -> records, plus optionally a forged identities file)."""
    def eps(recs):
        for r in recs:
            if r["type"] == "privacy":
                r["epsilon"] = 0.05
                r["holds_against"] = ["every observer, the aggregator included"]
        return recs

    def clear_deleted(recs):
        return [r for r in recs if not (r["type"] == "observation" and r["form"] == "clear"
                                        and r["what"] == "upload")]

    def client_removed(recs):
        out = [r for r in recs if 2 not in (r.get("sender"), r.get("receiver"),
                                            _stmt(r).get("sender"))]
        for r in out:
            if r["type"] == "run":
                r["attestation"]["keys"].pop("2")
        return out

    def moved(recs):
        for r in recs:
            if r["type"] == "message" and r["round"] == 0 and r["sender"] == 1:
                r["round"] = 1
        return recs

    def one_dropped(recs):
        st = next(_stmt(r) for r in recs if _stmt(r).get("sender") == 1
                  and _stmt(r)["stage"] == "upload" and _stmt(r)["round"] == 0)
        return [r for r in recs if not (
            _stmt(r) == st or (r["type"] == "message" and r.get("digest") == st["digest"])
            or (r["type"] == "message" and r["stage"] == "attest" and r["sender"] == 1
                and r["round"] == 0)
            or (r["type"] == "observation" and r["sender"] == 1 and r["round"] == 0))]

    def round_erased(recs):
        return [r for r in recs if (r.get("round", 0) != 1 and _stmt(r).get("round", 0) != 1)
                or _stmt(r).get("stage") == "end"]

    def replayed(recs):
        i = next(i for i, r in enumerate(recs) if _stmt(r).get("sender") == 3
                 and _stmt(r)["stage"] == "upload")
        msg = next(r for r in recs if r["type"] == "message"
                   and r.get("digest") == recs[i]["statement"]["digest"])
        recs[i + 1:i + 1] = [dict(msg), dict(recs[i])]
        return recs

    return {"privacy records rewritten eps 8 -> 0.05": eps,
            "server observations of clear uploads deleted": clear_deleted,
            "one client's records all removed": client_removed,
            "message records moved to another round": moved,
            "server mints its own keys, rewrites identities.json": "mint",
            "variant: one upload dropped with its statement": one_dropped,
            "variant: a whole round erased": round_erased,
            "variant: an upload replayed": replayed}


def mint(recs: list[dict], folder: Path) -> list[dict]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    mine: dict = {}
    for r in recs:
        st = _stmt(r)
        if st:
            key = mine.setdefault(str(st["sender"]), Ed25519PrivateKey.generate())
            if st["form"] == "clear":
                st["form"], st["noised"] = "noised", sorted(st["fields"])
            r["signature"] = _sign(key, st)
        if r["type"] == "observation" and r["form"] == "clear" and r["what"] == "upload":
            r["form"] = "noised"
    pub = {p: k.public_key().public_bytes(serialization.Encoding.Raw,
                                          serialization.PublicFormat.Raw).hex()
           for p, k in mine.items()}
    for r in recs:
        if r["type"] == "run":
            r["attestation"]["keys"] = pub
            scheme = r["attestation"]["scheme"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "identities.json").write_text(json.dumps({"scheme": scheme, "keys": pub}))
    return recs


def audit(tree: Path, folder: Path, ids: Path) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    p = _run([sys.executable, "-m", "secagg.cli", "audit", str(folder), "--identities",
              str(ids)], tree, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = p.stdout.splitlines()
    words = lines[0][:60] if lines else p.stderr.strip()[-60:]
    detail = next((ln.strip() for ln in lines[1:] if ln.startswith("  record")), "")
    return p.returncode, words + (f" | {detail[:110]}" if detail else ""), wall


def store_attacks(tree: Path, work: Path) -> list[tuple[str, str]]:
    """Item 7: a link planted at the writer's temporary name and at the target."""
    src = r"""
import os, sys
from pathlib import Path
import numpy as np
from secagg import safestore
d = Path(sys.argv[1]); d.mkdir()
v = d / "victim"; v.write_text("precious"); v.chmod(0o644)
def intact(): return v.read_text() == "precious" and v.stat().st_mode & 0o777 == 0o644
# 1. at the temporary name the writer used before the fix
for s in (".npz", ".json"):
    (d / f".state{s}.tmp{os.getpid()}").symlink_to(v)
try:
    safestore.save(d / "state", {"a": np.arange(3)})
    r1 = "written; victim " + ("intact" if intact() else "OVERWRITTEN and chmod-ed 0600")
except Exception as e:
    r1 = f"{type(e).__name__}: {e}"[:90]
# 2. at the target
v.write_text("precious"); v.chmod(0o644)
t = d / "other.npz"; t.symlink_to(v)
try:
    safestore.save(d / "other", {"a": np.arange(3)})
    r2 = "written (link replaced, not refused)"
except Exception as e:
    r2 = f"{type(e).__name__}: {str(e)[:70]}"
print(r1); print(r2)
"""
    p = _run([sys.executable, "-c", src, str(work)], tree, capture_output=True, text=True)
    out = (p.stdout.strip() or p.stderr.strip()[-200:]).splitlines()
    return list(zip(["link at the temporary name", "link at the target"], out, strict=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    args = ap.parse_args()
    print(__doc__.split("\n\n")[0])
    print(f"host: {os.cpu_count()} CPUs (shared); python {sys.version.split()[0]}\n")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for label, tree in (("before", args.before.resolve()), ("after", args.after.resolve())):
            run = base / label / "honest"
            _run([sys.executable, "-c", MAKE_RUN, str(run)], tree, check=True,
                 capture_output=True)
            keys = run.parent / "honest.keys" / "identities.json"
            trusted = keys if keys.exists() else run / "identities.json"
            rc, words, wall = audit(tree, run, trusted)
            print(f"[{label}: {tree} at {_head(tree)}] trust root "
                  f"{trusted.relative_to(base / label)}")
            print(f"  {'honest run':<52} exit {rc}  {wall:5.2f} s  {words}")
            for name, fn in attacks().items():
                folder = base / label / name.replace(" ", "_").replace(":", "")[:40]
                recs = _records(run)
                if fn == "mint":
                    recs = mint(recs, folder)
                else:
                    recs = fn(recs)
                _write(tree, recs, folder)
                ids = folder / "identities.json" if fn == "mint" and label == "before" \
                    else trusted
                rc, words, wall = audit(tree, folder, ids)
                print(f"  {name:<52} exit {rc}  {wall:5.2f} s  {words}")
                if fn == "mint" and label == "after":
                    rc, words, wall = audit(tree, folder, folder / "identities.json")
                    print(f"  {'  ... audited with the forged run-folder file':<52} exit {rc}"
                          f"  {wall:5.2f} s  {words}")
            for name, outcome in store_attacks(tree, base / label / "store"):
                print(f"  {'safestore: ' + name:<52} {outcome}")
            print()


if __name__ == "__main__":
    main()
