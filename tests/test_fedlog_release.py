"""Local-only phases and FedLog's one-release mode (issue 13, point 4).

A :class:`~algorithms.base.LocalPhase` uploads nothing: the engine runs the clients' steps,
books their work as zero-byte ``local`` rows, calls no layer and counts no release. FedLog
with ``release_rounds=1`` releases one statistic (of the seeded, untrained bodies) and then
only personalises locally, so record-level DP on that one release covers the whole run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import pytest

from algorithms.base import Aggregate, Algorithm, ClientState, LocalPhase, Phase
from algorithms.fedlog import DEFAULT_CLIENT_L2, FedLog
from secagg.data import Dataset
from secagg.errors import ConfigurationError, PrivacyError
from secagg.federation import Federation
from secagg.layers import Plaintext
from secagg.messages import Bound, Field, UploadSpec
from secagg.privacy import CentralDP
from secagg.secure_sum import SecureSum


def _run(algo: Any, layer: Any, clients: Any, rounds: int = 3, **kw: Any) -> Any:
    return Federation(algo, layer, clients, rounds=rounds, seed=0, progress=False, **kw).run()


def test_one_release_fedlog_uploads_once_and_personalises_locally(digits_clients):
    algo = FedLog(local_epochs=5, release_rounds=1)
    res = _run(algo, Plaintext(), digits_clients)
    rows = res.costs.rows
    ups = [r for r in rows if r.direction == "up" and r.wire_bytes > 0]
    assert {(r.round, r.phase) for r in ups} == {(0, "stats")}
    local = [r for r in rows if r.stage == "local"]
    assert {(r.round, r.phase) for r in local} == {(1, "personalize"), (2, "personalize")}
    assert all(r.wire_bytes == 0 and r.flops > 0 and r.step_flops == r.flops for r in local)
    assert len(local) == 2 * len(digits_clients)
    # local work is no message: the transcript has only the head's broadcasts there
    sent = [r for r in res.transcript.records if r.get("type") == "message"
            and r.get("phase") == "personalize"]
    assert sent and {r["stage"] for r in sent} == {"broadcast"}
    # the head reaches the clients (downlink) and the bodies learn against it
    downs = [r for r in rows if r.phase == "personalize" and r.direction == "down"]
    assert len(downs) == 2 * len(digits_clients) and all(r.wire_bytes > 0 for r in downs)
    assert res.history[-1] > res.history[0] + 0.05
    # the head is round 0's: the personalize rounds leave it as it was
    once = FedLog(local_epochs=5, release_rounds=1)
    _run(once, Plaintext(), digits_clients, rounds=1)
    np.testing.assert_array_equal(algo.eta, once.eta)
    assert [p[1] for p in res.participation] == ["stats", "personalize", "personalize"]


def test_one_release_fedlog_is_record_level_and_its_epsilon_covers_the_whole_run(
        digits_clients):
    algo = FedLog(local_epochs=1, release_rounds=1)
    assert algo.client_l2 is None and algo.spec  # auto: the per-record bound of round 0
    layer = CentralDP(Plaintext(), epsilon=1.0, delta=1e-5)
    res = _run(algo, layer, digits_clients, rounds=3)
    assert layer.releases == 1  # local phases are no releases: the budget is not split
    header = res.transcript.records[0]
    assert header["layer"]["releases"] == 1  # the header shows the layer as it ran
    assert header["layer"]["noise_multiplier"] == pytest.approx(layer.noise_multiplier)
    assert len(res.privacy.events) == 1
    assert res.privacy.epsilon() == pytest.approx(1.0, abs=1e-3)
    assert res.privacy.private
    one_round = CentralDP(Plaintext(), epsilon=1.0, delta=1e-5)
    _run(FedLog(local_epochs=1, release_rounds=1), one_round, digits_clients, rounds=1)
    assert layer.noise_multiplier == pytest.approx(one_round.noise_multiplier, rel=1e-9)


def test_fedlog_released_every_round_keeps_the_client_level_default(digits_clients):
    assert FedLog().client_l2 == DEFAULT_CLIENT_L2
    assert FedLog(release_rounds=2).client_l2 == DEFAULT_CLIENT_L2
    # two releases: the second is of trained bodies, so the per-record bound is refused
    with pytest.raises(PrivacyError, match="stats"):
        _run(FedLog(local_epochs=1, release_rounds=2, client_l2=None),
             CentralDP(Plaintext(), epsilon=1.0, delta=1e-5), digits_clients)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "1"])
def test_release_rounds_is_validated(bad):
    with pytest.raises(ConfigurationError, match="release_rounds"):
        FedLog(release_rounds=bad)


def test_one_release_under_secure_sum_equals_plaintext(digits_clients):
    a = _run(FedLog(local_epochs=1, release_rounds=1), Plaintext(), digits_clients, rounds=2)
    b = _run(FedLog(local_epochs=1, release_rounds=1), SecureSum(threshold=0.6),
             digits_clients, rounds=2)
    assert a.history == pytest.approx(b.history, abs=1e-3)


def test_fedlog_books_the_body_training_it_runs(digits_clients):
    res = _run(FedLog(local_epochs=2), Plaintext(), digits_clients, rounds=2)
    algo = FedLog(local_epochs=2)
    st = ClientState(digits_clients[0])
    algo.setup(digits_clients.dataset, [st], 0)
    n_body = sum(p.numel() for p in st.state["model"].body.parameters())
    train = 6.0 * n_body * st.n_records * 2
    up = {r.round: r.step_flops for r in res.costs.rows
          if r.direction == "up" and r.sender == 0 and r.phase == "stats"
          and r.stage != "attest"}
    assert up[0] < train  # round 0: statistics of the untrained body only
    assert up[1] >= train + up[0] * 0.99


class _Echo(LocalPhase):
    name: ClassVar[str] = "echo"

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]
                    ) -> dict[str, np.ndarray]:
        return {"x": np.zeros(1)}


class _Sum(Phase):
    name: ClassVar[str] = "sum"

    def spec(self) -> UploadSpec:
        return UploadSpec((Field("x", (1,), "float64", additive=True,
                                 bound=Bound(l2=1.0, linf=1.0)),))

    def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]
                    ) -> dict[str, np.ndarray]:
        return {"x": np.ones(1)}

    def server_step(self, aggregate: Aggregate) -> None:
        pass


class _Algo(Algorithm):
    name: ClassVar[str] = "local-test"

    def __init__(self, phases: Sequence[Phase]) -> None:
        self._phases = phases

    def setup(self, dataset: Dataset, clients: Sequence[ClientState], seed: int) -> None:
        pass

    def phases(self, round: int, rounds: int) -> Sequence[Phase]:
        return self._phases

    def evaluate(self, dataset: Dataset, clients: Sequence[ClientState]) -> float:
        return 0.0


def test_a_local_phase_that_returns_values_is_refused(digits_clients):
    with pytest.raises(ConfigurationError, match="local phase must return"):
        _run(_Algo([_Echo()]), Plaintext(), digits_clients, rounds=1)


def test_local_phases_do_not_count_as_releases(digits_clients):
    class Quiet(LocalPhase):
        name: ClassVar[str] = "quiet"

        def client_step(self, client: ClientState, broadcast: Mapping[str, np.ndarray]
                        ) -> dict[str, np.ndarray]:
            return {}

    layer = CentralDP(Plaintext(), epsilon=1.0, delta=1e-5)
    res = _run(_Algo([Quiet(), _Sum(), Quiet()]), layer, digits_clients, rounds=2)
    assert layer.releases == 2
    assert len(res.privacy.events) == 2
    assert not [r for r in res.costs.rows if r.phase == "quiet" and r.wire_bytes]
