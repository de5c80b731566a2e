"""Issue 35, point 3: the simulated clients' work uses the machine.

``Federation(workers=...)``, ``secagg run --workers`` and sweeps default to the cores this
process may use (:func:`secagg.cores.available_cores`), 1 still runs everything in this
process; DistributedDP's noise shares are drawn where each client runs (the secure sum's
forked workers), from that client's own stream, so the released sum under a seed is the
same with any number of workers, and without a seed no two clients share a stream.
"""

from __future__ import annotations

import multiprocessing
import os

import numpy as np
import pytest

import secagg.privacy.distributed as distributed
from algorithms.fedavg import FedAvg
from secagg import DistributedDP, Federation, SecureSum
from secagg.cli import _make_parser
from secagg.cores import available_cores
from secagg.data import dirichlet_split, load_dataset
from secagg.errors import ConfigurationError
from secagg.layers.base import RoundContext
from secagg.messages import Bound, Field, Upload, UploadSpec
from secagg.privacy.noise import noise_source

SPEC = UploadSpec((Field("x", (6,), additive=True, bound=Bound(linf=1.0, adjacency="client")),
                   Field("y", (2,), additive=True, bound=Bound(linf=1.0, adjacency="client"))),
                  max_records=1)
N = 12


def _uploads():
    rng = np.random.default_rng(0)
    return {c: Upload.validate(SPEC, {"x": rng.uniform(-1, 1, 6), "y": rng.uniform(-1, 1, 2)},
                               c, 1, "raise") for c in range(N)}


def _layer(seed, mechanism="discrete_gaussian"):
    return DistributedDP(SecureSum(threshold=0.6), noise_multiplier=1.0, rounds=1, seed=seed,
                         mechanism=mechanism)


def _release(layer, workers):
    return layer.aggregate(_uploads(), SPEC, RoundContext(2, "p", 0, workers=workers))


@pytest.fixture
def draws(monkeypatch, tmp_path):
    """Record every noise share drawn (into ``tmp_path``, by the drawing process) and fail
    any draw made in this (the server's) process."""
    main = os.getpid()
    real = distributed.discrete_gaussian
    count = iter(range(10**6))

    def spy(std, size, rng):
        if os.getpid() == main:
            raise AssertionError("a client's noise share was drawn in the server's process")
        out = real(std, size, rng)
        np.save(tmp_path / f"{os.getpid()}-{next(count)}.npy", out)
        return out

    monkeypatch.setattr(distributed, "discrete_gaussian", spy)
    return tmp_path


def test_the_default_is_the_cores_this_process_may_use(monkeypatch):
    import secagg.federation

    monkeypatch.setattr(secagg.federation, "available_cores", available_cores)  # conftest's
    part = dirichlet_split(load_dataset("digits"), 4, 0.5, seed=0)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
    assert available_cores() == 3
    assert Federation(FedAvg(), SecureSum(), part).workers == 3
    assert Federation(FedAvg(), SecureSum(), part, workers=1).workers == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(), raising=False)
    assert available_cores() == 1  # never 0
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # no affinity call (macOS)
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    assert available_cores() == 5
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert available_cores() == 1
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ConfigurationError, match="workers"):
            Federation(FedAvg(), SecureSum(), part, workers=bad)


def test_secagg_run_says_its_default_and_leaves_it_to_the_federation():
    parser = _make_parser()
    run = next(a for a in parser._subparsers._group_actions[0].choices["run"]._actions
               if a.dest == "workers")
    assert run.default is None  # resolved by Federation: not written into config.toml
    assert "cores this process may use" in run.help and str(available_cores()) in run.help
    assert parser.parse_args(["run", "--workers", "1"]).workers == 1


def _by_own_streams(layer, seed):
    """The release when each client draws its shares itself, from its own seeded stream
    (as a node does), all in this process."""
    release = layer.release_plan(SPEC, N)
    total = np.zeros(sum(f.size for f in release.additive), np.uint64)
    for c, up in _uploads().items():
        total = total + layer.encode_noised(release, up, noise_source(seed, 2, "p", c).rng)
    if release.ring_bits < 64:
        total &= np.uint64(2**release.ring_bits - 1)
    ctx = RoundContext(2, "p", 0)
    return layer.finish(release, SPEC, total, tuple(range(N)), ctx, layer.ledger(ctx), False)


def test_distributed_dp_noise_is_drawn_in_the_workers(draws):
    _release(_layer(seed=7), workers=2)
    pids = [int(f.name.split("-")[0]) for f in draws.glob("*.npy")]
    assert len(pids) == 2 * N  # one share per noised field per client, none here
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("mechanism", ["discrete_gaussian", "skellam"])
def test_the_seeded_release_is_the_same_with_any_number_of_workers(mechanism):
    one, two = _release(_layer(3, mechanism), 1), _release(_layer(3, mechanism), 2)
    want = _by_own_streams(_layer(3, mechanism), 3)
    for name in ("x", "y"):
        np.testing.assert_array_equal(one[name], two[name])
        np.testing.assert_array_equal(two[name], want[name])
    assert one.contributors == two.contributors == tuple(range(N))
    plain = sum(u["x"] for u in _uploads().values())
    assert not np.allclose(one["x"], plain, atol=1e-3)  # noised


def test_unseeded_workers_draw_fresh_noise_for_every_client(draws):
    """Forked workers start from one copy of this process: each client's share must still
    come from fresh OS randomness (no two clients, and no two runs, share a stream)."""
    a = _release(_layer(seed=None), workers=2)
    b = _release(_layer(seed=None), workers=2)
    shares = [np.load(f) for f in sorted(draws.glob("*.npy"))]
    assert len(shares) == 4 * N
    x_shares = [s.tobytes() for s in shares if s.size == 6]
    assert len(set(x_shares)) == len(x_shares) == 2 * N
    assert not np.array_equal(a["x"], b["x"])


_HOLDER = """
import sys, time
from secagg.secure_sum.client import Client
from secagg.secure_sum.parties import Forked
f = Forked({u: Client(u, bytes(16), 0) for u in range(6)}, 3)
print(" ".join(str(p.pid) for p in f.procs), flush=True)
time.sleep(120)
"""


def _running(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_the_workers_end_when_the_process_that_forked_them_is_killed():
    """A killed session cannot close its workers; they hold its clients' keys and shares,
    so each must see its parent's end of the pipe close and exit (before, every worker also
    held the parent's ends of the pipes and waited forever)."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root))
    proc = subprocess.Popen([sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE,
                            text=True, env=env, cwd=root)
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 3 and all(_running(p) for p in pids)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 20
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in pids if _running(p)]
    for p in left:  # leave nothing behind if the check fails
        os.kill(p, 9)
    assert left == []


def test_a_layer_whose_client_side_is_overridden_runs_it_as_it_is():
    """The audits (threat_models.dp_audit) check a layer's ``encode_noised``/``_draw`` as
    it runs: an override (here: no noise at all) must be what the release carries with any
    number of workers, not the class's own draw in the workers."""
    layer = _layer(seed=4)
    layer._draw = lambda std, size, rng: np.zeros(size, np.int64)
    got = _release(layer, workers=2)
    plain = sum(u["x"] for u in _uploads().values())
    np.testing.assert_allclose(got["x"], plain, atol=1e-5)
    honest = _release(_layer(seed=4), workers=2)
    assert not np.allclose(honest["x"], plain, atol=1e-3)
