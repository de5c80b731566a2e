"""Which labels a TurboSVM-FL client holds, read from its class embeddings.

TurboSVM-FL uploads each client's head rows (``embeddings``: weight row and bias per class)
because the server fits an SVM on them; they cannot be summed. After local cross-entropy
training from the broadcast head, the bias of a class the client does not hold only goes
down (its gradient is the sum of that class's softmax probabilities, all positive), while a
held class's bias goes up by the share of its records. The attack: a class is held when its
bias moved by more than half the most negative move (that one is an absent class). The
``class_counts`` field the algorithm also uploads reveals the same directly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from secagg.transcript import Transcript
from threat_models.attacks.common import AttackResult, observed


def presence_from_embeddings(rows: np.ndarray, head_before: np.ndarray) -> np.ndarray:
    """Boolean (C,) guess of the held classes from one client's rows (bias in the last
    column) and the head the server broadcast."""
    delta = np.asarray(rows, float)[:, -1] - np.asarray(head_before, float)[:, -1]
    return delta > 0.5 * min(float(delta.min()), 0.0)


def label_presence(transcript: Transcript, head_before: np.ndarray, coalition: Any = "server",
                   round: int | None = None) -> AttackResult:
    """Per client, the guessed set of held classes (a boolean vector) from ``embeddings``."""
    obs = observed(transcript, coalition, "train", "embeddings", round)
    if obs.uploads:
        return AttackResult("label presence",
                            "clear uploads" if obs.form == "clear" else "noised uploads",
                            {c: presence_from_embeddings(v, head_before)
                             for c, v in obs.uploads.items()})
    return AttackResult("label presence", "nothing", {})
