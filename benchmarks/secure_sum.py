"""SecureSum vs Flower's SecAgg+ (flwr 1.41.0), side by side, plus the floor on this machine.

What runs:

* **ours**: ``secagg.secure_sum.SecureSum`` (the layer: fixed-point encoding of a float32
  vector, the five-stage protocol with real wire messages -- including the consistency round
  of Bonawitz et al.'s active variant, Ed25519-signed survivor sets -- decoding), SecAgg+ graph
  ("auto": complete for small n, k-regular Harary otherwise), threshold 0.7, precision 2^-20
  (a 32-bit ring for every n here, 4 bytes a value on the wire).
* **Flower**: Flower's own ``SecAggPlusWorkflow`` (server) and ``secaggplus_mod`` (client),
  unmodified, driven in-process through a minimal in-memory ``Grid`` that serialises every
  message with Flower's own protobuf serde (bytes counted on the wire, parse time charged to
  the receiver). Same n, same neighbour count (num_shares = k + 1) and reconstruction
  threshold, Flower's default quantisation (2^22 levels, modulus 2^32). The Flower side runs
  as a subprocess of this script (``--flower-driver``), in the same run, under this
  interpreter when flwr imports here (the ``flower`` extra: ``pip install -e ".[flower]"``),
  else under ``$FLWR_PYTHON`` (a separate environment with flwr==1.41.0 and numpy).
* **floor**: what any SecAgg+ client must do, timed here: 2k X25519 agreements (share-channel
  and mask keys), k + 1 AES-256-CTR expansions of m 32-bit words and k + 1 modular additions.

Dropout: the given fraction of clients vanishes before sending its masked input (the stage
that forces mask reconstruction), the same clients in both systems.

Reported per configuration: client CPU s (mean per client, whole protocol), server CPU s
(whole protocol), upload bytes per client, the Flower/ours ratios, and ours/floor; and the
cost of the consistency round: its own stage (SURVIVORS down, SIGNATURE up: CPU and bytes from
the ledger), the signatures forwarded inside each UNMASK_REQUEST (68 B per signer), and the
client's time to verify them (timed here on the same number of Ed25519 signatures). The run
uses per-session keys (no pinned identities): a client then verifies the signatures of its
neighbours; with pinned keys it verifies every signer's (at most n).

Usage::

    python benchmarks/secure_sum.py --flower-max-nm 1e8   # full grid; Flower skipped at n=500, m=1e6
    python benchmarks/secure_sum.py --n 10 100 --m 10000 1000000 --dropout 0 0.1
    python benchmarks/secure_sum.py --scale               # n=1000, SecAgg+ graph, m=1e4
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping

import numpy as np

FLOWER_PYTHON = os.environ.get("FLWR_PYTHON") or (
    sys.executable if importlib.util.find_spec("flwr") is not None
    else "/opt/flwr-venv/bin/python")
NODE_BASE = 1000  # Flower reserves small node ids (SUPERLINK_NODE_ID = 1)


def _pool(m: int, count: int = 4, seed: int = 0) -> list[np.ndarray]:
    """A few distinct float32 client vectors in [-1, 1] (clients share them by reference, so
    memory stays O(m) whatever n is)."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, m).astype(np.float32) for _ in range(count)]


