"""What both sides share: the algorithm, the data split and the layer."""

from __future__ import annotations

from typing import Any

from secagg.data import Partition, dirichlet_split, load_dataset
from secagg.layers.base import Layer

#: run-config ``layer`` values (the DP layers wrap SecureSum; noise for ``epsilon``)
LAYERS = ("plaintext", "secure-sum", "bfv", "central-dp", "local-dp", "distributed-dp")


def make_algorithm() -> Any:
    """FedLog with a small body (the ServerApp and every ClientApp use the same one);
    imported here so that processes which never run a client step skip torch."""
    from algorithms import FedLog

    return FedLog(feature_dim=8, local_epochs=1)


def make_partition(n: int) -> Partition:
    """scikit-learn's digits, split over ``n`` clients (deterministic)."""
    return dirichlet_split(load_dataset("digits"), n, 0.5, seed=0, local_test_fraction=0.2)


def make_layer(name: str, threshold: int, epsilon: float = 4.0) -> Layer:
    """The privacy layer named in the run config: ``plaintext``, ``secure-sum``, ``bfv``
    (Homomorphic with a decryptor node), or a DP layer around SecureSum at ``epsilon``
    (delta 1e-5, client-level: FedLog's bound is one client's whole statistic). Imported
    here: a ClientApp process (one per message) then skips the DP accountant and TenSEAL."""
    from secagg import CentralDP, DistributedDP, Homomorphic, LocalDP, Plaintext, SecureSum

    if name not in LAYERS:
        raise ValueError(f"layer must be one of {LAYERS}, got {name!r}")
    if name == "plaintext":
        return Plaintext()
    if name == "bfv":
        return Homomorphic(scheme="bfv")
    inner = SecureSum(threshold=threshold)
    dp = {"central-dp": CentralDP, "local-dp": LocalDP, "distributed-dp": DistributedDP}
    if name in dp:
        return dp[name](inner, epsilon=epsilon, delta=1e-5, adjacency="client")
    return inner
