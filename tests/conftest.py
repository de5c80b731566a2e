"""Shared fixtures: small, deterministic federations on scikit-learn's digits."""

import pytest
import torch

from secagg.data import dirichlet_split, load_dataset

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def digits():
    return load_dataset("digits")


@pytest.fixture(scope="session")
def digits_clients(digits):
    """10 clients, Dirichlet alpha 0.5, 20% local test split."""
    return dirichlet_split(digits, 10, 0.5, seed=0, local_test_fraction=0.2)
