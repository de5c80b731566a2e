"""TurboSVM-FL label presence from class embeddings: clear vs local DP on the embeddings."""

from __future__ import annotations

import numpy as np

from algorithms.base import ClientState
from algorithms.turbosvm import TurboSVM
from secagg import Federation
from secagg.data import load_dataset, shard_split
from secagg.layers.per_group import PerGroup
from secagg.layers.plaintext import Plaintext
from secagg.privacy import LocalDP
from secagg.secure_sum import SecureSum
from threat_models.attacks.turbosvm import label_presence


def test_label_presence_clear_vs_local_dp():
    part = shard_split(load_dataset("digits"), n_clients=6, classes_per_client=2, seed=0)
    truth = {c.id: np.bincount(c.y, minlength=10) > 0 for c in part}
    algo = TurboSVM(local_epochs=1)
    algo.setup(part.dataset, [ClientState(c) for c in part], 0)
    head = algo.head.copy()
    exact = lambda e, t: bool(np.array_equal(e, t))  # noqa: E731
    clear = Federation(TurboSVM(local_epochs=1), PerGroup({"embeddings": Plaintext()},
                                                          default=SecureSum()),
                       part, rounds=1, include_values=True).run()
    res = label_presence(clear.transcript, head)
    assert res.basis == "clear uploads"
    assert res.score(truth, exact)["success_rate"] == 1.0
    dp = PerGroup({"embeddings": LocalDP(Plaintext(), epsilon=1.0, delta=1e-5, rounds=1)},
                  default=SecureSum())
    noised = Federation(TurboSVM(local_epochs=1), dp, part, rounds=1, include_values=True).run()
    res = label_presence(noised.transcript, head)
    assert res.basis == "noised uploads"
    assert res.score(truth, exact)["success_rate"] == 0.0
