"""Every layer books the client's step (the statistic it computed) once, on its upload.

The engine measures each client step (``Upload.cpu_s``, ``Upload.flops``); whatever the
layer does with the upload afterwards (mask it, encrypt it, noise it), that compute must
appear in the cost ledger exactly once per client and phase, as under Plaintext. FLOPs are
deterministic (they come from the phase's FLOP model), so they are what is compared.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from algorithms.fedlog import FedLog
from secagg import (
    CentralDP,
    DistributedDP,
    Federation,
    Homomorphic,
    LocalDP,
    PerGroup,
    Plaintext,
    SecureSum,
)
from secagg.federation import ClientState

LAYERS = {
    "plaintext": lambda: Plaintext(),
    "secure-sum": lambda: SecureSum(threshold=0.7),
    "bfv": lambda: Homomorphic("bfv", precision=1e-6),
    "ckks": lambda: Homomorphic("ckks"),
    "central-dp": lambda: CentralDP(Plaintext(), epsilon=4.0, delta=1e-5),
    "local-dp": lambda: LocalDP(Plaintext(), epsilon=4.0, delta=1e-5),
    "distributed-dp": lambda: DistributedDP(SecureSum(threshold=0.7), epsilon=4.0, delta=1e-5),
    "per-group": lambda: PerGroup({}, default=SecureSum(threshold=0.7)),
    "per-group-ddp": lambda: PerGroup(
        {"default": DistributedDP(SecureSum(threshold=0.7), epsilon=4.0, delta=1e-5)}),
}


def _client_step_costs(result) -> tuple[dict[int, float], Counter]:
    """Per client: the client-step FLOPs booked on its own messages (the layer's crypto is
    booked beside them in ``flops``), and how many rows carry them."""
    flops: dict[int, float] = defaultdict(float)
    rows: Counter = Counter()
    for r in result.costs.rows:
        if isinstance(r.sender, int) and r.step_flops > 0:
            assert r.flops >= r.step_flops, "a row's total work includes its client step"
            flops[r.sender] += r.step_flops
            rows[r.sender] += 1
    return dict(flops), rows


@pytest.fixture(scope="module")
def expected(digits_clients) -> dict[int, float]:
    """Each client's client-step FLOPs from FedLog's own FLOP model (round 0: no training)."""
    algo = FedLog(feature_dim=16)
    states = [ClientState(cd) for cd in digits_clients]
    algo.setup(digits_clients.dataset, states, 0)
    phase = algo.phases(0, 1)[0]
    return {s.id: float(phase.client_flops(s)) for s in states}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_every_layer_books_the_client_step_once(name, digits_clients, expected) -> None:
    result = Federation(FedLog(feature_dim=16), LAYERS[name](), digits_clients, rounds=1,
                        seed=0).run()
    flops, rows = _client_step_costs(result)
    assert all(v > 0 for v in expected.values())
    assert flops == pytest.approx(expected), f"{name}: client-step FLOPs differ from Plaintext's"
    assert set(rows) == set(expected) and set(rows.values()) == {1}, (
        f"{name}: the client step must be booked once per client, got {dict(rows)}")
    # the measured client-step CPU is booked too (a positive figure on each client's rows)
    cpu = defaultdict(float)
    for r in result.costs.rows:
        if isinstance(r.sender, int):
            cpu[r.sender] += r.client_cpu_s
    assert all(cpu[c] > 0 for c in expected)
