"""SecureSum with malicious clients: rounds completed, honest clients excluded, and what the
verifiable complaints cost (issue 26).

What runs: bare secure-sum sessions (:func:`secagg.secure_sum.run_secure_sum`, real wire
messages and cryptography, no layer or model) of ``--n`` clients on the SecAgg+ graph
(Harary, degree chosen for n), threshold 0.7, vectors of ``--m`` 32-bit ring elements, for
0, 1, 2 and 5 malicious clients, ``--rounds`` sessions each, fresh keys, graph relabelling and
malicious clients per session. The malicious clients alternate two attacks: the issue's lie
(an ACK accusing every neighbour, with the true share keys revealed -- so the server opens the
shares and finds them fine), and a garbage sender (signed ciphertexts that do not open, sent
to every neighbour -- so every honest neighbour complains, truthfully). Nobody else drops.

Reported per setting: rounds completed, honest clients excluded (summed over the rounds; it
must be 0), malicious clients excluded, complaints judged, and the cost of the machinery:
the server's CPU seconds on share signatures, pair digests and complaint verdicts (measured in
the state machine), the clients' extra CPU seconds (one Ed25519 signature per share sent and
one verification per share received, plus the commitments: timed here on the same counts),
and the bytes it adds: 96 B per share entry up (signature + pair digest), 64 B per entry
down (signature), 68 B per complaint in the ACK.

Usage::

    python benchmarks/malicious_clients.py                      # n=100, 20 rounds, m=100
    python benchmarks/malicious_clients.py --n 30 --rounds 3    # quick look
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import secagg.secure_sum.protocol as protocol
from secagg.dropouts import ScheduledDropouts
from secagg.errors import SecureSumAborted
from secagg.layers.base import RoundContext
from secagg.secure_sum import run_secure_sum, wire
from secagg.secure_sum.client import Client
from secagg.secure_sum.keys import key_commitment, share_statement

BITS = 32


class Liar(Client):
    """Accuses every sender in its ACK, revealing the true keys (the issue's attack)."""

    def receive_forward(self, forward_msg: bytes) -> bytes:
        super().receive_forward(forward_msg)
        named = set(self.accepted)
        self.accepted, self.rejected = set(), named
        body = wire.complaints_body({v: (self._channels[v][1], key_commitment(self._channels[v][0]))
                                     for v in named})
        return wire.encode(wire.MsgType.ACK, self.session, self.cid, wire.SERVER_ID, body)


class GarbageSender(Client):
    """Sends every neighbour a signed ciphertext that does not open."""

    def share_keys(self, roster_msg: bytes) -> bytes:
        msg = super().share_keys(roster_msg)
        body = wire.decode_header(msg, wire.MsgType.SHARES, self.session, wire.SERVER_ID)[1]
        commitment, entries = wire.parse_shares(body)
        n_ct, n_fw = wire.SHARE_CIPHERTEXT_BYTES, wire.FORWARD_ENTRY_BYTES
        n_signed = wire.SIGNED_SHARE_BYTES  # the ciphertext and the share digests
        assert self._sign is not None
        out = {}
        for v, e in entries.items():
            signed = os.urandom(n_ct) + e[n_ct:n_signed]
            sig = self._sign.sign(share_statement(self.session, self.round, self.cid, v,
                                                  signed))
            out[v] = signed + sig + e[n_fw:]
        return wire.encode(wire.MsgType.SHARES, self.session, self.cid, wire.SERVER_ID,
                           wire.shares_body(commitment, out))


def _client_overhead_s(sends: int, receives: int) -> float:
    """Client CPU of the machinery for ``sends`` shares sent and ``receives`` received: an
    Ed25519 signature and two key commitments + a pair digest per send, a verification per
    receive (timed on real keys)."""
    key = Ed25519PrivateKey.generate()
    pub = key.public_key()
    msg = bytes(200)
    reps = 200
    t0 = time.perf_counter()
    for _ in range(reps):
        sig = key.sign(msg)
        key_commitment(msg[:32])
        key_commitment(msg[32:64])
        key_commitment(msg[64:96])
    per_send = (time.perf_counter() - t0) / reps
    t0 = time.perf_counter()
    for _ in range(reps):
        pub.verify(sig, msg)
    per_recv = (time.perf_counter() - t0) / reps
    return sends * per_send + receives * per_recv


def one_setting(n: int, m: int, bad_count: int, rounds: int, seed: int) -> dict[str, Any]:
    """``rounds`` sessions with ``bad_count`` malicious clients; the table's row."""
    rng = random.Random(seed)
    out: dict[str, Any] = dict(n=n, bad=bad_count, completed=0, honest_excluded=0,
                               bad_excluded=0, complaints=0, aborts=[], wall=[], server=[],
                               check=[], client_extra=[], bytes_up=0, bytes_complaints=0,
                               bytes_down=0)
    for r in range(rounds):
        bad = set(rng.sample(range(n), bad_count))
        kinds = {u: (Liar if i % 2 == 0 else GarbageSender) for i, u in enumerate(sorted(bad))}

        def make(cid: int, *args: Any, kinds: dict = kinds, **kwargs: Any) -> Client:
            return kinds.get(cid, Client)(cid, *args, **kwargs)

        protocol.Client = make  # type: ignore[assignment,misc]
        vrng = np.random.default_rng(seed * 1000 + r)
        vecs = {u: vrng.integers(0, 2**20, m, dtype=np.uint64) for u in range(n)}
        ctx = RoundContext(round=r, phase="bench", seed=0, dropouts=ScheduledDropouts({}))
        t0 = time.perf_counter()
        try:
            rep = run_secure_sum(vecs, BITS, ctx, threshold=0.7, graph="harary",
                                 graph_seed=seed * 1000 + r)
        except SecureSumAborted as exc:
            out["aborts"].append(str(exc))
            continue
        finally:
            protocol.Client = Client  # type: ignore[misc]
        out["wall"].append(time.perf_counter() - t0)
        honest = set(range(n)) - bad
        want = sum(vecs[u].astype(object) for u in rep.contributors) % (1 << BITS)
        assert np.array_equal(rep.total, want.astype(np.uint64)), "wrong sum"
        out["completed"] += 1
        out["honest_excluded"] += len(honest - set(rep.contributors))
        out["bad_excluded"] += len(bad - set(rep.contributors))
        out["complaints"] += len(rep.verdicts)
        out["server"].append(rep.server_cpu_s)
        out["check"].append(sum(rep.check_cpu_s.values()))
        entries = sum(len(rep.graph.neighbours[u]) for u in range(n))
        out["client_extra"].append(_client_overhead_s(entries, entries) / n)
        out["bytes_up"] += 96 * entries
        out["bytes_down"] += 64 * entries
        out["bytes_complaints"] += wire.COMPLAINT_BYTES * len(rep.verdicts)
        out["degree"] = len(rep.graph.neighbours[0])
        out["total_up"] = out.get("total_up", 0) + sum(rep.bytes_up.values())
        out["total_down"] = out.get("total_down", 0) + sum(rep.bytes_down.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--m", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--bad", type=int, nargs="+", default=[0, 1, 2, 5])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    print(f"SecureSum, n={a.n} clients, SecAgg+ graph (Harary), threshold 0.7, "
          f"m={a.m} x {BITS}-bit, {a.rounds} sessions per row; malicious clients alternate "
          "false complaints against every neighbour and garbage shares to every neighbour\n")
    head = (f"{'malicious':>9} {'rounds ok':>10} {'honest excl.':>12} {'malicious excl.':>15} "
            f"{'complaints':>10} {'server CPU s':>12} {'check CPU s':>11} {'check %':>7} "
            f"{'client extra ms':>15} {'extra up B':>10} {'extra down B':>12} "
            f"{'evidence B':>10} {'extra bytes %':>13}")
    print(head)
    rows = []
    for b in a.bad:
        o = one_setting(a.n, a.m, b, a.rounds, a.seed + b)
        rows.append(o)
        k = max(o["completed"], 1)
        server = statistics.mean(o["server"]) if o["server"] else float("nan")
        check = statistics.mean(o["check"]) if o["check"] else float("nan")
        client = statistics.mean(o["client_extra"]) * 1e3 if o["client_extra"] else float("nan")
        extra = o["bytes_up"] + o["bytes_down"] + o["bytes_complaints"]
        total = o.get("total_up", 0) + o.get("total_down", 0)
        print(f"{b:>9} {o['completed']:>7}/{a.rounds:<2} {o['honest_excluded']:>12} "
              f"{o['bad_excluded']:>15} {o['complaints']:>10} {server:>12.3f} {check:>11.3f} "
              f"{100 * check / server:>6.1f}% {client:>15.2f} {o['bytes_up'] // k:>10} "
              f"{o['bytes_down'] // k:>12} {o['bytes_complaints'] // k:>10} "
              f"{100 * extra / max(total, 1):>12.1f}%")
        for why in o["aborts"]:
            print(f"{'':>9} abort: {why}")
    deg = rows[0].get("degree", "?")
    print(f"\nper session (means over completed rounds): server CPU s = the whole session's; check "
          f"CPU s = share signatures + pair digests + complaint verdicts; client extra ms = per "
          f"client, signing and verifying its {deg} shares each way; extra up/down B = the "
          f"signatures and pair digests on all SHARES / FORWARD messages; evidence B = the "
          f"complaints' keys in the ACKs; extra bytes % = all of it over the session's bytes")
    assert all(o["honest_excluded"] == 0 for o in rows), "an honest client was excluded"


if __name__ == "__main__":
    main()
