"""The client-level DP matrix: every algorithm that trains a model x {central-dp, local-dp,
distributed-dp} x {client-level with a clip, record-level with DP-SGD} runs privately or
refuses with a named reason, before anything is released."""

from __future__ import annotations

import math
import warnings

import pytest

from algorithms.ccvr import CCVR
from algorithms.fedavg import FedAvg
from algorithms.fedprox import FedProx
from algorithms.feduv import FedUV
from algorithms.spherefed import SphereFed
from algorithms.turbosvm import TurboSVM
from secagg import CentralDP, DistributedDP, Federation, LocalDP, Plaintext, SecureSum
from secagg.data import dirichlet_split, load_dataset
from secagg.errors import ConfigurationError, InadmissibleField
from secagg.privacy.dpsgd import DPSGD

ALGORITHMS = {"fedavg": FedAvg, "fedprox": FedProx, "feduv": FedUV, "spherefed": SphereFed,
              "ccvr": CCVR, "turbosvm": TurboSVM}
LAYERS = {
    "central-dp": lambda **k: CentralDP(Plaintext(), **k),
    "local-dp": lambda **k: LocalDP(Plaintext(), **k),
    "distributed-dp": lambda **k: DistributedDP(SecureSum(threshold=0.7), **k),
}
#: The cells that refuse, and the words their reason must contain. TurboSVM-FL's server
#: needs each client's class embeddings: a layer that noises only sums cannot carry them,
#: and DP-SGD would not make them private. FedUV's batch-level regularisers make DP-SGD's
#: per-sample clipping meaningless (it ran, and reported itself private, before the fix).
REFUSED = {
    ("turbosvm", "central-dp", "client"): (InadmissibleField, "embeddings"),
    ("turbosvm", "distributed-dp", "client"): (InadmissibleField, "embeddings"),
    ("turbosvm", "central-dp", "record"): (ConfigurationError, "embeddings"),
    ("turbosvm", "local-dp", "record"): (ConfigurationError, "embeddings"),
    ("turbosvm", "distributed-dp", "record"): (ConfigurationError, "embeddings"),
    # FedUV's regularisers couple a batch's records: per-sample clipping bounds nothing
    ("feduv", "central-dp", "record"): (ConfigurationError, "couple the records"),
    ("feduv", "local-dp", "record"): (ConfigurationError, "couple the records"),
    ("feduv", "distributed-dp", "record"): (ConfigurationError, "couple the records"),
}


@pytest.fixture(scope="module")
def part():
    return dirichlet_split(load_dataset("digits"), 6, 0.5, seed=0)


@pytest.mark.parametrize("adjacency", ["client", "record"])
@pytest.mark.parametrize("layer", sorted(LAYERS))
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_training_algorithm_dp_matrix(algorithm, layer, adjacency, part):
    kwargs = {"local_epochs": 1, "feature_dim": 16}
    if adjacency == "client":
        kwargs["clip"] = 1.0
        # client level: the clipped update needs no max_records; the statistics phases
        # (SphereFed's FFC, CCVR's moments) scale their per-record bounds by a public one
        dp = {"epsilon": 4.0, "delta": 1e-5}
    else:
        kwargs["dpsgd"] = DPSGD(1.0, 1.0)
        # record level with DP-SGD: the layer's noise is given, so its budget does not
        # also have to hold DP-SGD's spend (which depends on the clients' private sizes)
        dp = {"noise_multiplier": 2.0, "delta": 1e-5}
    want = REFUSED.get((algorithm, layer, adjacency))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            algo = ALGORITHMS[algorithm](**kwargs)
            fed = Federation(algo, LAYERS[layer](adjacency=adjacency, **dp), part, rounds=1,
                             seed=0, max_records=500, progress=False)
            result = fed.run()
        except (InadmissibleField, ConfigurationError) as exc:
            assert want is not None, f"refused unexpectedly: {exc}"
            assert isinstance(exc, want[0]) and want[1] in str(exc), str(exc)
            return
    assert want is None, f"expected a refusal ({want[1]}), but it ran"
    assert result.failure() is None
    ledger = result.privacy
    assert ledger is not None and ledger.private, ledger.not_private_reasons
    eps = ledger.epsilon(1e-5)
    assert 0 < eps < math.inf
    assert not ledger.unnoised
    if adjacency == "client":
        assert result.measurements[0]["clip"] == 1.0
