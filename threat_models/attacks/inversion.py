"""Gradient inversion: one record out of a batch-1 FedAvg update of an MLP.

For a first layer ``h = W1 x + b1``, the gradient of any loss on a single record is
``dL/dW1 = delta x^T`` and ``dL/db1 = delta`` (delta = dL/dh). So every row i with
``delta_i != 0`` gives ``x = dL/dW1[i, :] / dL/db1[i]`` exactly: no optimisation needed
(the analytic observation behind DLG-style attacks for layers with a bias). One local SGD
step (batch 1, one epoch; momentum does not change the first step) makes the update
``params_before - params_after = lr * gradient``, and the ratio does not depend on lr or
on the FedAvg weight n. The attack uses the least-squares ratio over all rows, which is
exact for one record and robust to float32 rounding.

Under secure summation the coalition sees only the cohort's summed update: the same ratio
then mixes every client's records, and the recovered "record" is a blend (low PSNR).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from secagg.messages import UploadSpec
from secagg.transcript import Transcript
from threat_models.attacks.common import AttackResult, observed


def record_from_update(update: np.ndarray, in_features: int, hidden: int) -> np.ndarray:
    """The input record behind a batch-1 gradient (or any positive multiple of it) of an MLP
    whose flat parameters start with W1 (hidden x in_features) then b1 (hidden)."""
    u = np.asarray(update, dtype=np.float64).ravel()
    w1 = u[: hidden * in_features].reshape(hidden, in_features)
    b1 = u[hidden * in_features: hidden * in_features + hidden]
    denom = float(b1 @ b1)
    if denom == 0.0:
        return np.zeros(in_features)
    return (b1 @ w1) / denom


def psnr(estimate: np.ndarray, truth: np.ndarray, data_range: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB (inf for an exact copy)."""
    mse = float(np.mean((np.asarray(estimate, float) - np.asarray(truth, float)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(data_range ** 2 / mse)


def invert_fedavg(transcript: Transcript, params_before: np.ndarray, coalition: Any = "server",
                  in_features: int = 64, hidden: int = 128, round: int | None = None,
                  spec: UploadSpec | None = None) -> AttackResult:
    """Recover each client's record from its FedAvg upload (``n``, ``weighted_params``) in
    phase ``train``: ``params_after = weighted_params / n``, update = before - after.

    Args:
        params_before: the parameters the server broadcast that round (it knows them).
        in_features, hidden: the first layer's shape (the digits MLP: 64 -> 128).
        spec: the phase's UploadSpec, to decode a secure sum.
    """
    wp = observed(transcript, coalition, "train", "weighted_params", round, spec)
    n = observed(transcript, coalition, "train", "n", round, spec)
    before = np.asarray(params_before, dtype=np.float64)
    if wp.uploads and n.uploads:
        est = {}
        for c, v in wp.uploads.items():
            after = v / max(float(n.uploads[c][0]), 1e-12)
            est[c] = record_from_update(before - after, in_features, hidden)
        return AttackResult("gradient inversion", "clear uploads" if wp.form == "clear"
                            else "noised uploads", est)
    if wp.sum is not None and n.sum is not None and float(n.sum[0]) > 0:
        x = record_from_update(before - wp.sum / float(n.sum[0]), in_features, hidden)
        return AttackResult("gradient inversion", "sum", {c: x for c in wp.contributors})
    return AttackResult("gradient inversion", "nothing", {})
