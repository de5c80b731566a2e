"""Acceptance 5: every additive algorithm gives the same result under SecureSum as in the clear."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from algorithms.ccvr import CCVR
from algorithms.fedprox import FedProx
from algorithms.feduv import FedUV
from algorithms.spherefed import SphereFed
from algorithms.turbosvm import TurboSVM
from secagg.data import dirichlet_split, load_dataset
from secagg.federation import Federation
from secagg.layers.base import Layer
from secagg.layers.per_group import PerGroup
from secagg.layers.plaintext import Plaintext
from secagg.secure_sum import SecureSum

KW = {"feature_dim": 16, "local_epochs": 1}

CASES: dict[str, tuple[Callable[[], object], Callable[[], Layer]]] = {
    "fedprox": (lambda: FedProx(mu=0.1, **KW), SecureSum),
    "feduv": (lambda: FedUV(**KW), SecureSum),
    "spherefed+ffc": (lambda: SphereFed(lr=0.5, **KW), SecureSum),
    "spherefed-fedprox+ffc": (lambda: SphereFed(base="fedprox", lr=0.5, **KW), SecureSum),
    "ccvr": (lambda: CCVR(**KW), SecureSum),
    "ccvr-fedprox": (lambda: CCVR(base="fedprox", **KW), SecureSum),
    # TurboSVM-FL's encoder is additive; its embeddings stay per client.
    "turbosvm-encoder": (lambda: TurboSVM(feature_dim=16),
                         lambda: PerGroup({"encoder": SecureSum(), "embeddings": Plaintext()})),
}


@pytest.fixture(scope="module")
def part():
    return dirichlet_split(load_dataset("digits"), 4, alpha=0.5, seed=2)


@pytest.mark.parametrize("case", sorted(CASES))
def test_securesum_matches_plaintext(case: str, part) -> None:
    make_algo, make_layer = CASES[case]
    clear, secure = make_algo(), make_algo()
    r0 = Federation(clear, Plaintext(), part, rounds=2, seed=0, progress=False).run()
    r1 = Federation(secure, make_layer(), part, rounds=2, seed=0, progress=False).run()
    assert abs(r0.accuracy - r1.accuracy) <= 1e-6
    assert np.max(np.abs(np.asarray(clear.params, float) - np.asarray(secure.params, float))) < 1e-5
    # The secure run really was masked: the server never saw a training upload in the clear.
    seen = {(o["field"], o["form"]) for o in r1.transcript.records
            if o.get("party") == "server" and o.get("what") == "upload"}
    trained = {"weighted_params", "weighted_encoder"}
    assert not any(f in trained and form == "clear" for f, form in seen)
    assert any(f in trained and form == "masked" for f, form in seen)
