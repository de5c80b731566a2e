"""Attacks over a recorded transcript (run with ``include_values=True``).

Each attack reads only what a coalition observed (:func:`observed`) and returns an
:class:`AttackResult` holding its per-client estimates and the basis it had (single clear
uploads, noised uploads, or only a sum). ``AttackResult.score(truth)`` measures it against
the ground truth, which only a test or an experiment knows.

* :mod:`.statistics` — label histograms (FedLog, CCVR, SphereFed), class prototypes, the
  exact feature vector of a record alone in its class.
* :mod:`.membership` — membership inference on a summed statistic, with and without DP.
* :mod:`.inversion` — a record from a batch-1 FedAvg update of the digits MLP.
* :mod:`.turbosvm` — which labels a TurboSVM-FL client holds, from its class embeddings.
* :mod:`.collusion` — server + colluding clients unmasking a SecureSum upload.
* :mod:`.differencing` — a client's round-invariant upload from exact sums over cohorts
  that differ (retries, dropouts, client sampling).
"""

from threat_models.attacks.common import AttackResult, Observed, observed

__all__ = ["AttackResult", "Observed", "observed"]
