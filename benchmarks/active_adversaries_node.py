"""What a Flower node's new checks against a lying server cost, per client per round, at
n = 100 and m = 10^5 (issue 33, node part): the policy and release check before the data
(the event the node would be charged, from DistributedDP's release plan), the noise share
sized alone (a second plan), the ledger's head file (one synced write per ledger append,
two appends per release), and, with pinned identities, verifying every survivor's
consistency signature (n Ed25519 verifications) where an unpinned node checks only its
neighbourhood's. Run: ``python benchmarks/active_adversaries_node.py`` (writes
``benchmarks/results/active_adversaries_node.txt``'s cost table to stdout).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from secagg import DistributedDP, SecureSum
from secagg.messages import Bound, Field, UploadSpec
from secagg.privacy.node_budget import node_event
from secagg.privacy.node_ledger import NodeLedger
from secagg.privacy.policy import NodePolicy
from secagg.privacy.release import node_noiser
from secagg.secure_sum.graph import auto_degree

N, M, REPEAT = 100, 100_000, 5


def _best(fn, repeat=REPEAT):
    """The fastest of ``repeat`` runs of ``fn`` (seconds)."""
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return min(out)


def main() -> None:
    spec = UploadSpec((Field("update", (M,), "float64", bound=Bound(l2=1.0, adjacency="client"),
                             additive=True),), max_records=1000)
    layer = DistributedDP(SecureSum(threshold=0.7), noise_multiplier=1.0, delta=1e-5,
                          adjacency="client")
    layer.plan_releases(1)
    dp = layer.node_params()
    params = json.dumps({k: getattr(layer.inner, k) for k in ("threshold", "graph", "k",
                                                              "precision", "ring_bits")})
    rec = {"dp": json.dumps(dp), "layer": params}
    noiser = node_noiser(rec)
    policy = NodePolicy(min_noise_multiplier=1.0, dp_required=True, max_epsilon=10.0)
    rows = []

    def check() -> None:
        policy.check(dp, None, cohort=N)
        ev = node_event(0, "r", 0, "train", dp, spec=spec, cohort=N, layer=params,
                        sizing="pinned")
        policy.check_release(ev, 1e-5)

    rows.append(("policy + release check before the data (node_event: the release plan "
                 "and its epsilon)", _best(check), 0))
    rows.append(("dp-noise-alone: the second plan (share sized for one survivor)",
                 _best(lambda: noiser.release_plan(spec, N, 1)), 0))
    with tempfile.TemporaryDirectory() as d:
        plain = NodeLedger(Path(d) / "a.jsonl")
        anchored = NodeLedger(Path(d) / "b.jsonl", Path(d) / "key.ledger-head", init=True)
        ev = node_event(0, "r", 0, "train", dp, spec=spec, cohort=N, layer=params,
                        sizing="pinned").to_dict()
        count = iter(range(10**6))

        def release(led: NodeLedger) -> None:
            rid = f"r/{next(count)}/train"
            led.intend(rid, ev)
            led.commit(rid, {"status": "uploaded"})

        base = _best(lambda: release(plain), 20)
        head = _best(lambda: release(anchored), 20)
        plain.close()
        anchored.close()
    rows.append(("ledger head file: 2 extra synced writes per release (intent, commit)",
                 head - base, 0))
    key = Ed25519PrivateKey.generate()
    msg = b"survivor set statement" * 4
    sig = key.sign(msg)
    pub = key.public_key()
    one = _best(lambda: pub.verify(sig, msg), 200)
    k = auto_degree(N)
    rows.append((f"pinned: verify all {N} survivors' signatures, not the {k + 1} of the "
                 "neighbourhood", one * (N - (k + 1)), 0))
    rows.append(("dp_sizing in each step reply (the server's copy of the node's event)", 0.0,
                 len(json.dumps({"dp_sizing": "pinned"}))))
    print(f"n = {N}, m = {M:,}: extra cost per client per round (best of {REPEAT})")
    print("| check | ms (wall) | bytes |")
    print("|---|---:|---:|")
    for what, s, b in rows:
        print(f"| {what} | {s * 1e3:.2f} | {b} |")


if __name__ == "__main__":
    main()
