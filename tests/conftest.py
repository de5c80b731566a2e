"""Shared fixtures: small, deterministic federations on scikit-learn's digits; every test
runs in its own temporary working directory."""

import pytest
import torch

from secagg.data import dirichlet_split, load_dataset

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _in_tmp_cwd(tmp_path, monkeypatch):
    """Run every test in a fresh temporary directory, so that no test depends on the
    directory pytest was started from or on what a user ran there before (a ``secagg run``
    leaves ``runs/...`` in the working directory)."""
    monkeypatch.chdir(tmp_path)


@pytest.fixture(autouse=True)
def _clients_in_one_process(monkeypatch):
    """``Federation(workers=None)`` (and ``secagg run`` without ``--workers``) forks one
    worker per core for every secure-sum session; on the suite's small cohorts that costs
    more than it saves (about 0.2 s a session on a loaded 2-core box), so in the suite the
    default is one process. Tests of the parties pass ``workers`` explicitly; the test of
    the default itself restores :func:`secagg.cores.available_cores`."""
    import secagg.federation

    monkeypatch.setattr(secagg.federation, "available_cores", lambda: 1)


@pytest.fixture(scope="session")
def digits():
    return load_dataset("digits")


@pytest.fixture(scope="session")
def digits_clients(digits):
    """10 clients, Dirichlet alpha 0.5, 20% local test split."""
    return dirichlet_split(digits, 10, 0.5, seed=0, local_test_fraction=0.2)


@pytest.fixture(scope="session")
def ledger_messages():
    """A function: a Result -> its cost ledger's messages as a multiset (dict of counts)
    of (round, stage, sender, receiver, direction), to compare two runtimes' ledgers."""
    def count(result):
        out = {}
        for r in result.costs.rows:
            key = (r.round, r.stage, r.sender, r.receiver, r.direction)
            out[key] = out.get(key, 0) + 1
        return out

    return count
