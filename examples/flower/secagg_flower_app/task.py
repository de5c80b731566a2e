"""What both sides share: the algorithm, the data split and the layer."""

from __future__ import annotations

from typing import Any

from secagg import Plaintext, SecureSum
from secagg.data import Partition, dirichlet_split, load_dataset
from secagg.layers.base import Layer


def make_algorithm() -> Any:
    """FedLog with a small body (the ServerApp and every ClientApp use the same one);
    imported here so that processes which never run a client step skip torch."""
    from algorithms import FedLog

    return FedLog(feature_dim=8, local_epochs=1)


def make_partition(n: int) -> Partition:
    """scikit-learn's digits, split over ``n`` clients (deterministic)."""
    return dirichlet_split(load_dataset("digits"), n, 0.5, seed=0, local_test_fraction=0.2)


def make_layer(name: str, threshold: int) -> Layer:
    """The privacy layer named in the run config."""
    return SecureSum(threshold=threshold) if name == "secure-sum" else Plaintext()
