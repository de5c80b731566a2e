"""Streamed uploads (issue 21, point 1): the engine computes each client's upload when the
layer reads it, so a cohort is never held whole -- and the aggregate equals the
all-in-memory one bit for bit, under every layer that streams, with dropouts."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from algorithms.fedavg import FedAvg
from algorithms.fedlog import FedLog
from secagg import CentralDP, DistributedDP, Federation, LocalDP, Plaintext, SecureSum
from secagg.data import dirichlet_split, load_dataset
from secagg.errors import ConfigurationError, StreamConsumed
from secagg.homomorphic import Homomorphic
from secagg.layers.base import Aggregate, Layer, RoundContext
from secagg.layers.per_group import PerGroup
from secagg.messages import Upload, UploadSpec
from secagg.stream import Lazy, UploadStream


@pytest.fixture(scope="module")
def part():
    return dirichlet_split(load_dataset("digits"), 12, 0.5, seed=1, min_size=5)


def _layers() -> dict[str, callable]:
    # k = 10 of 11 others, t_k = 7 of 11: the seeded dropouts (at most 4 per round here)
    # never abort the session, whichever relabelling the OS CSPRNG draws
    def ss() -> SecureSum:
        return SecureSum(threshold=0.6, graph="harary", k=10)

    dp = dict(noise_multiplier=0.8, adjacency="client", seed=5)
    return {
        "plaintext": Plaintext,
        "secure-sum": ss,
        "central-dp(secure-sum)": lambda: CentralDP(ss(), **dp),
        "local-dp(secure-sum)": lambda: LocalDP(ss(), **dp),
        "distributed-dp": lambda: DistributedDP(ss(), **dp),
        "central-dp(plaintext)": lambda: CentralDP(Plaintext(), **dp),
    }


def _run(part, layer: Layer, stream: bool, algorithm=None, dropout: float = 0.15):
    aggs: list[Aggregate] = []
    algo = algorithm or FedAvg(local_epochs=1, feature_dim=8, clip=1.0)
    res = Federation(algo, layer, part, rounds=2, seed=3, dropout=dropout,
                     stream=stream).run(on_aggregate=lambda r, p, a: aggs.append(a))
    return res, aggs, algo


@pytest.mark.parametrize("name", list(_layers()))
def test_streamed_aggregate_equals_the_all_in_memory_one_bit_for_bit(part, name):
    make = _layers()[name]
    assert make().streams
    held, held_aggs, a1 = _run(part, make(), stream=False)
    streamed, streamed_aggs, a2 = _run(part, make(), stream=True)
    assert len(held_aggs) == len(streamed_aggs) == 2
    dropped = 0
    for h, s in zip(held_aggs, streamed_aggs):
        assert h.contributors == s.contributors
        dropped += 12 - len(h.contributors)
        assert h.sums.keys() == s.sums.keys()
        for k in h.sums:
            assert h.sums[k].dtype == s.sums[k].dtype
            assert h.sums[k].tobytes() == s.sums[k].tobytes(), k  # bit for bit
    assert dropped > 0  # the dropouts happened: some clients' steps ran after the layer
    assert held.history == streamed.history
    assert held.clips == streamed.clips
    p1 = np.concatenate([v.detach().numpy().ravel() for v in a1.model.state_dict().values()])
    p2 = np.concatenate([v.detach().numpy().ravel() for v in a2.model.state_dict().values()])
    assert p1.tobytes() == p2.tobytes()
    # the same messages in the same order, with the same client work booked on each
    # (their sizes follow the SecAgg+ graph, which each session relabels from the OS CSPRNG)
    rows = [(r.round, r.stage, r.sender, r.receiver, r.flops) for r in held.costs.rows]
    assert rows == [(r.round, r.stage, r.sender, r.receiver, r.flops)
                    for r in streamed.costs.rows]
    assert sum(r.step_flops for r in streamed.costs.rows) > 0  # the steps are booked


def test_a_statistics_algorithm_streams_too(part):
    held, ha, _ = _run(part, SecureSum(threshold=0.6, graph="harary", k=10), False,
                       FedLog(), dropout=0.1)
    streamed, sa, _ = _run(part, SecureSum(threshold=0.6, graph="harary", k=10), True,
                           FedLog(), dropout=0.1)
    for h, s in zip(ha, sa):
        assert all(h.sums[k].tobytes() == s.sums[k].tobytes() for k in h.sums)
    assert held.history == streamed.history


def _uploads_alive() -> int:
    gc.collect()
    return sum(isinstance(o, Upload) for o in gc.get_objects())


class _Spy(Layer):
    """Wraps a layer and counts the Upload objects alive each time the inner layer reads
    one."""

    name = "spy"

    def __init__(self, inner: Layer) -> None:
        self.inner = inner
        self.alive: list[int] = []

    def dropout_stages(self):
        return self.inner.dropout_stages()

    @property
    def streams(self) -> bool:
        return self.inner.streams

    def aggregate(self, uploads, spec: UploadSpec, ctx: RoundContext) -> Aggregate:
        def watch(c: int, up: Upload) -> Upload:
            self.alive.append(_uploads_alive())
            return up

        return self.inner.aggregate(Lazy(uploads, watch), spec, ctx)


def test_a_streamed_secure_sum_holds_one_upload_at_a_time(part):
    """The memory claim itself: while the secure sum masks client after client, only the
    upload being masked is alive; held (stream=False), all twelve are, from the start."""
    spy = _Spy(SecureSum(threshold=0.6, graph="harary", k=10))
    Federation(FedAvg(local_epochs=1, feature_dim=8), spy, part, rounds=1, seed=0,
               stream=True).run()
    assert len(spy.alive) == 12 and max(spy.alive) == 1
    spy = _Spy(SecureSum(threshold=0.6, graph="harary", k=10))
    Federation(FedAvg(local_epochs=1, feature_dim=8), spy, part, rounds=1, seed=0,
               stream=False).run()
    assert spy.alive == [12] * 12


def test_layers_that_read_twice_do_not_stream():
    assert not PerGroup({}, default=Plaintext()).streams
    assert not Homomorphic("bfv").streams


def test_upload_stream_runs_every_step_once_and_refuses_a_second_read():
    ran: list[int] = []
    spec = UploadSpec(())

    def make(c: int) -> Upload:
        ran.append(c)
        return Upload.validate(spec, {}, c, 1)

    s = UploadStream([3, 1, 2], make, keep=False)
    assert ran == [] and list(s) == [3, 1, 2] and len(s) == 3 and 1 in s and 7 not in s
    s[2]
    with pytest.raises(StreamConsumed):
        s[2]
    with pytest.raises(KeyError):
        s[7]
    assert s.finish() == 2 and ran == [2, 3, 1]
    held = UploadStream([3, 1], make, keep=True)
    assert ran[-2:] == [3, 1]
    assert held[3] is held[3] and held.finish() == 0


def _models_alive() -> int:
    from algorithms.models import SplitModel

    gc.collect()
    return sum(isinstance(o, SplitModel) for o in gc.get_objects())


@pytest.mark.parametrize("make", [
    lambda: FedAvg(local_epochs=1, feature_dim=8, batched=False),
    lambda: __import__("algorithms.turbosvm", fromlist=["TurboSVM"]).TurboSVM(
        local_epochs=1, feature_dim=8),
])
def test_clients_share_one_working_model(part, make):
    """A model the broadcast fixes entirely is trained in one working copy: the clients keep
    no model of their own (12 copies here before; 10,000 copies of the CNN filled ~4 GB)."""
    from secagg.layers.per_group import PerGroup

    algo = make()
    layer = (PerGroup({"embeddings": Plaintext()}, default=Plaintext())
             if algo.name == "turbosvm" else Plaintext())
    seen: list[int] = []
    Federation(algo, layer, part, rounds=2, seed=0).run(
        on_aggregate=lambda r, p, a: seen.append(_models_alive()))
    assert seen and max(seen) <= 2  # the global model and the working copy


def test_a_model_with_state_of_its_own_keeps_a_copy_per_client(part):
    import torch

    class WithBuffer(FedAvg):
        def build_model(self, dataset):
            m = super().build_model(dataset)
            m.body.register_buffer("seen", torch.zeros(1))
            return m

    algo = WithBuffer(local_epochs=1, feature_dim=8, batched=False)
    seen: list[int] = []
    Federation(algo, Plaintext(), part, rounds=1, seed=0).run(
        on_aggregate=lambda r, p, a: seen.append(_models_alive()))
    assert algo.keeps_model_state(algo.model) and seen == [1 + 12]


def test_the_clients_train_on_one_torch_thread_and_the_setting_is_restored(part):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: list[int] = []
        Federation(FedAvg(local_epochs=1, feature_dim=8), Plaintext(), part, rounds=1,
                   seed=0).run(on_aggregate=lambda r, p, a: seen.append(torch.get_num_threads()))
        assert seen == [1] and torch.get_num_threads() == 2
        Federation(FedAvg(local_epochs=1, feature_dim=8), Plaintext(), part, rounds=1, seed=0,
                   torch_threads=None).run(
            on_aggregate=lambda r, p, a: seen.append(torch.get_num_threads()))
        assert seen == [1, 2]
    finally:
        torch.set_num_threads(before)


def test_the_run_holds_numpy_blas_to_one_thread_and_restores_it(part):
    """Federation(blas_threads=1), the default: numpy's BLAS runs on one thread during the
    run (a second one spun on cores the clients were using), and its setting is restored;
    None leaves it alone."""
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    if not blas():
        pytest.skip("numpy without a BLAS threadpoolctl can see")
    with threadpool_limits(limits=2, user_api="blas"):
        seen: list[list[int]] = []
        Federation(FedAvg(local_epochs=1, feature_dim=8), Plaintext(), part, rounds=1,
                   seed=0).run(on_aggregate=lambda r, p, a: seen.append(blas()))
        after = blas()
        Federation(FedAvg(local_epochs=1, feature_dim=8), Plaintext(), part, rounds=1, seed=0,
                   blas_threads=None).run(on_aggregate=lambda r, p, a: seen.append(blas()))
    assert all(n == 1 for n in seen[0]), seen
    assert after == seen[1] and all(n == 2 for n in after), (after, seen)
    with pytest.raises(ConfigurationError, match="blas_threads"):
        Federation(FedAvg(), Plaintext(), part, blas_threads=0)



@pytest.mark.parametrize("stream", [True, False])
def test_an_aborted_release_still_steps_every_client_once(part, monkeypatch, stream):
    """A secure sum that aborts before any vector is read (8 of 12 clients drop at its first
    stage) with on_abort="skip": every client of the cohort still stepped once, streamed or
    not (before, a streamed cohort skipped the steps the layer never asked for)."""
    from algorithms import fedavg
    from secagg.dropouts import ScheduledDropouts

    steps: list[int] = []
    real = fedavg._TrainPhase.client_step

    def counted(self, client, broadcast):
        steps.append(client.id)
        return real(self, client, broadcast)

    monkeypatch.setattr(fedavg._TrainPhase, "client_step", counted)
    drop = ScheduledDropouts({"advertise": range(8)})
    res = Federation(FedAvg(local_epochs=1, feature_dim=8), SecureSum(threshold=0.6), part,
                     rounds=1, seed=3, dropout=drop, on_abort="skip", stream=stream).run()
    assert res.failure() is not None  # the only release aborted
    assert sorted(steps) == list(range(12))