def _dropped(n: int, dropout: float) -> list[int]:
    """The clients (0-based) that drop before their masked input: every 1/dropout-th one."""
    d = round(n * dropout)
    return sorted({(i * n) // d for i in range(d)}) if d else []


# --------------------------------------------------------------------------- Flower side


def flower_driver(cfg: dict) -> dict:
    """Run Flower's SecAgg+ workflow and mod in-process (inside the flwr venv)."""
    import flwr
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.client.mod.secure_aggregation.secaggplus_mod import secaggplus_mod
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
    from flwr.common.serde import message_from_proto, message_to_proto
    from flwr.compat.common import recorddict_compat as compat
    from flwr.proto.message_pb2 import Message as ProtoMessage
    from flwr.server import ServerConfig, SimpleClientManager
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.compat.legacy_context import LegacyContext
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey
    from flwr.server.workflow.secure_aggregation.secaggplus_workflow import SecAggPlusWorkflow
    from flwr.serverapp.grid import Grid
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1  # as a ServerApp
    n, m = cfg["n"], cfg["m"]
    nodes = [NODE_BASE + i for i in range(n)]
    dropped = {NODE_BASE + i for i in cfg["dropped"]}
    pool = [ndarrays_to_parameters([v]) for v in _pool(m)]
    client_ctx = {
        nid: Context(run_id=1, node_id=nid, node_config={}, state=RecordDict(), run_config={})
        for nid in nodes
    }
    stats = {"client_cpu": dict.fromkeys(nodes, 0.0), "up": dict.fromkeys(nodes, 0),
             "down": dict.fromkeys(nodes, 0), "client_total": 0.0}

    def wire(msg: Message) -> bytes:
        return message_to_proto(msg).SerializeToString()

    def unwire(raw: bytes) -> Message:
        proto = ProtoMessage()
        proto.ParseFromString(raw)
        return message_from_proto(proto)

    class InProcessGrid(Grid):
        """Delivers each message to the destination node's mod, through protobuf bytes."""

        def __init__(self) -> None:
            self._next = 0

        def set_run(self, run):  # noqa: ANN001, ANN201
            pass

        @property
        def run(self):  # noqa: ANN201
            return None

        def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: ANN001, ANN201
            return Message(content=content, dst_node_id=dst_node_id,
                           message_type=message_type, group_id=group_id)

        def get_node_ids(self):  # noqa: ANN201
            return list(nodes)

        def push_messages(self, messages):  # noqa: ANN001, ANN201
            raise NotImplementedError

        def pull_messages(self, message_ids):  # noqa: ANN001, ANN201
            raise NotImplementedError

        def send_and_receive(self, messages, *, timeout=None):  # noqa: ANN001, ANN201
            replies = []
            for msg in messages:
                dst = msg.metadata.dst_node_id
                self._next += 1
                msg.metadata.__dict__["_message_id"] = f"m{self._next}"
                msg.metadata.__dict__["_src_node_id"] = 1
                stage = msg.content.config_records[RECORD_KEY_CONFIGS][Key.STAGE]
                raw = wire(msg)  # server-side serialisation (server CPU)
                stats["down"][dst] += len(raw)
                if stage == Stage.COLLECT_MASKED_VECTORS and dst in dropped:
                    continue  # the client vanishes before sending its masked vector
                t0 = time.process_time()  # process-wide: Flower's Shamir uses worker threads
                incoming = unwire(raw)
                out = secaggplus_mod(incoming, client_ctx[dst], call_next)
                out_raw = wire(out)
                dt = time.process_time() - t0
                stats["client_cpu"][dst] += dt
                stats["client_total"] += dt
                stats["up"][dst] += len(out_raw)
                replies.append(unwire(out_raw))  # server-side parse (server CPU)
            return replies

    def call_next(msg: Message, ctxt: Context) -> Message:
        params = pool[ctxt.node_id % len(pool)]
        fitres = FitRes(Status(Code.OK, ""), params, 1, {})
        return Message(compat.fitres_to_recorddict(fitres, True), reply_to=msg)

    grid = InProcessGrid()
    manager = SimpleClientManager()
    for nid in nodes:
        manager.register(GridClientProxy(nid, grid, 1))
    strategy = FedAvg(fraction_fit=1.0, min_fit_clients=n, min_available_clients=n,
                      fraction_evaluate=0.0, min_evaluate_clients=0)
    base = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    ctx = LegacyContext(base, config=ServerConfig(num_rounds=1), strategy=strategy,
                        client_manager=manager)
    ctx.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord({WorkflowKey.CURRENT_ROUND: 1})
    ctx.state.array_records[MAIN_PARAMS_RECORD] = compat.parameters_to_arrayrecord(
        ndarrays_to_parameters([np.zeros(m, np.float32)]), True)
    workflow = SecAggPlusWorkflow(num_shares=cfg["num_shares"],
                                  reconstruction_threshold=cfg["threshold"])
    import logging

    logging.getLogger("flwr").setLevel(logging.ERROR)
    t_wall, t_cpu = time.perf_counter(), time.process_time()
    workflow(grid, ctx)
    cpu = time.process_time() - t_cpu
    wall = time.perf_counter() - t_wall
    agg = compat.arrayrecord_to_parameters(ctx.state.array_records[MAIN_PARAMS_RECORD], True)
    from flwr.common import parameters_to_ndarrays

    result = parameters_to_ndarrays(agg)[0]
    live = [i for i in range(n) if i not in set(cfg["dropped"])]
    pool_arr = _pool(m)
    want = np.mean([pool_arr[(NODE_BASE + i) % len(pool_arr)] for i in live], axis=0)
    senders = [nid for nid in nodes if stats["up"][nid] and nid not in dropped]
    return {
        "system": f"flower {flwr.__version__}",
        "mode": "Flower's SecAggPlusWorkflow + secaggplus_mod, unmodified, in-process grid",
        "client_cpu_s": float(np.mean([stats["client_cpu"][v] for v in senders])),
        "server_cpu_s": cpu - stats["client_total"],
        "up_bytes": float(np.mean([stats["up"][v] for v in senders])),
        "down_bytes": float(np.mean([stats["down"][v] for v in nodes])),
        "wall_s": wall,
        "max_abs_err": float(np.max(np.abs(result - want))) if len(result) == m else None,
    }


def run_flower(n: int, m: int, dropped: list[int], num_shares: int, threshold: int,
               timeout: float) -> dict:
    """Run :func:`flower_driver` in the flwr venv."""
    cfg = {"n": n, "m": m, "dropped": dropped, "num_shares": num_shares, "threshold": threshold}
    proc = subprocess.run(
        [FLOWER_PYTHON, os.path.abspath(__file__), "--flower-driver", json.dumps(cfg)],
        capture_output=True, text=True, timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"Flower driver failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- our side


def run_ours(n: int, m: int, dropped: list[int], graph: str = "auto", workers: int = 1,
             expect_dropout: float = 0.0) -> dict:
    """Our SecureSum layer on the same workload (the clients' work over ``workers``
    processes; the SecAgg+ degree sized for ``expect_dropout``)."""
    from secagg.dropouts import ScheduledDropouts
    from secagg.layers.base import RoundContext
    from secagg.messages import Bound, Field, Upload, UploadSpec
    from secagg.secure_sum import SecureSum

    spec = UploadSpec((Field("w", (m,), "float32", bound=Bound(linf=1.0, adjacency="client"), additive=True),))
    pool = _pool(m)

    class LazyUploads(Mapping[int, Upload]):
        def __getitem__(self, c: int) -> Upload:
            # clients share pooled arrays by reference (no copy; validation is the engine's job)
            return Upload({"w": pool[(NODE_BASE + c) % len(pool)]}, spec, c, 1)

        def __iter__(self) -> Iterator[int]:
            return iter(range(n))

        def __len__(self) -> int:
            return n

    layer = SecureSum(threshold=0.7, graph=graph, precision=2.0 ** -20, dropout=expect_dropout)
    ctx = RoundContext(0, "bench", 0, dropouts=ScheduledDropouts({"masked-input": set(dropped)}),
                       workers=workers)
    t_wall = time.perf_counter()
    agg = layer.aggregate(LazyUploads(), spec, ctx)
    wall = time.perf_counter() - t_wall
    rep = layer.last_report
    assert rep is not None
    want = np.sum([pool[(NODE_BASE + c) % len(pool)].astype(np.float64)
                   for c in agg.contributors], axis=0)
    senders = list(agg.contributors)  # clients that went through every stage they reached
    cons = [r for r in ctx.ledger.rows if r.stage == "consistency"]
    signers = rep.live.get("consistency", 0)
    up = [r for r in cons if r.receiver == "server"]
    down = [r for r in cons if r.sender == "server"]
    consistency = {
        "signers": signers,
        "client_cpu_s": sum(r.client_cpu_s for r in up) / max(len(up), 1),
        "server_cpu_s": sum(r.server_cpu_s for r in cons),
        "up_bytes": sum(r.wire_bytes for r in up) / max(len(up), 1),
        "down_bytes": sum(r.wire_bytes for r in down) / max(len(down), 1),
        # an unpinned client is sent its closed neighbourhood's signatures only
        "request_sig_bytes": 68 * min(signers, rep.graph.k + 1),
        "verify_neighbours_s": _verify_time(min(signers, rep.graph.k + 1)),
        "verify_all_s": _verify_time(signers),
    }
    return {
        "system": "secagg SecureSum",
        "graph": rep.graph.kind, "k": rep.graph.k, "share_threshold": rep.graph.share_threshold,
        "ring_bits": rep.ring_bits,
        "client_cpu_s": float(np.mean([rep.client_cpu_s[c] for c in senders])),
        "server_cpu_s": rep.server_cpu_s,
        "up_bytes": float(np.mean([rep.bytes_up[c] for c in senders])),
        "down_bytes": float(np.mean([rep.bytes_down.get(c, 0) for c in range(n)])),
        "wall_s": wall,
        "max_abs_err": float(np.max(np.abs(agg["w"] - want))),
        "contributors": len(agg.contributors),
        "consistency": consistency,
    }


def _verify_time(count: int, repeats: int = 3) -> float:
    """CPU seconds to verify ``count`` Ed25519 signatures of one survivor set (best of
    ``repeats``): what a client does before it releases its unmasking shares."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from secagg.secure_sum.keys import sign_public, survivors_statement, verify_signature
    from secagg.secure_sum.prg import SeededEntropy

    stmt = survivors_statement(bytes(16), 0, list(range(count)))
    keys = [Ed25519PrivateKey.from_private_bytes(SeededEntropy(0, i)(32)) for i in range(count)]
    signed = [(sign_public(k), k.sign(stmt)) for k in keys]
    best = math.inf
    for _ in range(repeats):
        t0 = time.process_time()
        ok = all(verify_signature(pk, sig, stmt) for pk, sig in signed)
        best = min(best, time.process_time() - t0)
    assert ok
    return best


def floor(k: int, m: int, repeats: int = 3) -> float:
    """CPU seconds of the unavoidable client work: 2k X25519 agreements, k + 1 AES-256-CTR
    expansions of m 32-bit words, k + 1 modular additions (best of ``repeats``)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    peers = [X25519PrivateKey.generate().public_key() for _ in range(k)]
    mine = X25519PrivateKey.generate()
    zeros = bytes(4 * m + 16)
    best = math.inf
    for _ in range(repeats):
        acc = np.zeros(m, np.uint32)
        buf = np.empty(4 * m + 16, np.uint8)
        t0 = time.process_time()
        keys = [mine.exchange(p) for p in peers] + [mine.exchange(p) for p in peers]
        for i in range(k + 1):
            enc = Cipher(algorithms.AES(keys[i % len(keys)] if keys else bytes(32)),
                         modes.CTR(bytes(16))).encryptor()
            enc.update_into(memoryview(zeros)[: 4 * m], buf)
            np.add(acc, buf[: 4 * m].view(np.uint32), out=acc)
        best = min(best, time.process_time() - t0)
    return best


# --------------------------------------------------------------------------- main


def _fmt_bytes(b: float) -> str:
    return f"{b / 1e6:.3f} MB" if b >= 1e5 else f"{b / 1e3:.1f} kB"


def compare(n: int, m: int, dropout: float, with_flower: bool, timeout: float,
            flower_max_nm: float = math.inf) -> dict:
    """One configuration, both systems and the floor."""
    dropped = _dropped(n, dropout)
    ours = run_ours(n, m, dropped)
    k, tk = ours["k"], ours["share_threshold"]
    out = {"n": n, "m": m, "dropout": dropout, "ours": ours, "floor_s": floor(k, m)}
    if with_flower and n * m > flower_max_nm:
        out["flower_error"] = (f"skipped: n*m = {n * m:.0e} > --flower-max-nm {flower_max_nm:.0e} "
                               "(Flower holds every int64 masked vector in memory)")
    elif with_flower:
        try:
            out["flower"] = run_flower(n, m, dropped, k + 1, tk, timeout)
        except (RuntimeError, subprocess.TimeoutExpired, FileNotFoundError) as exc:
            out["flower_error"] = str(exc).splitlines()[-1][:200] if str(exc) else repr(exc)
    return out


def report(r: dict) -> None:
    """Print one configuration's lines."""
    o = r["ours"]
    plain = 4 * r["m"]
    print(f"\nn={r['n']:4d}  m={r['m']:>8,d}  dropout={r['dropout']:.0%}  graph={o['graph']} "
          f"k={o['k']} t_k={o['share_threshold']} ring={o['ring_bits']} bits")
    print(f"  {'':10s} {'client CPU s':>13s} {'server CPU s':>13s} {'upload/client':>14s} "
          f"{'x float32':>10s} {'wall s':>8s}")
    rows = [("ours", o)] + ([("flower", r["flower"])] if "flower" in r else [])
    for name, s in rows:
        print(f"  {name:10s} {s['client_cpu_s']:13.4f} {s['server_cpu_s']:13.3f} "
              f"{_fmt_bytes(s['up_bytes']):>14s} {s['up_bytes'] / plain:10.3f} {s['wall_s']:8.1f}")
    print(f"  floor      {r['floor_s']:13.4f}   (2k X25519 + (k+1) AES-CTR expansions + adds)")
    print(f"  ours/floor (client): {o['client_cpu_s'] / r['floor_s']:.2f}x   "
          f"ours max |sum error| {o['max_abs_err']:.2e}")
    c = o["consistency"]
    print(f"  consistency round ({c['signers']} signers): client sign {c['client_cpu_s'] * 1e3:.2f} ms"
          f" + verify {c['verify_neighbours_s'] * 1e3:.1f} ms (neighbours; all {c['signers']}: "
          f"{c['verify_all_s'] * 1e3:.1f} ms), server {c['server_cpu_s'] * 1e3:.1f} ms; "
          f"bytes/client up {c['up_bytes']:.0f} B, down {c['down_bytes']:.0f} B "
          f"+ {c['request_sig_bytes'] / 1e3:.1f} kB of signatures in the unmask request")
    if "flower" in r:
        f = r["flower"]
        total_f = f["client_cpu_s"] * r["n"] + f["server_cpu_s"]
        total_o = o["client_cpu_s"] * r["n"] + o["server_cpu_s"]
        print(f"  Flower/ours: client {f['client_cpu_s'] / o['client_cpu_s']:.1f}x  "
              f"server {f['server_cpu_s'] / max(o['server_cpu_s'], 1e-9):.1f}x  "
              f"end-to-end CPU {total_f / total_o:.1f}x  bytes {f['up_bytes'] / o['up_bytes']:.2f}x"
              + (f"  (Flower mean error {f['max_abs_err']:.1e})" if f.get("max_abs_err") else ""))
    elif "flower_error" in r:
        print(f"  flower: not run ({r['flower_error']})")


def scale(n: int = 1000, m: int = 10_000) -> None:
    """Acceptance 7: n = 1000 on the SecAgg+ graph, m = 1e4, in one process."""
    t0 = time.perf_counter()
    o = run_ours(n, m, _dropped(n, 0.1), graph="harary")
    wall = time.perf_counter() - t0
    print(f"\nscale: n={n} SecAgg+ (k={o['k']}, t_k={o['share_threshold']}), m={m:,}, 10% dropout: "
          f"{wall:.1f} s wall in one process (client mean {o['client_cpu_s']:.4f} s CPU, "
          f"server {o['server_cpu_s']:.2f} s CPU, {o['contributors']} contributors, "
          f"max |error| {o['max_abs_err']:.1e})  -> {'OK' if wall < 120 else 'OVER'} (< 120 s)")


def main(argv: list[str] | None = None) -> None:
    """Command line."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[10, 100, 500])
    p.add_argument("--m", type=int, nargs="+", default=[10_000, 1_000_000])
    p.add_argument("--dropout", type=float, nargs="+", default=[0.0, 0.1])
    p.add_argument("--no-flower", action="store_true", help="skip the Flower side")
    p.add_argument("--flower-timeout", type=float, default=3600.0)
    p.add_argument("--flower-max-nm", type=float, default=math.inf,
                   help="skip Flower where n*m exceeds this (memory/time on small machines)")
    p.add_argument("--scale", action="store_true", help="only the n=1000 scale run")
    p.add_argument("--json", help="also write the results to this file")
    a = p.parse_args(argv)
    if a.scale:
        scale()
        return
    with_flower = not a.no_flower and os.path.exists(FLOWER_PYTHON)
    if not with_flower and not a.no_flower:
        print(f"(flwr not importable here and no Python at {FLOWER_PYTHON}: install the "
              "flower extra or set FLWR_PYTHON; Flower skipped)")
    results = []
    for n in a.n:
        for m in a.m:
            for d in a.dropout:
                r = compare(n, m, d, with_flower, a.flower_timeout, a.flower_max_nm)
                report(r)
                results.append(r)
                sys.stdout.flush()
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--flower-driver":
        print(json.dumps(flower_driver(json.loads(sys.argv[2]))))
    else:
        main()
