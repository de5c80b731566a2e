"""The simulated clients of a secure-sum session on several cores
(:mod:`secagg.secure_sum.parties`): the same session, message for message, as in one
process; failures and errors where they were; no worker outlives its session."""

from __future__ import annotations

import multiprocessing

import numpy as np
import pytest

from algorithms.fedavg import FedAvg
from secagg import DistributedDP, Federation, SecureSum
from secagg.data import dirichlet_split, load_dataset
from secagg.dropouts import ScheduledDropouts
from secagg.errors import ConfigurationError
from secagg.layers.base import RoundContext
from secagg.secure_sum import run_secure_sum, wire
from secagg.secure_sum.client import Client
from secagg.secure_sum.parties import Forked, Inline, WorkerFailed, parties


def _session(workers: int, tamper=None, vectors=None):
    rng = np.random.default_rng(0)
    vecs = vectors or {u: rng.integers(0, 2**32, 50, dtype=np.uint64) for u in range(30)}
    ctx = RoundContext(round=1, phase="p", seed=0,
                       dropouts=ScheduledDropouts({"masked-input": [4], "unmask": [9]}))
    rep = run_secure_sum(vecs, 32, ctx, threshold=0.6, graph="harary", k=10, entropy_seed=3,
                         graph_seed=2, tamper=tamper, workers=workers)
    return rep, ctx


def _garble_roster_of_7(stage, sender, receiver, msg):
    if stage == "share" and receiver == 7:
        return msg[: len(msg) // 2]  # truncated: the client cannot read it
    return msg


def test_forked_parties_play_the_same_session_as_inline():
    one, c1 = _session(1, _garble_roster_of_7)
    two, c2 = _session(2, _garble_roster_of_7)
    assert one.total.tobytes() == two.total.tobytes()
    assert one.contributors == two.contributors and 7 not in one.contributors
    assert one.failures == two.failures and one.failures[0][:2] == ("share", 7)
    assert one.bytes_up == two.bytes_up and one.bytes_down == two.bytes_down
    assert one.live == two.live
    # every client's CPU is booked (measured in its worker), and every message is the same
    assert set(two.client_cpu_s) == set(one.client_cpu_s)
    assert all(t > 0 for t in two.client_cpu_s.values())
    rows = [(r.stage, r.sender, r.receiver, r.wire_bytes) for r in c1.ledger.rows]
    assert rows == [(r.stage, r.sender, r.receiver, r.wire_bytes) for r in c2.ledger.rows]
    assert multiprocessing.active_children() == []  # the workers ended with the session


def test_an_error_in_a_worker_is_raised_here_as_inline():
    rng = np.random.default_rng(1)
    vecs = {u: rng.integers(0, 2**32, 50, dtype=np.uint64) for u in range(12)}
    vecs[5] = vecs[5][:-1]  # the wrong length: masked_input refuses it
    for workers in (1, 3):
        with pytest.raises(ConfigurationError, match="client 5"):
            _session(workers, vectors=vecs)
    assert multiprocessing.active_children() == []


def test_federation_with_workers_gives_the_same_aggregates():
    part = dirichlet_split(load_dataset("digits"), 10, 0.5, seed=0)
    sums = {}
    for workers in (1, 2):
        aggs = []
        layer = DistributedDP(SecureSum(threshold=0.7, graph="harary", k=8),
                              noise_multiplier=1.0, adjacency="client", seed=1)
        Federation(FedAvg(local_epochs=1, feature_dim=8, clip=1.0), layer, part, rounds=2,
                   seed=0, dropout=0.1, workers=workers).run(
            on_aggregate=lambda r, p, a, aggs=aggs: aggs.append(a))
        sums[workers] = [(a.contributors, {k: v.tobytes() for k, v in a.sums.items()})
                         for a in aggs]
    assert sums[1] == sums[2]
    with pytest.raises(ConfigurationError, match="workers"):
        Federation(FedAvg(), SecureSum(), part, workers=0)


def test_parties_picks_inline_for_one_worker_and_a_worker_died_is_typed():
    clients = {u: Client(u, bytes(16), 0) for u in range(3)}
    assert isinstance(parties(clients, 1), Inline)
    assert isinstance(parties({0: clients[0]}, 4), Inline)  # never more than one per client
    f = parties(clients, 2)
    assert isinstance(f, Forked)
    out = list(f.run("advertise", [(u, None) for u in range(3)]))
    assert [o[0] for o in out] == [0, 1, 2] and all(o[3] is None for o in out)
    assert all(wire.decode_header(o[1], wire.MsgType.ADVERTISE, bytes(16), wire.SERVER_ID)
               for o in out)
    f.procs[1].kill()
    f.procs[1].join()
    with pytest.raises(WorkerFailed, match="worker 1"):
        list(f.run("advertise", [(u, None) for u in range(3)]))
    f.close()
    assert multiprocessing.active_children() == []
