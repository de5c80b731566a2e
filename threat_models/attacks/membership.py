"""Membership inference on a summed statistic, and its measured advantage under DP.

The attacker knows the target record's contribution ``target`` and the sum of everyone
else's, ``rest``, and sees the released sum ``s``: either ``rest`` (target out) or
``rest + target`` (target in), plus whatever noise the layer added. The likelihood-ratio
test for Gaussian noise says "in" when ``<s - rest, target> > ||target||^2 / 2``; without
noise it is always right (advantage 1).

Epsilon-delta DP bounds the advantage (TPR - FPR) of any test by
``(e^eps - 1 + 2 delta) / (e^eps + 1)`` (Kairouz et al. 2015; Humphries et al. 2023 state it
for membership). :func:`measure_advantage` runs the real layer many times on a one-field
upload (the target's client holds the record, or nothing) and reads each release back from
its transcript.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from secagg.errors import ConfigurationError
from secagg.layers.base import Layer, RoundContext
from secagg.messages import Bound, Field, Upload, UploadSpec
from secagg.transcript import Transcript


def released_sum(transcript: Transcript, phase: str, field: str,
                 round: int | None = None) -> np.ndarray:
    """The last sum of ``phase``/``field`` released in the round: the noised one when a DP
    layer noised it, else the clear one, else the sum of the clear uploads (plaintext)."""
    all_recs = [r for r in transcript.observations() if r["phase"] == phase
                and r["field"] == field and (round is None or r["round"] == round)]
    if all_recs and round is None:
        last = max(r["round"] for r in all_recs)
        all_recs = [r for r in all_recs if r["round"] == last]
    recs = [r for r in all_recs if r["what"] == "sum" and r["form"] in ("clear", "noised")]
    clear = [r for r in all_recs if r["what"] == "upload" and r["form"] == "clear"]
    if not recs and clear and all("values" in r for r in clear):
        return np.sum([np.asarray(r["values"], dtype=np.float64) for r in clear], axis=0)
    if not recs or "values" not in recs[-1]:
        raise ConfigurationError(f"no released sum of {phase}/{field} with values "
                                 "(record with include_values=True)")
    noised = [r for r in recs if r["form"] == "noised"]
    return np.asarray((noised or recs)[-1]["values"], dtype=np.float64)


def infer_membership(observed_sum: np.ndarray, rest: np.ndarray, target: np.ndarray) -> bool:
    """The likelihood-ratio guess: was ``target`` in the sum?"""
    t = np.asarray(target, float).ravel()
    d = np.asarray(observed_sum, float).ravel() - np.asarray(rest, float).ravel()
    return bool(d @ t > 0.5 * (t @ t))


def dp_advantage_bound(epsilon: float, delta: float) -> float:
    """The largest TPR - FPR any membership test can reach against an (eps, delta)-DP
    release."""
    e = math.exp(epsilon)
    return min(1.0, (e - 1.0 + 2.0 * delta) / (e + 1.0))


def measure_advantage(make_layer: Callable[[], Layer], target: np.ndarray, rest: np.ndarray,
                      trials: int = 200, seed: int = 0) -> float:
    """TPR - FPR of :func:`infer_membership` over ``trials`` one-release runs of the layer
    ``make_layer`` builds (half with the target in, half out; each trial gets a fresh privacy
    ledger and transcript, and the attack reads the release from that transcript).

    The upload has one field ``s`` (L2 bound 1 per record, so the target must have norm <= 1);
    client 0 holds the rest (``n_rest`` = ceil(||rest||) records' worth of bound), client 1
    holds the target or nothing.
    """
    target = np.asarray(target, float).ravel()
    rest = np.asarray(rest, float).ravel()
    if np.linalg.norm(target) > 1.0 + 1e-12:
        raise ConfigurationError("the target record must have L2 norm <= 1 (the field bound)")
    n_rest = max(1, math.ceil(float(np.linalg.norm(rest))))
    spec = UploadSpec((Field("s", target.shape, "float64", additive=True,
                             bound=Bound(l2=1.0, linf=1.0)),), max_records=n_rest)
    rng = np.random.default_rng(seed)
    tp = fp = n_in = n_out = 0
    layer = make_layer()
    if callable(getattr(layer, "plan_releases", None)):
        layer.plan_releases(1)  # one release per trial: each trial is its own run
    for i in range(trials):
        member = bool(i % 2) if trials > 1 else bool(rng.integers(2))
        maker = getattr(layer, "make_privacy_ledger", None)
        transcript = Transcript(include_values=True)
        ctx = RoundContext(0, "release", int(rng.integers(2**62)), transcript=transcript,
                           privacy=maker() if callable(maker) else None)
        uploads = {0: Upload.validate(spec, {"s": rest}, 0, n_rest),
                   1: Upload.validate(spec, {"s": target if member else np.zeros_like(target)},
                                      1, 1)}
        layer.aggregate(uploads, spec, ctx)
        guess = infer_membership(released_sum(transcript, "release", "s"), rest, target)
        if member:
            n_in += 1
            tp += guess
        else:
            n_out += 1
            fp += guess
    return tp / max(n_in, 1) - fp / max(n_out, 1)
